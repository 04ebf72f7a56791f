"""TRL's side of the GRPO benchmark: GRPOTrainer as a user would run it (plain
transformers generation, PEFT LoRA, reference = adapters disabled), configured to
match ponder's recipe in ponder_side.bench_recipe setting by setting.

Timing comes from a subclass that only wraps TRL's own methods with clocks:
generation (`_generate_single_turn`, every turn of the tool loop), logprob
recomputation (`_get_per_token_logps_and_entropies` without grad: the reference
pass), and the whole rollout-and-score call; the update is the rest of the step.
Needs `trl` (the `bench` extra).
"""

from __future__ import annotations

import tempfile
import time
from collections import defaultdict
from typing import Any, Callable

import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import qwen2_5_chat_template

from bench.common import BenchConfig
from bench.workloads import (
    SINGLE_SYSTEM,
    TOOL_SYSTEM,
    TOOL_TEMPLATE,
    arithmetic_tasks,
    calculator,
    number_reward,
    task_messages,
)


def trl_args(cfg: BenchConfig, output_dir: str, **overrides: Any) -> GRPOConfig:
    """GRPOConfig with every setting that differs between the systems pinned explicitly."""
    settings: dict[str, Any] = dict(
        output_dir=output_dir,
        per_device_train_batch_size=cfg.batch_size,
        gradient_accumulation_steps=1,
        num_generations=cfg.group_size,
        steps_per_generation=1,
        num_iterations=1,
        max_completion_length=cfg.max_new_tokens,
        temperature=cfg.temperature,
        top_p=1.0,
        top_k=0,
        repetition_penalty=1.0,
        beta=cfg.beta,
        loss_type=cfg.loss_type,
        epsilon=cfg.epsilon,
        epsilon_high=cfg.epsilon,
        scale_rewards="group",
        mask_truncated_completions=False,
        # TRL's default (True) weights the KL term by the importance ratio; ponder's k3 term is unweighted
        use_bias_correction_kl=False,
        learning_rate=cfg.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        max_steps=cfg.warmup + cfg.steps,
        seed=cfg.seed,
        shuffle_dataset=False,
        use_cpu=cfg.device == "cpu",
        bf16=cfg.dtype == "bfloat16",
        fp16=False,
        disable_dropout=True,
        gradient_checkpointing=False,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        log_completions=False,
    )
    if cfg.workload == "tool":
        settings["max_tool_calling_iterations"] = cfg.max_turns - 1
    settings.update(overrides)
    return GRPOConfig(**settings)


def lora_config(cfg: BenchConfig) -> LoraConfig:
    """The PEFT config ponder.models.apply_lora builds for the same r and alpha."""
    return LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=0.0,
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )


def load_model_and_tokenizer(cfg: BenchConfig) -> tuple[Any, Any]:
    """The model in cfg.dtype and its tokenizer from cfg.model; the tool workload's ChatML template."""
    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    if tokenizer.pad_token_id is None:  # as ponder.models.loading does
        tokenizer.pad_token = tokenizer.eos_token
    if cfg.workload == "tool":
        if TOOL_TEMPLATE != qwen2_5_chat_template:
            raise ValueError(
                "bench/chatml_tools.jinja no longer equals TRL's qwen2_5 template; "
                "TRL cannot parse tool calls"
            )
        tokenizer.chat_template = TOOL_TEMPLATE
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.dtype]
    model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=dtype, attn_implementation="sdpa")
    return model, tokenizer


def correct_answer(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
    """TRL reward function: number_reward on the last assistant message of each completion."""
    return [number_reward(_last_assistant_text(c), a) for c, a in zip(completions, answer)]


def _last_assistant_text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    for message in reversed(completion):
        if message.get("role") == "assistant":
            return message.get("content") or ""
    return ""


class TimedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer with clocks around its generation, reference and rollout methods."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bench_times: dict[str, float] = defaultdict(float)
        self.bench_tokens = 0.0

    def _generate_single_turn(self, *args: Any, **kwargs: Any) -> Any:
        tick = time.perf_counter()
        try:
            return super()._generate_single_turn(*args, **kwargs)
        finally:
            self.bench_times["generation_s"] += time.perf_counter() - tick

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled():  # the loss's own forward: part of the update
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)
        tick = time.perf_counter()
        try:
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)
        finally:
            self.bench_times["logprob_s"] += time.perf_counter() - tick

    def _generate_and_score_completions(self, inputs: Any) -> Any:
        tick = time.perf_counter()
        output = super()._generate_and_score_completions(inputs)
        self.bench_times["rollout_s"] += time.perf_counter() - tick
        self.bench_tokens += float(output["num_items_in_batch"])  # policy tokens: no padding, no tool output
        return output


class _StepClock(TrainerCallback):
    """Waits for the go-ahead before each step and reports it after (see worker.py)."""

    def __init__(self, wait: Callable[[], None], report: Callable[[dict[str, float]], None]) -> None:
        self.wait, self.report = wait, report
        self.trainer: TimedGRPOTrainer | None = None
        self.tick = 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.wait()
        self.trainer.bench_times.clear()
        self.trainer.bench_tokens = 0.0
        self.tick = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step_s = time.perf_counter() - self.tick
        self.report(step_record(self.trainer, step_s))


def step_record(trainer: TimedGRPOTrainer, step_s: float) -> dict[str, float]:
    times, metrics = trainer.bench_times, trainer._metrics["train"]
    rollout = times["rollout_s"]

    def last(name: str) -> float:
        return float(metrics[name][-1]) if metrics.get(name) else float("nan")

    return {
        "step_s": step_s,
        "generation_s": times["generation_s"],
        "logprob_s": times["logprob_s"],
        "update_s": step_s - rollout,
        "other_s": rollout - times["generation_s"] - times["logprob_s"],
        "completion_tokens": trainer.bench_tokens,
        "tool_calls_per_episode": last("tools/call_frequency") if "tools/call_frequency" in metrics else 0.0,
        "reward_mean": last("reward"),
        "kl": last("kl"),
    }


class TRLSide:
    """Builds the trainer; `run(wait, report)` trains warmup + steps steps, calling
    wait() before and report(record) after each."""

    def __init__(self, cfg: BenchConfig) -> None:
        self.cfg = cfg
        model, tokenizer = load_model_and_tokenizer(cfg)
        system = TOOL_SYSTEM if cfg.workload == "tool" else SINGLE_SYSTEM
        tasks = arithmetic_tasks(cfg.workload, cfg.prompts, cfg.seed)
        rows = [{"prompt": task_messages(t, system), "answer": t.answers[0]} for t in tasks]
        self.output_dir = tempfile.mkdtemp(prefix="trl-bench-")
        self.trainer_kwargs = dict(
            model=model,
            reward_funcs=correct_answer,
            args=trl_args(cfg, self.output_dir),
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            peft_config=lora_config(cfg),
            tools=[calculator] if cfg.workload == "tool" else None,
        )

    def run(self, wait: Callable[[], None], report: Callable[[dict[str, float]], None]) -> None:
        clock = _StepClock(wait, report)
        trainer = TimedGRPOTrainer(callbacks=[clock], **self.trainer_kwargs)
        clock.trainer = trainer
        trainer.train()
