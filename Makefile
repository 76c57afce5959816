# Two commands on a fresh machine with Python 3.11 and pip:  make run  /  make test
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.installed-docs
CHECK_STAMP := $(VENV)/.installed-docs-check

.PHONY: run test figures bench docs docs-check clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	@touch $(STAMP)

$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[docs]"
	@touch $(DOCS_STAMP)

$(CHECK_STAMP): $(DOCS_STAMP)
	$(BIN)/python -m pip install --quiet -e ".[docs,docs-check]"
	@touch $(CHECK_STAMP)

# the verification run; its figures go to run/ (ignored by git)
run: $(STAMP)
	$(BIN)/fisherdyn run --figures-dir run

# the fuzz compiles hundreds of programs: its own processes keep them out of the others'
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --ignore=tests/test_fuzz.py
	$(BIN)/python -m pytest -q -n 2 tests/test_fuzz.py

# every study, rewriting figures/<study>.png and .json
figures: $(STAMP)
	$(BIN)/python studies/run_all.py --out figures

bench: $(STAMP)
	$(BIN)/python benchmarks/operators.py
	$(BIN)/python benchmarks/dynamics.py
	$(BIN)/python benchmarks/import_time.py

# the site goes to site/; open site/index.html from disk, or run `mkdocs serve`
docs: $(DOCS_STAMP)
	$(BIN)/mkdocs build --strict

# the built site opened from disk in headless Chromium with no network (apt-get install chromium),
# driven by Playwright, which uses that Chromium and downloads none
docs-check: docs $(CHECK_STAMP)
	$(BIN)/python docs/_check/check_site.py site

clean:
	rm -rf $(VENV) .pytest_cache run site
