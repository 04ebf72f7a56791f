"""One Tinker training client's model: a LoRA copy of the base model (PEFT, through
ponder.models.apply_lora), its AdamW, and the gradient its forward_backward calls
have accumulated since the last optim_step.

forward_backward follows Tinker's datum alignment: position t of `model_input`
predicts `target_tokens[t]`, so a datum of N input tokens has N targets, N loss
inputs and N output log-probs. The loss is the datum's per-token loss (serve/tinker/
losses.py) summed over every position of every datum; micro-batches of about
`token_budget` tokens each run their own backward, and since the loss is a plain sum
their gradients add up to the whole batch's exactly.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ponder.algos.utils import masked_sum
from ponder.config import LoraConfig
from ponder.models.adapters import load_adapter_weights, save_trained
from ponder.models.loading import Policy
from ponder.models.logprobs import logprobs_from_logits, position_ids_from_mask
from ponder.models.lora import apply_lora
from ponder.serve.tinker.losses import TinkerLoss
from ponder.train.optim import optimizer_step

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
# Tinker fixes LoRA's alpha (its cookbook's hyperparameter helpers assume 32): scaling alpha / rank.
LORA_ALPHA = 32
MANIFEST = "tinker.json"
OPTIMIZER_FILE = "optimizer.pt"


@dataclass(frozen=True)
class LoraLayout:
    """Where the adapters go (Tinker's LoraConfig). train_unembed is recorded but the
    unembedding gets no adapter: the embedded model ties it to the input embedding,
    so an adapter there could not be merged into the sampler's weights."""

    rank: int
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True

    def target_modules(self) -> list[str]:
        return [*(ATTENTION if self.train_attn else ()), *(MLP if self.train_mlp else ())]


@dataclass
class LossBatch:
    """One datum as tensors: input token ids [N], target ids [N], loss inputs [N] each."""

    tokens: torch.Tensor
    targets: torch.Tensor
    inputs: dict[str, torch.Tensor]


def lora_copy(base: Policy, layout: LoraLayout, seed: int) -> Policy:
    """A copy of `base` with fresh LoRA adapters (A from `seed`, B zero: the copy starts
    as the base). The base itself is left as it was."""
    with torch.random.fork_rng(devices=[base.device] if base.device.type == "cuda" else []):
        torch.manual_seed(seed)
        copied = replace(base, model=copy.deepcopy(base.model))
        config = LoraConfig(r=layout.rank, alpha=LORA_ALPHA, target_modules=layout.target_modules())
        return apply_lora(copied, config)


class TrainedModel:
    """A training client's model and optimizer (see module doc)."""

    def __init__(self, model_id: str, base_model: str, policy: Policy, layout: LoraLayout, seed: int) -> None:
        self.model_id = model_id
        self.base_model = base_model
        self.policy = policy
        self.layout = layout
        self.seed = seed
        self.steps = 0
        self.params = [p for p in policy.model.parameters() if p.requires_grad]
        self._new_optimizer()

    def _new_optimizer(self) -> None:
        # The learning rate, betas, eps and decay come with every optim_step (AdamParams).
        self.optimizer = torch.optim.AdamW(self.params, lr=1.0, weight_decay=0.0)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: 1.0)

    def forward_backward(self, data: list[LossBatch], loss: TinkerLoss, config: dict[str, float],
                         forward_only: bool, token_budget: int) -> tuple[list[np.ndarray], float]:  # fmt: skip
        """Each datum's target log-probs and the summed loss; gradients accumulate
        into the adapters unless `forward_only`."""
        outputs: list[np.ndarray] = []
        total = 0.0
        for part in micro_batches(data, token_budget):
            with torch.set_grad_enabled(not forward_only):
                logprobs, valid, inputs = self._logprobs(part)
                summed = masked_sum(loss.per_token(logprobs, inputs, config), valid)
                if not forward_only:
                    summed.backward()
            total += float(summed.detach())
            outputs += [row[: len(d.tokens)].detach().float().cpu().numpy() for row, d in zip(logprobs, part)]
        return outputs, total

    def _logprobs(self, part: list[LossBatch]) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """(log π(target) [B, T], valid [B, T], loss inputs [B, T]) for right-padded rows."""
        device = self.policy.device
        width = max(len(d.tokens) for d in part)
        pad = self.policy.tokenizer.pad_token_id or 0

        def stack(rows: list[torch.Tensor], fill: float) -> torch.Tensor:
            return torch.stack([torch.nn.functional.pad(r, (0, width - len(r)), value=fill) for r in rows]).to(device)

        ids = stack([d.tokens for d in part], pad)
        targets = stack([d.targets for d in part], 0)
        valid = stack([torch.ones_like(d.tokens) for d in part], 0)
        inputs = {name: stack([d.inputs[name] for d in part], 0.0) for name in part[0].inputs}
        out = self.policy.model(input_ids=ids, attention_mask=valid, position_ids=position_ids_from_mask(valid),
                                use_cache=False)  # fmt: skip
        return logprobs_from_logits(out.logits, targets), valid, inputs

    def optim_step(self, learning_rate: float, betas: tuple[float, float], eps: float, weight_decay: float,
                   grad_clip_norm: float) -> dict[str, float]:  # fmt: skip
        """One AdamW step with these hyperparameters (torch.optim.AdamW's update:
        decoupled decay lr·wd·θ, bias-corrected moments), through ponder's shared step
        (gradient clipping when grad_clip_norm > 0, a NaN gradient refused)."""
        for group in self.optimizer.param_groups:
            group.update(lr=learning_rate, betas=betas, eps=eps, weight_decay=weight_decay)
        grad_norm, _ = optimizer_step(self.params, self.optimizer, self.scheduler, grad_clip_norm or None)
        self.steps += 1
        return {"grad_norm": grad_norm, "learning_rate": learning_rate}

    def save(self, directory: Path, with_optimizer: bool) -> None:
        """The adapter in PEFT's layout (ponder's adapter format: `ponder serve --adapter`
        serves it), the optimizer's state when asked, and the manifest last."""
        directory.mkdir(parents=True, exist_ok=True)
        save_trained(self.policy, directory)
        if with_optimizer:
            torch.save(self.optimizer.state_dict(), directory / f".{OPTIMIZER_FILE}.tmp")
            os.replace(directory / f".{OPTIMIZER_FILE}.tmp", directory / OPTIMIZER_FILE)
        manifest = {"model_id": self.model_id, "base_model": self.base_model, "lora": asdict(self.layout),
                    "steps": self.steps, "optimizer": with_optimizer}  # fmt: skip
        (directory / f".{MANIFEST}.tmp").write_text(json.dumps(manifest, indent=2) + "\n")
        os.replace(directory / f".{MANIFEST}.tmp", directory / MANIFEST)

    def load(self, directory: Path, with_optimizer: bool) -> None:
        """Weights saved by `save` (a layout of the same shape); the optimizer's state
        too when asked, else a fresh optimizer. Pending gradients are dropped."""
        load_adapter_weights(self.policy.model, directory)
        self.optimizer.zero_grad(set_to_none=True)
        if with_optimizer:
            state = torch.load(directory / OPTIMIZER_FILE, map_location=self.policy.device, weights_only=True)
            self.optimizer.load_state_dict(state)
        else:
            self._new_optimizer()
        self.steps = int(read_manifest(directory).get("steps", 0))


def read_manifest(directory: Path) -> dict[str, Any]:
    """A checkpoint's tinker.json: model_id, base_model, lora (LoraLayout's fields), steps."""
    return json.loads((directory / MANIFEST).read_text())


def micro_batches(data: list[LossBatch], token_budget: int) -> list[list[LossBatch]]:
    """Consecutive datums grouped so each group's rows × longest row stays within
    `token_budget` (a longer datum is a group of its own)."""
    groups: list[list[LossBatch]] = []
    current: list[LossBatch] = []
    for datum in data:
        width = max([len(d.tokens) for d in current] + [len(datum.tokens)])
        if current and width * (len(current) + 1) > token_budget:
            groups.append(current)
            current = []
        current.append(datum)
    return groups + ([current] if current else [])
