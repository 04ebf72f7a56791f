"""forward_policy's shared-prefix pass against the plain one."""

import pytest
import torch

import ponder.models.forward as forward
from ponder.models import tiny_policy
from ponder.models.forward import common_prefix_length, forward_policy


@pytest.fixture(scope="module")
def lora_policy(trained_lora):
    return trained_lora(tiny_policy(seed=0))


def right_padded(rows: list[list[int]], prompt: int):
    """input_ids, attention_mask [B, L] and a loss_mask [B, L-1] over each row's response."""
    width = max(map(len, rows))
    input_ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    loss_mask = torch.zeros(len(rows), width - 1)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention_mask[i, : len(row)] = 1
        loss_mask[i, prompt - 1 : len(row) - 1] = 1
    return input_ids, attention_mask, loss_mask


def logprobs_and_grads(policy, input_ids, attention_mask, loss_mask, minimum, monkeypatch):
    monkeypatch.setattr(forward, "MIN_SHARED_PREFIX", minimum)
    calls = []
    hook = policy.model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(kwargs["input_ids"].shape),
                                                  with_kwargs=True)
    policy.model.zero_grad()
    logprobs, _, _ = forward_policy(policy.model, input_ids, attention_mask, 0.7, loss_mask=loss_mask)
    (logprobs * loss_mask).sum().backward()
    hook.remove()
    grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
    return logprobs.detach(), grads, calls


def test_reading_the_shared_prompt_once_changes_neither_logprobs_nor_gradients(lora_policy, monkeypatch):
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(5, 300, (20,), generator=generator).tolist()
    rows = [prompt + torch.randint(5, 300, (n,), generator=generator).tolist() for n in (5, 9, 7)]
    input_ids, attention_mask, loss_mask = right_padded(rows, len(prompt))
    shared, shared_grads, shared_calls = logprobs_and_grads(lora_policy, input_ids, attention_mask, loss_mask, 8,
                                                            monkeypatch)
    plain, plain_grads, plain_calls = logprobs_and_grads(lora_policy, input_ids, attention_mask, loss_mask, 10**9,
                                                         monkeypatch)
    # the shared pass reads the 19 prompt tokens before the first kept position once
    assert shared_calls == [(1, 19), (3, input_ids.shape[1] - 19)] and plain_calls == [tuple(input_ids.shape)]
    assert torch.allclose(shared, plain, atol=1e-6)
    assert plain.abs().sum() > 1.0
    assert set(shared_grads) == set(plain_grads) and len(plain_grads) > 0
    for name, grad in plain_grads.items():
        assert torch.allclose(shared_grads[name], grad, rtol=1e-4, atol=1e-6), name


def test_common_prefix_length_by_hand():
    ids = torch.tensor([[1, 2, 3, 4, 5], [1, 2, 3, 9, 0], [1, 2, 3, 4, 7]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    assert common_prefix_length(ids, mask, torch.tensor([3, 4])) == 3  # rows differ at position 3
    assert common_prefix_length(ids, mask, torch.tensor([1, 2])) == 1  # capped below the first kept position
    assert common_prefix_length(ids[[0, 2]], mask[[0, 2]], torch.tensor([4])) == 4
    same = torch.tensor([[1, 2, 0], [1, 2, 0]])
    assert common_prefix_length(same, torch.tensor([[1, 1, 0], [1, 1, 0]]), torch.tensor([2])) == 2  # padding is not shared
    assert common_prefix_length(ids[:1], mask[:1], torch.tensor([3])) == 0  # one row: nothing to share
