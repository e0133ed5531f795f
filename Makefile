# Short commands for the whole pipeline. `make run` serves the bundled model; `make test` runs the suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MODEL ?= models/en-es-small
BUNDLE ?= bundles/en-es-small
DATA ?= data

.PHONY: help install system-deps run serve bundle corpus tokenizer train release tune-decoding evaluate model-card bench bench-batching proto lint test clean

help:
	@echo "make run        serve the bundled English->Spanish model over gRPC (installs on first use)"
	@echo "make test       lint + the whole test suite"
	@echo "make corpus     build the EN-ES corpus from Debian packages into $(DATA)/"
	@echo "make tokenizer  train the SentencePiece model into $(MODEL)/"
	@echo "make train      train the small model (see $(MODEL)/MODEL_CARD.md for the shipped settings)"
	@echo "make release    copy the training run's best weights into $(MODEL)/"
	@echo "make tune-decoding  choose the decoding defaults of $(MODEL) on the valid split"
	@echo "make evaluate   score $(MODEL) on the test split against Apertium"
	@echo "make model-card evaluate $(MODEL) (test, common UI strings, fp32/int8) and write its MODEL_CARD.md"
	@echo "make bundle     export $(MODEL) to the ONNX bundle $(BUNDLE)/"
	@echo "make bench      engine vs PyTorch vs CTranslate2 speed benchmark"
	@echo "make bench-batching  batching modes (off / request / in-flight) through gRPC, with a plot"

# The virtual environment is rebuilt when the dependency list changes. torch is pinned in
# pyproject.toml (the CPU wheel); Debian's python3 needs python3-venv for `-m venv`.
$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { apt-get update -qq && apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[train,dev]"
	@touch $@

install: $(VENV)/.installed

# Debian tools the tests drive for real: promtool/prometheus (metrics, rules, dashboard queries),
# apertium (baseline), nginx (gRPC load balancing), docker-compose (compose files, validated without
# an engine).
system-deps:
	@command -v promtool >/dev/null && command -v apertium >/dev/null && command -v nginx >/dev/null \
	  && command -v docker-compose >/dev/null || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    prometheus apertium apertium-eng-spa nginx docker-compose >/dev/null; }

$(BUNDLE)/manifest.json: $(MODEL)/model.safetensors $(MODEL)/config.json $(MODEL)/tokenizer.model $(MODEL)/decoding.json | install
	$(PY) -m export --checkpoint $(MODEL) --out $(BUNDLE)

bundle: $(BUNDLE)/manifest.json

# TRANSLATOR_MODEL_DIR, TRANSLATOR_HOST, TRANSLATOR_PORT, TRANSLATOR_METRICS_PORT (and the other
# TRANSLATOR_* variables) are read by the server itself. The server serves bundles only and never
# exports (server/store.py), so without TRANSLATOR_MODEL_DIR the bundle is (re-)exported here first.
run serve: install
	@if [ -z "$$TRANSLATOR_MODEL_DIR" ]; then $(MAKE) --no-print-directory bundle; fi
	$(PY) -m server

corpus: install
	$(PY) -m model.corpus --out $(DATA)

tokenizer: install
	$(PY) -m model.tokenizer --data $(DATA) --out $(MODEL)

# Trains into runs/en-es-small (last.pt every 100 steps and on Ctrl-C / SIGTERM; the best weights so far
# in runs/en-es-small/release). TRAIN_ARGS=--resume continues exactly where it stopped;
# TRAIN_ARGS="--init-from $(MODEL)" continues from the shipped model (how it was trained, see its card).
train: install
	$(PY) -m model.train --data $(DATA) --tokenizer $(MODEL)/tokenizer.model --run-dir runs/en-es-small \
	  --release-dir runs/en-es-small/release --config small --lr 1.5e-3 --warmup 1000 --max-tokens 3000 \
	  --valid-every 500 --valid-bleu-sentences 400 --threads 2 $(TRAIN_ARGS)

# Promote the run's best weights to the shipped model directory (then: make tune-decoding model-card).
release:
	cp runs/en-es-small/release/model.safetensors runs/en-es-small/release/config.json \
	  runs/en-es-small/release/training.json $(MODEL)/

# Decoding defaults, chosen on the valid split through the engine, written to $(MODEL)/decoding.json.
tune-decoding: install bundle
	$(PY) -m bench.tune_decoding --model $(MODEL) --data $(DATA) --bundle $(BUNDLE)
	$(MAKE) --no-print-directory bundle

evaluate: install system-deps
	$(PY) -m bench.evaluate --model $(MODEL) --data $(DATA) --split test --n 1000 --beam 4 --apertium \
	  --json $(MODEL)/eval.json

# Every number of the model card in one command: test split (all / novel / by package), the common UI
# strings, repeated words, placeholders, side by side with Apertium; fp32 and int8 engine; data counts
# and the training curve.
model-card: install system-deps bundle
	$(PY) -m bench.model_card --model $(MODEL) --data $(DATA) --bundle $(BUNDLE)

bench: install bundle
	$(PY) -m bench.engine_speed --model $(MODEL) --bundle $(BUNDLE) --json bench.json

# Servers on CPU 1 (1 ONNX Runtime thread each, one busy at a time), load generator on the others.
bench-batching: install bundle
	$(PY) -m bench.step_cost --bundle $(BUNDLE) --threads 1 --json bench-step-cost.json
	$(PY) -m bench.saturation --bundle $(BUNDLE) --threads 1 --json bench-saturation.json
	$(PY) -m bench.batching --model-dir $(BUNDLE) --out bench-batching.json --server-cpus 1 --threads 1

proto: install
	$(PY) -m proto.generate

lint: install
	$(VENV)/bin/ruff check .

test: install system-deps lint
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) bundles .pytest_cache .ruff_cache
