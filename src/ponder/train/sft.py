"""SFT warm-up on demonstration episodes, with the RL trainer's masks: demonstrations
are replayed through the real environment (scripted backend), so observations are
real retrieved text with loss_mask 0, and the loss covers only the policy's tokens.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from ponder.algos import demonstration_nll
from ponder.config import OptimConfig, Recipe, SFTConfig
from ponder.models import Policy
from ponder.models.cpu_threads import cpu_block
from ponder.models.forward import forward_policy
from ponder.models.memory import release_memory
from ponder.rollout import RolloutEngine, ScriptedBackend
from ponder.train.batch import TokenBatch, collate
from ponder.train.optim import build_optimizer, optimizer_step
from ponder.types import Task, Trajectory

BEHAVIOURS = ("oracle", "always_search", "search_once")


def demonstration_actions(task: Task, behaviour: str) -> list[str]:
    """The assistant actions to imitate for `task`; two deliberately sub-optimal teachers:

    `always_search` searches before answering even when the answer is in the
    prompt (the question itself is the query). `search_once` searches exactly once
    whatever the question: like `always_search` on questions answerable from the
    prompt, and on multi-hop questions it answers with what the first search found
    (the bridge entity) instead of searching again.
    """
    if behaviour not in BEHAVIOURS:
        raise ValueError(f"unknown SFT behaviour '{behaviour}'; valid: {', '.join(BEHAVIOURS)}")
    actions = list(task.oracle_actions)
    searches = sum("<search>" in a for a in actions)
    if behaviour != "oracle" and searches == 0:
        actions.insert(0, f"<think>I will look this up.</think>\n<search>{task.question}</search>")
    if behaviour == "search_once" and searches > 1:
        hop = task.metadata["hops"][0]
        actions = [actions[0], f"<think>The information says {hop['fact']}.</think>\n<answer>{hop['object']}</answer>"]
    return actions


def demonstration_scripts(tasks: list[Task], behaviour: str, oracle_fraction: float, seed: int) -> dict[str, list[str]]:
    """Task id → actions: the oracle's for a seeded `oracle_fraction` of the tasks,
    `behaviour`'s for the rest, so the warm-up policy knows every strategy but not
    when to use which."""
    rng = random.Random(seed)
    return {
        task.id: demonstration_actions(task, "oracle" if rng.random() < oracle_fraction else behaviour)
        for task in tasks
    }


def build_demonstrations(
    tasks: list[Task], behaviour: str, env_factory: Callable[[], Any], policy: Policy, recipe: Recipe,
    oracle_fraction: float = 0.0,
) -> list[Trajectory]:  # fmt: skip
    """Replay each task's demonstration through the environment into Trajectory records:
    the task's reference solution (`oracle_actions`, from its environment's solver),
    or for search-QA one of the sub-optimal teachers of `demonstration_actions`."""
    if behaviour != "oracle" and recipe.env.kind != "search_qa":
        raise ValueError(f"sft.behaviour '{behaviour}' is search-QA's; env.kind '{recipe.env.kind}' takes 'oracle'")
    scripts = demonstration_scripts(tasks, behaviour, oracle_fraction, recipe.train.seed)
    factory = env_factory
    # Demonstrations are replayed whole: the sampling caps bound what the policy may
    # generate, not what it should learn; a cut action would teach a broken protocol.
    sampling = replace(recipe.rollout.sampling, max_new_tokens_per_turn=1 << 16, max_total_tokens=1 << 20)
    rollout = replace(recipe.rollout, group_size=1, batch_size=max(1, len(tasks)), sampling=sampling)
    trajectories, _ = RolloutEngine(ScriptedBackend(policy.tokenizer, scripts), factory, rollout).run(tasks)
    return [t for t in trajectories if _completed(t)]


def _completed(trajectory: Trajectory) -> bool:
    """A demonstration worth imitating: no turn broke the protocol, and the episode
    ended on its own (an answer, or the environment's `done`), not at a cap or an error."""
    ended = trajectory.final_answer is not None or trajectory.stop_reason in ("answer", "done")
    return ended and all(turn.error is None for turn in trajectory.turns)


def sft_train(
    policy: Policy,
    demonstrations: list[Trajectory],
    config: SFTConfig,
    seed: int = 0,
    micro_batch_size: int = 4,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """config.steps AdamW steps of token-mean NLL on the policy tokens; returns per-step metrics."""
    if not demonstrations:
        raise ValueError("no demonstrations to train on (check sft.task_kinds)")
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optim_config = OptimConfig(lr=config.lr, warmup_steps=config.warmup_steps, schedule="constant")
    optimizer, scheduler = build_optimizer(params, optim_config, config.steps)
    order = cycled_order(len(demonstrations), config.steps * config.batch_size, seed)
    history = []
    policy.model.train()
    for step in range(config.steps):
        rows = order[step * config.batch_size : (step + 1) * config.batch_size]
        batch = collate([demonstrations[i] for i in rows], policy.tokenizer.pad_token_id)
        total = imitation_backward(policy, batch, micro_batch_size)
        grad_norm, lr = optimizer_step(params, optimizer, scheduler, 1.0)
        release_memory()  # the step's activations, before the next step allocates its own
        metrics = {"sft/loss": total, "sft/grad_norm": grad_norm, "sft/lr": lr}
        history.append(metrics)
        if on_step is not None:
            on_step(step + 1, metrics)
    policy.model.eval()
    return history


def imitation_backward(policy: Policy, batch: TokenBatch, micro_batch_size: int, scale: float = 1.0) -> float:
    """Accumulate scale × the batch's token-mean NLL on its policy tokens into the
    gradients, in micro-batches (exact: each divides by the whole batch's token count);
    returns the NLL. The SFT step's loss, and the RL update's anchor (algo.sft_coef)."""
    tokens = float(batch.loss_mask.sum())
    total = 0.0
    for start in range(0, len(batch), micro_batch_size):
        part = batch.select(list(range(start, min(start + micro_batch_size, len(batch))))).to(policy.device)
        with cpu_block():  # fewer while other processes hold the cores
            logprobs, _, _ = forward_policy(policy.model, part.input_ids, part.attention_mask, loss_mask=part.loss_mask)
            nll = demonstration_nll(logprobs, part.loss_mask, tokens)
            (scale * nll).backward()
        total += float(nll.detach())
    return total


def cycled_order(n: int, length: int, seed: int) -> list[int]:
    """`length` indices into n items: seeded shuffles of range(n), one after another."""
    rng = random.Random(seed)
    order: list[int] = []
    while len(order) < length:
        epoch = list(range(n))
        rng.shuffle(epoch)
        order += epoch
    return order[:length]


def train_and_save(
    policy: Policy, demonstrations: list[Trajectory], config: SFTConfig, seed: int, micro_batch_size: int,
    log_dir: Path, on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:  # fmt: skip
    """sft_train, its metrics logged in log_dir, the trained weights saved there."""
    from ponder.models.adapters import save_trained
    from ponder.runlog.metrics_log import MetricsLog

    with MetricsLog(log_dir, tensorboard=False) as log:

        def logged(step: int, metrics: dict[str, float]) -> None:
            log.log(step, metrics)
            if on_step is not None:
                on_step(step, metrics)

        history = sft_train(policy, demonstrations, config, seed, micro_batch_size, logged)
    save_trained(policy, log_dir)
    return history
