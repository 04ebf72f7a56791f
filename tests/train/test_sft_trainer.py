"""The conversational SFT trainer: exact gradient accumulation, task-type weighting,
a falling loss with eval loss logged, and the DPO trainer's first steps."""

from collections import Counter

import pytest
import torch

from ponder.config import DPOConfig, LoraConfig, SFTTrainerConfig
from ponder.data import ChatFormatter, Conversation
from ponder.models import apply_lora, tiny_policy
from ponder.train.dpo import DPOTrainer, PreferenceExample
from ponder.train.sft_trainer import ExampleSampler, SFTInputs, SFTTrainer, token_nll


def _examples(policy, n=4):
    formatter = ChatFormatter(policy.tokenizer, "hermes")
    return [
        formatter(Conversation([{"role": "user", "content": f"What is {i} plus {i}?"},
                                {"role": "assistant", "content": f"The answer is {2 * i}."}], task_type=kind))
        for i, kind in zip(range(n), ["tool_selection", "timing_decision"] * n)
    ]  # fmt: skip


def _grads(policy):
    return [p.grad.clone() for p in policy.model.parameters() if p.grad is not None]


def test_micro_batches_accumulate_to_the_full_batch_gradient():
    policy = tiny_policy()
    for p in policy.model.parameters():
        p.requires_grad_(True)
    examples = _examples(policy)
    token_nll(policy, examples, micro_batch_size=4, backward=True)
    whole = _grads(policy)
    policy.model.zero_grad()
    token_nll(policy, examples, micro_batch_size=1, backward=True)
    for a, b in zip(whole, _grads(policy)):
        assert torch.allclose(a, b, atol=1e-6)


def test_task_type_weights_set_the_sampling_frequencies():
    sampler = ExampleSampler(["tool_selection", "timing_decision"], {"tool_selection": 3.0}, seed=0)
    counts = Counter(sampler.next(4000))
    assert counts[0] / 4000 == pytest.approx(0.75, abs=0.03)
    uniform = ExampleSampler(["a", "b", "c"], {}, seed=0)
    assert sorted(uniform.next(3)) == [0, 1, 2]  # one shuffled epoch
    with pytest.raises(ValueError, match="task weights"):
        ExampleSampler(["a"], {"a": 0.0}, seed=0)


def test_lora_sft_lowers_the_loss_and_logs_eval_loss(tmp_path):
    policy = apply_lora(tiny_policy(), LoraConfig(r=4, alpha=8))
    examples = _examples(policy)
    cfg = SFTTrainerConfig(steps=6, batch_size=4, micro_batch_size=2, lr=1e-2, warmup_steps=1, eval_every=3)
    trainer = SFTTrainer(policy, SFTInputs(examples, examples[:2]), cfg, tmp_path)
    history = trainer.train()
    assert history[-1]["sft/loss"] < history[0]["sft/loss"]
    assert "sft/eval_loss" in history[2] and "sft/eval_loss" not in history[1]
    assert history[-1]["sft/lr"] < history[1]["sft/lr"]  # cosine decay after warm-up
    assert (tmp_path / "checkpoints" / "latest").is_file()


def test_dpo_raises_the_chosen_over_rejected_margin(tmp_path):
    policy = apply_lora(tiny_policy(), LoraConfig(r=4, alpha=8))
    good, bad = _examples(policy, 2)
    pairs = [PreferenceExample(good, bad)] * 4
    cfg = DPOConfig(steps=5, batch_size=4, micro_batch_size=2, lr=1e-2, beta=0.5, save_every=5)
    history = DPOTrainer(policy, pairs, cfg, tmp_path).train()
    assert history[0]["dpo/margin"] == pytest.approx(
        0.0, abs=1e-5
    )  # adapters start at zero: policy = reference
    assert history[-1]["dpo/margin"] > 0.0 and history[-1]["dpo/loss"] < history[0]["dpo/loss"]


def test_rpo_alpha_adds_the_chosen_nll_to_the_loss(tmp_path):
    first = {}
    for alpha in (0.0, 2.0):
        torch.manual_seed(0)
        policy = apply_lora(tiny_policy(), LoraConfig(r=4, alpha=8))
        good, bad = _examples(policy, 2)
        cfg = DPOConfig(steps=2, batch_size=2, micro_batch_size=1, lr=1e-2, save_every=2, rpo_alpha=alpha)
        pairs = [PreferenceExample(good, bad)] * 2
        first[alpha] = DPOTrainer(policy, pairs, cfg, tmp_path / str(alpha)).train()[0]
    # the same start: the loss grows by exactly α × the chosen reply's per-token NLL
    nll = first[0.0]["dpo/chosen_nll"]
    assert first[2.0]["dpo/chosen_nll"] == pytest.approx(nll) and nll > 1
    assert first[2.0]["dpo/loss"] == pytest.approx(first[0.0]["dpo/loss"] + 2.0 * nll)
