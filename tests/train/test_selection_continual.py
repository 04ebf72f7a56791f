"""Coreset strategies on a constructed set with known answers; reservoir sampling's
distribution; the diagonal Fisher of a tiny model against a hand computation."""

from collections import Counter

import numpy as np
import pytest
import torch

from ponder.data import TokenizedExample
from ponder.eval.agent_metrics import forgetting_metrics
from ponder.models import Policy
from ponder.train.continual import EWCState, ReservoirBuffer, diagonal_fisher, replay_count
from ponder.train.selection import embed_texts, k_center_greedy, select_indices

# Three tight clusters at x = 0, 10, 20 (3, 3, 2 points).
POINTS = np.array([[0.0], [0.1], [0.2], [10.0], [10.1], [10.2], [20.0], [20.4]])
LOSSES = [0.1, 0.2, 0.3, 5.0, 4.0, 3.0, 0.5, 0.4]


def test_k_center_picks_one_point_per_cluster():
    chosen = k_center_greedy(POINTS, 3)
    # farthest from 0 is 20.4; then 10.2 (10.2 from both centres) beats 10.1 (10.1) and 10.0 (10.0)
    assert chosen == [0, 7, 5]
    assert sorted(int(POINTS[i, 0] // 10) for i in chosen) == [0, 1, 2]


def test_strategies_on_known_answers():
    assert select_indices("loss_topk", 2, LOSSES) == [3, 4]
    diverse = select_indices("diversity", 3, embeddings=POINTS)
    assert sorted(int(POINTS[i, 0] // 10) for i in diverse) == [0, 1, 2]
    # hybrid: the top-loss point first, then the farthest-point fill covers the other clusters
    hybrid = select_indices("hybrid", 3, LOSSES, POINTS, loss_share=0.34)
    assert hybrid[0] == 3 and sorted(int(POINTS[i, 0] // 10) for i in hybrid) == [0, 1, 2]
    picked = select_indices("random", 4, LOSSES, seed=1)
    assert picked == select_indices("random", 4, LOSSES, seed=1) and len(set(picked)) == 4
    assert select_indices("none", 3, LOSSES) == list(range(8))
    with pytest.raises(ValueError, match="unknown selection strategy 'best'"):
        select_indices("best", 3, LOSSES)


def test_hashing_embeddings_put_similar_texts_close():
    vectors = embed_texts(
        ["search the capital of France", "search the capital of Spain", "2 + 2 = 4"], "hashing"
    )
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]


def test_reservoir_keeps_every_item_with_probability_capacity_over_seen():
    counts = Counter()
    trials = 4000
    for seed in range(trials):
        buffer = ReservoirBuffer(3, seed=seed)
        buffer.extend(list(range(10)))
        assert len(buffer) == 3 and buffer.seen == 10
        counts.update(buffer.items)
    for item in range(10):  # expected 0.3 each; 4 standard errors ≈ 0.029
        assert counts[item] / trials == pytest.approx(0.3, abs=0.03)


def test_reservoir_state_round_trip_and_replay_count():
    buffer = ReservoirBuffer(2, seed=0)
    buffer.extend(["a", "b", "c"])
    clone = ReservoirBuffer(2, seed=99)
    clone.load_state_dict(buffer.state_dict())
    assert clone.sample(5) == buffer.sample(5)
    assert replay_count(8, 0.25, buffered=0) == 0
    assert replay_count(8, 0.25, buffered=5) == 2
    assert replay_count(2, 0.9, buffered=5) == 1  # at least one new example per batch


class _Linear(torch.nn.Module):
    """logits = W[:, token]: a 'model' whose Fisher is easy to compute by hand."""

    def __init__(self, vocab):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(vocab, vocab))
        self.training = False

    def forward(self, input_ids, attention_mask=None, logits_to_keep=0, **_):
        logits = self.weight[:, input_ids].permute(1, 2, 0)
        if isinstance(logits_to_keep, torch.Tensor):
            logits = logits[:, logits_to_keep]
        return type("Out", (), {"logits": logits, "hidden_states": None})()


def test_diagonal_fisher_matches_the_hand_computation():
    vocab = 3
    model = _Linear(vocab)
    policy = Policy(model, type("Tok", (), {"pad_token_id": 0})(), "lin", torch.device("cpu"))
    # One example: tokens [1, 2], the second is the target. With W = 0, p = uniform (1/3),
    # d log p(2 | 1) / d W[v, 1] = 1[v = 2] − 1/3; squared: [1/9, 1/9, 4/9] in column 1.
    examples = [TokenizedExample([1, 2], [0, 1])] * 2
    fisher = diagonal_fisher(policy, examples)["weight"]
    expected = torch.zeros(vocab, vocab)
    expected[:, 1] = torch.tensor([1 / 9, 1 / 9, 4 / 9])
    assert torch.allclose(fisher, expected, atol=1e-6)
    ewc = EWCState(weight=2.0)
    ewc.consolidate(policy, examples)
    with torch.no_grad():
        model.weight[2, 1] += 3.0
    assert float(ewc.penalty(policy).detach()) == pytest.approx(0.5 * 2.0 * (4 / 9) * 9.0)


def test_forgetting_metrics_by_hand():
    accuracy = [[0.8, 0.1, 0.0], [0.5, 0.9, 0.2], [0.4, 0.6, 0.7]]
    metrics = forgetting_metrics(accuracy, baseline=[0.0, 0.1, 0.1])
    assert metrics["AA"] == pytest.approx((0.4 + 0.6 + 0.7) / 3)
    assert metrics["BWT"] == pytest.approx(((0.4 - 0.8) + (0.6 - 0.9)) / 2)
    assert metrics["FWT"] == pytest.approx(((0.1 - 0.1) + (0.2 - 0.1)) / 2)
    with pytest.raises(ValueError, match="square matrix"):
        forgetting_metrics([[1.0]])


def test_paired_difference_by_hand():
    from ponder.eval.agent_metrics import paired_difference

    mean, se, n = paired_difference({"a": 0.0, "b": 1.0, "c": 0.5, "x": 9.0}, {"a": 1.0, "b": 1.0, "c": 1.5})
    assert (n, mean) == (3, pytest.approx(2 / 3))  # differences 1, 0, 1; "x" has no pair
    assert se == pytest.approx(((1 / 9 + 4 / 9 + 1 / 9) / 2 / 3) ** 0.5)


def test_diagonal_fisher_of_the_tiny_model_matches_per_example_autograd():
    from ponder.config import LoraConfig
    from ponder.models import apply_lora, tiny_policy

    policy = apply_lora(tiny_policy(), LoraConfig(r=2, alpha=4))
    for name, param in policy.model.named_parameters():
        if "lora_B" in name:  # non-zero B so every adapter weight has a gradient
            torch.nn.init.normal_(param, std=0.1, generator=torch.Generator().manual_seed(1))
    ids = policy.tokenizer.encode("<answer>the answer</answer> search query")
    examples = [
        TokenizedExample(ids, [0, 0] + [1] * (len(ids) - 2)),
        TokenizedExample(ids[:5], [0, 1, 1, 0, 1]),
    ]
    fisher = diagonal_fisher(policy, examples)
    named = {n: p for n, p in policy.model.named_parameters() if p.requires_grad}
    expected = {n: torch.zeros_like(p) for n, p in named.items()}
    for example in examples:  # by hand: log-softmax of the plain forward, summed over masked targets
        tokens = torch.tensor([example.input_ids])
        logp = torch.log_softmax(policy.model(input_ids=tokens).logits[0, :-1], -1)
        picked = logp.gather(-1, tokens[0, 1:, None])[:, 0]
        loglik = (picked * torch.tensor(example.loss_mask[1:], dtype=torch.float)).sum()
        for (name, _), grad in zip(named.items(), torch.autograd.grad(loglik, list(named.values()))):
            expected[name] += grad**2 / len(examples)
    assert fisher.keys() == expected.keys()
    for name in fisher:
        assert torch.allclose(fisher[name], expected[name], rtol=1e-4, atol=1e-9), name
