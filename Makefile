# Short commands for the whole pipeline. `make run` serves the bundled model; `make test` runs the suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# CORPUS_LANG picks the target language (model/languages.py); not LANG, which is the shell's locale.
# Every path below follows it: CORPUS_LANG=fr is models/en-fr-small, runs/data-fr, runs/en-fr-small.
CORPUS_LANG ?= es
MODEL ?= models/en-$(CORPUS_LANG)-small
BUNDLE ?= bundles/$(notdir $(MODEL))
DATA ?= $(if $(filter es,$(CORPUS_LANG)),data,runs/data-$(CORPUS_LANG))
RUN ?= runs/$(notdir $(MODEL))
# The tokenizer `make train` trains with: the shipped one unless told (see `make tokenizer`).
TOKENIZER ?= $(MODEL)/tokenizer.model

.PHONY: help install system-deps run serve bundle bundles corpus data-check tokenizer train release average keep-terms memory dictionary-terms calibrate-int8 lexicon tune-decoding evaluate model-card model model-from-gpu grow finish-model bench bench-batching gpu-check gpu-pack proto lint test weblate stack-test fuzz soak mutation clean

# Every target, one line each (tests/test_cli.py checks that none is missing).
help:
	@echo "Serve and use:"
	@echo "  make run             serve the shipped models (English->Spanish first): gRPC :50051, HTTP + web page :5000, metrics :8000"
	@echo "                       (installs .venv and exports $(BUNDLE)/ on first use); make serve is the same"
	@echo "  make bundle          export $(MODEL) to the ONNX bundle $(BUNDLE)/ (only when the model changed)"
	@echo "  make bundles         export every model of models/ to its bundle in bundles/ (make run does)"
	@echo "  make install         create .venv/ with the package and its train + dev extras (pyproject.toml)"
	@echo "  make system-deps     apt-get install prometheus, apertium, nginx, docker-compose, gettext, chromium, hunspell-es/-fr/-de/-it/-pt-br, nodejs, npm (tests; root)"
	@echo "Develop:"
	@echo "  make test            lint + the whole test suite"
	@echo "  make weblate         Weblate in .venv-weblate/ for tests/test_weblate.py (its own env; ~3 min cold)"
	@echo "  make stack-test      build the images, run the compose stack (podman or Docker) and check it end to end"
	@echo "  make fuzz            10,000 fuzzed gRPC and 10,000 HTTP requests against the shipped model (FUZZ_EXAMPLES=N)"
	@echo "  make soak            30 min at half the measured saturation: errors, latency, RSS (SOAK_MINUTES=5)"
	@echo "  make mutation        mutation testing (mutmut) of server/ with its fast tests; hours: MUTATE='server.service*' or MUTATION_SAMPLE=450"
	@echo "  make lint            ruff check ."
	@echo "  make proto           regenerate proto/gen/ from proto/translator/v1/translator.proto"
	@echo "  make clean           DELETE .venv/ and bundles/ (the next make run reinstalls and re-exports) and caches"
	@echo "Model pipeline (all but corpus need $(DATA)/ from make corpus; data-check says so):"
	@echo "  make corpus          build the EN-ES corpus from Debian packages into $(DATA)/ (~1.5 min cached, ~2 cold)"
	@echo "                       (CORPUS_LANG=fr|de|it|pt_BR DATA=runs/data-fr: English to another language)"
	@echo "                       (EXTRA_CATALOGS=1 DATA=runs/data-es-extra: + catalogs of unranked packages, train only)"
	@echo "                       (EXTRA_DOCS=1 DATA=runs/data-es-docs: + Debian's translated documentation, train only)"
	@echo "  make data-check      exit 2, naming the command to run, when $(DATA)/ has no corpus"
	@echo "  make tokenizer       train a SentencePiece model into runs/tokenizer/ (the shipped one stays)"
	@echo "  make train           train the small model into $(RUN)/ (TRAIN_ARGS=--resume continues)"
	@echo "  make average         mean of the run's last validation snapshots, scored, into $(RUN)/averaged"
	@echo "  make release         copy the run's best weights (or RELEASE=dir) and their tokenizer into $(MODEL)/"
	@echo "  make keep-terms      learn the do-not-translate list and source words into $(MODEL)/ (~20 s)"
	@echo "  make memory          the translation memory (Debian's agreed translations) into $(MODEL)/ (~10 s)"
	@echo "  make dictionary-terms the dictionary entries the catalogs seldom hold into $(MODEL)/ (~5 s)"
	@echo "  make calibrate-int8  the int8 variant's activation ranges, measured on valid, into $(MODEL)/ (seconds)"
	@echo "  make lexicon         the word list of the lexical guard (hunspell expanded) of CORPUS_LANG into $(MODEL)/ (~1 min)"
	@echo "  make tune-decoding   choose the decoding defaults of $(MODEL) on the valid split (its decoding.json)"
	@echo "  make evaluate        score $(MODEL) on the test split against Apertium into runs/eval.json"
	@echo "  make model-card      evaluate $(MODEL) (test, UI strings, fp32/int8) and write its MODEL_CARD.md"
	@echo "  make model           the whole recipe, corpus to carded model in $(MODEL)/ (CORPUS_LANG=fr; ~8 h on 2 cores)"
	@echo "  make model-from-gpu  GPU_OUT=<device run folder>: restore, and ship it as make model does if it beats $(MODEL)"
	@echo "  make grow            grow $(MODEL) to a 6+2 model in rounds (GROW_ROUNDS=8000,8000,4000), ship it if it beats it (~7 h)"
	@echo "  make finish-model    RELEASE=<dir>: release it into $(MODEL)/ with lexicon, keep-terms, memory, tuning and card"
	@echo "Benchmarks:"
	@echo "  make bench           engine vs PyTorch vs CTranslate2 speed into bench.json"
	@echo "  make bench-batching  batching modes (off / request / in-flight) through gRPC, with a plot (~45 min)"
	@echo "GPU (docs/gpu.md):"
	@echo "  make gpu-check       the GPU serving check in its CPU mode into runs/gpu-check-cpu.json (~30 s)"
	@echo "                       (on a GPU machine: bash bench/gpu_run.sh check)"
	@echo "  make gpu-pack        what a GPU session carries: runs/pack-$(CORPUS_LANG).tar (training pack of $(DATA)/),"
	@echo "                       .whl/site-cp312.tar.xz (packages the GPU image lacks) and .ort/part-N"
	@echo "                       (onnxruntime-gpu, Hopper kernels only, in parts); ~5 min"

