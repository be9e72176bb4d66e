"""The Runs list: every run directory under the runs root, live or past, to open or delete."""
