"""torchdeck's training engine. Never imports textual; usable headless and under torchrun."""
