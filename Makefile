# gla-book: the two commands are `make test` and `make book` (see README.md).
# Both start from nothing but Python: they build a virtual environment in $(VENV) first.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is installed only when the environment has none (Colab and GPU machines keep theirs).
# The pinned CPU build avoids pulling gigabytes of CUDA packages; on a laptop add
# PIP_TORCH_ARGS="--index-url https://download.pytorch.org/whl/cpu" if pip cannot find it.
TORCH_SPEC ?= torch==2.13.0
PIP_TORCH_ARGS ?=
STAMP := $(VENV)/.installed
NOTEBOOKS_MD := $(sort $(wildcard notebooks/[0-9][0-9]_*.md))
NOTEBOOKS := $(NOTEBOOKS_MD:.md=.ipynb)
JOBS ?= 2

.PHONY: test disk unit jax-latest nbval reader book book-build site-check notebooks browser bench clean

# ---- environment -----------------------------------------------------------------------------
$(STAMP): pyproject.toml
	@$(PYTHON) -c "import sys; sys.exit(0 if sys.version_info >= (3, 11) else 'gla-book needs Python 3.11 or newer (jax >= 0.10 does); run make PYTHON=python3.11 ...')"
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)" $(PIP_TORCH_ARGS)
	$(PY) -m pip install -q -e ".[torch,jax,flax,test,book]"
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3" >/dev/null
	touch $@

# ---- the second environment, for `make jax-latest` ---------------------------------------------
# $(VENV) gets the jax of $(PYTHON); Python 3.11 gets no jax newer than 0.10, but readers on Colab have
# Python 3.12 and jax >= 0.11 (which, for one, prints the replica groups of compiled HLO differently).
# So the tests that need only jax run again, in $(JAX_LATEST_VENV), built from a Python >= 3.12 with the
# newest jax pip finds and without torch or Triton. PYTHON_JAX_LATEST names that Python; left empty, the
# first of these that runs and is >= 3.12 is taken (pyenv's shims are on PATH but fail for a version
# that is not selected, so each is tried, not just looked up). Delete $(JAX_LATEST_VENV) to move to a newer jax.
PYTHON_JAX_LATEST ?=
JAX_LATEST_CANDIDATES = python3.13 python3.12 $(sort $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python)) \
	$(sort $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python))
JAX_LATEST_VENV ?= .venv-jax-latest
JAX_LATEST_PY := $(JAX_LATEST_VENV)/bin/python
JAX_LATEST_STAMP := $(JAX_LATEST_VENV)/.installed
JAX_LATEST_SPEC ?= jax>=0.11
# The test files that import only jax, numpy, matplotlib and gla_ref (every other file imports torch or Triton):
#   reference/test_jax_ref.py                          the four jax_ref forms against the float64 recurrence,
#                                                      gradients, x64
#   pallas/test_pallas.py                              the Pallas kernels (interpreter) against jax_ref, gradients,
#                                                      gate rules
#   pallas/test_pallas_first_kernel.py                 chapter 5's first kernel, and its lowering for GPU
#   pallas/test_pallas_mosaic_gpu.py                   the Mosaic GPU launcher in jax's Mosaic GPU interpreter
#                                                      (jax-internal API)
#   pallas/test_pallas_tpu_lowering.py                 lowering for TPU (Mosaic) and GPU (Triton) without the device
#   sequence_parallel/test_sequence_parallel_jax.py    shard_map over 8 CPU devices and the collectives of its
#                                                      compiled HLO
JAX_LATEST_TESTS = tests/reference/test_jax_ref.py tests/pallas/test_pallas.py \
	tests/pallas/test_pallas_first_kernel.py tests/pallas/test_pallas_mosaic_gpu.py \
	tests/pallas/test_pallas_tpu_lowering.py tests/sequence_parallel/test_sequence_parallel_jax.py

$(JAX_LATEST_STAMP): pyproject.toml
	@py=; for c in $(or $(PYTHON_JAX_LATEST),$(JAX_LATEST_CANDIDATES)); do \
	  if "$$c" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; then py="$$c"; break; fi; done; \
	if [ -z "$$py" ]; then echo "make jax-latest needs Python 3.12 or newer, and none of these runs as one:" \
	  "$(strip $(or $(PYTHON_JAX_LATEST),$(JAX_LATEST_CANDIDATES)))." \
	  "Install one (e.g. pyenv install 3.12) and name it: make PYTHON_JAX_LATEST=/path/to/python3.12 ..."; exit 1; fi; \
	echo "creating $(JAX_LATEST_VENV) from $$py"; rm -rf $(JAX_LATEST_VENV) && "$$py" -m venv $(JAX_LATEST_VENV)
	$(JAX_LATEST_PY) -m pip install -q -e ".[jax]" "$(JAX_LATEST_SPEC)" "pytest>=8" "pytest-xdist>=3.5"
	touch $@

