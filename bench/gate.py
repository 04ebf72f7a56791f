"""The correctness gate: before any speed claim, ponder's GRPO loss and gradients
must equal TRL's on one fixed batch.

    python -m bench.gate --model DIR [--loss-type dapo] [--beta 0.04] [--temperature 1.0]

The batch: two prompts of different lengths × two samples, completions of
different lengths, one with a masked-out tool span in the middle (loss_mask 0 in
ponder, tool_mask 0 in TRL). Both systems get the same sequences, the same old
logprobs (the policy's own plus seeded noise, so ratios fall on both sides of the
clip), the same reference logprobs (ponder's adapters-disabled pass) and the same
per-sequence advantages, and start from the same LoRA weights (seeded, non-zero, so
policy ≠ reference and every adapter weight gets a gradient).

ponder's loss is its trainer's own micro-batch objective (policy loss + β·KL,
aggregated as the recipe says); TRL's is `GRPOTrainer._compute_loss` for the
matching loss_type (common.LOSS_TYPES). The gate runs twice:

1. in float64 on both (the model cast to float64): the same math with rounding out
   of the way. Passes when |Δloss|/|loss| and the relative error of the whole adapter
   gradient, ‖g_ponder − g_trl‖/‖g_trl‖, are ≤ tolerance (1e-5). (On SmolLM2 they sit
   near 1e-7 and 1e-6: TRL keeps a few float32 casts.) A real mismatch (TRL's KL
   bias correction left on) shows as ~3e-3 on the whole gradient.
2. in float32, as benchmarked, with ponder's matrix products on whichever library
   `ponder.models.cpu_matmul` picks: ponder's gradient must be as close to the exact
   (float64) one as TRL's own float32 gradient is, or within the tolerance. On the
   30-layer SmolLM2 each library's float32 rounding alone moves the gradient by
   ~1e-5 (TRL's measured 0.8-1.5e-5 from its float64 result), so the direct float32
   difference between the two systems, also reported, can exceed 1e-5 without any
   difference in what they compute.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from dataclasses import asdict, dataclass
from typing import Any

import torch

from bench.common import LOSS_TYPES, BenchConfig, emit
from ponder.jobs.parts import rl_trainer

TOLERANCE = 1e-5
PROMPT_LENGTHS = (6, 10)  # two groups
RESPONSE_LENGTHS = (7, 4, 12, 9)  # two samples per group
TOOL_SPAN = (2, 4, 8)  # row 2: response positions 4..7 are tool output (loss_mask 0)


@dataclass
class GateResult:
    """Outcome of the gate; `passed` is what the bench checks. The loss and gradient
    differences are float64's; the fp32_* fields are float32's (see the module doc)."""

    loss_type: str
    aggregation: str
    loss_ponder: float
    loss_trl: float
    loss_rel: float
    grad_rel_max: float
    grad_rel_global: float
    logprob_max_abs_diff: float
    tensors: int
    tolerance: float
    fp32_grad_rel: float = float("nan")  # ponder vs TRL, both float32
    fp32_ponder_error: float = float("nan")  # ponder float32 vs ponder float64
    fp32_trl_error: float = float("nan")  # TRL float32 vs TRL float64
    passed: bool = False

    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return (
            f"correctness gate {verdict} (TRL loss_type={self.loss_type} vs ponder {self.aggregation}): "
            f"float64: loss {self.loss_ponder:.8g} vs {self.loss_trl:.8g} (rel {self.loss_rel:.2e}), "
            f"grad rel max {self.grad_rel_max:.2e} over {self.tensors} tensors "
            f"(global {self.grad_rel_global:.2e}), logprob max |diff| {self.logprob_max_abs_diff:.2e}; "
            f"float32: ponder vs TRL {self.fp32_grad_rel:.2e}, rounding (vs float64) ponder "
            f"{self.fp32_ponder_error:.2e}, TRL {self.fp32_trl_error:.2e}; tolerance {self.tolerance:g}"
        )


def fixed_rows(vocab_size: int, seed: int) -> list[dict[str, Any]]:
    """Token ids (3 ≤ id < vocab, so no special token) and loss masks of the fixed batch."""
    generator = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, vocab_size, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]
    rows = []
    for i, length in enumerate(RESPONSE_LENGTHS):
        mask = [1] * length
        if i == TOOL_SPAN[0]:
            mask[TOOL_SPAN[1] : TOOL_SPAN[2]] = [0] * (TOOL_SPAN[2] - TOOL_SPAN[1])
        response = torch.randint(3, vocab_size, (length,), generator=generator).tolist()
        rows.append(
            {"group": i // 2, "prompt_ids": prompts[i // 2], "response_ids": response, "loss_mask": mask}
        )
    return rows


def run_gate(
    model_dir: str,
    loss_type: str = "dapo",
    beta: float = 0.04,
    temperature: float = 1.0,
    seed: int = 0,
    lora_r: int = 16,
    lora_alpha: int = 32,
    tolerance: float = TOLERANCE,
    ponder_aggregation: str | None = None,
) -> GateResult:
    """Compare ponder and TRL on the fixed batch. `ponder_aggregation` overrides the
    mapped aggregation (a deliberate mismatch shows the gate catches one)."""
    cfg = gate_config(model_dir, loss_type, beta, temperature, seed, lora_r, lora_alpha)
    ponder64, trl64 = both_sides(cfg, ponder_aggregation, "float64")
    ponder32, trl32 = both_sides(cfg, ponder_aggregation, "float32")
    result = compare(ponder64, trl64, loss_type, tolerance)
    result.fp32_grad_rel = gradient_distance(ponder32.grads, trl32.grads)
    result.fp32_ponder_error = gradient_distance(ponder32.grads, ponder64.grads)
    result.fp32_trl_error = gradient_distance(trl32.grads, trl64.grads)
    result.passed = (
        result.loss_rel <= tolerance
        and result.grad_rel_global <= tolerance
        and result.fp32_ponder_error <= max(tolerance, result.fp32_trl_error)
    )
    return result


def gate_config(model_dir: str, loss_type: str = "dapo", beta: float = 0.04, temperature: float = 1.0,
                seed: int = 0, lora_r: int = 16, lora_alpha: int = 32) -> BenchConfig:  # fmt: skip
    """The benchmark settings of the gate's fixed batch (two groups of two samples)."""
    return BenchConfig(
        workload="single",
        model=model_dir,
        prompts_per_step=len(PROMPT_LENGTHS),
        group_size=2,
        max_new_tokens=max(RESPONSE_LENGTHS),
        temperature=temperature,
        seed=seed,
        beta=beta,
        loss_type=loss_type,
        lora_r=lora_r,
        lora_alpha=lora_alpha,
    )


