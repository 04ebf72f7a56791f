"""Needle in a haystack: can the model find one fact in a long document?

A fact, "The secret code of <name> is <number>.", is hidden at a depth (0 = the
start, 1 = the end) of a synthetic filler document of `length` tokens; the
question comes after the document; a case counts when the first number the model
answers is the code (exact match). Lengths are chosen as multiples of the model's
trained context length (max_position_embeddings), with RoPE scaling (models/rope.py)
set on the policy beforehand. The filler is bland generated prose, so the needle is
the only sentence about a secret code.

`long_finetune` is the short fine-tune at the longer length: LoRA SFT on freshly
generated needle documents, loss on the answer only.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass
from typing import Any

import torch

from ponder.models.loading import Policy

NAMES = ("Alice", "Bilal", "Chen", "Dagny", "Emeka", "Farah", "Goran", "Hana", "Ivo", "Jun", "Kofi", "Lena")
_SUBJECTS = ("The river", "A farmer", "The old bridge", "The market", "A small boat", "The library",
             "The wind", "A teacher", "The valley", "The train", "A painter", "The garden")  # fmt: skip
_VERBS = ("crossed", "watched", "followed", "passed", "reached", "circled", "left", "found")
_OBJECTS = ("the quiet hills", "the northern road", "a field of wheat", "the harbour", "the town square",
            "a row of houses", "the forest edge", "the stone wall", "the morning fog", "the long shadow")  # fmt: skip
_TAILS = ("before noon", "after the rain", "without a sound", "as usual", "once again", "in the evening")


@dataclass
class NeedleCase:
    length: int
    depth: float
    name: str
    code: str
    prompt_ids: list[int]
    answer_ids: list[int]
    needle_at: int  # token index where the needle sentence starts


def _filler_sentence(rng: random.Random) -> str:
    return f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}. "


def build_case(tokenizer: Any, length: int, depth: float, seed: int) -> NeedleCase:
    """One document of about `length` prompt tokens (within one filler sentence), the
    needle sentence starting at `depth` of the filler, the question at the end."""
    rng = random.Random(f"needle-{seed}-{length}-{depth}")
    name, code = rng.choice(NAMES), str(rng.randint(10000, 99999))
    needle = f"The secret code of {name} is {code}. "
    question = f"\n\nWhat is the secret code of {name}? Answer with the number only."
    sentences: list[str] = []

    def compose() -> tuple[str, list[int]]:
        cut = round(depth * len(sentences))
        document = "".join(sentences[:cut]) + needle + "".join(sentences[cut:])
        text = _chat_text(tokenizer, "Read the document and answer the question.\n\nDocument:\n" + document + question)
        return text, tokenizer.encode(text, add_special_tokens=False)

    text, prompt = compose()
    while len(prompt) < length:  # grow by half the shortfall's worth of sentences, then one at a time
        gap = length - len(prompt)
        count = max(1, gap // 2 // len(tokenizer.encode(_filler_sentence(rng), add_special_tokens=False)))
        sentences.extend(_filler_sentence(rng) for _ in range(count if gap > 128 else 1))
        text, prompt = compose()
    needle_at = len(tokenizer.encode(text[: text.index(needle)], add_special_tokens=False))
    answer = tokenizer.encode(code, add_special_tokens=False) + [tokenizer.eos_token_id]
    return NeedleCase(length, depth, name, code, prompt, answer, needle_at)


def _chat_text(tokenizer: Any, user: str) -> str:
    messages = [{"role": "user", "content": user}]
    if getattr(tokenizer, "chat_template", None):
        return str(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    return user + "\nAnswer: "


def _chat(tokenizer: Any, user: str) -> list[int]:
    return tokenizer.encode(_chat_text(tokenizer, user), add_special_tokens=False)


def answer_matches(text: str, code: str) -> bool:
    """Exact match: the first number in the answer is the code."""
    found = re.search(r"\d+", text.replace(",", ""))
    return found is not None and found.group(0) == code


@torch.no_grad()
def answer(policy: Policy, case: NeedleCase, max_new_tokens: int = 20) -> str:
    """Greedy answer to one case (transformers' generate: any RoPE type)."""
    ids = torch.tensor([case.prompt_ids], device=policy.device)
    out = policy.model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
        pad_token_id=policy.tokenizer.pad_token_id,
    )  # fmt: skip
    return policy.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def evaluate_needles(
    policy: Policy, lengths: list[int], depths: list[float], per_cell: int, seed: int = 0, on_case: Any = None
) -> list[dict[str, Any]]:
    """One row per case: length, depth, code, the answer, correct, seconds."""
    rows = []
    for length in lengths:
        for depth in depths:
            for index in range(per_cell):
                case = build_case(policy.tokenizer, length, depth, seed * 1000 + index)
                start = time.perf_counter()
                text = answer(policy, case)
                row = {"length": length, "tokens": len(case.prompt_ids), "depth": depth, "code": case.code,
                       "answer": text, "correct": answer_matches(text, case.code),
                       "seconds": round(time.perf_counter() - start, 2)}  # fmt: skip
                rows.append(row)
                if on_case is not None:
                    on_case(row)
    return rows


