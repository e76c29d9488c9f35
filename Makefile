# Two commands do everything on a fresh machine:
#   make lab    set up .venv and start JupyterLab on notebooks/
#   make test   set up .venv and run every test
# Other targets: test-fast (the edit-test loop, minutes), shell, fuzz, demo, bench, lint, clean.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PORT   ?= 8888

.PHONY: lab lab-settings notebook-filter test test-fast shell fuzz demo bench lint browser-deps allocator-deps clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel

# Reinstall only when the dependency list changes. torch is pinned in pyproject.toml
# so pip takes the local CPU wheel instead of downloading CUDA packages.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[real,lab,dev,dask]'
	touch $(STAMP)

# Headless-safe: no browser is opened; the URL with its token is printed. Root (containers) needs --allow-root.
# The lab works on copies in out/lab/notebooks (a notebook updated in notebooks/ replaces its copy), so
# running and editing them leaves the checkout clean; docs/ and runs/ sit beside them as in the checkout,
# so the notebooks' links and paths work.
LAB_ROOT := out/lab
lab: $(STAMP) allocator-deps lab-settings notebook-filter
	@mkdir -p $(LAB_ROOT)/notebooks runs
	@cp -u notebooks/*.ipynb $(LAB_ROOT)/notebooks/
	@ln -sfn ../../docs $(LAB_ROOT)/docs
	@ln -sfn ../../runs $(LAB_ROOT)/runs
	@echo "Notebooks are copies in $(LAB_ROOT)/notebooks: run and edit them freely."
	$(BIN)/jupyter lab --no-browser --ip=127.0.0.1 --port=$(PORT) --notebook-dir=$(LAB_ROOT) \
	  --LabApp.default_url=/lab/tree/notebooks $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

# JupyterLab's defaults for this environment: no news pop-up over the notebooks, no update check.
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json
lab-settings: $(STAMP)
	@mkdir -p $(dir $(LAB_OVERRIDES))
	@echo '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}' \
	  > $(LAB_OVERRIDES)

# Whoever edits notebooks/ itself commits them without outputs: git strips them as it reads the files
# (the nbstripout filter that .gitattributes names, defined here in this clone's .git/config; cell ids
# and the committed kernel metadata kept).
KERNEL_DETAILS := codemirror_mode file_extension mimetype nbconvert_exporter pygments_lexer version
notebook-filter: $(STAMP)
	@if git rev-parse --git-dir >/dev/null 2>&1; then \
	  git config filter.nbstripout.clean "'$(abspath $(BIN))/python' -m nbstripout --keep-id \
	    --extra-keys '$(addprefix metadata.language_info.,$(KERNEL_DETAILS))'" && \
	  git config filter.nbstripout.smudge cat; fi

# The browser test needs Debian's chromium; install it when we can (root + apt),
# otherwise the test skips and says why.
browser-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || echo "chromium could not be installed; the browser test will skip"; \
	  else echo "no root/apt: chromium not installed; the browser test will skip"; fi; }

# Real runs start their CPU ranks on jemalloc where it is installed, so that freed memory
# is reused as a GPU's caching allocator reuses it (real_runs/allocator.py); install
# Debian's libjemalloc2 when we can (root + apt), otherwise ranks run on glibc and say so.
allocator-deps:
	@$(PYTHON) -c "import ctypes.util, sys; sys.exit(ctypes.util.find_library('jemalloc') is None)" || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libjemalloc2 >/dev/null 2>&1) \
	      || echo "libjemalloc2 could not be installed; real runs will use glibc's malloc"; \
	  else echo "no root/apt: libjemalloc2 not installed; real runs will use glibc's malloc"; fi; }

# Every test: those that start no real run and no browser on two workers, then the rest one
# at a time (real runs time their ranks on the machine's cores, so they must not share them).
test: $(STAMP) browser-deps allocator-deps
	$(BIN)/ruff check zero_sim real_runs sim2real tests bench
	$(BIN)/python -m pytest -q -n 2 -m "not slow and not browser"
	$(BIN)/python -m pytest -q -m "slow or browser"

# The edit-test loop: lint and every test that starts no real run and no browser (slow and
# browser markers); notebooks that launch real runs are marked slow.  make test stays what CI runs.
test-fast: $(STAMP)
	$(BIN)/ruff check zero_sim real_runs sim2real tests bench
	$(BIN)/python -m pytest -q -n auto -m "not slow and not browser"

# A shell with .venv active, so `zero-sim ...` works as typed; `exit` leaves it.
shell: $(STAMP)
	@echo "zero-sim and python from $(VENV) are first on PATH here; type exit to leave."
	@VIRTUAL_ENV="$(abspath $(VENV))" PATH="$(abspath $(BIN)):$$PATH" $${SHELL:-/bin/bash} -i

# Every property-based test with 10,000 examples (the suite runs a few hundred): minutes, not CI.
fuzz: $(STAMP)
	ZERO_SIM_FUZZ_EXAMPLES=10000 $(BIN)/python -m pytest -q -m fuzz -p no:cacheprovider

demo: $(STAMP)
	mkdir -p out
	$(BIN)/zero-sim demo --out out

bench: $(STAMP)
	$(BIN)/python bench/bench_engine.py
	$(BIN)/python bench/bench_plan.py

lint: $(STAMP)
	$(BIN)/ruff check zero_sim real_runs sim2real tests bench

clean:
	rm -rf $(VENV) out build *.egg-info
