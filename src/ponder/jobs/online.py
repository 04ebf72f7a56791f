"""`ponder gateway`: the online mode of the training gateway. Outside drivers (another
process, another language) open sessions with the admin key, run their agent against
each session's OpenAI base_url, post its reward and end it; the trainer takes the next
train.tasks_per_step x rollout.group_size ended sessions each step (sessions sharing a
task_id form a GRPO group) and updates the policy, whose next calls are served with the
new weights. `ponder serve --model OUT` serves the result."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ponder.config import Recipe
from ponder.jobs.parts import rl_trainer

ADMIN_KEY_ENV = "PONDER_GATEWAY_KEY"


def run_online(recipe: Recipe, out: str | Path, admin_key: str, host: str = "127.0.0.1", port: int = 8100,
               say: Callable[[str], None] = print) -> Path:  # fmt: skip
    """Serve sessions on host:port and train on them until train.steps (see module doc)."""
    from ponder.serve.gateway import OnlineRollouts

    if recipe.train.async_rollouts or recipe.train.eval_every:
        raise ValueError("ponder gateway trains on sessions as drivers end them: set train.async_rollouts=false "
                         "and train.eval_every=0 (evaluate afterwards with ponder eval)")  # fmt: skip
    trainer = rl_trainer(recipe, out)
    need = recipe.train.tasks_per_step * recipe.rollout.group_size
    rollouts = OnlineRollouts(trainer.backend, recipe.rollout.sampling, need, host, port, admin_key)
    trainer.use_rollouts(rollouts)
    say(f"ponder gateway: open sessions at {rollouts.server.url}/v1/sessions (admin key: ${ADMIN_KEY_ENV}); "
        f"each of {recipe.train.steps} steps trains on {need} ended sessions; weights in {out}")
    return trainer.train()