def accuracy_grid(rows: list[dict[str, Any]]) -> dict[int, dict[float, float]]:
    """length → depth → fraction correct."""
    grid: dict[int, dict[float, list[bool]]] = {}
    for row in rows:
        grid.setdefault(row["length"], {}).setdefault(row["depth"], []).append(row["correct"])
    return {n: {d: sum(v) / len(v) for d, v in by.items()} for n, by in grid.items()}


def long_finetune(
    policy: Policy, length: int, steps: int, lr: float = 1e-4, seed: int = 0, rank: int = 8, on_step: Any = None
) -> tuple[Policy, list[float]]:
    """LoRA SFT on `steps` generated needle documents of `length` tokens (random depths),
    loss on the answer tokens only; returns the adapted policy and the losses."""
    from ponder.config import LoraConfig
    from ponder.models.lora import apply_lora

    torch.manual_seed(seed)
    policy = apply_lora(policy, LoraConfig(r=rank, alpha=2 * rank))
    model = policy.model
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    rng = random.Random(seed)
    losses = []
    for step in range(steps):
        case = build_case(policy.tokenizer, length, rng.random(), seed=10_000 + step)
        ids = torch.tensor([case.prompt_ids + case.answer_ids], device=policy.device)
        labels = torch.full_like(ids, -100)
        labels[0, len(case.prompt_ids) :] = ids[0, len(case.prompt_ids) :]
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if on_step is not None:
            on_step(step, loss.item())
    model.eval()
    return policy, losses


def parse_lengths(text: str, trained: int) -> list[int]:
    """`1x,2x,4x` (multiples of the trained length) or token counts, comma-separated."""
    lengths = []
    for item in text.split(","):
        item = item.strip().lower()
        try:
            lengths.append(round(float(item[:-1]) * trained) if item.endswith("x") else int(item))
        except ValueError:
            raise ValueError(f"--lengths: {item!r} is neither a token count nor a multiple like 2x") from None
    if not lengths or min(lengths) < 16:
        raise ValueError(f"--lengths: need lengths of at least 16 tokens, got {text!r}")
    return lengths


@dataclass
class NeedleRun:
    """What `ponder needle` measures (see its --help)."""

    lengths: str = "1x,2x,4x"
    depths: str = "0,25,50,75,100"
    per_cell: int = 1
    seed: int = 0
    finetune_steps: int = 0
    finetune_length: str = "2x"
    finetune_lr: float = 1e-4


def run_needle(policy: Policy, run: NeedleRun, on_row: Any = None) -> dict[str, Any]:
    """Needles before (and, with finetune_steps, after) the long fine-tune."""
    config = policy.model.config
    rope = dict(getattr(config, "rope_parameters", None) or {})
    trained = int(rope.get("original_max_position_embeddings") or config.max_position_embeddings)
    lengths = parse_lengths(run.lengths, trained)
    try:
        depths = [float(d) / 100 for d in run.depths.split(",")]
    except ValueError:
        raise ValueError(f"--depths: percentages like 0,50,100, got {run.depths!r}") from None
    if any(not 0 <= d <= 1 for d in depths):
        raise ValueError(f"--depths: percentages in [0, 100], got {run.depths!r}")
    result: dict[str, Any] = {"trained_length": trained, "rope": rope, "lengths": lengths, "depths": depths}
    tag = (lambda stage: (lambda row: on_row({**row, "stage": stage}))) if on_row else (lambda stage: None)
    result["before"] = evaluate_needles(policy, lengths, depths, run.per_cell, run.seed, tag("before"))
    if run.finetune_steps > 0:
        length = parse_lengths(run.finetune_length, trained)[0]
        start = time.perf_counter()
        policy, losses = long_finetune(policy, length, run.finetune_steps, run.finetune_lr, run.seed)
        result["finetune"] = {"length": length, "steps": run.finetune_steps, "lr": run.finetune_lr,
                              "losses": losses, "seconds": round(time.perf_counter() - start, 1)}  # fmt: skip
        result["after"] = evaluate_needles(policy, lengths, depths, run.per_cell, run.seed, tag("after"))
    result["policy"] = policy
    return result
