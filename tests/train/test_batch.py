"""collate / turn_rewards / TokenBatch.select on hand-built trajectories with known ids."""

import math

import pytest
import torch

from ponder.train.batch import collate, turn_rewards
from ponder.types import ToolCall, Trajectory, Turn

PAD = 0
SEARCH_COST = -0.05


def _search(query="q"):
    return ToolCall("search", {"query": query}, raw=f"<search>{query}</search>")


def two_turn():
    """P=3, R=5: action (2 tokens) + observation (2) in turn 0, action (1) in turn 1."""
    return Trajectory(
        task_id="a",
        prompt_ids=[5, 6, 7],
        response_ids=[10, 11, 12, 13, 14],
        loss_mask=[1, 1, 0, 0, 1],
        old_logprobs=[-0.1, -0.2, 0.0, 0.0, -0.5],
        turns=[
            Turn(0, "s", observation="o", tool_calls=[_search()], n_action_tokens=2, n_observation_tokens=2,
                 reward=SEARCH_COST),
            Turn(1, "a", answer="x", n_action_tokens=1, reward=0.0),
        ],
        reward=1.0,
        group_id="g1",
    )


def unscored():
    """P=2, R=2, one turn, reward None (unscorable)."""
    return Trajectory(
        task_id="b",
        prompt_ids=[8, 9],
        response_ids=[20, 21],
        loss_mask=[1, 1],
        old_logprobs=[-1.0, -2.0],
        turns=[Turn(0, "a", answer="y", n_action_tokens=2)],
        reward=None,
        group_id="g2",
    )


@pytest.fixture
def batch():
    return collate([two_turn(), unscored()], PAD)


def test_input_ids_are_right_padded_with_the_pad_id(batch):
    assert batch.input_ids.tolist() == [[5, 6, 7, 10, 11, 12, 13, 14], [8, 9, 20, 21, PAD, PAD, PAD, PAD]]
    assert batch.attention_mask.tolist() == [[1] * 8, [1, 1, 1, 1, 0, 0, 0, 0]]
    assert batch.input_ids.dtype == torch.long and batch.attention_mask.dtype == torch.long
    assert len(batch) == 2 and batch.group_ids == ["g1", "g2"]


def test_loss_mask_and_old_logprobs_sit_at_prompt_plus_j_minus_one(batch):
    # Row 0: P=3, response token j at entry 2+j. Row 1: P=2, entries 1 and 2.
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1, 0, 0, 1], [0, 1, 1, 0, 0, 0, 0]]
    expected = torch.tensor([[0, 0, -0.1, -0.2, 0, 0, -0.5], [0, -1.0, -2.0, 0, 0, 0, 0]])
    assert torch.equal(batch.old_logprobs, expected)
    assert batch.loss_mask.shape == batch.old_logprobs.shape == (2, 7)


def test_entry_t_predicts_input_token_t_plus_one(batch):
    """The alignment logprobs_from_logits(logits[:, :-1], input_ids[:, 1:]) relies on."""
    for row, trajectory in enumerate([two_turn(), unscored()]):
        prompt = len(trajectory.prompt_ids)
        for j, token in enumerate(trajectory.response_ids):
            t = prompt + j - 1
            assert int(batch.input_ids[row, t + 1]) == token
            assert float(batch.loss_mask[row, t]) == trajectory.loss_mask[j]
            assert float(batch.old_logprobs[row, t]) == pytest.approx(trajectory.old_logprobs[j])


def test_turn_ids_follow_action_and_observation_counts_and_are_minus_one_elsewhere(batch):
    assert batch.turn_ids.tolist() == [[-1, -1, 0, 0, 0, 0, 1], [-1, 0, 0, -1, -1, -1, -1]]
    assert batch.turn_ids.dtype == torch.long


def test_response_tokens_beyond_the_turn_counts_belong_to_the_last_turn():
    trajectory = two_turn()
    trajectory.turns[1].n_action_tokens = 0  # counts cover 4 of the 5 tokens
    batch = collate([trajectory], PAD)
    assert batch.turn_ids.tolist() == [[-1, -1, 0, 0, 0, 0, 1]]


def test_turn_rewards_charge_each_search_at_its_turn_and_the_rest_at_the_last(batch):
    # Turn 0 searched once: -0.05 there; turn 1 gets 1.0 - (-0.05) = 1.05.
    assert batch.turn_rewards[0].tolist() == pytest.approx([-0.05, 1.05])
    assert float(batch.turn_rewards[0].sum()) == pytest.approx(1.0)
    assert batch.turn_mask.tolist() == [[1, 1], [1, 0]]


def test_turn_rewards_hand_case_with_several_calls_per_turn():
    trajectory = Trajectory(
        task_id="c",
        prompt_ids=[1],
        turns=[  # the environment's per-turn rewards: -0.1 per search (2, 0, 1 searches)
            Turn(0, "", tool_calls=[_search("a"), _search("b"), ToolCall("calculator", {})], reward=-0.2),
            Turn(1, "", tool_calls=[]),
            Turn(2, "", tool_calls=[_search("c")], reward=-0.1),
        ],
        reward=0.5,
    )
    rewards = turn_rewards(trajectory)
    # -0.2, 0 (none given), and the last turn -0.1 + (0.5 - (-0.3)) = 0.7
    assert rewards == pytest.approx([-0.2, 0.0, 0.7])
    assert sum(rewards) == pytest.approx(0.5)
    assert turn_rewards(Trajectory(task_id="d", prompt_ids=[1], reward=1.0)) == []


def test_unscorable_reward_becomes_nan(batch):
    assert float(batch.rewards[0]) == 1.0
    assert math.isnan(float(batch.rewards[1]))
    assert math.isnan(float(batch.turn_rewards[1, 0]))
    assert float(batch.turn_rewards[1, 1]) == 0.0  # past its last turn: 0, masked out


def test_select_trims_to_the_longest_selected_row_and_keeps_alignment(batch):
    batch.advantages = torch.arange(14, dtype=torch.float).reshape(2, 7)
    short = batch.select([1])
    assert short.input_ids.tolist() == [[8, 9, 20, 21]]
    assert short.attention_mask.tolist() == [[1, 1, 1, 1]]
    assert short.loss_mask.tolist() == [[0, 1, 1]]
    assert short.old_logprobs.tolist() == [[0.0, -1.0, -2.0]]
    assert short.turn_ids.tolist() == [[-1, 0, 0]]
    assert short.advantages.tolist() == [[7.0, 8.0, 9.0]]
    # Per-turn tensors are not trimmed.
    assert short.turn_rewards.shape == (1, 2) and short.turn_mask.tolist() == [[1, 0]]
    assert short.group_ids == ["g2"] and math.isnan(float(short.rewards[0]))
    assert short.ref_logprobs is None and short.old_values is None


def test_select_reorders_rows_and_keeps_full_width_for_the_longest(batch):
    swapped = batch.select([1, 0])
    assert swapped.input_ids.shape == (2, 8)
    assert torch.equal(swapped.input_ids, batch.input_ids.flip(0))
    assert torch.equal(swapped.loss_mask, batch.loss_mask.flip(0))
    assert torch.equal(swapped.turn_ids, batch.turn_ids.flip(0))
    assert swapped.group_ids == ["g2", "g1"]
    assert swapped.rewards[1] == 1.0