@dataclass
class Side:
    """One system's loss, adapter gradients and per-token logprobs on the fixed batch."""

    loss: float
    grads: dict[str, torch.Tensor]
    logprobs: torch.Tensor
    aggregation: str = ""
    inputs: dict[str, torch.Tensor] | None = None  # TRL's layout of the batch (on the TRL side)


def both_sides(cfg: BenchConfig, ponder_aggregation: str | None, dtype: str) -> tuple[Side, Side]:
    """ponder's and TRL's loss and gradients on the fixed batch, both in `dtype`."""
    trainer, trl_base = _ponder_trainer(cfg, ponder_aggregation, dtype)
    batch, advantages = _ponder_batch(trainer, cfg, cfg.seed)
    trl = _trl_trainer(cfg, trl_base, trainer.policy.tokenizer)
    _copy_adapters(trainer.policy.model, trl.model)
    ponder = Side(*_ponder_loss_and_grads(trainer, batch), aggregation=trainer.recipe.algo.aggregation)
    inputs = _trl_inputs(batch, advantages, trainer.policy.tokenizer.pad_token_id)
    return ponder, Side(*_trl_loss_and_grads(trl, inputs), inputs=inputs)


def compare(ponder: Side, trl: Side, loss_type: str, tolerance: float) -> GateResult:
    """The two sides' loss, gradient and logprob differences (`passed` left False)."""
    grad_rel = {name: _relative(ponder.grads[name], trl.grads[name]) for name in trl.grads}
    return GateResult(
        loss_type,
        ponder.aggregation,
        ponder.loss,
        trl.loss,
        abs(ponder.loss - trl.loss) / max(abs(trl.loss), 1e-30),
        max(grad_rel.values()),
        gradient_distance(ponder.grads, trl.grads),
        _logprob_diff(ponder.logprobs, trl.logprobs, trl.inputs),
        len(grad_rel),
        tolerance,
    )