# The targets that read the corpus depend on this first: without $(DATA)/manifest.json (written last by
# `make corpus`) make stops with one line naming the command to run (also under make -n).
data-check:
	$(if $(wildcard $(DATA)/manifest.json),,$(error $(DATA)/ is $(if $(wildcard $(DATA)/.),incomplete (no manifest.json),missing): run `make corpus$(if $(filter-out data,$(DATA)), DATA=$(DATA))` first (about 1 minute)))

# The virtual environment is rebuilt when the dependency list changes. torch is pinned in
# pyproject.toml (the CPU wheel); Debian's python3 needs python3-venv for `-m venv`.
$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { apt-get update -qq && apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[train,dev]"
	@touch $@

install: $(VENV)/.installed

# Weblate for tests/test_weblate.py, in an environment of its own: the `weblate` extra of pyproject.toml,
# whose pins are older than .venv's. Measured 161 s cold on the 2-core build machine (busy), mostly the C
# builds of borgbackup, pycairo, PyGObject and tesserocr, whose headers make system-deps installs.
WEBLATE_VENV := .venv-weblate
$(WEBLATE_VENV)/.installed: pyproject.toml | install system-deps
	$(PYTHON) -m venv $(WEBLATE_VENV)
	$(WEBLATE_VENV)/bin/python -m pip install -q --upgrade pip
	$(WEBLATE_VENV)/bin/python -m pip install -q $$($(PY) -c 'import tomllib; \
	  print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["weblate"]))')
	@touch $@

weblate: $(WEBLATE_VENV)/.installed

# Debian tools the tests drive for real: promtool/prometheus (metrics, rules, dashboard queries),
# apertium (baseline), nginx (gRPC load balancing), docker-compose (compose files, validated without
# an engine).
# The -dev packages, gcc and pkg-config build Weblate's C dependencies (make weblate); Weblate's font
# checks import PangoCairo through GObject introspection (gir1.2-pango-1.0). nodejs and npm
# only where there is no npm yet: Debian's npm conflicts with a NodeSource nodejs (which has its own).
system-deps:
	@command -v promtool >/dev/null && command -v apertium >/dev/null && command -v nginx >/dev/null \
	  && [ -e /usr/share/hunspell/es_ES.dic ] && [ -e /usr/share/hunspell/fr.dic ] && [ -e /usr/share/hunspell/de_DE.dic ] \
	  && [ -e /usr/share/hunspell/it_IT.dic ] && [ -e /usr/share/hunspell/pt_BR.dic ] && command -v lt-print >/dev/null \
	  && command -v docker-compose >/dev/null && command -v msgfmt >/dev/null \
	  && command -v chromium >/dev/null && command -v chromedriver >/dev/null \
	  && command -v node >/dev/null && command -v npm >/dev/null \
	  && pkg-config --exists liblz4 libzstd libxxhash cairo gobject-introspection-1.0 tesseract lept \
	  && [ -e /usr/include/sys/acl.h ] && command -v gcc >/dev/null \
	  && ls /usr/lib/*/girepository-1.0/PangoCairo-1.0.typelib >/dev/null \
	  && $(PYTHON) -c 'import os, sysconfig as s; assert os.path.exists(s.get_paths()["include"] + "/Python.h")' \
	  2>/dev/null || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    prometheus apertium apertium-eng-spa nginx docker-compose gettext chromium chromium-driver hunspell-es lttoolbox-dev \
	    hunspell-fr-classical hunspell-de-de hunspell-it hunspell-pt-br \
	    $$(command -v npm >/dev/null || echo nodejs npm) \
	    pkg-config gcc python3-dev liblz4-dev libzstd-dev libxxhash-dev libacl1-dev libcairo2-dev \
	    libgirepository1.0-dev gir1.2-pango-1.0 libtesseract-dev libleptonica-dev >/dev/null; }

$(BUNDLE)/manifest.json: $(MODEL)/model.safetensors $(MODEL)/config.json $(MODEL)/tokenizer.model $(wildcard $(MODEL)/decoding.json $(MODEL)/keep_terms.txt $(MODEL)/source_words.txt $(MODEL)/memory.jsonl.gz $(MODEL)/lexicon.txt.gz $(MODEL)/dictionary_terms.tsv $(MODEL)/int8_ranges.json) | install
	$(PY) -m export --checkpoint $(MODEL) --out $(BUNDLE)

bundle: $(BUNDLE)/manifest.json

# Every model shipped in models/, each to its bundle: what `make run` serves (server/store.py).
SHIPPED_MODELS := $(patsubst models/%/model.safetensors,%,$(wildcard models/*/model.safetensors))
bundles: install
	@for m in $(SHIPPED_MODELS); do $(MAKE) --no-print-directory bundle MODEL=models/$$m BUNDLE=bundles/$$m || exit 1; done

