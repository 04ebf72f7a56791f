"""Update one user's adapter from their feedback: `update_user`.

feedback rows ──feedback.preference_pairs──▶ (prompt messages, chosen, rejected)
  ──chat template──▶ TokenizedExample pairs (mask 1 on the response and its end token)
  ──▶ the base + the user's current adapter (or a fresh LoRA) ──DPOTrainer──▶ new version
  ──AdapterStore.save_version──▶ current

Only the user's adapter trains: the base is frozen and no other user's adapter is
loaded. The KL anchor to the base is DPO's own reference, the base with adapters
disabled (train/dpo.py), so `beta` sets how far a user's model may drift from the
base for a given preference margin. Every update trains on all of the user's pairs
so far, continuing the current adapter: a pair is not forgotten because it is old.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ponder.config import DPOConfig, LoraConfig
from ponder.data.format import TokenizedExample
from ponder.models.adapters import is_lora
from ponder.models.base_hash import base_model_hash
from ponder.models.chat import encode_chat
from ponder.models.loading import Policy
from ponder.models.lora import apply_lora
from ponder.personal.config import PersonalConfig
from ponder.personal.feedback import PreferencePair, preference_pairs
from ponder.personal.store import AdapterStore, AdapterVersion, check_user
from ponder.train.checkpoint import latest_checkpoint
from ponder.train.dpo import DPOTrainer, PreferenceExample


def response_example(prompt_ids: list[int], response: str, tokenizer: Any, example_id: str) -> TokenizedExample:
    """prompt + response + the end-of-turn token, loss mask 1 on the last two: the
    tokens the served model wrote (or should have written) after that prompt."""
    ids = tokenizer.encode(response, add_special_tokens=False) + [tokenizer.eos_token_id]
    return TokenizedExample(prompt_ids + ids, [0] * len(prompt_ids) + [1] * len(ids), id=example_id)


def pair_examples(
    tokenizer: Any, pairs: list[PreferencePair], max_tokens: int
) -> tuple[list[PreferenceExample], int]:
    """Tokenised pairs (the prompt rendered as `ponder serve` renders it: the chat
    template with the generation prompt), and how many were left out as too long."""
    examples, too_long = [], 0
    for index, pair in enumerate(pairs):
        prompt_ids = encode_chat(tokenizer, pair.messages)
        chosen = response_example(prompt_ids, pair.chosen, tokenizer, f"pair-{index}")
        rejected = response_example(prompt_ids, pair.rejected, tokenizer, f"pair-{index}")
        if max(len(chosen.input_ids), len(rejected.input_ids)) > max_tokens:
            too_long += 1
        else:
            examples.append(PreferenceExample(chosen, rejected))
    return examples, too_long


def with_user_adapter(
    policy: Policy, store: AdapterStore, current: AdapterVersion | None, base_hash: str, cfg: PersonalConfig
) -> Policy:
    """The base with the user's current adapter loaded trainable (refused when it was
    trained on another base), or with a fresh seeded LoRA when the user has none."""
    from peft import PeftModel

    from ponder.models.lora_fused import fuse_lora_linears

    if current is None:
        with torch.random.fork_rng():  # the seed must not shift the caller's RNG
            torch.manual_seed(cfg.seed)
            return apply_lora(policy, LoraConfig(r=cfg.lora_r, alpha=cfg.lora_alpha))
    path = store.adapter_path(current.user, current.version, base_hash=base_hash)
    model = PeftModel.from_pretrained(policy.model, str(path), is_trainable=True)
    fuse_lora_linears(model)  # the same fast exact training forward apply_lora gives
    return replace(policy, model=model)


def update_user(
    store: AdapterStore, user: str, base: Policy | Callable[[], Policy], cfg: PersonalConfig | None = None,
    say: Callable[[str], None] | None = None,
) -> tuple[int, dict[str, Any]]:  # fmt: skip
    """Train the user's next adapter version on all their preference pairs and make it
    current; returns (version, metrics). `base` is the bare base policy or a function
    that loads one; it gets the adapter attached, so pass a copy nobody else uses (the
    server passes a loader, never its serving model). ValueError when the user has
    fewer than cfg.min_pairs pairs or their adapter was trained on another base."""
    cfg = cfg or PersonalConfig()
    check_user(user)
    interactions, feedback = store.feedback_for(user)
    pairs, report = preference_pairs(interactions, feedback)
    if len(pairs) < cfg.min_pairs:
        raise ValueError(f"user {user}: {len(pairs)} preference pair(s) from {len(feedback)} feedback row(s) "
                         f"({describe_report(report)}); an update needs at least {cfg.min_pairs}")  # fmt: skip
    policy = base() if callable(base) else base
    if is_lora(policy.model):
        raise ValueError("update_user takes the bare base model; the user's adapter comes from the store")
    base_hash = base_model_hash(policy.model)
    examples, too_long = pair_examples(policy.tokenizer, pairs, cfg.max_tokens)
    if len(examples) < cfg.min_pairs:
        raise ValueError(f"user {user}: {too_long} of {len(pairs)} pairs are longer than max_tokens "
                         f"{cfg.max_tokens}; fewer than {cfg.min_pairs} left")  # fmt: skip
    current = store.current(user)
    policy = with_user_adapter(policy, store, current, base_hash, cfg)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"ponder-personal-{user}-") as run_dir:
        history = DPOTrainer(policy, examples, dpo_config(cfg), run_dir, seed=cfg.seed).train()
        checkpoint = latest_checkpoint(Path(run_dir))
        if checkpoint is None:
            raise RuntimeError(f"the DPO run in {run_dir} left no checkpoint")
        version = store.save_version(
            user, checkpoint, base_hash, steps=(current.steps if current else 0) + cfg.steps,
            feedback=len(feedback), pairs=len(examples), parent_version=current.version if current else None,
        )  # fmt: skip
    metrics = {
        "user": user, "version": version, "parent_version": current.version if current else None,
        "pairs": len(examples), "feedback": len(feedback), "too_long": too_long, "report": dict(report),
        "steps": cfg.steps, "seconds": round(time.monotonic() - started, 3),
        "margin_first": history[0]["dpo/margin"], "margin_last": history[-1]["dpo/margin"],
        "loss_first": history[0]["dpo/loss"], "loss_last": history[-1]["dpo/loss"],
        "accuracy_last": history[-1]["dpo/accuracy"],
    }  # fmt: skip
    if say is not None:
        say(f"user {user} v{version}: {len(examples)} pairs, {cfg.steps} DPO steps, margin "
            f"{metrics['margin_first']:.3f} -> {metrics['margin_last']:.3f} ({metrics['seconds']:.1f} s)")  # fmt: skip
    return version, metrics


def dpo_config(cfg: PersonalConfig) -> DPOConfig:
    """DPOTrainer's settings for an update: one checkpoint, at the end (the one saved)."""
    return DPOConfig(loss=cfg.loss, beta=cfg.beta, rpo_alpha=cfg.rpo_alpha, steps=cfg.steps,
                     batch_size=cfg.batch_size, micro_batch_size=min(cfg.micro_batch_size, cfg.batch_size),
                     lr=cfg.lr, warmup_steps=0, save_every=cfg.steps)  # fmt: skip


def describe_report(report: Counter) -> str:
    return ", ".join(f"{count} {what}" for what, count in sorted(report.items())) or "no feedback"
