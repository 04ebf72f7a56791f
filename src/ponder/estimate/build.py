"""An estimate from a recipe: the device (named, or this machine's), the model's and
teacher's shapes from their configs (models/model_config.py: no weights loaded)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ponder.config import Recipe
from ponder.estimate import formulas as f
from ponder.estimate.devices import Device, gpu, gpu_from_torch_name, known_devices, this_cpu
from ponder.estimate.recipe import Estimate, Inputs, Tokens, estimate, precision, trainable


def resolve_device(name: str | None, recipe: Recipe) -> tuple[Device, bool]:
    """(device, calibrated): --device NAME, else this machine: its GPU when torch sees
    one the table knows and model.device allows it, else its CPU."""
    if name is not None and name.lower() != "cpu":
        return gpu(name), True
    if name is None and recipe.model.device != "cpu":
        import torch

        if torch.cuda.is_available():
            found = gpu_from_torch_name(torch.cuda.get_device_name(0))
            if found is None:
                raise ValueError(f"this machine's GPU '{torch.cuda.get_device_name(0)}' is not in the device table; "
                                 f"give --device (known: {', '.join(known_devices())})")  # fmt: skip
            return found, True
    return this_cpu()


def model_shape(name: str) -> f.ModelShape:
    """The shape of the model `name` (anything model.name takes), from its config."""
    from ponder.models.model_config import read_model_config

    return f.shape_from_config(read_model_config(name))


def teacher_shape(recipe: Recipe) -> f.ModelShape | None:
    """The in-process teacher of algo.distill_coef (the largest of a per-kind mapping);
    None without one or for a teacher behind a URL."""
    if recipe.algo.distill_coef == 0 or not recipe.teacher.model:
        return None
    model = recipe.teacher.model
    names = sorted(set(model.values())) if isinstance(model, dict) else [model]
    local = [name for name in names if not str(name).startswith(("http://", "https://"))]
    shapes = [model_shape(name) for name in local]
    return max(shapes, key=f.parameter_count) if shapes else None


def build_estimate(recipe: Recipe, device: str | None = None, devices: int = 1, tokens: Tokens | None = None,
                   compute_util: float | None = None, bandwidth_util: float | None = None) -> Estimate:  # fmt: skip
    """The estimate of `recipe` on `devices` x `device` (None: this machine), at the
    device's utilisation unless compute_util (MFU) or bandwidth_util replace it."""
    if devices < 1:
        raise ValueError(f"--devices must be at least 1, got {devices}")
    chosen, calibrated = resolve_device(device, recipe)
    for name, value in (("--mfu", compute_util), ("--bandwidth-util", bandwidth_util)):
        if value is not None and not 0 < value <= 1:
            raise ValueError(f"{name} must be in (0, 1], got {value}")
    chosen = replace(chosen, compute_util=compute_util or chosen.compute_util,
                     bandwidth_util=bandwidth_util or chosen.bandwidth_util)  # fmt: skip
    shape = model_shape(recipe.model.name)
    inputs = Inputs(recipe, shape, chosen, devices, tokens, teacher_shape(recipe))
    train = trainable(recipe, shape, precision(recipe, chosen).weights)
    model: dict[str, Any] = {"name": recipe.model.name, "model_type": shape.model_type,
                             "parameters": f.parameter_count(shape), "trainable": train.parameters,
                             "shape": shape.__dict__.copy()}  # fmt: skip
    return estimate(inputs, model, calibrated)
