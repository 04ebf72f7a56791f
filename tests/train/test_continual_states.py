"""The stateful continual-learning pieces (train/continual.py) by hand: MAS's importance
on a linear 'model', SI's path integral over scripted steps, DER++'s stored logits;
and the method registry's checks (train/continual_methods.py)."""

import pytest
import torch

from ponder.config import ContinualConfig, LoraConfig
from ponder.data import ChatFormatter, Conversation, TokenizedExample
from ponder.models import Policy, apply_lora, tiny_policy
from ponder.algos.continual import derpp_logit_term
from ponder.train.continual import (
    MASState,
    SIState,
    assistant_logits,
    mas_importance,
    record_logits,
    stored_logits_batch,
)
from ponder.train.continual_methods import CONTINUAL_METHODS, check_continual, resolve_method
from ponder.train.sft import sft_batch


class _Linear(torch.nn.Module):
    """logits = W[:, token]: a 'model' whose gradients are easy to compute by hand."""

    def __init__(self, weight):
        super().__init__()
        self.weight = torch.nn.Parameter(weight)

    def forward(self, input_ids, attention_mask=None, logits_to_keep=0, **_):
        logits = self.weight[:, input_ids].permute(1, 2, 0)
        if isinstance(logits_to_keep, torch.Tensor):
            logits = logits[:, logits_to_keep]
        return type("Out", (), {"logits": logits, "hidden_states": None})()


def _policy(model):
    return Policy(model, type("Tok", (), {"pad_token_id": 0})(), "lin", torch.device("cpu"))


def test_mas_importance_and_penalty_by_hand():
    weight = torch.zeros(3, 3)
    weight[:, 1] = torch.tensor([1.0, -2.0, 0.5])
    policy = _policy(_Linear(weight))
    # tokens [1, 2], the second is an assistant token: the logits read are W[:, 1], F = ‖W[:, 1]‖²,
    # ∂F/∂W[v, 1] = 2·W[v, 1], so Ω = |2·W[:, 1]| = [2, 4, 1] in column 1 and 0 elsewhere
    examples = [TokenizedExample([1, 2], [0, 1])] * 2
    expected = torch.zeros(3, 3)
    expected[:, 1] = torch.tensor([2.0, 4.0, 1.0])
    assert torch.allclose(mas_importance(policy, examples)["weight"], expected)
    mas = MASState(weight=0.5)
    mas.consolidate(policy, examples)
    assert float(mas.penalty(policy).detach()) == 0.0  # at the anchor
    with torch.no_grad():
        policy.model.weight[1, 1] += 3.0
        policy.model.weight[0, 0] += 9.0  # importance 0: free to move
    assert float(mas.penalty(policy).detach()) == pytest.approx(0.5 * 4.0 * 9.0)


class _Weights(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(2))


def test_si_path_integral_importance_and_pull_back_by_hand():
    policy = _policy(_Weights())
    param = policy.model.w
    si = SIState(c=2.0, xi=0.01)
    si.begin_task(policy)
    # two scripted steps: (task gradient, weights after the step)
    for grad, after in (([1.0, -1.0], [-0.1, 0.1]), ([0.5, 0.0], [-0.2, 0.1])):
        param.grad = torch.tensor(grad)
        assert si.after_backward(policy, [param]) == {"sft/si_penalty": 0.0}  # no earlier task yet
        with torch.no_grad():
            param.copy_(torch.tensor(after))
        si.after_step(policy, [param])
    # ω = [0.1 + 0.05, 0.1 + 0]; Δ = [−0.2, 0.1]; Ω = ω / (Δ² + 0.01) = [0.15 / 0.05, 0.1 / 0.02] = [3, 5]
    assert si.omega["w"].tolist() == pytest.approx([0.15, 0.1])
    si.consolidate(policy)
    assert si.importance["w"].tolist() == pytest.approx([3.0, 5.0])
    assert si.anchors["w"].tolist() == pytest.approx([-0.2, 0.1])
    # next task: moved by [1, 0] from θ*: penalty c·Ω·1² = 6; its gradient 2·c·Ω·(θ − θ*) = [12, 0]
    si.begin_task(policy)
    with torch.no_grad():
        param += torch.tensor([1.0, 0.0])
    param.grad = torch.tensor([0.25, 0.5])  # the task's own gradient
    assert si.after_backward(policy, [param])["sft/si_penalty"] == pytest.approx(6.0)
    assert si.grads["w"].tolist() == pytest.approx([0.25, 0.5])  # recorded before the penalty's
    assert param.grad.tolist() == pytest.approx([0.25 + 12.0, 0.5])  # descent pulls w back to θ*


