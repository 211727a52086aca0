# Two commands do all the set-up on a fresh machine:
#   make demo   installs, then collects from CartPole on an embedded LocalCluster
#   make test   installs, then runs ruff, builds the docs (strict) and runs the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test lint docs bench clean

$(STAMP): pyproject.toml requirements/dev.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements/dev.txt
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/daskcollect run --env CartPole-v1 --collectors 2 --frames 20000

lint: install
	$(VENV)/bin/ruff check daskcollect tests benchmarks examples
	$(VENV)/bin/ruff format --check daskcollect tests benchmarks examples

docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet -d site

test: lint docs
	$(PY) -m pytest

bench: install
	$(PY) benchmarks/throughput.py --env CartPole-v1 --workers 2 --pairs 3
	$(PY) benchmarks/throughput.py --env Pendulum-v1 --workers 2 --pairs 3

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info site
