"""The settings that take a recipe to a GPU, checked where they also apply on the CPU:
model.dtype auto, model.gradient_checkpointing, batches moved to the model's device."""

import pytest
import torch

from ponder.config import load_recipe
from ponder.models import tiny_policy
from ponder.models.loading import ModelLoadError, enable_gradient_checkpointing, resolve_dtype
from ponder.models.forward import forward_policy
from ponder.train.batch import TokenBatch
from ponder.models.prepare import fresh_trainable


def test_auto_dtype_is_float32_on_the_cpu_and_bad_names_say_which():
    assert resolve_dtype("auto", torch.device("cpu")) is torch.float32
    assert resolve_dtype("bfloat16", torch.device("cpu")) is torch.bfloat16
    with pytest.raises(ModelLoadError, match="unknown dtype 'fp8'.*auto, float32"):
        resolve_dtype("fp8", torch.device("cpu"))


def _loss_grads(policy, ids, mask):
    policy.model.train()
    policy.model.zero_grad(set_to_none=True)
    logprobs, _, _ = forward_policy(policy.model, ids, torch.ones_like(ids), loss_mask=mask)
    loss = -(logprobs * mask).sum() / mask.sum()
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}


def _assert_same_loss_and_grads(a, b, ids, mask):
    loss_a, grads_a = _loss_grads(a, ids, mask)
    loss_b, grads_b = _loss_grads(b, ids, mask)
    assert loss_a == pytest.approx(loss_b, abs=1e-6)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 0
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-5, atol=1e-7)


def test_gradient_checkpointing_gives_the_same_loss_and_gradient(trained_lora):
    """Checkpointing recomputes activations; it must not change the gradient."""
    ids = torch.randint(3, 200, (2, 24), generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(2, 23)
    mask[:, 10:] = 1.0
    torch.manual_seed(0)  # the same LoRA A matrices in both
    plain = trained_lora(tiny_policy(seed=0))
    torch.manual_seed(0)
    checkpointed = trained_lora(tiny_policy(seed=0))
    enable_gradient_checkpointing(checkpointed)
    assert checkpointed.model.get_base_model().is_gradient_checkpointing
    _assert_same_loss_and_grads(plain, checkpointed, ids, mask)


def test_recipe_turns_gradient_checkpointing_on():
    recipe = load_recipe(None, ["model.name=tiny", "model.gradient_checkpointing=true"])
    policy = fresh_trainable(tiny_policy(seed=0), recipe)
    assert policy.model.get_base_model().is_gradient_checkpointing


def test_batch_to_its_own_device_is_the_same_object():
    batch = TokenBatch(input_ids=torch.zeros(1, 3, dtype=torch.long), attention_mask=torch.ones(1, 3),
                       loss_mask=torch.ones(1, 2), old_logprobs=torch.zeros(1, 2), turn_ids=torch.zeros(1, 2),
                       rewards=torch.zeros(1), turn_rewards=torch.zeros(1, 1), turn_mask=torch.ones(1, 1),
                       group_ids=["g"])  # fmt: skip
    assert batch.to(torch.device("cpu")) is batch


def test_activation_offload_gives_the_same_loss_and_gradient(trained_lora):
    """What autograd saves goes to host memory and back (save_on_cpu): the same gradient,
    and the recipe's switch reaches the model however the policy was made."""
    from ponder.models.forward import saved_activations
    from ponder.models.prepare import prepare_policy

    ids = torch.randint(3, 200, (2, 24), generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(2, 23)
    mask[:, 5:] = 1.0
    torch.manual_seed(0)
    plain = trained_lora(tiny_policy(seed=0))
    torch.manual_seed(0)
    offloaded = trained_lora(tiny_policy(seed=0))
    recipe = load_recipe(None, ["model.name=tiny", "model.activation_offload=true"])
    offloaded = prepare_policy(recipe, offloaded)  # already adapted: only the settings applied
    assert offloaded.model.activation_offload and not getattr(plain.model, "activation_offload", False)
    assert isinstance(saved_activations(offloaded.model, ids), torch.autograd.graph.save_on_cpu)
    with torch.no_grad():  # no gradient: nothing is saved, nothing to move
        assert not isinstance(saved_activations(offloaded.model, ids), torch.autograd.graph.save_on_cpu)
    _assert_same_loss_and_grads(plain, offloaded, ids, mask)
    fresh = fresh_trainable(tiny_policy(seed=0), recipe)
    assert fresh.model.activation_offload
