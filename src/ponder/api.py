"""ponder from Python, for people who would rather not write YAML:

    from ponder.api import load_recipe, train, evaluate, serve

    recipe = load_recipe("recipes/search_qa_grpo.yaml", ["train.steps=4"])  # or None: defaults
    run_dir = train(recipe, "runs/mine")                         # SFT warm-up (if any), then RL
    metrics = evaluate(recipe, model=run_dir).metrics            # held-out tasks
    serve(run_dir, port=8000)                                    # OpenAI-compatible, blocks

Each is the function behind the command of the same name (`ponder train`, `ponder
eval`, `ponder serve`): the same checks, files and errors (a ValueError naming the
problem), without the command line.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ponder.config import Recipe
from ponder.config import load_recipe as _load_recipe


def load_recipe(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """A recipe from a YAML file (or a packaged recipe's name, or None for the defaults),
    with `key=value` overrides applied and every key validated."""
    return _load_recipe(path, list(overrides))


def train(
    recipe: Recipe | str | Path, out: str | Path, overrides: list[str] | tuple[str, ...] = (),
    overwrite: bool = False, resume: bool = False,
) -> Path:  # fmt: skip
    """Train as `ponder train` does: the SFT warm-up when recipe.sft.steps > 0, then RL
    for train.steps, into the run directory `out` (which it returns). resume=True
    continues the run in `out` from its latest checkpoint."""
    from ponder.jobs.train import TrainOptions, run_train

    source = recipe if isinstance(recipe, Recipe) else str(recipe)
    options = TrainOptions(recipe=None if resume else source, resume=str(out) if resume else None, out=str(out),
                           overwrite=overwrite, overrides=list(overrides))  # fmt: skip
    run_train(options)
    return Path(out)


def evaluate(recipe: Recipe | str | Path | None = None, model: str | Path | None = None,
             episodes: int | None = None, samples: int = 1) -> Any:  # fmt: skip
    """Evaluate as `ponder eval` does, on the recipe's held-out tasks: `model` (a run,
    stage or checkpoint directory, an HF model directory, `smollm2-135m`, `tiny`)
    replaces the recipe's. Returns the EvalResult (`.metrics`, `.trajectories`)."""
    from ponder.eval import evaluate as run_evaluation
    from ponder.eval import held_out_recipe

    loaded = recipe if isinstance(recipe, Recipe) else load_recipe(recipe)
    if model is not None:
        loaded = replace(loaded, model=replace(loaded.model, name=str(model)))
    return run_evaluation(held_out_recipe(loaded, episodes, samples))


def serve(model: str | Path = "smollm2-135m", host: str = "127.0.0.1", port: int = 8000, **settings: Any) -> None:
    """Serve `model` over the OpenAI-compatible HTTP API until interrupted, as `ponder
    serve` does; `settings` are ServeConfig's other fields (adapters, api_key, backend…)."""
    from ponder.serve import ServeConfig
    from ponder.serve import serve as run_server

    run_server(ServeConfig(model=str(model), host=host, port=port, **settings))
