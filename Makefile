# `make demo` (the main job) and `make test`; both create .venv and install on first use.
# TORCH picks the torch requirement installed first, e.g. `make test TORCH=torch` for a CUDA build.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NOTEBOOKS := $(wildcard notebooks/[0-9][0-9]_*.py)
NBTEST := .nbtest

.PHONY: demo test test-unit test-notebooks notebooks bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[notebooks,dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m minidape demo

test: test-unit test-notebooks

# Tests run many tiny tensor ops, where OpenMP threads mostly wait on each other; with the 2 cores shared,
# the model tests took 7 s on one thread against 64 s on two.
test-unit: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q tests

# The .py files are the notebooks' source: convert each one, keeping the outputs of its executed .ipynb (the
# cells marked NBVAL_CHECK_OUTPUT are compared with them), and run every cell in fast mode. nbval runs a
# notebook in its own folder: .nbtest/ sits beside notebooks/, so paths like ../runs mean the same in both.
test-notebooks: $(STAMP)
	@if [ -n "$(NOTEBOOKS)" ]; then \
	  rm -rf $(NBTEST) && mkdir -p $(NBTEST) && \
	  for f in $(NOTEBOOKS); do \
	    out=$(NBTEST)/$$(basename $${f%.py}).ipynb; \
	    if [ -f $${f%.py}.ipynb ]; then cp $${f%.py}.ipynb $$out; fi; \
	    $(BIN)/jupytext --quiet --update --to ipynb -o $$out $$f || exit 1; \
	  done && \
	  MINIDAPE_FAST=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env $(NBTEST); \
	fi

# Execute every notebook in full mode (in its own folder) and write the committed .ipynb beside its source.
# One notebook: make notebooks NOTEBOOKS=notebooks/02_kerple_cpd_kernels.py
notebooks: $(STAMP)
	for f in $(NOTEBOOKS); do MINIDAPE_FAST=0 $(BIN)/jupytext --to ipynb --execute --set-kernel python3 $$f || exit 1; done

bench: $(STAMP)
	$(BIN)/python -m minidape bench

clean:
	rm -rf $(VENV) $(NBTEST) runs
