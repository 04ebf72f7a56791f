"""SFT: one loop, one masked NLL, fed by either source.

- Demonstrations: episodes replayed through the real environment (scripted backend),
  so observations are real retrieved text with loss_mask 0 and the loss covers only
  the policy's tokens (the SFT warm-up, `sft_train`; the RL update's anchor, algo.sft_coef).
- Conversations: tokenised chats (ponder.data.format), loss on the assistant tokens
  (the pipeline's SFT stage, task sequences, continual learning), with task-type
  weighted sampling, packing, eval loss, checkpoint/resume, rehearsal and EWC.

Both become Trajectory rows collated to a TokenBatch; `masked_nll_pass` accumulates the
token-mean NLL (ponder.algos.demonstration_nll) over micro-batches, exact over the batch.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Union

import torch

from ponder.algos import demonstration_nll
from ponder.config import OptimConfig, Recipe, SFTConfig, SFTTrainerConfig
from ponder.data.format import TokenizedExample, pack
from ponder.models import Policy
from ponder.models.cpu_threads import cpu_block
from ponder.models.forward import forward_policy
from ponder.models.memory import release_memory
from ponder.rollout import ScriptedBackend, build_engine
from ponder.runlog.metrics_log import MetricsLog
from ponder.train.batch import TokenBatch, collate
from ponder.train.checkpoint import Resumable, rng_state, set_rng_state
from ponder.train.continual import EWCState, ReservoirBuffer, StepHook, replay_count
from ponder.train.optim import build_optimizer, optimizer_step
from ponder.train.sampler import ExampleSampler
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
    rollout = replace(recipe.rollout.uncapped(), group_size=1, batch_size=max(1, len(tasks)))
    trajectories, _ = build_engine(ScriptedBackend(policy.tokenizer, scripts), factory, rollout).run(tasks)
    return [t for t in trajectories if _completed(t)]


def _completed(trajectory: Trajectory) -> bool:
    """A demonstration worth imitating: no turn broke the protocol, and the episode
    ended on its own (an answer, or the environment's `done`), not at a cap or an error."""
    ended = trajectory.final_answer is not None or trajectory.stop_reason in ("answer", "done")
    return ended and all(turn.error is None for turn in trajectory.turns)


# What SFT trains on: a replayed demonstration, or a tokenised conversation.
Row = Union[Trajectory, TokenizedExample]


def sft_batch(rows: list[Row], pad_id: int) -> TokenBatch:
    """Rows collated for the NLL; a conversation as a Trajectory whose first token is
    the prompt (TokenizedExample.to_trajectory), so both align the same way."""
    trajectories = [row if isinstance(row, Trajectory) else row.to_trajectory() for row in rows]
    return collate(trajectories, pad_id)


def masked_nll_pass(
    policy: Any, batch: TokenBatch, micro_batch_size: int, scale: float = 1.0, backward: bool = True
) -> float:
    """The batch's token-mean NLL on its loss-mask tokens, in micro-batches (exact: each
    divides by the whole batch's token count); with `backward`, scale × it is
    accumulated into the gradients, else it is only measured (no graph). Returns the
    NLL. The SFT step's loss, its eval loss, and the RL update's anchor (algo.sft_coef)."""
    tokens = float(batch.loss_mask.sum())
    total = 0.0
    for start in range(0, len(batch), micro_batch_size):
        part = batch.select(list(range(start, min(start + micro_batch_size, len(batch))))).to(policy.device)
        with torch.set_grad_enabled(backward), cpu_block():  # fewer threads while others hold the cores
            logprobs, _, _ = forward_policy(policy.model, part.input_ids, part.attention_mask, loss_mask=part.loss_mask)
            nll = demonstration_nll(logprobs, part.loss_mask, tokens)
            if backward:
                (scale * nll).backward()
        total += float(nll.detach())
    return total


@dataclass
class SFTInputs:
    """What one SFT run trains on.

    train / eval: demonstrations or tokenised examples (rows). task_weights: task
    type -> sampling weight (a conversation's task_type; a demonstration's is `general`).
    replay: rehearsal buffer whose items are mixed into each batch (replay_ratio).
    ewc: EWC state of earlier tasks (penalty added to every step's loss).
    continual: a continual-learning method's step hook (train/continual.py: SI, MAS,
        A-GEM, DER++ …), called after the NLL backward and after the optimizer step.
    pack_tokens: row length when cfg.packing is on (tokenised examples only).
    """

    train: list[Row]
    eval: list[Row] = field(default_factory=list)
    task_weights: dict[str, float] = field(default_factory=dict)
    replay: ReservoirBuffer | None = None
    replay_ratio: float = 0.0
    ewc: EWCState | None = None
    continual: StepHook | None = None
    pack_tokens: int = 1024


def warmup_config(sft: SFTConfig, micro_batch_size: int, save_every: int = 10) -> SFTTrainerConfig:
    """The demonstration warm-up (section `sft`) as the loop's settings: a constant LR
    after sft.warmup_steps, micro-batches of algo.micro_batch_size."""
    return SFTTrainerConfig(
        steps=sft.steps, batch_size=sft.batch_size, micro_batch_size=micro_batch_size, lr=sft.lr,
        warmup_steps=sft.warmup_steps, schedule="constant", save_every=save_every, max_grad_norm=sft.max_grad_norm,
    )  # fmt: skip


@contextlib.contextmanager
def _metrics_log(run_dir: Path | None, resume_step: int) -> Iterator[MetricsLog | None]:
    if run_dir is None:
        yield None
        return
    with MetricsLog(run_dir, tensorboard=False, resume_step=resume_step) as log:
        yield log


class SFTTrainer(Resumable):
    """The loop: sample → (replay) → accumulate → clip → step → log → eval → checkpoint.

    run_dir None: nothing is written (no metrics.jsonl, no checkpoints); the caller
    logs through on_step and saves what it wants (sft_train, train_and_save).
    """

    def __init__(
        self, policy: Any, inputs: SFTInputs, cfg: SFTTrainerConfig, run_dir: str | Path | None = None, seed: int = 0
    ) -> None:
        if not inputs.train:
            raise ValueError("no SFT examples to train on")
        if cfg.packing and not all(isinstance(row, TokenizedExample) for row in inputs.train):
            raise ValueError("sft_trainer.packing packs tokenised conversations, not demonstrations")
        self.policy, self.cfg, self.inputs = policy, cfg, inputs
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.train_rows = pack(inputs.train, inputs.pack_tokens) if cfg.packing else inputs.train
        types = [getattr(row, "task_type", "general") for row in self.train_rows]
        self.sampler = ExampleSampler(types, inputs.task_weights, seed)
        self.params = [p for p in policy.model.parameters() if p.requires_grad]
        optim = OptimConfig(lr=cfg.lr, warmup_steps=cfg.warmup_steps, schedule=cfg.schedule)
        self.optimizer, self.scheduler = build_optimizer(self.params, optim, max(1, cfg.steps))
        self.step = 0

    def train(self, on_step: Callable[[int, dict[str, float]], None] | None = None) -> list[dict[str, float]]:
        history = []
        # from step 0 too: lines a run killed before its first checkpoint logged go
        with _metrics_log(self.run_dir, self.step) as log:
            while self.step < self.cfg.steps:
                metrics = self.train_step()
                self.step += 1
                last = self.step == self.cfg.steps
                if self.inputs.eval and (last or (self.cfg.eval_every and self.step % self.cfg.eval_every == 0)):
                    metrics["sft/eval_loss"] = self.eval_loss()
                if log is not None:
                    log.log(self.step, metrics)
                history.append(metrics)
                if on_step is not None:
                    on_step(self.step, metrics)
                if self.run_dir is not None and (last or self.step % self.cfg.save_every == 0):
                    self.save()
        self.policy.model.eval()
        return history

    def train_step(self) -> dict[str, float]:
        cfg, inputs = self.cfg, self.inputs
        replayed = replay_count(cfg.batch_size, inputs.replay_ratio, len(inputs.replay or []))
        rows = [self.train_rows[i] for i in self.sampler.next(cfg.batch_size - replayed)]
        rows += inputs.replay.sample(replayed) if inputs.replay is not None else []
        batch = sft_batch(rows, self.policy.tokenizer.pad_token_id)
        self.policy.model.train()
        metrics = {"sft/loss": masked_nll_pass(self.policy, batch, cfg.micro_batch_size)}
        hooks = [hook for hook in (inputs.ewc, inputs.continual) if hook is not None]
        for hook in hooks:
            metrics.update(hook.after_backward(self.policy, self.params))
        metrics["sft/grad_norm"], metrics["sft/lr"] = optimizer_step(
            self.params, self.optimizer, self.scheduler, cfg.max_grad_norm
        )
        for hook in hooks:
            hook.after_step(self.policy, self.params)
        release_memory()  # the step's activations, before the next step allocates its own
        if inputs.replay is not None:
            metrics["sft/replayed"] = float(replayed)
        metrics["sft/tokens"] = float(batch.loss_mask.sum())
        return metrics

    def eval_loss(self) -> float:
        self.policy.model.eval()
        batch = sft_batch(self.inputs.eval, self.policy.tokenizer.pad_token_id)
        return masked_nll_pass(self.policy, batch, self.cfg.micro_batch_size, backward=False)

    def trainer_state(self) -> dict[str, Any]:
        state = {"step": self.step, "sampler": self.sampler.state_dict(), "rng": rng_state()}
        if self.inputs.replay is not None:
            state["replay"] = self.inputs.replay.state_dict()
        if self.inputs.continual is not None:
            state["continual"] = self.inputs.continual.state_dict()
        return state

    def load_trainer_state(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])
        if self.inputs.replay is not None and "replay" in state:
            self.inputs.replay.load_state_dict(state["replay"])
        if self.inputs.continual is not None and "continual" in state:
            self.inputs.continual.load_state_dict(state["continual"])
        set_rng_state(state["rng"])


def sft_train(
    policy: Policy,
    demonstrations: list[Trajectory],
    config: SFTConfig,
    seed: int = 0,
    micro_batch_size: int = 4,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """The demonstration warm-up: config.steps AdamW steps of the SFT loop on the
    demonstrations, nothing written; returns per-step metrics."""
    if not demonstrations:
        raise ValueError("no demonstrations to train on (check sft.task_kinds)")
    trainer = SFTTrainer(policy, SFTInputs(demonstrations), warmup_config(config, micro_batch_size), None, seed)
    return trainer.train(on_step)


def train_and_save(
    policy: Policy, demonstrations: list[Trajectory], config: SFTConfig, seed: int, micro_batch_size: int,
    log_dir: Path, on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:  # fmt: skip
    """sft_train, its metrics logged in log_dir, the trained weights saved there."""
    from ponder.models.adapters import save_trained

    with MetricsLog(log_dir, tensorboard=False) as log:

        def logged(step: int, metrics: dict[str, float]) -> None:
            log.log(step, metrics)
            if on_step is not None:
                on_step(step, metrics)

        history = sft_train(policy, demonstrations, config, seed, micro_batch_size, logged)
    save_trained(policy, log_dir)
    return history