# TRANSLATOR_MODEL_DIR, TRANSLATOR_HOST, TRANSLATOR_PORT, TRANSLATOR_METRICS_PORT (and the other
# TRANSLATOR_* variables) are read by the server itself; `make run` turns the HTTP API and web page on
# at :5000 unless TRANSLATOR_HTTP_PORT says otherwise (0 = off). The server serves bundles only and never
# exports (server/store.py), so without TRANSLATOR_MODEL_DIR the bundle is (re-)exported here first.
run serve: install
	@if [ -z "$$TRANSLATOR_MODEL_DIR$$TRANSLATOR_MODELS" ]; then $(MAKE) --no-print-directory bundles; fi
	TRANSLATOR_HTTP_PORT=$${TRANSLATOR_HTTP_PORT:-5000} $(PY) -m server

# lt-print (Debian's lttoolbox-dev) reads Apertium's compiled bilingual dictionary, one of the sources.
# EXTRA_CATALOGS=1 (opt-in, off by default: the shipped cards were computed without it) adds the catalogs
# of Debian packages outside the ranked list to train only (model/extra_catalogs.py); give it its own DATA.
# EXTRA_DOCS=1 (opt-in too) adds Debian's translated documentation, train only (model/extra_docs.py).
# EXTRA_QT=1 (opt-in too) adds the Qt catalogs (.qm) of packages outside the ranked list (model/extra_qt.py).
corpus: install
	@command -v lt-print >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends lttoolbox-dev >/dev/null; }
	$(PY) -m model.corpus --lang $(CORPUS_LANG) --out $(DATA)$(if $(EXTRA_CATALOGS), --extra-catalogs)$(if $(EXTRA_DOCS), --extra-docs)$(if $(EXTRA_QT), --extra-qt)

