"""The needle grid on a GPU: every RoPE method (factor 4; none at 1), lengths 1x, 2x, 4x
the embedded model's trained context, five depths, before and after a STEPS-step LoRA
fine-tune at 2x. The same as `ponder needle --device cuda --dtype bfloat16 --rope R
--factor F --lengths 1x,2x,4x --finetune-steps STEPS --finetune-length 2x`, loading
eval/needle.py by path so that a machine without ponder's evaluation dependencies
(jsonschema, for the tool registry `ponder.eval` imports) can run it.

OUT=DIR [LR=1e-4] python examples/needle/gpu_grid.py STEPS [METHOD ...]   (from the repo root)
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time

sys.path[:0] = ["src"]
from ponder.config import RopeScalingConfig  # noqa: E402
from ponder.models.loading import load_policy  # noqa: E402

spec = importlib.util.spec_from_file_location("needle", "src/ponder/eval/needle.py")
needle = importlib.util.module_from_spec(spec)
sys.modules["needle"] = needle
spec.loader.exec_module(needle)

out, steps, lr = os.environ["OUT"], int(sys.argv[1]), float(os.environ.get("LR", "1e-4"))
for rope in sys.argv[2:] or ["none", "yarn", "linear", "dynamic"]:
    start = time.time()
    scaling = RopeScalingConfig(type=rope, factor=1.0 if rope == "none" else 4.0)
    policy = load_policy("smollm2-135m", "bfloat16", "cuda", scaling)
    result = needle.run_needle(policy, needle.NeedleRun("1x,2x,4x", "0,25,50,75,100", 1, 0, steps, "2x", lr))
    result.pop("policy")
    result["seconds"] = round(time.time() - start, 1)
    with open(f"{out}/{rope}.json", "w") as handle:
        json.dump(result, handle)
    for stage in ("before", "after"):
        grid = {str(k): v for k, v in needle.accuracy_grid(result.get(stage, [])).items()}
        print(rope, stage, json.dumps(grid), result["seconds"], flush=True)
