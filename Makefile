# Gridgate: `make run` (demo on the embedded SQLite database) and `make test` (the CI gate).
# Debian's own Python where there is one: the isolation and QRMI tests run a user's part as
# unprivileged accounts, which must be able to read the interpreter the venv points at (a Python
# installed under root's home is not readable by them).
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || echo python3)
VENV   := .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8000
# pytest's arguments for `make test`: two processes by default (pytest-xdist); PYTEST_ARGS="" runs
# in one, PYTEST_ARGS="tests/cases -n 0" a part.
PYTEST_ARGS ?= -n 2

.PHONY: run test lint format bench screenshots clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: requirements.txt | $(BIN)/python
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

# requirements-dev.txt installs client/ (the gridgate CLI) editable: a change to its dependencies reinstalls.
$(VENV)/.installed-dev: requirements.txt requirements-dev.txt client/pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@ $(VENV)/.installed

run: $(VENV)/.installed
	DEBUG=$${DEBUG:-true} $(BIN)/python manage.py migrate --noinput
	DEBUG=$${DEBUG:-true} $(BIN)/python manage.py collectstatic --noinput --verbosity 0
	DEBUG=$${DEBUG:-true} $(BIN)/python manage.py demo
	DEBUG=$${DEBUG:-true} HOST=$(HOST) PORT=$(PORT) scripts/run.sh

test: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python manage.py check
	$(BIN)/python manage.py makemigrations --check --dry-run
	$(BIN)/python scripts/with_test_database.py $(BIN)/pytest $(PYTEST_ARGS)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(VENV)/.installed-dev
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: $(VENV)/.installed-dev
	$(BIN)/python scripts/with_test_database.py $(BIN)/python bench/run.py

# Re-take the user guide's screenshots of the user pages (the browser tests, saving into docs/).
screenshots: $(VENV)/.installed-dev
	GRIDGATE_SCREENSHOTS_DIR=docs/screenshots $(BIN)/python scripts/with_test_database.py $(BIN)/pytest -m browser tests/browser

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
