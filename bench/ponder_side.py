"""ponder's side of the GRPO benchmark: the real RLTrainer.train_step, with the
benchmark's environment, tasks and reward plugged into it.

RLTrainer builds a search-QA environment from its recipe; the benchmark swaps in
its own rollout engine (same backend, the workload's environment factory) and an
in-order task sampler, so both systems see the same prompts in the same order.
The recipe's search-QA world is shrunk to a few entities: it is built and unused.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

from bench.common import LOSS_TYPES, BenchConfig
from bench.workloads import TOOL_TEMPLATE, EnvFactory, arithmetic_tasks, episode_reward
from ponder.config import Recipe, load_recipe
from ponder.models import load_policy
from ponder.types import Task


class RecordingReward:
    """The benchmark's reward, keeping the trajectories it scored in the last step for the report."""

    def __init__(self) -> None:
        self.last: list[Any] = []

    def __call__(self, trajectory: Any, task: Task) -> tuple[float, dict[str, float]]:
        self.last.append(trajectory)
        return episode_reward(trajectory, task)


def bench_recipe(cfg: BenchConfig, max_prompt_tokens: int, run_dir: str) -> Recipe:
    """The RL recipe that matches TRL's GRPOConfig in trl_side.trl_args, setting by setting."""
    aggregation = LOSS_TYPES[cfg.loss_type]
    overrides = [
        f"model.name={cfg.model}",
        f"model.dtype={cfg.dtype}",
        f"model.device={cfg.device}",
        f"model.activation_offload={str(cfg.activation_offload).lower()}",
        f"rollout.batch_size={cfg.batch_size}",
        f"rollout.group_size={cfg.group_size}",
        f"rollout.sampling.temperature={cfg.temperature}",
        "rollout.sampling.top_p=1.0",
        f"rollout.sampling.decoder={cfg.decoder}",
        f"rollout.sampling.max_new_tokens_per_turn={cfg.max_new_tokens}",
        f"rollout.sampling.max_total_tokens={max_prompt_tokens + cfg.max_new_tokens}",
        "lora.enabled=true",
        f"lora.r={cfg.lora_r}",
        f"lora.alpha={cfg.lora_alpha}",
        "lora.dropout=0.0",
        f"optim.lr={cfg.lr}",
        "optim.weight_decay=0.0",
        "optim.warmup_steps=0",
        "optim.schedule=constant",
        "optim.max_grad_norm=1.0",
        "algo.advantage=grpo",
        "algo.norm_by_std=true",
        "algo.loss=ppo",
        f"algo.aggregation={aggregation}",
        f"algo.clip_low={cfg.epsilon}",
        f"algo.clip_high={cfg.epsilon}",
        f"algo.norm_constant={cfg.max_new_tokens}",
        f"algo.kl_coef={cfg.beta}",
        "algo.kl_estimator=k3",
        "algo.kl_in_reward=false",
        "algo.entropy_coef=0.0",
        "algo.epochs=1",
        "algo.mini_batch_size=0",
        f"algo.micro_batch_size={cfg.micro_batch or cfg.batch_size}",
        f"algo.logprob_micro_batch_size={cfg.batch_size}",  # no-grad reference pass: one batch, as TRL
        f"train.steps={cfg.warmup + cfg.steps}",
        f"train.tasks_per_step={cfg.prompts_per_step}",
        f"train.seed={cfg.seed}",
        "train.save_every=1000000",
        f"train.out={run_dir}",
        "env.options.taskgen.n_people=12",
        "env.options.taskgen.n_train=4",
        "env.options.taskgen.n_eval=2",
        "train.shuffle=false",  # tasks in list order, as TRL's shuffle_dataset=False
    ]
    return load_recipe(None, overrides)


class PonderSide:
    """Builds the trainer once; `step()` runs one measured GRPO step."""

    def __init__(self, cfg: BenchConfig) -> None:
        from ponder.train.rl import RLTrainer
        from ponder.models.prepare import prepare_policy
        from ponder.rollout.build import build_backend

        self.cfg = cfg
        policy = load_policy(cfg.model, cfg.dtype, cfg.device)
        if cfg.workload == "tool":
            policy.tokenizer.chat_template = TOOL_TEMPLATE
        factory = EnvFactory(cfg.workload, policy.tokenizer, cfg.max_turns)
        self.tasks = arithmetic_tasks(cfg.workload, cfg.prompts, cfg.seed)
        longest = max(len(_prompt_ids(policy.tokenizer, factory, t)) for t in self.tasks)
        self.run_dir = tempfile.mkdtemp(prefix="ponder-bench-")
        recipe = bench_recipe(cfg, longest, self.run_dir)
        policy = prepare_policy(recipe, policy)
        self.reward = RecordingReward()
        backend = build_backend(policy, recipe)
        self.trainer = RLTrainer(policy, factory, self.tasks, self.reward, backend, recipe, self.run_dir)

    def step(self) -> dict[str, float]:
        self.reward.last = []
        tick = time.perf_counter()
        metrics = self.trainer.train_step()
        step_s = time.perf_counter() - tick
        self.trainer.step += 1
        episodes = self.reward.last
        tokens = sum(sum(t.loss_mask) for t in episodes)
        accounted = metrics["time/generation_s"] + metrics["time/logprob_s"] + metrics["time/update_s"]
        return {
            "step_s": step_s,
            "generation_s": metrics["time/generation_s"],
            "logprob_s": metrics["time/logprob_s"],
            "update_s": metrics["time/update_s"],
            "other_s": step_s - accounted,
            "completion_tokens": float(tokens),
            "tool_calls_per_episode": sum(t.metrics.get("tool_calls", 0.0) for t in episodes) / len(episodes),
            "reward_mean": metrics["reward/mean"],
            "kl": metrics.get("policy/kl", float("nan")),
        }


def _prompt_ids(tokenizer: Any, factory: EnvFactory, task: Task) -> list[int]:
    messages = factory().reset(task)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)
