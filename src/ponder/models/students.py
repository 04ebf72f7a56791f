"""Smaller students for distillation: a model with k of its teacher's decoder layers.

`layers_to_keep(n, k)` spreads the kept layers evenly over the depth, the first and
the last always among them (the layers nearest the embeddings and the head matter
most in the layer-pruning studies); `drop_layers` builds the smaller model with
those layers' weights and the teacher's embeddings, final norm and head; `write_student`
writes it as a standard Hugging Face model directory (what `ponder export
--keep-layers K` does), which transformers and vLLM load and ponder trains as any
model (`model.name=DIR`, then distilled from the teacher: `teacher.model=...`).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch

from ponder.fileio import atomic_dir
from ponder.models.loading import load_policy


def layers_to_keep(n_layers: int, keep: int) -> list[int]:
    """`keep` layer indices out of `n_layers`, evenly spaced, 0 and n_layers-1 included."""
    if not 1 <= keep <= n_layers:
        raise ValueError(f"--keep-layers {keep}: the model has {n_layers} decoder layers; keep 1 to {n_layers}")
    if keep == 1:
        return [n_layers - 1]
    return sorted({int(i * (n_layers - 1) / (keep - 1) + 0.5) for i in range(keep)})  # halves round up


def drop_layers(model: Any, keep: list[int]) -> Any:
    """A copy of the causal LM `model` with only decoder layers `keep` (in order),
    renumbered 0..k-1 (each attention's layer_idx, which indexes the KV cache)."""
    small = copy.deepcopy(model)
    layers = small.model.layers
    small.model.layers = torch.nn.ModuleList([layers[i] for i in keep])
    for index, layer in enumerate(small.model.layers):
        if hasattr(layer, "self_attn") and hasattr(layer.self_attn, "layer_idx"):
            layer.self_attn.layer_idx = index
    small.config.num_hidden_layers = len(keep)
    if getattr(small.config, "layer_types", None):
        small.config.layer_types = [small.config.layer_types[i] for i in keep]
    return small


def write_student(source: str, keep: int, out: str | os.PathLike[str]) -> tuple[Path, list[int]]:
    """`source` (any model ponder loads: a run, a HF directory, the embedded model) with
    `keep` of its decoder layers, as a HF model directory at `out` (new or empty),
    written whole or not at all. Returns the directory and the kept layer indices."""
    with atomic_dir(out) as staging:  # a taken --out fails here, before the model loads
        policy = load_policy(source, "float32", "cpu")
        kept = layers_to_keep(policy.model.config.num_hidden_layers, keep)
        student = drop_layers(policy.model, kept)
        student.save_pretrained(staging, safe_serialization=True)
        policy.tokenizer.save_pretrained(staging)
    return Path(out), kept
