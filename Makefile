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

.PHONY: test unit nbval reader book book-build site-check notebooks browser bench clean

# ---- environment -----------------------------------------------------------------------------
$(STAMP): pyproject.toml
	@$(PYTHON) -c "import sys; sys.exit(0 if sys.version_info >= (3, 11) else 'gla-book needs Python 3.11 or newer (jax >= 0.10 does); run make PYTHON=python3.11 ...')"
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)" $(PIP_TORCH_ARGS)
	$(PY) -m pip install -q -e ".[torch,jax,flax,test,book]"
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3" >/dev/null
	touch $@

# A real headless browser for the rendered-book check (Debian/Ubuntu: chromium + chromedriver).
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else echo "make test needs chromium and chromedriver on PATH (e.g. apt-get install chromium chromium-driver)"; exit 1; fi; }

# ---- make test: unit tests, nbval over every notebook, the reader's test (the wheel in a fresh
# environment, every notebook executed outside the repository), the book from stored outputs, browser check
test: $(STAMP) browser
	$(PY) -m pytest tests --ignore=tests/site --ignore=tests/reader -n $(JOBS) -q
	$(PY) -m pytest --nbval-lax $(NOTEBOOKS) -q
	$(MAKE) reader
	$(MAKE) book-build
	$(PY) -m pytest tests/site -q

unit: $(STAMP)
	$(PY) -m pytest tests --ignore=tests/site --ignore=tests/reader -n $(JOBS) -q

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

# ---- make bench: GPU benchmarks (needs CUDA), results under benchmarks/results/
bench: $(STAMP)
	$(PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'make bench needs a CUDA GPU')"
	@for s in benchmarks/bench_*.py; do echo "running $$s"; $(PY) $$s || exit 1; done

clean:
	rm -rf book/_build book/notebooks book/_vendor .pytest_cache