# A new tokenizer goes to runs/tokenizer/, never over $(MODEL)/tokenizer.model: the shipped weights only
# work with the tokenizer they were trained with. To adopt a new one, train on it and release both:
#   make train TOKENIZER=runs/tokenizer/tokenizer.model && make release
tokenizer: data-check install
	$(PY) -m model.tokenizer --data $(DATA) --out runs/tokenizer
	@echo "runs/tokenizer/tokenizer.model is not in use: make train TOKENIZER=runs/tokenizer/tokenizer.model, then make release"

# Trains into $(RUN) (last.pt every 100 steps and on Ctrl-C / SIGTERM; the best weights so far
# in $(RUN)/release). TRAIN_ARGS=--resume continues exactly where it stopped;
# TRAIN_ARGS="--init-from $(MODEL)" continues from the shipped model (how it was trained, see its card).
TRAIN_SETTINGS = --config small --lr 1.5e-3 --warmup 1000 --max-tokens 3000 --valid-bleu-sentences 400 --threads 2 \
  --keep-snapshots 8
train: data-check install
	$(PY) -m model.train --data $(DATA) --tokenizer $(TOKENIZER) --run-dir $(RUN) \
	  --release-dir $(RUN)/release $(TRAIN_SETTINGS) --valid-every 250 $(TRAIN_ARGS)

# Promote the run's best weights, with the tokenizer they were trained with, to the shipped model
# directory (then: make tune-decoding model-card). RELEASE=$(RUN)/averaged ships an average.
RELEASE ?= $(RUN)/release
release:
	cp $(RELEASE)/model.safetensors $(RELEASE)/config.json $(RELEASE)/training.json $(RELEASE)/tokenizer.model $(MODEL)/

# The mean of the run's last AVERAGE_LAST validation snapshots (TRAIN_ARGS=--keep-snapshots N), scored
# like a validation next to each snapshot, into $(RUN)/averaged (see model/average.py).
AVERAGE_LAST ?= 4
average: data-check install
	$(PY) -m model.average --run-dir $(RUN) --last $(AVERAGE_LAST) --tokenizer $(TOKENIZER) \
	  --data $(DATA) --threads 2 --out $(RUN)/averaged

# Terms the human translations copy unchanged (program and product names): the text layer keeps them.
# With the language's lexicon in $(MODEL) (make lexicon), the language's own lowercase words are not kept.
keep-terms: data-check install
	$(PY) -m model.keep_terms --data $(DATA) --out $(MODEL)/keep_terms.txt \
	  $(if $(wildcard $(MODEL)/lexicon.txt.gz),--lexicon $(MODEL)/lexicon.txt.gz)

# The translation memory: each training source with the translation Debian's packages agree on.
memory: data-check install
	$(PY) -m model.memory --data $(DATA) --out $(MODEL)/memory.jsonl.gz

# The text layer's dictionary terms: entries of the bilingual dictionaries that the catalogs seldom hold and
# that translate one way (model/dictionary_terms.py; words of the translations checked with the lexicon).
dictionary-terms: data-check install
	$(PY) -m model.dictionary_terms --data $(DATA) --out $(MODEL)/dictionary_terms.tsv \
	  $(if $(wildcard $(MODEL)/lexicon.txt.gz),--lexicon $(MODEL)/lexicon.txt.gz)

