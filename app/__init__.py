"""torchdeck's terminal app. Never imports torch at module import: the first frame must be fast."""