def gradient_distance(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """‖g − g_ref‖ / ‖g_ref‖ over all adapter tensors together, in float64."""
    flat = torch.cat([grads[n].double().flatten() for n in reference])
    return _relative(flat, torch.cat([reference[n].double().flatten() for n in reference]))


def _ponder_trainer(cfg: BenchConfig, aggregation: str | None, dtype: str) -> tuple[Any, Any]:
    from bench.ponder_side import bench_recipe
    from ponder.models import load_policy

    recipe = bench_recipe(cfg, max(PROMPT_LENGTHS), tempfile.mkdtemp(prefix="ponder-gate-"))
    if aggregation is not None:
        recipe.algo.aggregation = aggregation
    policy = load_policy(cfg.model, "float32", "cpu")
    policy.model.to(getattr(torch, dtype))  # float64: the same math with rounding out of the way
    trl_base = copy.deepcopy(policy.model)  # TRL wraps its own copy of the untouched base
    trainer = rl_trainer(recipe, recipe.train.out, policy=policy)
    generator = torch.Generator().manual_seed(cfg.seed + 1)
    with torch.no_grad():
        for name, parameter in trainer.policy.model.named_parameters():
            if parameter.requires_grad:  # fresh LoRA B is zero: make policy ≠ reference
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)  # cast by copy_
    return trainer, trl_base


def _ponder_batch(trainer: Any, cfg: BenchConfig, seed: int) -> tuple[Any, torch.Tensor]:
    """The fixed batch as ponder's TokenBatch, with old/ref logprobs and advantages set."""
    from ponder.models.forward import forward_policy
    from ponder.train.batch import collate
    from ponder.train.update import forward_pass_no_grad
    from ponder.types import Trajectory

    policy = trainer.policy
    rows = fixed_rows(policy.model.config.vocab_size, seed)
    trajectories = [
        Trajectory(
            task_id=f"g{r['group']}",
            prompt_ids=r["prompt_ids"],
            response_ids=r["response_ids"],
            loss_mask=r["loss_mask"],
            old_logprobs=[0.0] * len(r["response_ids"]),
            group_id=f"g{r['group']}",
        )
        for r in rows
    ]
    batch = collate(trajectories, policy.tokenizer.pad_token_id)
    generator = torch.Generator().manual_seed(seed + 2)
    mask = batch.loss_mask.bool()
    with torch.no_grad():
        current, _, _ = forward_policy(policy.model, batch.input_ids, batch.attention_mask, cfg.temperature)
    noise = torch.randn(current.shape, generator=generator) * 0.3
    batch.old_logprobs = torch.where(mask, current + noise, torch.zeros_like(current))
    with trainer._reference_policy():  # adapters disabled: the base model, TRL's reference too
        batch.ref_logprobs = forward_pass_no_grad(policy, batch, len(batch), cfg.temperature)
    advantages = torch.randn(len(batch), generator=generator)
    batch.advantages = advantages[:, None] * batch.loss_mask
    batch.returns = torch.zeros_like(batch.advantages)
    return batch, advantages


def _trl_trainer(cfg: BenchConfig, base_model: Any, tokenizer: Any) -> Any:
    from datasets import Dataset
    from trl import GRPOTrainer

    from bench.trl_side import correct_answer, lora_config, trl_args

    rows = [{"prompt": [{"role": "user", "content": "x"}], "answer": "1"}] * cfg.batch_size
    args = trl_args(cfg, tempfile.mkdtemp(prefix="trl-gate-"), max_steps=1)
    return GRPOTrainer(
        model=base_model,
        reward_funcs=correct_answer,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=lora_config(cfg),
    )


def _copy_adapters(source_model: Any, target_model: Any) -> None:
    source = {n: p for n, p in source_model.named_parameters() if p.requires_grad}
    target = {n: p for n, p in target_model.named_parameters() if p.requires_grad}
    if set(source) != set(target):
        missing = sorted(set(source) ^ set(target))[:3]
        raise ValueError(f"ponder and TRL adapters differ in their parameters, e.g. {missing}")
    with torch.no_grad():
        for name, parameter in source.items():
            target[name].copy_(parameter)


def _ponder_loss_and_grads(trainer: Any, batch: Any) -> tuple[float, dict[str, torch.Tensor], torch.Tensor]:
    from ponder.algos import aggregation_denominator
    from ponder.models.forward import forward_policy
    from ponder.train.update import _micro_batch_loss  # the trainer's own objective, nothing re-implemented

    model = trainer.policy.model
    model.train()
    model.zero_grad(set_to_none=True)
    denominator = aggregation_denominator(
        trainer.recipe.algo.aggregation, batch.loss_mask, trainer.loss_config()
    )
    loss, _ = _micro_batch_loss(trainer.update_inputs(), batch, denominator)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    with torch.no_grad():
        logprobs, _, _ = forward_policy(
            model, batch.input_ids, batch.attention_mask, trainer.recipe.rollout.sampling.temperature
        )
    return float(loss.detach()), grads, logprobs


