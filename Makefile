# `make demo` (the main job), `make test`, `make student` (the notebooks without solutions), `make lab` (on them),
# `make handout` (what students get), `make book` (the notebooks as two web books: book/teacher, book/student);
# each creates .venv and installs on first use.
# TORCH picks the torch requirement installed first, e.g. `make test TORCH=torch` for a CUDA build; TORCH_INDEX the
# index it comes from, e.g. `make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu` for PyTorch's CPU build.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NOTEBOOKS := $(wildcard notebooks/[0-9][0-9]_*.py)
NBTEST := .nbtest

.PHONY: demo test lint test-unit test-gpu test-notebooks notebooks student lab handout bench clean book test-book \
	test-colab test-hostile pair

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install -q -e ".[notebooks,grade,dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m minidape demo

test: lint test-unit test-notebooks

# ruff (configured in pyproject.toml: rules, line length, the notebooks left to jupytext): lint, then the format
# check. `ruff format` and `ruff check --fix` apply what they report.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Tests run many tiny tensor ops, where OpenMP threads mostly wait on each other; with the 2 cores shared,
# the model tests took 7 s on one thread against 64 s on two. So: one thread per test process, and one process
# per core (pytest-xdist), each test file in one process (--dist loadfile: a file's shared fixtures, such as the
# hostile submissions graded once, are computed once). The grader's workers of two processes never meet: user
# ids and cgroups are per grader process.
# The browser test of the book, the tests of an installed package (Colab's, a hand-out's) and the grader's hostile
# submissions are left to their own targets (test-book, test-colab, test-hostile, which .ci/run runs after this):
# they take minutes each, and `make test` is kept under ten.
test-unit: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -rs -n auto --dist loadfile tests --ignore=tests/test_book.py \
	  --ignore=tests/test_colab.py --ignore=tests/test_grade_hostile.py

# The grader against hostile submissions (tests/test_grade_hostile.py): 36 (34 hostile, 2 honest) graded in the sandbox
# at once, each case's marks and every attack's refusal checked (minutes: several sandboxed workers per submission).
test-hostile: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -rs -p no:cacheprovider tests/test_grade_hostile.py

# On a machine with a CUDA GPU (and a CUDA build of torch: make test-gpu TORCH=torch): tests/test_gpu.py, which
# MINIDAPE_EXPECT_GPU=1 makes fail instead of skip without a GPU (it also trains the demo in quick mode), then every
# notebook in quick mode, where each picks CUDA by itself.
test-gpu: $(STAMP)
	MINIDAPE_EXPECT_GPU=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -rs tests/test_gpu.py
	$(MAKE) test-notebooks

