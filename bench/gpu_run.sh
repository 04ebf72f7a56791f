#!/usr/bin/env bash
# The GPU rows of docs/results/benchmarks.md ("On a GPU"), in one device call (under 10 min):
#   bash bench/gpu_run.sh OUT_DIR
# Needs a CUDA machine with torch, transformers, peft, accelerate (the device image),
# and in .whl/ (installed into /tmp/site) the wheels the image lacks, for Python 3.12:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl \
#     trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 jsonschema referencing \
#     rpds-py jsonschema-specifications bm25s==0.3.16 orjson
set -u
OUT=${1:?OUT_DIR}
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD/src:$PWD
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"
python3 -m bench.gpu_model --shape qwen2.5-1.5b --out /tmp/q15 --device cuda || exit 1
timeout ${DECODE_S:-220} python3 -m bench.gpu_decode --model /tmp/q15 --batches 1 16 256 \
    --decoders transformers auto compiled --out "$OUT/gpu_decode.json" 2>&1 | grep -v "^USDT\|Warning\|warn("
timeout ${GRPO_S:-170} python3 bench/grpo_vs_trl.py --workload single --model /tmp/q15 --device cuda \
    --dtype bfloat16 --gate-model tiny --threads 8 --prompts-per-step 4 --group-size 8 --max-new-tokens 256 \
    --steps 5 --warmup 1 --micro-batch 8 --decoder ${GRPO_DECODER:-compiled} --out "$OUT/grpo_vs_trl.json" 2>&1 \
    | grep -v "^USDT" | tail -40
# model.activation_offload: one pass of 32 (the 64 GB peak of "On a GPU" (b)) with and without it
for offload in "" --activation-offload; do
  timeout ${OFFLOAD_S:-100} python3 bench/grpo_vs_trl.py --workload single --model /tmp/q15 --device cuda \
      --dtype bfloat16 --gate-model tiny --threads 8 --prompts-per-step 4 --group-size 8 --max-new-tokens 256 \
      --steps 2 --warmup 1 --micro-batch 0 $offload --out "$OUT/grpo_onepass${offload:+_offload}.json" 2>&1 \
      | grep -i "peak\|update\|step (s)" | tail -6
done
