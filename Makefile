# The two commands of the README: `make demo` runs the example job, `make test` runs every check.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test quick lint typecheck unit bench bench-render bench-local bench-sdk bench-slurm schema clean slurm-try slurm-try-stop

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch's CPU build where pip can find it (here: a wheel on local disk), else the default one:
	# the default Linux build carries CUDA, whose import takes 0.4 s longer and whose processes hold
	# twice the memory, which every rank, fork and test pays for (benchmarks/README.md).
	-$(BIN)/python -m pip install --quiet 'torch==2.13.0+cpu'
	$(BIN)/python -m pip install --quiet -e '.[torch,dev,flyte]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/torchjob run examples/pytorch-job.yaml

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples tools
	$(BIN)/ruff format --check src tests benchmarks examples tools
	$(BIN)/lint-imports  # the layers and import rules in pyproject.toml [tool.importlinter]

typecheck: $(STAMP)
	$(BIN)/mypy src

# Most tests wait (on jobs, Slurm, timeouts) rather than compute: several workers at once keep a
# 2-core machine busy (with 4 the suite used about 60 % of its two cores; 6 ended under a load of 14
# in 10 min where 4 took 13.5 at a load of 7); worksteal lets an idle worker take tests queued
# behind a long one, and the longest tests are collected first (tests/suite_order.py) so that none
# starts near the end.
TEST_WORKERS ?= 6
unit: $(STAMP)
	$(BIN)/python -m pytest -q -rs -n $(TEST_WORKERS) --dist worksteal

test: lint typecheck unit

# While working: the core's in-process tests (no job, no cluster started), about a minute.
QUICK := spec expand plugins lifecycle controller targets targets_added flags phases records \
	podschema sdk_config cli_habits local_plan local_units slurm_plan readme
quick: $(STAMP)
	$(BIN)/python -m pytest -q -m "not torch" $(QUICK:%=tests/test_%.py)

# Timings live in benchmarks/README.md, not in tests; each script prints its own table.
bench: bench-render bench-local bench-sdk

bench-render: $(STAMP)
	$(BIN)/python benchmarks/render_scale.py

bench-local: $(STAMP)
	$(BIN)/python benchmarks/bench_local_run.py

bench-sdk: $(STAMP)
	$(BIN)/python benchmarks/bench_sdk.py

bench-slurm: $(STAMP)
	$(BIN)/python benchmarks/bench_slurm.py

# A private Slurm on this machine to try `torchjob run --engine slurm` (docs/slurm.md): needs
# Debian's slurm-wlm and munge; runs as you (or root). SLURM_TRY=DIR puts it elsewhere.
SLURM_TRY ?= $(HOME)/.torchjob/slurm-try
slurm-try: $(STAMP)
	$(BIN)/python tools/slurm_cluster.py start $(SLURM_TRY) --nodes 2

slurm-try-stop:
	$(BIN)/python tools/slurm_cluster.py stop $(SLURM_TRY)

# The schemas torchjob ships, rebuilt from the CRDs: the Volcano Job's pod template (CRD=path to override)
# and the other kinds it reads, from the CRDs beside it.
CRD ?= ../shared/crds/batch.volcano.sh_jobs.yaml
schema: $(STAMP)
	$(BIN)/python tools/podtemplate_schema.py $(CRD)
	$(BIN)/python tools/kinds_schema.py $(dir $(CRD))

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
