# Two commands do all the set-up: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
# The CPU build of torch that lies on this disk; a bare `torch` would pull a multi-GB CUDA build.
TORCH   ?= torch==2.13.0
# pip compiles every module at install: keep it, since with PYTHONDONTWRITEBYTECODE=1 (set on this machine)
# nothing compiled later is kept, and each process would compile torch again.
PIP     := $(BIN)/python -m pip install -q --disable-pip-version-check

.PHONY: demo test test-full clean

# torch first, so that trainscale's `torch>=2.4` is already satisfied by the CPU build.
$(VENV)/.torch:
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) "$(TORCH)"
	touch $@

$(VENV)/.base: pyproject.toml $(VENV)/.torch
	$(PIP) -e ".[data]"
	touch $@

# Everything the test suite exercises: Ray (parameter server), matplotlib (reports), trackers, pytest. One install
# of the package, not two (CI builds this on every run). HolisticTraceAnalysis without its declared dependencies:
# they pull JupyterLab for its notebooks (40 s of CI's install); what its trace reader imports is in `test`.
$(VENV)/.full: pyproject.toml $(VENV)/.torch
	$(PIP) -e ".[all,test]"
	$(PIP) --no-deps "HolisticTraceAnalysis>=0.5"
	touch $@

demo: $(VENV)/.base
	$(BIN)/trainscale train --nproc 2

# Lint and type-check first (seconds), then the suite. --durations=25 lists the slowest tests: the suite must
# stay within 30 minutes on a 2-core machine.
test: $(VENV)/.full
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/mypy
	$(BIN)/python -m pytest -q --durations=25

# Every test, the `full` tier's further variants included (about 12 minutes more than `make test` here).
test-full: $(VENV)/.full
	TRAINSCALE_FULL=1 $(BIN)/python -m pytest -q --durations=25

clean:
	rm -rf $(VENV) build src/*.egg-info
