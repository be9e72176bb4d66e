# Two entry points on a fresh machine: `make run` (the app on the quick-start preset) and
# `make test` (the whole suite; it lists its 15 slowest tests, to keep it inside CI's time). Both create
# .venv and install what they need first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,deepspeed,docs]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/torchdeck

# The suite in TEST_WORKERS processes (pytest-xdist): in one process it kept one of CI's 2 cores idle (30 CPU
# minutes in 31), its tests waiting on subprocesses, grace periods and timeouts. Each file's tests stay in one
# process, in order (--dist loadfile), and the longest files start first (tests/conftest.py's LONGEST;
# xdist's own order, most tests first, left the longest to the end). TEST_WORKERS=0: one process.
# 3 on 2 cores: with 2, the cores were ~74 % busy (tests waiting on ranks, timeouts, the SLURM cluster);
# a third process fills those waits (fresh clone, quiet: 17:52 -> 14:34 at 48416e6, CPU 26.4 -> 24.2 min).
TEST_WORKERS ?= 3

test: $(STAMP)
	$(PY) -m pytest -q -m 'not gpu' -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15 $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) runs .pytest_cache