# The int8 variant's activation scales: each linear layer's input range per channel on valid pairs
# (export/calibrate.py); the export reads them (export/int8.py), else it scales rows at run time.
calibrate-int8: data-check install
	$(PY) -m export.calibrate --checkpoint $(MODEL) --data $(DATA)

# The lexical guard's word list: every form of the language's Debian hunspell dictionary (model/languages.py
# names it; make system-deps installs them).
lexicon: install
	$(PY) -m model.lexicon --lang $(CORPUS_LANG) --out $(MODEL)/lexicon.txt.gz

# Decoding defaults, chosen on the valid split through the engine, written to $(MODEL)/decoding.json.
tune-decoding: data-check install bundle
	$(PY) -m bench.tune_decoding --model $(MODEL) --data $(DATA) --bundle $(BUNDLE) --text-layer
	$(MAKE) --no-print-directory bundle

# One recipe, from the corpus to the released, tuned, carded model of a language (make model
# CORPUS_LANG=fr). Each stage is skipped when its output exists, and training resumes where it stopped,
# so the recipe can be run again after an interruption. Training: MODEL_STEPS - MODEL_COOLDOWN steps at
# the schedule's rate, then a linear cooldown to 0 over MODEL_COOLDOWN steps; the release is the run's
# best step or the mean of the last AVERAGE_LAST validation snapshots, whichever scores higher on valid
# (model/pick.py). A new tokenizer is trained for the run into $(RUN)/tokenizer/.
# The times in the README are this machine's (2 cores); docs/gpu.md trains on a GPU instead.
MODEL_STEPS ?= 26000
MODEL_COOLDOWN ?= 3000
MODEL_VALID_EVERY ?= 500
RUN_TOKENIZER = $(RUN)/tokenizer/tokenizer.model
model: install
	@test -f $(DATA)/manifest.json || $(MAKE) --no-print-directory corpus
	@test -f $(RUN_TOKENIZER) || $(PY) -m model.tokenizer --data $(DATA) --out $(RUN)/tokenizer
	$(PY) -m model.train --data $(DATA) --tokenizer $(RUN_TOKENIZER) --run-dir $(RUN) \
	  --release-dir $(RUN)/release $(TRAIN_SETTINGS) --valid-every $(MODEL_VALID_EVERY) \
	  $(if $(wildcard $(RUN)/last.pt),--resume) --max-steps $$(( $(MODEL_STEPS) - $(MODEL_COOLDOWN) ))
	$(PY) -m model.train --data $(DATA) --tokenizer $(RUN_TOKENIZER) --run-dir $(RUN) \
	  --release-dir $(RUN)/release $(TRAIN_SETTINGS) --valid-every $(MODEL_VALID_EVERY) \
	  --resume --cooldown $(MODEL_COOLDOWN) --max-steps $(MODEL_STEPS)
	$(MAKE) --no-print-directory average TOKENIZER=$(RUN_TOKENIZER)
	choice=$$($(PY) -m model.pick $(RUN)/release $(RUN)/averaged) && \
	  $(MAKE) --no-print-directory finish-model RELEASE=$$choice

# The same recipe's end for a model trained on a lent GPU (docs/gpu.md: make gpu-pack, then
# bench/gpu_run.sh train on the device): GPU_OUT is the run's folder as the device gave it back. It is
# restored into $(RUN)/gpu and ships only when it beats $(MODEL) on valid (model/pick.py), as a release must.
model-from-gpu: data-check install
	@test -n "$(GPU_OUT)" || { echo "GPU_OUT=<the run's folder from the device> is required"; exit 2; }
	$(PY) -m model.gpu_train --restore $(GPU_OUT) --to $(RUN)/gpu
	@choice=$(RUN)/gpu; [ ! -f $(MODEL)/training.json ] || choice=$$($(PY) -m model.pick $(MODEL) $(RUN)/gpu) || exit 1; \
	if [ "$$choice" = "$(RUN)/gpu" ]; then $(MAKE) --no-print-directory finish-model RELEASE=$(RUN)/gpu; \
	else echo "$(RUN)/gpu does not beat $(MODEL) on valid: not released"; fi