# The .py files are the notebooks' source: convert each one, keeping the outputs of its executed .ipynb (the
# cells marked NBVAL_CHECK_OUTPUT are compared with them), and run every cell in quick mode. nbval runs a
# notebook in its own folder: .nbtest/ sits beside notebooks/, so paths like ../runs mean the same in both.
# Then the student edition of the same notebooks (solution cells removed by nbconvert's TagRemovePreprocessor,
# outputs kept so that the checked cells are compared too) in .nbtest-student/. MINIDAPE_EXPECT_EXERCISES makes
# each notebook's closing summary fail unless every exercise passed (worked solutions) or none did (stubs).
# MINIDAPE_CHECK_FIGURES makes every figure a notebook shows raise if it breaks a rule of minidape/lab/figure_rules.py
# (repeated legend labels, colours too alike, a log axis with one labelled tick, heads on different colour scales).
test-notebooks: $(STAMP)
	@if [ -n "$(NOTEBOOKS)" ]; then \
	  rm -rf $(NBTEST) $(NBTEST)-student && mkdir -p $(NBTEST) && \
	  for f in $(NOTEBOOKS); do \
	    out=$(NBTEST)/$$(basename $${f%.py}).ipynb; \
	    if [ -f $${f%.py}.ipynb ]; then cp $${f%.py}.ipynb $$out; fi; \
	    $(BIN)/jupytext --quiet --update --to ipynb -o $$out $$f || exit 1; \
	  done && \
	  $(BIN)/jupyter-nbconvert --to notebook --log-level WARN $(REMOVE_SOLUTIONS) --output-dir $(NBTEST)-student \
	    $(NBTEST)/*.ipynb && \
	  MINIDAPE_CHECK_FIGURES=1 MINIDAPE_EXPECT_EXERCISES=all MINIDAPE_QUICK=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -p no:cacheprovider \
	    --nbval-lax --nbval-current-env $(NBTEST) && \
	  MINIDAPE_CHECK_FIGURES=1 MINIDAPE_EXPECT_EXERCISES=none MINIDAPE_QUICK=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -p no:cacheprovider \
	    --nbval-lax --nbval-current-env $(NBTEST)-student; \
	fi

# The student edition: every notebook without its solution cells (cell tag `solution`) and without outputs,
# made by jupytext and nbconvert's preprocessors. The stub cell before each solution stays; checks say "not
# done yet" until the student replaces it.
# Unpaired (the teacher's notebooks are paired with their .py): a student's save writes no .py beside it.
REMOVE_SOLUTIONS := --TagRemovePreprocessor.enabled=True --TagRemovePreprocessor.remove_cell_tags=solution
student: $(STAMP)
	rm -rf student && mkdir -p student/.full
	for f in $(NOTEBOOKS); do $(BIN)/jupytext --quiet --to ipynb --update-metadata '{"jupytext":null}' \
	  -o student/.full/$$(basename $${f%.py}).ipynb $$f || exit 1; done
	$(BIN)/jupyter-nbconvert --to notebook --log-level WARN $(REMOVE_SOLUTIONS) --ClearOutputPreprocessor.enabled=True \
	  --output-dir student student/.full/*.ipynb
	rm -rf student/.full
	@echo "wrote the student edition: $$(ls student/*.ipynb | wc -l) notebooks in student/"

# JupyterLab on the student edition, made first if student/ does not exist yet (so the work a student saved
# there is never overwritten). The teacher's edition, with the solutions, stays in notebooks/.
lab: $(STAMP)
	@if [ ! -d student ]; then $(MAKE) --no-print-directory student; fi
	$(BIN)/jupyter lab student/

# What a teacher hands out (never the repository, which holds the worked solutions): handout/ with the student
# edition of NOTEBOOKS, the package as a wheel and a README for students. Refuses to replace an existing handout/.
handout: $(STAMP)
	$(BIN)/python -m minidape handout handout $(if $(HANDOUT),--notebooks $(HANDOUT))

# Execute every notebook in full mode (in its own folder) and write the committed .ipynb beside its source; then
# once more in quick mode (output thrown away). Both runs record the reference measurements of the experiments
# on the notebooks' trained models in minidape/classroom/references.json (package data), which the grader and a
# notebook's own feedback in quick mode judge experiments against.
# One notebook: make notebooks NOTEBOOKS=notebooks/02_kerple_cpd_kernels.py
# The full-mode run also stores, inside the package, the results that quick mode draws beside its own (the
# teacher's reference: a quick run trains too little to show some effects).
REFERENCES := $(CURDIR)/minidape/classroom/references.json
REFERENCE_RUNS := $(CURDIR)/minidape/classroom/reference_runs.json
notebooks: $(STAMP)
	for f in $(NOTEBOOKS); do \
	  MINIDAPE_QUICK=0 MINIDAPE_RECORD_REFERENCES=$(REFERENCES) MINIDAPE_RECORD_FIGURES=$(REFERENCE_RUNS) \
	    $(BIN)/jupytext --to ipynb --execute \
	    --set-kernel python3 $$f || exit 1; \
	  quick=$$(mktemp -d) && MINIDAPE_QUICK=1 MINIDAPE_RECORD_REFERENCES=$(REFERENCES) $(BIN)/jupytext --to ipynb \
	    --execute --set-kernel python3 --run-path $$(dirname $$f) -o $$quick/notebook.ipynb $$f && rm -rf $$quick \
	    || exit 1; \
	done

# The web book (docs/book/build.py says how it is made): both editions built by Sphinx from the executed notebooks
# (not run again), into $(BOOK)/teacher and $(BOOK)/student, each a folder for any static web host. Its "Open in
# Colab" links open each page's notebook in BOOK_REPOSITORY at BOOK_BRANCH, the GitHub repository and branch the
# site is published from; MINIDAPE_SOURCE (a wheel's URL or path) is what the notebooks' first cell installs
# where minidape is missing (default: minidape from the package index).
BOOK ?= book
BOOK_REPOSITORY ?= https://github.com/OWNER/minidape
BOOK_BRANCH ?= gh-pages
BOOK_STAMP := $(VENV)/.book-installed
$(BOOK_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e ".[book]"
	touch $(BOOK_STAMP)

book: $(BOOK_STAMP)
	$(BIN)/python docs/book/build.py $(BOOK) --repository $(BOOK_REPOSITORY) --branch $(BOOK_BRANCH) \
	  $(if $(MINIDAPE_SOURCE),--install-from $(MINIDAPE_SOURCE))

# Both editions built and read by Chromium (Debian's, headless; .ci/run installs it), every page.
test-book: $(BOOK_STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -rs -p no:cacheprovider tests/test_book.py

# Every notebook as Colab runs it: from a fresh venv holding torch and Jupyter's kernel, outside the checkout,
# where the notebook's first cell installs the built wheel (quick mode); and every notebook of a hand-out, its
# wheel installed into a fresh venv far from the checkout.
test-colab: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -rs -p no:cacheprovider tests/test_colab.py

# Give every notebook the Colab cell (docs/book/colab_cell.py) and pair it with jupytext (ipynb,py:percent), so
# that `jupytext --sync` (or JupyterLab's jupytext) carries an edit of either file to the other.
pair: $(STAMP)
	$(BIN)/python docs/book/pair.py

bench: $(STAMP)
	$(BIN)/python -m minidape bench

clean:
	rm -rf $(VENV) $(NBTEST) $(NBTEST)-student student runs handout $(BOOK)
