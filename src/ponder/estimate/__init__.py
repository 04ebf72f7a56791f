"""`ponder estimate`: a recipe's peak memory and time per stage, predicted before
anything runs, from the model's config and the recipe's numbers.

- formulas.py: parameter counts, bytes (weights, LoRA, AdamW, gradients, KV cache,
  activations) and FLOPs (forward, training, decode), pure functions of numbers;
- devices.py: the device table (published GPU peaks; the CPU from a calibration),
  with the utilisation each pass is assumed to reach;
- recipe.py: a recipe's numbers through the formulas (pure);
- build.py: the device and the model's shape for a recipe (reads configs, not weights);
- report.py: the tables and the JSON; versus.py: predicted against a finished run.

Sits beside eval/: it reads config/ and models/ (configs only), nothing above.
"""

from ponder.estimate.build import build_estimate
from ponder.estimate.recipe import Estimate, Tokens

__all__ = ["Estimate", "Tokens", "build_estimate"]
