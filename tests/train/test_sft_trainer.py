"""The one SFT loop on conversations and demonstrations: the masked NLL by hand, exact
gradient accumulation, the same loss from either source, task-type weighting, a falling
loss with eval loss logged, clipping from the config, and the DPO trainer's first steps."""

from collections import Counter

import pytest
import torch

from ponder.config import DPOConfig, LoraConfig, SFTTrainerConfig
from ponder.data import ChatFormatter, Conversation
from ponder.models import apply_lora, tiny_policy
import ponder.train.dpo as dpo
import ponder.train.sft as sft
from ponder.train.dpo import DPOTrainer, PreferenceExample, trajectory_example
from ponder.train.sampler import ExampleSampler
from ponder.train.sft import SFTInputs, SFTTrainer, masked_nll_pass, sft_batch
from ponder.types import Trajectory


def _examples(policy, n=4):
    formatter = ChatFormatter(policy.tokenizer, "hermes")
    return [
        formatter(Conversation([{"role": "user", "content": f"What is {i} plus {i}?"},
                                {"role": "assistant", "content": f"The answer is {2 * i}."}], task_type=kind))
        for i, kind in zip(range(n), ["tool_selection", "timing_decision"] * n)
    ]  # fmt: skip


def _grads(policy):
    return [p.grad.clone() for p in policy.model.parameters() if p.grad is not None]


def test_masked_nll_is_the_mean_negative_logprob_of_the_masked_tokens():
    """By hand from the logits: -log softmax of each masked next token, averaged over them."""
    policy = tiny_policy()
    rows = [Trajectory("a", [5, 9], [7, 8, 6], [1, 0, 1], [0.0] * 3), Trajectory("b", [4], [3, 2], [1, 1], [0.0] * 2)]
    with torch.no_grad():
        terms = []
        for row in rows:
            ids = row.prompt_ids + row.response_ids
            logits = policy.model(torch.tensor([ids])).logits[0].log_softmax(-1)
            for j, (token, mask) in enumerate(zip(row.response_ids, row.loss_mask)):
                if mask:
                    terms.append(-float(logits[len(row.prompt_ids) + j - 1, token]))
    assert len(terms) == 4  # the observation token (mask 0) is left out
    nll = masked_nll_pass(policy, sft_batch(rows, policy.tokenizer.pad_token_id), micro_batch_size=1, backward=False)
    assert nll == pytest.approx(sum(terms) / len(terms), rel=1e-5)


def test_micro_batches_accumulate_to_the_full_batch_gradient():
    policy = tiny_policy()
    for p in policy.model.parameters():
        p.requires_grad_(True)
    batch = sft_batch(_examples(policy), policy.tokenizer.pad_token_id)
    masked_nll_pass(policy, batch, micro_batch_size=4)
    whole = _grads(policy)
    policy.model.zero_grad()
    masked_nll_pass(policy, batch, micro_batch_size=1)
    for a, b in zip(whole, _grads(policy)):
        assert torch.allclose(a, b, atol=1e-6)


def _demonstration(example):
    """The demonstration that example is: its first assistant turn's start as the prompt."""
    prompt = example.loss_mask.index(1)
    return Trajectory(example.id, example.input_ids[:prompt], example.input_ids[prompt:],
                      example.loss_mask[prompt:], [0.0] * (len(example.input_ids) - prompt))  # fmt: skip


def test_the_loop_gives_the_same_loss_on_demonstrations_and_on_their_conversations():
    runs = {}
    for source in ("conversations", "demonstrations"):
        torch.manual_seed(0)
        policy = apply_lora(tiny_policy(), LoraConfig(r=4, alpha=8))
        examples = _examples(policy, 5)
        rows = examples if source == "conversations" else [_demonstration(e) for e in examples]
        cfg = SFTTrainerConfig(steps=4, batch_size=3, micro_batch_size=2, lr=1e-2, warmup_steps=1)
        history = SFTTrainer(policy, SFTInputs(rows), cfg, seed=3).train()
        runs[source] = [h["sft/loss"] for h in history], [p.detach().clone() for p in policy.model.parameters()]
    same = trajectory_example(_demonstration(examples[0]))
    assert (same.input_ids, same.loss_mask) == (examples[0].input_ids, examples[0].loss_mask)
    assert runs["conversations"][0] == runs["demonstrations"][0]  # bit for bit, every step
    assert all(torch.equal(a, b) for a, b in zip(runs["conversations"][1], runs["demonstrations"][1]))


@pytest.mark.parametrize("trainer", ["sft", "dpo"])
def test_sft_and_dpo_clip_at_their_configs_max_grad_norm(monkeypatch, tmp_path, trainer):
    policy = apply_lora(tiny_policy(), LoraConfig(r=4, alpha=8))
    norms = []
    module = sft if trainer == "sft" else dpo
    real = module.optimizer_step
    monkeypatch.setattr(module, "optimizer_step", lambda *args: norms.append(args[3]) or real(*args))
    good, bad = _examples(policy, 2)
    if trainer == "sft":
        cfg = SFTTrainerConfig(steps=1, batch_size=2, micro_batch_size=2, max_grad_norm=0.25)
        SFTTrainer(policy, SFTInputs([good, bad]), cfg, tmp_path).train()
    else:
        cfg = DPOConfig(steps=1, batch_size=2, micro_batch_size=2, save_every=1, max_grad_norm=0.25)
        DPOTrainer(policy, [PreferenceExample(good, bad)], cfg, tmp_path).train()
    assert norms == [0.25]


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
