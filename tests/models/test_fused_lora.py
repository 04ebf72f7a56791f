"""The fused LoRA linear against PEFT's own forward: same outputs, same gradients."""

import pickle

import pytest
import torch
from peft.tuners.lora.layer import Linear

from ponder.config import LoraConfig, SamplingConfig
from ponder.models import apply_lora, tiny_policy
from ponder.models.lora_fused import (
    FrozenLinear, FusedLoraLinear, LoraLinearFunction, drop_base_copies, fuse_lora_linears,
)
from ponder.rollout.hf import HFBackend


def _loss_and_grads(model, input_ids):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=input_ids, use_cache=False).logits
    loss = (logits.log_softmax(-1)[..., 7] * torch.linspace(-1, 1, logits.shape[1])).sum()
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads


def _with_class(model, cls):
    for module in model.modules():
        if isinstance(module, Linear):
            module.__class__ = cls


@pytest.mark.parametrize("kernel", ["blas", "onednn"])
def test_fused_lora_matches_peft_forward_and_gradients(kernel, trained_lora, monkeypatch):
    monkeypatch.setenv("PONDER_MATMUL", kernel)  # the frozen products through MKL or oneDNN
    policy = trained_lora(tiny_policy(seed=0))
    model = policy.model
    assert sum(type(m) is FusedLoraLinear for m in model.modules()) == 14  # 2 layers x 7 linears
    assert type(model.get_output_embeddings()) is FrozenLinear
    input_ids = torch.randint(5, 400, (3, 11), generator=torch.Generator().manual_seed(0))
    fused_logits, fused_grads = _loss_and_grads(model, input_ids)
    _with_class(model, Linear)  # PEFT's own forward
    model.get_output_embeddings().__class__ = torch.nn.Linear
    peft_logits, peft_grads = _loss_and_grads(model, input_ids)
    assert torch.allclose(fused_logits, peft_logits, rtol=1e-5, atol=1e-6)
    assert fused_grads.keys() == peft_grads.keys() and len(fused_grads) == 28  # A and B of 14 linears
    for name, grad in peft_grads.items():
        assert float((fused_grads[name] - grad).norm() / grad.norm()) < 1e-5, (name, float((fused_grads[name] - grad).norm() / grad.norm()))
        assert grad.abs().sum() > 0


def test_lora_linear_function_hand_computed():
    # x = [1, 2], W = [[1, 0], [0, 1]], A = [[1, 1]], B = [[2], [3]], s = 0.5:
    # u = x Aᵀ = 3, y = x + 0.5 * 3 * [2, 3] = [4, 6.5].
    # L = y · [1, 1]: g = [1, 1]; g B = 5; dx = g W + 0.5 * 5 * A = [3.5, 3.5];
    # dA = 0.5 * 5 * x = [2.5, 5]; dB = 0.5 * gᵀ u = [1.5, 1.5].
    x = torch.tensor([[1.0, 2.0]], requires_grad=True)
    a = torch.tensor([[1.0, 1.0]], requires_grad=True)
    b = torch.tensor([[2.0], [3.0]], requires_grad=True)
    y = LoraLinearFunction.apply(x, torch.eye(2), None, a, b, 0.5)
    assert y.tolist() == [[4.0, 6.5]]
    y.sum().backward()
    assert x.grad.tolist() == [[3.5, 3.5]] and a.grad.tolist() == [[2.5, 5.0]] and b.grad.tolist() == [[1.5], [1.5]]


