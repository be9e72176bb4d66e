"""The run directory's rooms: what is on disk (layout), what a run's status is (status), the
ranks' stacks dumped on demand (stacks), its config read back as validated (config). The bottom
floor: torch-free, UI-free, imported by every layer above."""
