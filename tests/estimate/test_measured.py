"""The estimate against one measured training step: the tiny random model with LoRA
(and fully fine-tuned), one forward/backward and ponder's optimizer step. Parameters,
gradients and AdamW state are counted exactly from the tensors and must match the
prediction byte for byte; the process's peak RSS only loosely (no timing is asserted)."""

import pytest
import torch

from ponder.config import LoraConfig, OptimConfig, load_recipe
from ponder.estimate import formulas as f
from ponder.estimate.devices import Device
from ponder.estimate.recipe import Inputs, memory_lines, peak_lines
from ponder.models import apply_lora, tiny_policy
from ponder.models.memory import peak_rss_gb
from ponder.models.model_config import read_model_config
from ponder.train.optim import build_optimizer, optimizer_step

CPU = Device("cpu", "test CPU", 0.1, 0.1, 10.0, 0.0, bf16=False, compute_util=0.5, bandwidth_util=0.5)


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _one_step(lora: bool) -> dict[str, int]:
    """Train the tiny model one step; the bytes of its parts, counted from the tensors."""
    torch.manual_seed(0)
    policy = tiny_policy()
    if lora:
        policy = apply_lora(policy, LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    else:
        for parameter in policy.model.parameters():
            parameter.requires_grad_(True)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer, scheduler = build_optimizer(params, OptimConfig(lr=1e-3), total_steps=1)
    policy.model.train()
    ids = torch.randint(0, policy.model.config.vocab_size, (2, 12))
    policy.model(input_ids=ids, labels=ids).loss.backward()
    gradients = _bytes(p.grad for p in params)
    optimizer_step(params, optimizer, scheduler, max_grad_norm=1.0)
    state = _bytes(v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))
    frozen = _bytes(p for p in policy.model.parameters() if not p.requires_grad)
    return {"trainable": _bytes(params), "gradients": gradients, "optimizer": state, "frozen": frozen,
            "config": policy.model.config.to_dict(), "steps": len(optimizer.state)}  # fmt: skip


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_parameter_gradient_and_adam_bytes_match_exactly(lora):
    measured = _one_step(lora)
    recipe = load_recipe(None, ["model.name=tiny", "model.dtype=float32", f"lora.enabled={str(lora).lower()}",
                                "lora.r=4", "lora.target_modules=[q_proj, v_proj, down_proj]"])  # fmt: skip
    shape = f.shape_from_config(measured["config"])
    assert shape == f.shape_from_config(read_model_config("tiny"))  # the estimate reads the same config
    predicted = {line.key: line.value for line in memory_lines(Inputs(recipe, shape, CPU))}
    if lora:
        assert predicted["weights"] == measured["frozen"]
        assert predicted["trainable"] == measured["trainable"]
    else:
        assert predicted["weights"] == measured["trainable"] and measured["frozen"] == 0
    assert predicted["gradients"] == measured["gradients"]
    assert predicted["optimizer"] == measured["optimizer"]
    if lora:
        assert measured["steps"] == 2 * 3 * shape.num_layers  # A and B of 3 modules, each with its step counter


def test_peak_rss_is_of_the_predicted_order():
    _one_step(lora=True)
    recipe = load_recipe(None, ["model.name=tiny", "lora.r=4", "sft.steps=1", "train.steps=1"])
    shape = f.shape_from_config(read_model_config("tiny"))
    peaks = {line.key: line.value for line in peak_lines(recipe, memory_lines(Inputs(recipe, shape, CPU)))}
    rss = peak_rss_gb() * 1e9
    # the tiny model is a few MB; both are the runtime (torch, transformers) within a factor
    assert 0.2 < peaks["peak_update"] / rss < 5
