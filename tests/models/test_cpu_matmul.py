"""cpu_matmul: both libraries compute the same products; the choice is measured or forced."""

import json
import os
import subprocess
import sys

import pytest
import torch

from ponder.models import cpu_matmul
from ponder.models.lora_fused import FrozenLinear, FrozenLinearFunction, fuse_lora_linears


@pytest.mark.parametrize("kernel", ["blas", "onednn", "auto"])
def test_linear_hand_computed(kernel, monkeypatch):
    # x = [[1, 2]], W = [[1, 0], [2, 1], [0, 3]], b = [1, 0, -1]: x Wᵀ + b = [2, 4, 5]
    monkeypatch.setenv(cpu_matmul.ENV_VAR, kernel)
    x = torch.tensor([[1.0, 2.0]])
    weight = torch.tensor([[1.0, 0.0], [2.0, 1.0], [0.0, 3.0]])
    assert cpu_matmul.linear(x, weight, torch.tensor([1.0, 0.0, -1.0])).tolist() == [[2.0, 4.0, 5.0]]
    # Wᵀ (a transposed view) as the weight: [1, 2, 3] @ W = [5, 11]
    assert cpu_matmul.linear(torch.tensor([[1.0, 2.0, 3.0]]), weight.t()).tolist() == [[5.0, 11.0]]


@pytest.mark.parametrize("kernel", ["blas", "onednn"])
def test_linear_matches_torch_on_batched_strided_inputs(kernel, monkeypatch):
    monkeypatch.setenv(cpu_matmul.ENV_VAR, kernel)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 40, generator=generator)
    weight = torch.randn(40, 24, generator=generator).t()  # [24, 40], not contiguous
    bias = torch.randn(24, generator=generator)
    expected = x @ weight.t() + bias
    assert torch.allclose(cpu_matmul.linear(x, weight, bias), expected, atol=1e-5)
    # rows are independent: each row alone gives the same result (invariance to batching)
    alone = torch.stack([cpu_matmul.linear(x[i : i + 1], weight, bias)[0] for i in range(3)])
    assert torch.allclose(alone, expected, atol=1e-5)


def test_unknown_kernel_is_refused(monkeypatch):
    monkeypatch.setenv(cpu_matmul.ENV_VAR, "cublas")
    with pytest.raises(ValueError, match="PONDER_MATMUL='cublas'.*auto, blas, onednn"):
        cpu_matmul.linear(torch.ones(1, 2), torch.ones(2, 2))


def test_packing_is_forced_or_measured_once_per_shape(monkeypatch):
    weight = torch.randn(64, 32)
    packed = cpu_matmul.pack(weight)
    x = torch.randn(8, 32)
    assert torch.allclose(cpu_matmul.onednn_linear(x, packed, None), x @ weight.t(), atol=1e-5)
    monkeypatch.setenv(cpu_matmul.ENV_VAR, "onednn")
    assert cpu_matmul.packing_wins(weight, packed) is True
    monkeypatch.setenv(cpu_matmul.ENV_VAR, "blas")
    assert cpu_matmul.packing_wins(weight, packed) is False
    monkeypatch.setenv(cpu_matmul.ENV_VAR, "auto")
    monkeypatch.setattr(cpu_matmul, "_PACKING_VERDICTS", {})
    verdict = cpu_matmul.packing_wins(weight, packed)
    assert cpu_matmul._PACKING_VERDICTS == {(64, 32): verdict}
    monkeypatch.setattr(cpu_matmul, "best_time", lambda *a, **k: pytest.fail("measured twice"))
    assert cpu_matmul.packing_wins(torch.zeros(64, 32), packed) == verdict


@pytest.mark.parametrize("kernel", ["blas", "onednn"])
def test_frozen_linear_hand_computed_gradient(kernel, monkeypatch):
    # y = x Wᵀ, L = y · [1, 2, 3]: dL/dx = [1, 2, 3] W = [5, 11] for W above
    monkeypatch.setenv(cpu_matmul.ENV_VAR, kernel)
    x = torch.tensor([[1.0, 2.0]], requires_grad=True)
    weight = torch.tensor([[1.0, 0.0], [2.0, 1.0], [0.0, 3.0]])
    (FrozenLinearFunction.apply(x, weight, None) * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert x.grad.tolist() == [[5.0, 11.0]]


def test_frozen_linear_only_while_frozen():
    layer = torch.nn.Linear(4, 3)
    assert fuse_lora_linears(layer) == 0 and type(layer) is FrozenLinear
    x = torch.randn(2, 4)
    out = layer(x)
    # trainable: torch's own path
    assert out.grad_fn is not None and "FrozenLinear" not in type(out.grad_fn).__name__
    out.sum().backward()
    assert layer.weight.grad is not None  # a trainable weight still gets its gradient
    layer.requires_grad_(False)
    assert "FrozenLinearFunction" in type(layer(x.requires_grad_()).grad_fn).__name__
    assert torch.allclose(layer(x), x @ layer.weight.t() + layer.bias, atol=1e-6)


def test_verdicts_are_kept_per_machine_so_every_process_rounds_alike(tmp_path, monkeypatch):
    """A resumed run must pick the same library as the run it continues, even when the
    CPU is loaded differently: the first measurement is kept on disk and wins."""
    monkeypatch.setenv("PONDER_CACHE_DIR", str(tmp_path))
    assert cpu_matmul._verdict("linear/8", lambda: True) is True
    assert cpu_matmul._verdict("linear/8", lambda: False) is True  # kept, not re-measured
    assert cpu_matmul._verdict("linear/16", lambda: False) is False
    kept = json.loads(cpu_matmul._verdict_file().read_text())
    assert kept == {"linear/8": True, "linear/16": False}
    cpu_matmul._verdict_file().write_text("{not json")
    assert cpu_matmul._verdict("linear/8", lambda: False) is False  # a damaged file is measured anew


def test_onednn_primitive_cache_is_bounded_unless_the_user_set_it():
    # a fresh interpreter each: oneDNN reads the variable once, at its first primitive
    probe = ("import os, sys; from ponder.models import cpu_matmul; import torch; "
             "cpu_matmul.linear(torch.ones(3, 4), torch.ones(5, 4), None); "
             "print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'])")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != cpu_matmul.PRIMITIVE_CACHE}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["64"]
    env[cpu_matmul.PRIMITIVE_CACHE] = "7"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["7"]
