"""Typed, nested configuration. YAML recipes load into these dataclasses; CLI
overrides (`rollout.sampling.temperature=0.7`) apply on top. Unknown keys and wrong
types fail before anything heavy loads, naming the file and the dotted key.

- sections.py: the recipe's sections and `Recipe` (every field documented there);
- pipeline.py: the staged pipeline's sections and `PipelineRecipe`;
- load.py: YAML, overrides, validation (`load_recipe`, `ConfigError`);
- reference.py: the recipe reference (docs/guide/recipe-reference.md) from the docstrings.

Plain data: imports nothing of ponder outside this package.
"""

from ponder.config.load import (
    ConfigError,
    apply_overrides,
    check_ranges,
    from_dict,
    load_recipe,
    packaged_recipes,
    resolve_recipe_path,
    save_recipe,
    to_dict,
)
from ponder.config.pipeline import (
    AgentRewardConfig,
    ContinualConfig,
    DataConfig,
    DPOConfig,
    PipelineConfig,
    PipelineRecipe,
    SelectionConfig,
    SFTTrainerConfig,
)
from ponder.config.sections import (
    AlgoConfig,
    ConstrainConfig,
    ContextConfig,
    EnvConfig,
    EvalConfig,
    ImproveConfig,
    JudgeConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    Recipe,
    RewardConfig,
    RolloutConfig,
    RopeScalingConfig,
    SamplingConfig,
    SFTConfig,
    ShapingConfig,
    TrackingConfig,
    TrainConfig,
)

__all__ = [
    "AgentRewardConfig", "AlgoConfig", "apply_overrides", "check_ranges", "ConfigError",
    "ContextConfig", "ContinualConfig", "DataConfig", "DPOConfig", "EnvConfig", "EvalConfig", "from_dict",
    "ImproveConfig", "JudgeConfig", "load_recipe", "LoraConfig", "ModelConfig", "OptimConfig",
    "packaged_recipes", "PipelineConfig", "PipelineRecipe", "Recipe", "resolve_recipe_path",
    "ConstrainConfig", "RewardConfig", "RolloutConfig", "RopeScalingConfig", "SamplingConfig",
    "save_recipe", "SelectionConfig", "SFTConfig", "SFTTrainerConfig", "ShapingConfig",
    "to_dict", "TrackingConfig", "TrainConfig",
]  # fmt: skip