def _trl_inputs(batch: Any, advantages: torch.Tensor, pad_id: int) -> dict[str, torch.Tensor]:
    """TRL's layout: prompts left-padded, completions right-padded, per-token tensors
    aligned to completion positions; tool_mask 0 on the tool span."""
    lengths = batch.attention_mask.sum(-1).tolist()
    prompt_lengths = [PROMPT_LENGTHS[i // 2] for i in range(len(batch))]
    width_p, width_c = max(prompt_lengths), max(n - p for n, p in zip(lengths, prompt_lengths))
    fields = {
        k: []
        for k in (
            "prompt_ids",
            "prompt_mask",
            "completion_ids",
            "completion_mask",
            "tool_mask",
            "old_per_token_logps",
            "ref_per_token_logps",
            "positions",
        )
    }
    for row, (total, prompt) in enumerate(zip(lengths, prompt_lengths)):
        ids, size = batch.input_ids[row], total - prompt
        span = slice(prompt - 1, total - 1)  # per-token entries of the completion tokens
        fields["prompt_ids"].append([pad_id] * (width_p - prompt) + ids[:prompt].tolist())
        fields["prompt_mask"].append([0] * (width_p - prompt) + [1] * prompt)
        fields["completion_ids"].append(ids[prompt:total].tolist() + [pad_id] * (width_c - size))
        fields["completion_mask"].append([1] * size + [0] * (width_c - size))
        fields["tool_mask"].append(batch.loss_mask[row, span].long().tolist() + [1] * (width_c - size))
        fields["old_per_token_logps"].append(
            batch.old_logprobs[row, span].tolist() + [0.0] * (width_c - size)
        )
        fields["ref_per_token_logps"].append(
            batch.ref_logprobs[row, span].tolist() + [0.0] * (width_c - size)
        )
        fields["positions"].append(list(range(prompt - 1, total - 1)) + [-1] * (width_c - size))
    floats = ("old_per_token_logps", "ref_per_token_logps")
    dtype = batch.old_logprobs.dtype  # float64 in the gate's float64 run
    inputs = {k: torch.tensor(v, dtype=dtype if k in floats else None) for k, v in fields.items()}
    inputs["advantages"] = advantages.clone()
    inputs["num_items_in_batch"] = batch.loss_mask.sum()
    return inputs


def _trl_loss_and_grads(
    trl: Any, inputs: dict[str, torch.Tensor]
) -> tuple[float, dict[str, torch.Tensor], torch.Tensor]:
    model = trl.model
    model.train()
    model.zero_grad(set_to_none=True)
    if not hasattr(trl, "current_gradient_accumulation_steps"):  # set by Trainer.train(); one step here
        trl.current_gradient_accumulation_steps = 1
    loss_inputs = {k: v for k, v in inputs.items() if k != "positions"}
    loss = trl._compute_loss(model, loss_inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        logprobs, _, _ = trl._get_per_token_logps_and_entropies(
            model, ids, mask, inputs["completion_ids"].shape[1]
        )
    return float(loss.detach()), grads, logprobs


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ in float64 (‖a − b‖ itself when b is zero)."""
    diff = float((a.double() - b.double()).norm())
    scale = float(b.double().norm())
    return diff / scale if scale > 0 else diff


def _logprob_diff(ponder: torch.Tensor, trl: torch.Tensor, inputs: dict[str, torch.Tensor]) -> float:
    """Largest |Δ| between the two systems' per-token logprobs on the loss tokens."""
    positions = inputs["positions"]
    keep = (inputs["completion_mask"] * inputs["tool_mask"]).bool()
    rows = torch.arange(len(positions))[:, None].expand_as(positions)
    aligned = ponder[rows[keep], positions[keep]]
    return float((aligned - trl[keep]).abs().max())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="local HF model directory")
    parser.add_argument("--loss-type", default="dapo", choices=sorted(LOSS_TYPES))
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--lora-alpha", type=int, default=32)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # deterministic reductions; the gate measures equality, not speed
    result = run_gate(
        args.model, args.loss_type, args.beta, args.temperature, args.seed, args.lora_r, args.lora_alpha
    )
    print(result.line())
    emit({"event": "gate", **asdict(result)})
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
