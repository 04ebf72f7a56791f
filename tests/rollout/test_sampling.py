import math

import pytest
import torch

from ponder.rollout.backend import draw_from, first_stop, sample_tokens


def logits_batch() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(4, 50, generator=generator) * 3


def test_greedy_picks_argmax_with_untempered_logprob():
    logits = logits_batch()
    tokens, logprobs = sample_tokens(logits, temperature=0.0, top_p=1.0, generator=None)
    assert tokens.tolist() == logits.argmax(-1).tolist()
    expected = torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1)
    assert torch.allclose(logprobs, expected, atol=1e-6)
    assert tokens.shape == logprobs.shape == (4,)


def test_greedy_hand_example():
    logits = torch.tensor([[0.0, math.log(3)], [math.log(4), 0.0]])
    tokens, logprobs = sample_tokens(logits, 0.0, 1.0, None)
    assert tokens.tolist() == [1, 0]
    assert torch.allclose(logprobs, torch.tensor([math.log(0.75), math.log(0.8)]), atol=1e-6)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_tempered_logprob_is_log_softmax_of_scaled_logits(temperature):
    logits = logits_batch()
    generator = torch.Generator().manual_seed(1)
    tokens, logprobs = sample_tokens(logits, temperature, 1.0, generator)
    expected = torch.log_softmax(logits / temperature, -1).gather(-1, tokens[:, None]).squeeze(-1)
    assert torch.allclose(logprobs, expected, atol=1e-5)


def test_half_precision_logits_give_float32_logprobs():
    logits = logits_batch().to(torch.bfloat16)
    tokens, logprobs = sample_tokens(logits, 0.7, 1.0, torch.Generator().manual_seed(0))
    assert logprobs.dtype == torch.float32
    expected = torch.log_softmax(logits.float() / 0.7, -1).gather(-1, tokens[:, None]).squeeze(-1)
    assert torch.allclose(logprobs, expected, atol=1e-5)


def test_tiny_top_p_always_returns_argmax():
    # the argmax holds well under half the mass, so plain sampling would often miss it
    logits = torch.tensor([[1.0, 0.9, 0.8, 0.7, 0.6, 0.5], [0.0, 0.1, 0.2, 0.3, 0.35, 0.0]])
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        tokens, _ = sample_tokens(logits, 1.0, 0.01, generator)
        assert tokens.tolist() == [0, 4]
    plain = {tuple(sample_tokens(logits, 1.0, 1.0, generator)[0].tolist()) for _ in range(50)}
    assert len(plain) > 1


def test_top_p_keeps_the_smallest_prefix_and_logprobs_use_the_full_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(2000, 1)
    generator = torch.Generator().manual_seed(0)
    tokens, logprobs = sample_tokens(logits, 1.0, 0.75, generator)
    counts = torch.bincount(tokens, minlength=4).tolist()
    assert counts[2] == counts[3] == 0  # 0.5 + 0.3 reaches 0.75: the tail is never drawn
    assert abs(counts[0] / 2000 - 0.625) < 0.04  # renormalised 0.5 / 0.8 for drawing
    # ... but the recorded logprob is under the untruncated distribution
    assert torch.allclose(logprobs, probs.log()[tokens], atol=1e-6)


def test_same_generator_seed_gives_same_tokens():
    logits = logits_batch()
    runs = []
    for _ in range(2):
        generator = torch.Generator().manual_seed(42)
        runs.append([sample_tokens(logits, 1.0, 0.9, generator)[0].tolist() for _ in range(10)])
    assert runs[0] == runs[1]
    other = torch.Generator().manual_seed(43)
    assert [sample_tokens(logits, 1.0, 0.9, other)[0].tolist() for _ in range(10)] != runs[0]


@pytest.mark.parametrize(
    "text, stops, expected",
    [
        ("<search>owls</search>", ["</search>", "</answer>"], len("<search>owls</search>")),
        ("<search>a</search> then <answer>b</answer>", ["</answer>", "</search>"], len("<search>a</search>")),
        ("abc</search>def", ["</search>"], 12),
        ("no stop here", ["</search>"], -1),
        ("anything", [], -1),
        ("anything", [""], -1),  # an empty stop string never matches
        ("xabc", ["abc", "b"], 3),  # earliest end wins, even if another stop started first
        ("</search></search>", ["</search>"], 9),  # first occurrence
        ("\nObservation: x", ["\nObservation:"], 13),
    ],
)
def test_first_stop(text, stops, expected):
    assert first_stop(text, stops) == expected


def test_draw_from_follows_the_distribution_and_never_draws_zero_mass():
    # rows need not be normalised: [1, 2, 0, 7] is 0.1 / 0.2 / 0 / 0.7
    probs = torch.tensor([[1.0, 2.0, 0.0, 7.0]]).expand(20_000, 4).contiguous()
    drawn = draw_from(probs, torch.Generator().manual_seed(0))
    share = torch.bincount(drawn, minlength=4).float() / len(drawn)
    assert share[2] == 0.0
    # binomial se of a share p over 20k draws is at most 0.0036: 4 se is 0.015
    assert torch.allclose(share, torch.tensor([0.1, 0.2, 0.0, 0.7]), atol=0.015)


def test_draw_from_single_mass_row_and_row_order_invariance():
    one_hot = torch.zeros(3, 10)
    one_hot[0, 9], one_hot[1, 0], one_hot[2, 4] = 1.0, 1.0, 1.0
    assert draw_from(one_hot, torch.Generator().manual_seed(1)).tolist() == [9, 0, 4]
    # each row is drawn with its own uniform: reversing the rows reverses the draws of one-hot rows
    assert draw_from(one_hot.flip(0), torch.Generator().manual_seed(1)).tolist() == [4, 0, 9]
