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

test: $(STAMP)
	$(PY) -m pytest -q -m 'not gpu' --durations=15 $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) runs .pytest_cache