def test_disabled_adapters_and_dropout_take_peft_path(trained_lora):
    policy = trained_lora(tiny_policy(seed=0))
    input_ids = torch.randint(5, 400, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        with_adapters = policy.model(input_ids=input_ids).logits
        with policy.model.disable_adapter():
            base = policy.model(input_ids=input_ids).logits
    assert not torch.allclose(with_adapters, base)  # the reference pass really drops the adapters
    dropout = apply_lora(tiny_policy(seed=0), LoraConfig(r=4, alpha=8, dropout=0.5))
    linear = next(m for m in dropout.model.modules() if type(m) is FusedLoraLinear)
    assert linear._fusable_adapter(torch.zeros(1, 64), (), {}) is None
    assert fuse_lora_linears(torch.nn.Linear(2, 2)) == 0
    assert type(pickle.loads(pickle.dumps(linear))) is FusedLoraLinear  # e.g. sent to a Ray worker


def test_merged_adapters_give_the_same_output(trained_lora):
    policy = trained_lora(tiny_policy(seed=0))
    input_ids = torch.randint(5, 400, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = policy.model(input_ids=input_ids).logits
        policy.model.merge_adapter()
        after = policy.model(input_ids=input_ids).logits
    assert torch.allclose(before, after, atol=1e-5)


def test_lora_linear_function_scale_invariance():
    # (s, B) and (s c, B / c) are the same adapter: same output and input gradient, and
    # the gradient of B' = B / c is c times B's (dL/dB' = s c gᵀ u).
    generator = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 5, 6, generator=generator), torch.randn(3, 6, generator=generator)
    a, b = torch.randn(2, 6, generator=generator), torch.randn(3, 2, generator=generator)
    results = []
    for c in (1.0, 4.0):
        xs, bs = x.clone().requires_grad_(), (b / c).requires_grad_()
        y = LoraLinearFunction.apply(xs, w, None, a, bs, 0.5 * c)
        (y * torch.arange(3.0)).sum().backward()
        results.append((y.detach(), xs.grad, bs.grad))
    assert torch.allclose(results[0][0], results[1][0], atol=1e-5)
    assert torch.allclose(results[0][1], results[1][1], atol=1e-5)
    assert torch.allclose(results[1][2], 4.0 * results[0][2], rtol=1e-5)


def test_bf16_base_products_round_only_the_frozen_matmuls():
    """lora.base_matmul_dtype=bfloat16: the frozen product is x and W rounded to bf16
    (a hand-checkable case: values bf16 cannot hold), the LoRA term stays fp32; on
    the tiny model the gradients stay within a few % of the fp32 ones; the bf16 copy
    follows a write to the weight."""
    x = torch.tensor([[1.0 + 2**-10, 3.0]])  # 1 + 2^-10 rounds to 1.0 in bf16 (8 bits of mantissa)
    weight = torch.tensor([[1.0, 1.0 + 2**-9]])  # rounds to 1.0 too
    a, b = torch.tensor([[1.0 + 2**-10, 0.0]]), torch.tensor([[1.0]])
    y = LoraLinearFunction.apply(x, weight.bfloat16(), None, a, b, 1.0)
    assert y.dtype == torch.float32
    # frozen: 1 * 1 + 3 * 1 = 4 (fp32 would give 4 + 2^-10 + 3 * 2^-9); LoRA: (1 + 2^-10)^2 exactly
    assert float(y) == 4.0 + (1.0 + 2**-10) ** 2
    dtypes = ("float32", "bfloat16")
    policies = [apply_lora(tiny_policy(seed=0), LoraConfig(base_matmul_dtype=d)) for d in dtypes]
    for policy in policies:  # the same non-zero adapters on both
        generator = torch.Generator().manual_seed(1)
        for name, param in policy.model.named_parameters():
            if "lora_" in name:
                param.data.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    input_ids = torch.randint(5, 400, (3, 11), generator=torch.Generator().manual_seed(0))
    (exact_logits, exact), (bf16_logits, rounded) = (_loss_and_grads(p.model, input_ids) for p in policies)
    assert 0 < float((bf16_logits - exact_logits).abs().max()) < 0.05 * float(exact_logits.abs().max())
    for name, grad in exact.items():
        assert float((rounded[name] - grad).norm() / grad.norm()) < 0.1, name
    head = policies[1].model.get_output_embeddings()
    copy = head._copy
    assert copy.dtype == torch.bfloat16 and torch.equal(copy, head.weight.detach().bfloat16())
    with torch.no_grad():
        head.weight.mul_(2.0)  # a write (a merge, a load) makes the next product use a fresh copy
    again = _loss_and_grads(policies[1].model, input_ids)
    assert torch.equal(head._copy, head.weight.detach().bfloat16())
    # a sampler built from the policy frees the copies; the next product remakes them, the same
    HFBackend(policies[1], SamplingConfig()).sampling_model()
    assert all(getattr(m, "_copy", None) is None for m in policies[1].model.modules())
    remade = _loss_and_grads(policies[1].model, input_ids)
    assert torch.equal(remade[0], again[0]) and torch.equal(head._copy, head.weight.detach().bfloat16())
    frozen = [m for m in policies[1].model.modules() if isinstance(m, FrozenLinear) and not m.weight.requires_grad]
    assert drop_base_copies(policies[1].model) == len(frozen)  # one copy per frozen product
    with pytest.raises(ValueError, match="lora.base_matmul_dtype: unknown 'half'"):
        apply_lora(tiny_policy(seed=0), LoraConfig(base_matmul_dtype="half"))
