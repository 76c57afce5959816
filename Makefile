# Two commands on a fresh machine with Python 3.11 and pip:  make run  /  make test
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test figures bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	@touch $(STAMP)

run: $(STAMP)
	$(BIN)/fisherdyn run

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

figures: $(STAMP)
	$(BIN)/fisherdyn figures

bench: $(STAMP)
	$(BIN)/python benchmarks/operators.py
	$(BIN)/python benchmarks/dynamics.py

clean:
	rm -rf $(VENV) .pytest_cache
