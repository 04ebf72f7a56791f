"""A fused LoRA linear for training: PEFT's LoRA Linear with a faster exact forward.

PEFT computes a LoRA linear as base(x) + lora_B(lora_A(dropout(x))) * scaling: five
autograd nodes, and an elementwise multiply and add over the whole [tokens, out]
output in each direction. `LoraLinearFunction` computes the same thing with the scale
and the sum folded into one matrix product (`addmm_`) and a hand-written backward,
so the update step runs the same matrix products and none of those elementwise
passes. `FusedLoraLinear` uses it where it is exact: one active plain adapter, no
dropout, no LoRA bias, unmerged, adapters enabled, frozen base weights; with
adapters disabled (the reference pass) it runs the base layer alone, as PEFT does;
anything else goes through PEFT's own forward. The frozen products (x Wᵀ forward,
g W backward) go through `cpu_matmul.linear`, oneDNN or MKL, whichever measured
faster on this CPU, here and in every other frozen linear layer (the base layers, the
LM head: `FrozenLinear`).

With `lora.base_matmul_dtype: bfloat16` (or `auto` on a CPU with AVX-512 BF16 or AMX)
those frozen products run in bf16: each layer keeps a bf16 copy of its frozen weight
(`_base_weight`), the product's input is rounded to bf16 and its output returned in
fp32; the LoRA matrices, their products and gradients, the norms and the loss stay
fp32. An SFT step of the embedded model ran 1.3x faster, its LoRA gradient within
~2 % (relative norm) of the fp32 one (bench/train_dtype.py, docs/results/benchmarks.md).
This module imports PEFT; `apply_lora` imports it on first use.
"""

from __future__ import annotations

from typing import Any

import torch
from peft.tuners.lora.layer import Linear

from ponder.models.cpu_matmul import linear


def _product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x Wᵀ + b; a weight in a narrower dtype than x (the frozen base's bf16 copy) takes
    x rounded to it, and the product comes back in x's dtype, the bias added there."""
    if weight.dtype == x.dtype:
        return linear(x, weight, bias)
    out = linear(x.to(weight.dtype), weight).to(x.dtype)
    return out if bias is None else out.add_(bias)


class LoraLinearFunction(torch.autograd.Function):
    """y = x Wᵀ + b + s (x Aᵀ) Bᵀ with W and b frozen; gradients for x, A and B.

    Backward, with g = dL/dy and u = x Aᵀ saved from the forward:
    dL/dx = g W + s (g B) A,  dL/dA = s (g B)ᵀ x,  dL/dB = s gᵀ u.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        down = rows @ lora_a.t()
        out = _product(rows, weight, bias)
        out.addmm_(down, lora_b.t(), alpha=scaling)
        ctx.save_for_backward(rows, down, weight, lora_a, lora_b)
        ctx.scaling = scaling
        return out.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        rows, down, weight, lora_a, lora_b = ctx.saved_tensors
        scaling = ctx.scaling
        grad_rows = grad.reshape(-1, grad.shape[-1])
        grad_down = grad_rows @ lora_b
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = _product(grad_rows, weight.t()).addmm_(grad_down, lora_a, alpha=scaling)
            grad_x = grad_x.view(*grad.shape[:-1], weight.shape[1])
        grad_a = (grad_down.t() @ rows).mul_(scaling) if ctx.needs_input_grad[3] else None
        grad_b = (grad_rows.t() @ down).mul_(scaling) if ctx.needs_input_grad[4] else None
        return grad_x, None, None, grad_a, grad_b, None


class FrozenLinearFunction(torch.autograd.Function):
    """y = x Wᵀ + b with W and b frozen; dL/dx = g W."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(weight)
        return _product(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (weight,) = ctx.saved_tensors
        return _product(grad, weight.t()) if ctx.needs_input_grad[0] else None, None, None


def _frozen(layer: torch.nn.Linear) -> bool:
    return not layer.weight.requires_grad and (layer.bias is None or not layer.bias.requires_grad)


def fuse_lora_linears(model: Any, base_dtype: torch.dtype | None = None) -> int:
    """Give every PEFT LoRA Linear of `model` the fused forward, and every plain
    torch Linear the frozen one (used while it is frozen), their frozen products in
    `base_dtype` (default: the weights' own); returns how many LoRA linears were fused."""
    count = 0
    for module in model.modules():
        if type(module) is Linear:
            module.__class__ = FusedLoraLinear
            count += 1
        elif type(module) is torch.nn.Linear:
            module.__class__ = FrozenLinear
        if isinstance(module, FrozenLinear):
            module.base_dtype = base_dtype
    return count


def _base_weight(layer: torch.nn.Linear) -> torch.Tensor:
    """The frozen weight the products use: itself, or its copy in the layer's
    `base_dtype` (made once; remade if the weight was written, e.g. merged into)."""
    dtype = getattr(layer, "base_dtype", None)
    weight = layer.weight
    if dtype is None or dtype == weight.dtype:
        return weight
    stamp = (weight.data_ptr(), weight._version)
    if getattr(layer, "_copy_stamp", None) != stamp:
        layer._copy, layer._copy_stamp = weight.detach().to(dtype), stamp
    return layer._copy


def drop_base_copies(model: Any) -> int:
    """Free every frozen layer's copy in its `base_dtype` (the next product remakes it);
    returns how many were freed. A sampler built from the weights holds its own copy,
    so while it lives the training copies (270 MB on SmolLM2 in bf16) need not."""
    freed = 0
    for module in model.modules():
        if getattr(module, "_copy", None) is not None:
            module._copy = module._copy_stamp = None
            freed += 1
    return freed


class FrozenLinear(torch.nn.Linear):
    """torch's Linear; while its weight and bias are frozen, through FrozenLinearFunction."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _frozen(self):
            return FrozenLinearFunction.apply(x, _base_weight(self), self.bias)
        return super().forward(x)


class FusedLoraLinear(Linear):
    """PEFT's LoRA Linear; its forward takes `LoraLinearFunction` when that is exact,
    and the base layer alone when adapters are disabled (the reference pass)."""

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        base = self.base_layer
        plain_call = not args and not kwargs and isinstance(base, torch.nn.Linear)
        if self.disable_adapters and not self.merged and plain_call:
            return base(x)  # PEFT's forward does the same; base is a FrozenLinear when frozen
        name = self._fusable_adapter(x, args, kwargs)
        if name is None:
            return super().forward(x, *args, **kwargs)
        return LoraLinearFunction.apply(x, _base_weight(base), base.bias, self.lora_A[name].weight,
                                        self.lora_B[name].weight, float(self.scaling[name]))

    def _fusable_adapter(self, x: torch.Tensor, args: tuple, kwargs: dict) -> str | None:
        active = [name for name in self.active_adapters if name in self.lora_A]
        if args or kwargs or self.disable_adapters or self.merged or len(active) != 1:
            return None
        name = active[0]
        base, lora_a, lora_b = self.base_layer, self.lora_A[name], self.lora_B[name]
        plain = (
            name not in self.lora_variant
            and isinstance(self.lora_dropout[name], torch.nn.Identity)
            and lora_b.bias is None
            and not self.fan_in_fan_out
            and isinstance(base, torch.nn.Linear)
            and not base.weight.requires_grad
            and (base.bias is None or not base.bias.requires_grad)
            and x.dtype == base.weight.dtype == lora_a.weight.dtype == lora_b.weight.dtype
        )
        return name if plain else None
