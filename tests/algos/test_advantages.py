"""Advantage estimators: hand-computed examples and invariances."""

import ast
import math
from pathlib import Path

import pytest
import torch

from ponder.algos import (
    ADVANTAGES,
    AdvantageConfig,
    AdvantageInput,
    Registry,
    compute_advantages,
    discounted_turn_returns,
    generalized_advantage_estimate,
    group_normalize,
    masked_mean,
    masked_whiten,
)

T = torch.tensor
HUGE = 1e30


def outcome_input(rewards, group_ids, lengths=None, width=4):
    """Rows of policy tokens of the given lengths (default: all `width`), padding after."""
    lengths = lengths or [width] * len(rewards)
    mask = torch.zeros(len(rewards), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
    return AdvantageInput(T(rewards, dtype=torch.float64), mask, list(group_ids))


def per_episode(advantages, mask):
    """The one value each row broadcasts (0 for empty rows), checking it is constant."""
    values = []
    for row in range(advantages.shape[0]):
        kept = advantages[row][mask[row].bool()]
        assert torch.allclose(kept, kept[:1].expand_as(kept)) if kept.numel() else True
        values.append(float(kept[0]) if kept.numel() else 0.0)
        assert torch.all(advantages[row][~mask[row].bool()] == 0)
    return values


# --- registry ----------------------------------------------------------------------


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(ValueError) as err:
        compute_advantages("ppo2", outcome_input([1.0], ["a"]))
    assert str(err.value) == "unknown advantage estimator 'ppo2'; valid: gae, grpo, none, reinforce, rloo, togo, turn"


def test_registry_refuses_a_second_object_under_a_taken_name():
    reg = Registry("thing")
    reg.register("a")(len)
    reg.register("a")(len)  # the same object again is fine (module reloads)
    with pytest.raises(ValueError, match="thing 'a' is already registered"):
        reg.register("a")(abs)
    assert "a" in reg and reg.names() == ["a"] and len(reg) == 1


def test_missing_input_field_is_named():
    with pytest.raises(ValueError, match="'gae' needs AdvantageInput.values"):
        compute_advantages("gae", outcome_input([1.0], ["a"]))


# --- grpo --------------------------------------------------------------------------


def test_grpo_hand_example_with_and_without_std():
    groups = ["a", "a", "a", "b", "b", "c"]
    inp = outcome_input([1.0, 0.0, 0.0, 2.0, 4.0, 5.0], groups, lengths=[4, 2, 3, 1, 4, 2])
    # group a: [1, 0, 0], mean 1/3, unbiased var ((2/3)² + 2·(1/3)²)/2 = 1/3, std 0.57735
    #   → (2/3)/0.57735 = 1.15470, (−1/3)/0.57735 = −0.57735
    # group b: [2, 4], mean 3, std sqrt((1 + 1)/1) = 1.41421 → ∓0.70711
    # group c: [5] alone → 0
    adv, ret = compute_advantages("grpo", inp, AdvantageConfig(eps=0.0))
    s3 = math.sqrt(1 / 3)
    expected = [(2 / 3) / s3, -(1 / 3) / s3, -(1 / 3) / s3, -1 / math.sqrt(2), 1 / math.sqrt(2), 0.0]
    assert per_episode(adv, inp.loss_mask) == pytest.approx(expected, abs=1e-9)
    assert per_episode(ret, inp.loss_mask) == pytest.approx([1, 0, 0, 2, 4, 5])
    # Dr. GRPO: centre only → [2/3, −1/3, −1/3], [−1, 1], 0
    adv, _ = compute_advantages("grpo", inp, AdvantageConfig(norm_by_std=False))
    assert per_episode(adv, inp.loss_mask) == pytest.approx([2 / 3, -1 / 3, -1 / 3, -1, 1, 0], abs=1e-12)


def test_grpo_uses_eps_in_the_denominator():
    # [0, 1]: mean 0.5, std sqrt(0.5) → 0.5 / (0.70711 + 0.1)
    adv, _ = compute_advantages("grpo", outcome_input([0.0, 1.0], ["g", "g"]), AdvantageConfig(eps=0.1))
    assert adv[1, 0].item() == pytest.approx(0.5 / (math.sqrt(0.5) + 0.1))


def test_grpo_is_invariant_to_shift_and_scale_within_a_group():
    rewards = [0.3, 1.7, -0.4, 2.2, 1.0, 0.1]
    groups = ["a", "a", "a", "b", "b", "b"]
    base, _ = compute_advantages("grpo", outcome_input(rewards, groups))
    shifted = [r + 5.0 if g == "a" else r - 3.0 for r, g in zip(rewards, groups)]
    adv, _ = compute_advantages("grpo", outcome_input(shifted, groups))
    torch.testing.assert_close(adv, base, atol=1e-9, rtol=0)
    scaled = [r * 7.0 if g == "a" else r * 0.5 for r, g in zip(rewards, groups)]
    adv, _ = compute_advantages("grpo", outcome_input(scaled, groups))
    torch.testing.assert_close(adv, base, atol=1e-5, rtol=0)  # eps makes it approximate
    dr_cfg = AdvantageConfig(norm_by_std=False)
    dr_base, _ = compute_advantages("grpo", outcome_input(rewards, groups), dr_cfg)
    dr, _ = compute_advantages("grpo", outcome_input(shifted, groups), dr_cfg)
    torch.testing.assert_close(dr, dr_base, atol=1e-9, rtol=0)


# --- rloo ------------------------------------------------------------------------


def test_rloo_hand_example():
    inp = outcome_input([1.0, 0.0, 0.0, 2.0, 4.0, 5.0], ["a", "a", "a", "b", "b", "c"])
    # a: 1 − mean(0, 0) = 1;  0 − mean(1, 0) = −0.5 (twice)
    # b: 2 − 4 = −2;  4 − 2 = 2;   c alone → 0
    adv, _ = compute_advantages("rloo", inp)
    assert per_episode(adv, inp.loss_mask) == pytest.approx([1, -0.5, -0.5, -2, 2, 0], abs=1e-12)


# --- reinforce ---------------------------------------------------------------------


def test_reinforce_running_baseline_hand_example():
    state = {}
    cfg = AdvantageConfig(baseline_momentum=0.9)
    # step 1: no baseline yet → b = batch mean (1 + 0 + 0 + 3)/4 = 1 → A = [0, −1, −1, 2]
    inp = outcome_input([1.0, 0.0, 0.0, 3.0], "abcd")
    adv, _ = compute_advantages("reinforce", inp, cfg, state)
    assert per_episode(adv, inp.loss_mask) == pytest.approx([0, -1, -1, 2])
    assert state == {"reinforce_baseline": pytest.approx(1.0)}  # 0.9·1 + 0.1·1
    # step 2: A uses the OLD baseline 1 → [1, 3]; then b = 0.9·1 + 0.1·mean(2, 4) = 1.2
    inp = outcome_input([2.0, 4.0], "ab")
    adv, _ = compute_advantages("reinforce", inp, cfg, state)
    assert per_episode(adv, inp.loss_mask) == pytest.approx([1, 3])
    assert state["reinforce_baseline"] == pytest.approx(1.2)
    assert all(isinstance(v, float) for v in state.values())  # checkpointable
    # step 3: [1.2] − 1.2 = 0
    adv, _ = compute_advantages("reinforce", outcome_input([1.2], "a"), cfg, state)
    assert adv.abs().max() < 1e-12


# --- gae ---------------------------------------------------------------------------


def gae_input():
    # one episode: policy, policy, observation, policy, padding
    mask = T([[1, 1, 0, 1, 0]])
    values = T([[0.5, 0.6, 99.0, 0.8, -99.0]], dtype=torch.float64)
    return AdvantageInput(T([1.0], dtype=torch.float64), mask, ["a"], values=values)


def test_gae_hand_example_skips_observation_tokens():
    # reward 1 on the last policy token (t=3); γ = 0.9, λ = 0.8, γλ = 0.72
    # t=3: δ = 1 + 0.9·0 − 0.8 = 0.2                       A3 = 0.2
    # t=2: observation, skipped
    # t=1: next value is V3 (next POLICY token): δ = 0.9·0.8 − 0.6 = 0.12
    #      A1 = 0.12 + 0.72·0.2 = 0.264
    # t=0: δ = 0.9·0.6 − 0.5 = 0.04;  A0 = 0.04 + 0.72·0.264 = 0.23008
    # returns = A + V = [0.73008, 0.864, 0, 1.0, 0]
    adv, ret = compute_advantages("gae", gae_input(), AdvantageConfig(gamma=0.9, lam=0.8))
    torch.testing.assert_close(adv, T([[0.23008, 0.264, 0.0, 0.2, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(ret, T([[0.73008, 0.864, 0.0, 1.0, 0.0]], dtype=torch.float64))


def test_gae_with_gamma_lambda_one_is_return_minus_value():
    # γ = λ = 1: A_t = R − V_t = [1 − 0.5, 1 − 0.6, 0, 1 − 0.8, 0]
    adv, ret = compute_advantages("gae", gae_input(), AdvantageConfig(gamma=1.0, lam=1.0))
    torch.testing.assert_close(adv, T([[0.5, 0.4, 0.0, 0.2, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(ret, T([[1.0, 1.0, 0.0, 1.0, 0.0]], dtype=torch.float64))


def test_gae_token_rewards_enter_per_token():
    inp = gae_input()
    inp.token_rewards = T([[0.0, -0.1, 50.0, 0.0, 50.0]], dtype=torch.float64)  # masked 50s ignored
    # γ = λ = 1: A_t = Σ_{j≥t} r_j − V_t → A0 = 0.9 − 0.5, A1 = 0.9 − 0.6, A3 = 1 − 0.8
    adv, _ = compute_advantages("gae", inp, AdvantageConfig())
    torch.testing.assert_close(adv, T([[0.4, 0.3, 0.0, 0.2, 0.0]], dtype=torch.float64))


def test_generalized_advantage_estimate_batched_rows_are_independent():
    rewards = T([[0.0, 1.0], [0.0, 2.0]], dtype=torch.float64)
    values = T([[0.5, 0.5], [1.0, 1.0]], dtype=torch.float64)
    mask = T([[1, 1], [1, 1]])
    # row 0: A1 = 1 − 0.5 = 0.5; A0 = (0 + 0.5 − 0.5) + 0.5 = 0.5 ; row 1: A1 = 1, A0 = 0 + 1 = 1
    adv = generalized_advantage_estimate(rewards, values, mask, 1.0, 1.0)
    torch.testing.assert_close(adv, T([[0.5, 0.5], [1.0, 1.0]], dtype=torch.float64))


def test_gae_whitening_option():
    inp = AdvantageInput(T([1.0, 0.0]), T([[1, 1, 0], [1, 1, 1]]), ["a", "b"], values=torch.rand(2, 3))
    adv, ret = compute_advantages("gae", inp, AdvantageConfig(whiten_gae=True))
    mask = inp.loss_mask
    assert masked_mean(adv, mask).abs() < 1e-6
    assert masked_mean(adv.square(), mask).item() == pytest.approx(4 / 5, abs=1e-4)  # unbiased var 1, n=5
    raw, raw_ret = compute_advantages("gae", inp)
    torch.testing.assert_close(ret, raw_ret)  # returns are the unwhitened critic target
    torch.testing.assert_close(adv, masked_whiten(raw, mask))


# --- turn --------------------------------------------------------------------------


def turn_input():
    # ep0: 3 turns, rewards [−0.1 search, −0.1 search, 1.0 answer]
    # ep1: 2 turns, rewards [−0.1 search, 0.0 wrong answer]
    turn_rewards = T([[-0.1, -0.1, 1.0], [-0.1, 0.0, 0.0]], dtype=torch.float64)
    turn_mask = T([[1, 1, 1], [1, 1, 0]])
    # tokens: turn id of each token; observation tokens belong to their turn, mask 0
    turn_ids = T([[0, 0, 0, 1, 1, 2, 2], [0, 0, 1, 1, -1, -1, -1]])
    loss_mask = T([[1, 1, 0, 1, 0, 1, 1], [1, 0, 1, 1, 0, 0, 0]])
    return AdvantageInput(T([1.0, 0.0], dtype=torch.float64), loss_mask, ["g", "g"], turn_ids=turn_ids,
                          turn_rewards=turn_rewards, turn_mask=turn_mask)


def test_turn_hand_example():
    # γ = 0.5: ep0 G2 = 1.0, G1 = −0.1 + 0.5·1.0 = 0.4, G0 = −0.1 + 0.5·0.4 = 0.1
    #          ep1 G1 = 0.0, G0 = −0.1 + 0.5·0 = −0.1
    # Dr. (no std): position 0: [0.1, −0.1] − 0 = [0.1, −0.1]; position 1: [0.4, 0.0] − 0.2 = [0.2, −0.2]
    #               position 2: only ep0 has it → 0
    adv, ret = compute_advantages("turn", turn_input(), AdvantageConfig(gamma=0.5, norm_by_std=False))
    torch.testing.assert_close(adv, T([[0.1, 0.1, 0, 0.2, 0, 0, 0], [-0.1, 0, -0.2, -0.2, 0, 0, 0]],
                                      dtype=torch.float64))
    torch.testing.assert_close(ret, T([[0.1, 0.1, 0, 0.4, 0, 1.0, 1.0], [-0.1, 0, 0, 0, 0, 0, 0]],
                                      dtype=torch.float64))
    # with std (n−1): two values ±d around the mean have std d·√2 → ±1/√2 at positions 0 and 1
    adv, _ = compute_advantages("turn", turn_input(), AdvantageConfig(gamma=0.5, eps=0.0))
    h = 1 / math.sqrt(2)
    torch.testing.assert_close(adv, T([[h, h, 0, h, 0, 0, 0], [-h, 0, -h, -h, 0, 0, 0]], dtype=torch.float64))


def test_togo_hand_example():
    # γ = 1: ep0 G = [0.8, 0.9, 1.0], ep1 G = [−0.1, 0.0]; baseline = mean of the totals
    # [0.8, −0.1] = 0.35 → Dr.: ep0 [0.45, 0.55, 0.65], ep1 [−0.45, −0.35]
    adv, ret = compute_advantages("togo", turn_input(), AdvantageConfig(norm_by_std=False))
    expected = T([[0.45, 0.45, 0, 0.55, 0, 0.65, 0.65], [-0.45, 0, -0.35, -0.35, 0, 0, 0]],
                 dtype=torch.float64)
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, T([[0.8, 0.8, 0, 0.9, 0, 1.0, 1.0], [-0.1, 0, 0, 0, 0, 0, 0]],
                                      dtype=torch.float64))
    # with std: the totals' std (n−1) is 0.9·/√2 = 0.636396 for every turn
    adv, _ = compute_advantages("togo", turn_input(), AdvantageConfig(eps=0.0))
    torch.testing.assert_close(adv, expected / (0.9 / math.sqrt(2)))


@pytest.mark.parametrize("std_scope", ["group", "batch"])
def test_togo_with_every_reward_at_the_last_turn_is_grpo(std_scope):
    inp = rich_input(seed=2)
    last = inp.turn_mask.sum(1) - 1
    inp.turn_rewards = torch.zeros_like(inp.turn_rewards).scatter(1, last[:, None], inp.rewards[:, None])
    cfg = AdvantageConfig(std_scope=std_scope)
    togo, _ = compute_advantages("togo", inp, cfg)
    grpo, _ = compute_advantages("grpo", inp, cfg)
    torch.testing.assert_close(togo, grpo, rtol=0, atol=1e-12)


def test_togo_leaves_an_unscorable_episode_out_of_the_baseline():
    inp = turn_input()
    three = AdvantageInput(
        T([1.0, 0.0, float("nan")], dtype=torch.float64), torch.cat([inp.loss_mask, inp.loss_mask[:1]]),
        ["g", "g", "g"], torch.cat([inp.turn_ids, inp.turn_ids[:1]]),
        torch.cat([inp.turn_rewards, T([[-0.1, float("nan"), 0.0]], dtype=torch.float64)]),
        torch.cat([inp.turn_mask, inp.turn_mask[:1]]),
    )  # fmt: skip
    with_nan, _ = compute_advantages("togo", three)
    without, _ = compute_advantages("togo", inp)
    torch.testing.assert_close(with_nan[:2], without)
    assert torch.all(with_nan[2] == 0)


def test_discounted_turn_returns_ignores_turns_past_the_end():
    r = T([[1.0, 2.0, 1e9]])
    # γ = 0.5: G1 = 2, G0 = 1 + 0.5·2 = 2; the masked third turn does not count
    torch.testing.assert_close(discounted_turn_returns(r, T([[1, 1, 0]]), 0.5), T([[2.0, 2.0, 0.0]],
                                                                                    dtype=torch.float64))


def test_group_normalize_per_column_counts_only_valid_rows():
    values = T([[1.0, 5.0], [3.0, 1e9], [2.0, 7.0]])
    valid = T([[True, True], [True, False], [True, True]])
    # column 0: [1, 3, 2] − 2 ; column 1: [5, 7] − 6 (row 1 invalid)
    out = group_normalize(values, valid, T([0, 0, 0]), norm_by_std=False, eps=0.0)
    torch.testing.assert_close(out, T([[-1.0, -1.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64))


def test_group_normalize_batch_std_keeps_the_size_of_each_groups_differences():
    # group 0 rewards [0, 1] (one answered), group 1 [1.0, 1.1] (a search cost apart)
    values = T([[0.0], [1.0], [1.0], [1.1]])
    valid = torch.ones(4, 1, dtype=torch.bool)
    groups = T([0, 0, 1, 1])
    # centred: ±0.5 and ±0.05; batch std (n−1) = sqrt((2·0.25 + 2·0.0025) / 3) = 0.410284
    out = group_normalize(values, valid, groups, norm_by_std=True, eps=0.0, std_scope="batch")
    a, b = 0.5 / 0.4102844, 0.05 / 0.4102844
    torch.testing.assert_close(out, T([[-a], [a], [-b], [b]], dtype=torch.float64))
    # the group std instead gives both groups the same ±0.7071
    by_group = group_normalize(values, valid, groups, norm_by_std=True, eps=0.0, std_scope="group")
    torch.testing.assert_close(by_group.abs(), torch.full((4, 1), 2 ** -0.5, dtype=torch.float64))


def test_batch_std_scores_are_invariant_to_reward_shift_and_scale():
    values = T([[0.0], [1.0], [0.3], [1.0], [1.1], [0.2]])
    valid = torch.ones(6, 1, dtype=torch.bool)
    groups = T([0, 0, 0, 1, 1, 1])
    base = group_normalize(values, valid, groups, True, 0.0, "batch")
    torch.testing.assert_close(group_normalize(3.0 * values - 7.0, valid, groups, True, 0.0, "batch"), base)


def test_unknown_std_scope_lists_the_valid_ones():
    with pytest.raises(ValueError, match="group, batch"):
        group_normalize(T([[0.0], [1.0]]), torch.ones(2, 1, dtype=torch.bool), T([0, 0]), True, 0.0, "global")


# --- invariances shared by the estimators -----------------------------------------


def rich_input(seed=0):
    """8 episodes in 3 groups, varied lengths, observation tokens, values and turns."""
    gen = torch.Generator().manual_seed(seed)
    batch, width, turns = 8, 10, 3
    lengths = [10, 6, 8, 3, 10, 5, 7, 9]
    n_turns = [3, 2, 3, 1, 3, 2, 2, 3]
    loss_mask = torch.zeros(batch, width, dtype=torch.long)
    turn_ids = torch.full((batch, width), -1)
    for row, (n, k) in enumerate(zip(lengths, n_turns)):
        turn_ids[row, :n] = torch.arange(n) * k // n
        loss_mask[row, :n] = (torch.arange(n) % 3 != 2).long()  # every third token is environment text
    turn_mask = (torch.arange(turns)[None, :] < T(n_turns)[:, None]).long()
    return AdvantageInput(
        rewards=torch.rand(batch, generator=gen, dtype=torch.float64),
        loss_mask=loss_mask,
        group_ids=["a", "a", "a", "b", "b", "b", "c", "c"],
        turn_ids=turn_ids,
        turn_rewards=torch.where(
            turn_mask.bool(), torch.randn(batch, turns, generator=gen, dtype=torch.float64), 0.0
        ),
        turn_mask=turn_mask,
        values=torch.randn(batch, width, generator=gen, dtype=torch.float64),
    )


@pytest.mark.parametrize("name", ADVANTAGES.names())
def test_masked_positions_do_not_change_the_result(name):
    inp = rich_input()
    base = compute_advantages(name, inp, AdvantageConfig(gamma=0.9, lam=0.95), {})
    off = ~inp.loss_mask.bool()
    noise = torch.rand(inp.values.shape, dtype=torch.float64) * HUGE
    inp.values = torch.where(off, noise, inp.values)
    inp.turn_rewards = torch.where(inp.turn_mask.bool(), inp.turn_rewards, HUGE)
    inp.turn_ids = torch.where(off, torch.randint(-1, 3, inp.turn_ids.shape), inp.turn_ids)
    again = compute_advantages(name, inp, AdvantageConfig(gamma=0.9, lam=0.95), {})
    for before, after in zip(base, again):
        torch.testing.assert_close(after, before, rtol=0, atol=0)
        assert torch.all(after[off] == 0)


@pytest.mark.parametrize("name", ADVANTAGES.names())
def test_permuting_episodes_permutes_advantages(name):
    inp = rich_input(seed=1)
    adv, ret = compute_advantages(name, inp, AdvantageConfig(gamma=0.9, lam=0.95), {})
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(3))
    permuted = AdvantageInput(
        inp.rewards[perm], inp.loss_mask[perm], [inp.group_ids[i] for i in perm], inp.turn_ids[perm],
        inp.turn_rewards[perm], inp.turn_mask[perm], inp.values[perm],
    )
    padv, pret = compute_advantages(name, permuted, AdvantageConfig(gamma=0.9, lam=0.95), {})
    torch.testing.assert_close(padv, adv[perm], atol=1e-12, rtol=0)
    torch.testing.assert_close(pret, ret[perm], atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", ["grpo", "rloo", "turn", "togo"])
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_identical_rewards_in_a_group_give_exactly_zero(name, norm_by_std):
    inp = rich_input()
    inp.rewards = torch.full((8,), 0.1, dtype=torch.float64)  # 0.1 is inexact in binary
    inp.turn_mask = torch.ones_like(inp.turn_mask)  # every episode has every turn
    inp.turn_rewards = torch.full_like(inp.turn_rewards, 0.1)
    adv, _ = compute_advantages(name, inp, AdvantageConfig(norm_by_std=norm_by_std))
    assert torch.all(adv == 0)


@pytest.mark.parametrize("name", ["grpo", "rloo"])
def test_group_of_one_gets_zero(name):
    adv, _ = compute_advantages(name, outcome_input([3.0, 1.0, 2.0], ["x", "y", "z"]))
    assert torch.all(adv == 0)


@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce"])
def test_nan_reward_is_left_out_of_the_baseline(name):
    # [1, 0, NaN] behaves like [1, 0] for the scored ones; the NaN episode gets 0
    with_nan, _ = compute_advantages(name, outcome_input([1.0, 0.0, float("nan")], "ggg"), state={})
    without, _ = compute_advantages(name, outcome_input([1.0, 0.0], "gg"), state={})
    torch.testing.assert_close(with_nan[:2], without)
    assert torch.all(with_nan[2] == 0)


def test_outcome_estimators_add_token_rewards_to_the_episode_reward():
    inp = outcome_input([1.0, 0.0], "gg", lengths=[2, 2])
    inp.token_rewards = T([[-0.25, -0.25, 9.0, 9.0], [0.0, 0.0, 9.0, 9.0]], dtype=torch.float64)
    # effective rewards [1 − 0.5, 0] (masked 9s ignored) → Dr. GRPO A = ±0.25
    adv, ret = compute_advantages("grpo", inp, AdvantageConfig(norm_by_std=False))
    assert per_episode(adv, inp.loss_mask) == pytest.approx([0.25, -0.25])
    assert per_episode(ret, inp.loss_mask) == pytest.approx([0.5, 0.0])


def test_algos_imports_only_torch_and_types():
    allowed = ("torch", "ponder.types", "ponder.algos", "ponder.registry", "__future__", "dataclasses", "typing", "math",
               "collections")
    package = Path(__file__).resolve().parents[2] / "src" / "ponder" / "algos"
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.startswith(allowed), f"{path.name} imports {name}"


def test_shape_mismatches_are_reported():
    inp = turn_input()
    inp.turn_mask = inp.turn_mask[:, :2]
    with pytest.raises(ValueError, match="turn_rewards .* and turn_mask .* must both be"):
        compute_advantages("turn", inp)
    with pytest.raises(ValueError, match="2 group_ids for 3 episodes"):
        compute_advantages("grpo", AdvantageInput(T([1.0, 2.0, 3.0]), torch.ones(3, 2), ["a", "b"]))


def test_only_gae_needs_values():
    # RLTrainer reads this trait (never the name) to add a value head
    assert [name for name in ADVANTAGES if ADVANTAGES.trait(name, "needs_values")] == ["gae"]


def test_none_gives_no_signal_from_the_reward():
    advantages, returns = compute_advantages("none", outcome_input([1.0, 0.0], ["a", "a"]))
    assert advantages.abs().sum() == 0 and returns.abs().sum() == 0 and advantages.shape == returns.shape