# Grow the shipped model to other layer counts in rounds (model/grow.py), each cooling down to 0 from
# the mean of the last: the recipe of the Spanish 6+2 release (from the 3+3, GROW_ROUNDS=8000,8000,4000,
# DATA=runs/data-es-extra; about 7 h on 2 cores with bf16, which --bf16-native uses where the CPU
# computes it natively). It ships only when it beats $(MODEL) on valid
# (model/pick.py), through finish-model as make model does.
GROW_ROUNDS ?= 8000,8000,4000
GROW_ENCODER_LAYERS ?= 6
GROW_DECODER_LAYERS ?= 2
GROW_TRAIN_ARGS ?= --bf16-native
grow: data-check install
	$(PY) -m model.grow --from $(MODEL) --data $(DATA) --run-dir $(RUN)-grow \
	  --encoder-layers $(GROW_ENCODER_LAYERS) --decoder-layers $(GROW_DECODER_LAYERS) --rounds $(GROW_ROUNDS) \
	  --against $(MODEL) --choice $(RUN)-grow/choice \
	  -- $(TRAIN_SETTINGS) --valid-every $(MODEL_VALID_EVERY) $(GROW_TRAIN_ARGS)
	@choice=$$(cat $(RUN)-grow/choice 2>/dev/null); \
	if [ -n "$$choice" ]; then $(MAKE) --no-print-directory finish-model RELEASE=$$choice; \
	else echo "$(RUN)-grow: nothing beats $(MODEL) on valid: not released"; fi

# A release made a shipped model: its weights and tokenizer, lexicon (where Debian has a hunspell
# dictionary), do-not-translate terms, translation memory, decoding defaults and model card.
finish-model: data-check install
	@mkdir -p $(MODEL)
	@if $(PY) -c 'import sys; from model.languages import language; sys.exit(not language("$(CORPUS_LANG)").hunspell)'; \
	then $(MAKE) --no-print-directory lexicon; \
	else echo "no hunspell dictionary for $(CORPUS_LANG) in model/languages.py: the lexical guard stays off"; fi
	$(MAKE) --no-print-directory release keep-terms memory calibrate-int8 RELEASE=$(RELEASE)
	@if $(PY) -c 'import sys; from model.languages import language; sys.exit(not language("$(CORPUS_LANG)").dictionary_terms)'; \
	then $(MAKE) --no-print-directory dictionary-terms; \
	else echo "$(CORPUS_LANG) ships no dictionary terms (model/languages.py: its valid split does not gain)"; fi
	$(MAKE) --no-print-directory tune-decoding model-card

# The report goes to runs/eval.json (the model card's own reports, in $(MODEL)/, are make model-card's).
evaluate: data-check install system-deps
	@mkdir -p runs
	$(PY) -m bench.evaluate --model $(MODEL) --data $(DATA) --split test --n 1000 --beam 4 --apertium \
	  --json runs/eval.json

# Every number of the model card in one command: test split (all / novel / by package), the common UI
# strings, repeated words, placeholders, side by side with Apertium; fp32 and int8 engine; data counts
# and the training curve.
model-card: data-check install system-deps bundle
	$(PY) -m bench.model_card --model $(MODEL) --data $(DATA) --bundle $(BUNDLE)

bench: install bundle
	$(PY) -m bench.engine_speed --model $(MODEL) --bundle $(BUNDLE) --json bench.json

# Servers on CPU 1 (1 ONNX Runtime thread each, one busy at a time), load generator on the others.
bench-batching: install bundle
	$(PY) -m bench.step_cost --bundle $(BUNDLE) --threads 1 --json bench-step-cost.json
	$(PY) -m bench.saturation --bundle $(BUNDLE) --threads 1 --json bench-saturation.json
	$(PY) -m bench.batching --model-dir $(BUNDLE) --out bench-batching.json --server-cpus 1 --threads 1