# A real headless browser for the rendered-book check (Debian/Ubuntu: chromium + chromedriver).
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else echo "make test needs chromium and chromedriver on PATH (e.g. apt-get install chromium chromium-driver)"; exit 1; fi; }

# make test builds two more environments beside $(VENV): $(JAX_LATEST_VENV) and the reader's (torch and jax, in a
# temporary folder, removed when its test passes). From a fresh clone the disk use peaked about 5.1 GB above the
# start (2026-11-27, sampled every 20 s); a machine with less free space fails here, saying so, rather than in pip.
DISK_GB ?= 5
disk:
	@for dir in . "$${TMPDIR:-/tmp}"; do \
	  free=$$(df -Pk "$$dir" | awk 'NR == 2 {print int($$4 / 1048576)}'); \
	  if [ "$$free" -lt $(DISK_GB) ]; then echo "make test needs about $(DISK_GB) GB of free disk (three Python" \
	    "environments, one of them temporary); $$dir has $$free GB free. Free some, or set DISK_GB to try anyway."; \
	    exit 1; fi; done

# ---- make test: unit tests, the jax-only tests again under the newest jax (make jax-latest), nbval over
# every notebook, the reader's test (the wheel in a fresh environment, every notebook executed outside the
# repository), the book from stored outputs, browser check
test: disk $(STAMP) browser
	$(PY) -m pytest tests --ignore=tests/site --ignore=tests/reader -n $(JOBS) -q
	$(MAKE) jax-latest
	$(PY) -m pytest --nbval-lax $(NOTEBOOKS) -q
	$(MAKE) reader
	$(MAKE) book-build
	$(PY) -m pytest tests/site -q

unit: $(STAMP)
	$(PY) -m pytest tests --ignore=tests/site --ignore=tests/reader -n $(JOBS) -q

# The jax-only tests under the newest jax (the second environment above); torch and Triton must be absent there.
# make test leaves out the tests marked slow (numerics at larger shapes, > 20 s each on a CPU), which the unit
# tests run under the first environment's jax: here the point is the newest jax's API and lowering. All of them:
# make jax-latest JAX_LATEST_MARK=
JAX_LATEST_MARK ?= not slow
jax-latest: $(JAX_LATEST_STAMP)
	@$(JAX_LATEST_PY) -c "import importlib.util, sys, jax; \
	found = [m for m in ('torch', 'triton') if importlib.util.find_spec(m)]; \
	found and sys.exit(f'{found} installed in $(JAX_LATEST_VENV), which must show that these tests need neither'); \
	print('jax-latest: jax', jax.__version__, 'on Python', sys.version.split()[0])"
	$(JAX_LATEST_PY) -m pytest $(JAX_LATEST_TESTS) -n $(JOBS) -q $(if $(JAX_LATEST_MARK),-m "$(JAX_LATEST_MARK)")

reader: $(STAMP)
	TORCH_SPEC="$(TORCH_SPEC)" PIP_TORCH_ARGS="$(PIP_TORCH_ARGS)" $(PY) -m pytest tests/reader -q -p no:xdist

nbval: $(STAMP)
	$(PY) -m pytest --nbval-lax $(NOTEBOOKS) -q

# ---- make notebooks: MyST sources -> executed .ipynb on this machine's default device
notebooks: $(STAMP)
	@for md in $(NOTEBOOKS_MD); do echo "executing $$md"; \
	  $(VENV)/bin/jupytext --to ipynb --execute "$$md" || exit 1; done

# ---- make book: execute every notebook afresh, then render the site to book/_build/html
book: notebooks
	$(MAKE) book-build
	@echo "book written to book/_build/html/index.html"

book-build: $(STAMP)
	$(PY) book/fetch_mathjax.py
	rm -rf book/notebooks && mkdir -p book/notebooks && cp $(NOTEBOOKS) book/notebooks/
	rm -rf book/_build
	$(VENV)/bin/jupyter-book build book -W -n --keep-going

site-check: $(STAMP) browser
	$(PY) -m pytest tests/site -q

# ---- make bench: the benchmark suites on one CUDA GPU (python -m gla_ref.bench list; benchmarks/README.md),
# one file per suite under benchmarks/results/; run again to continue a suite cut short. varlen and
# sequence_parallel (two GPUs) join once their suites replace the older scripts' files.
BENCH_SUITES ?= headline paper long pallas
bench: $(STAMP)
	$(PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'make bench needs a CUDA GPU')"
	@for s in $(BENCH_SUITES); do echo "suite $$s"; $(PY) -m gla_ref.bench run $$s || exit 1; done

clean:
	rm -rf book/_build book/notebooks book/_vendor .pytest_cache