def _examples(policy):
    formatter = ChatFormatter(policy.tokenizer, "hermes")
    chats = [("a question", "yes it is"), ("another, longer question here", "no")]
    return [
        formatter(Conversation([{"role": "user", "content": q}, {"role": "assistant", "content": a}]))
        for q, a in chats
    ]


@pytest.mark.parametrize("topk", [0, 5])
def test_stored_logits_line_up_with_a_batch_of_the_same_examples(topk):
    policy = apply_lora(tiny_policy(), LoraConfig(r=4, alpha=8))
    examples = _examples(policy)
    stored = [record_logits(policy, e, topk) for e in examples]
    assert stored[0].values.shape == (sum(examples[0].loss_mask), topk or len(policy.tokenizer))
    assert (stored[0].index is None) == (topk == 0)
    batch = sft_batch(list(reversed(examples)), policy.tokenizer.pad_token_id)  # rows of two lengths
    with torch.no_grad():
        _, logits, mask = assistant_logits(policy, batch)
    values, index = stored_logits_batch(list(reversed(stored)), mask)
    assert float(derpp_logit_term(logits, values, mask, index)) < 1e-10  # the same model: nothing to match
    assert float(derpp_logit_term(logits + 1.0, values, mask, index)) == pytest.approx(1.0)


def test_the_method_name_comes_from_the_older_fields_when_unset():
    assert resolve_method(ContinualConfig()) == "naive"
    assert resolve_method(ContinualConfig(replay_capacity=4)) == "replay"
    assert resolve_method(ContinualConfig(replay_capacity=4, ewc_lambda=1.0)) == "ewc"
    assert resolve_method(ContinualConfig(method="si", ewc_lambda=1.0)) == "si"
    names = {"naive", "replay", "ewc", "si", "mas", "agem", "derpp", "lora_per_task"}
    assert names <= set(CONTINUAL_METHODS.names())


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"method": "gem"}, "continual.method: unknown continual method 'gem'; valid: agem, derpp"),
        ({"method": "agem"}, "continual.method agem: set continual.replay_capacity > 0"),
        ({"method": "naive", "replay_capacity": 4}, "replay_capacity: method naive keeps no buffer"),
        ({"method": "ewc"}, "continual.method ewc: set continual.ewc_lambda > 0"),
        ({"method": "si", "si_c": 0.0}, "continual.method si: set continual.si_c > 0"),
        ({"method": "derpp", "replay_capacity": 4, "memory_batch_size": 0}, "continual.memory_batch_size"),
        ({"method": "lora_per_task", "lora_router": "mlp"}, "lora_router: unknown LoRA router 'mlp'"),
        ({"method": "lora_per_task", "lora_merge": "avg"}, "lora_merge: unknown merge method 'avg'"),
        ({"method": "lora_per_task", "lora_merge": "ties", "lora_merge_density": 0.0}, "lora_merge_density"),
    ],
)
def test_check_refuses_settings_a_method_cannot_run_with(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        check_continual(ContinualConfig(**fields))


def test_every_method_passes_the_check_with_its_settings():
    settings = {"replay": {"replay_capacity": 4}, "ewc": {"ewc_lambda": 1.0}, "agem": {"replay_capacity": 4},
                "derpp": {"replay_capacity": 4}, "mas": {"replay_capacity": 4}}  # fmt: skip
    for name in CONTINUAL_METHODS.names():
        assert check_continual(ContinualConfig(method=name, **settings.get(name, {}))) == name