# The GPU serving check (bench/gpu_check.py) on the CPU provider with tiny counts; on a CUDA machine the
# device tool runs `bash bench/gpu_run.sh check` (docs/gpu.md).
gpu-check: install bundle
	@mkdir -p runs
	$(PY) -m bench.gpu_check --cpu-only --bundle $(BUNDLE) --json runs/gpu-check-cpu.json

# Everything a GPU session carries (docs/gpu.md): the training pack of $(DATA)/ with $(TOKENIZER), the
# Python packages the GPU image lacks, for CPython 3.12, and onnxruntime-gpu in parts.
gpu-pack: data-check install
	$(PY) -m model.pack --data $(DATA) --tokenizer $(TOKENIZER) --out runs/pack-$(CORPUS_LANG).tar
	PYTHON=$(PY) bash bench/gpu_run.sh wheels
	$(PY) -m bench.ort_gpu_pack --out .ort

proto: install
	$(PY) -m proto.generate

lint: install
	$(VENV)/bin/ruff check .

test: install system-deps lint weblate
	$(PY) -m pytest -q

# The compose stack for real (deploy/stack_test.py): images, health, translations through the published
# ports, Prometheus scraping every container, calls through nginx, drain on SIGTERM, a clean down.
# Without Docker it installs podman & co (apt, root) and podman-compose (.venv) first.
stack-test: install
	bash deploy/stack.sh deps
	$(PY) -m deploy.stack_test

# The request-path fuzzer of the test suite, long, on gRPC and on the HTTP API: never INTERNAL/UNKNOWN
# nor a 500, no traceback logged, a well-formed client unaffected, descriptors and RSS back.
FUZZ_EXAMPLES ?= 10000
fuzz: install bundle
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -p no:cacheprovider tests/test_fuzz.py

# A real server at half its measured saturation: errors, p50/p95 first vs last minute, RSS trend.
SOAK_MINUTES ?= 30
soak: install bundle
	$(PY) -m bench.soak --minutes $(SOAK_MINUTES) --bundle $(BUNDLE) --json runs/soak.json

# Mutation testing of server/ (settings: setup.cfg [mutmut]) in a scratch copy of the tree, so its
# mutants/ never lands in the checkout. Hours for all of server/ on 2 cores: MUTATE takes mutant name
# globs, e.g. MUTATE='server.service* server.app*', and MUTATION_SAMPLE=N runs a random sample of N
# mutants, stratified by file (each file its share), drawn with MUTATION_SEED: the same tree and seed
# give the same mutants (tests/mutation.py). Prints killed / tried per file with a 95% confidence
# interval and the mutants not killed (`cd $(MUTATION_DIR) && mutmut show NAME` shows one);
# docs/mutation.md keeps the scores and the reasons.
MUTATION_DIR ?= /tmp/translator-mutation
MUTATE ?=
MUTATION_SAMPLE ?= 0
MUTATION_SEED ?= 22
# Parallel mutants: the serving tests mostly wait on sockets and sleeps.
MUTATION_JOBS ?= 4
mutation: install bundle
	rm -rf $(MUTATION_DIR) && mkdir -p $(MUTATION_DIR)/mutants/models/en-es-small $(MUTATION_DIR)/mutants/bundles
	git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C $(MUTATION_DIR)
	cp $(MODEL)/tokenizer.model $(MUTATION_DIR)/mutants/models/en-es-small/
	cp -r $(BUNDLE) $(MUTATION_DIR)/mutants/bundles/
	cd $(MUTATION_DIR) && $(abspath $(PY)) -m tests.mutation sample --size $(MUTATION_SAMPLE) \
		--seed $(MUTATION_SEED) $(foreach m,$(MUTATE),'$(m)') > sample.txt
	cd $(MUTATION_DIR) && TRANSLATOR_TEST_CACHE=$(MUTATION_DIR)/test-cache $(abspath $(VENV))/bin/mutmut run \
		--max-children $(MUTATION_JOBS) $$(cat sample.txt)
	cd $(MUTATION_DIR) && $(abspath $(PY)) -m tests.mutation score sample.txt --survivors

# Deletes the virtual environment and every exported bundle (not data/, runs/ or models/).
clean:
	rm -rf $(VENV) $(WEBLATE_VENV) bundles .pytest_cache .ruff_cache
