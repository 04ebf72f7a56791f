"""Harness variance: the spread of repeated evaluations, by hand."""

from __future__ import annotations

import math

import pytest

from ponder.eval.variance import repeat_spread, spread_reading


def test_spread_by_hand():
    # means 0.5, 0.6, 0.7: mean 0.6, sample sd sqrt((0.01 + 0 + 0.01) / 2) = 0.1
    spread = repeat_spread([0, 1, 2], [0.5, 0.6, 0.7], [0.02, 0.03, 0.04])
    assert spread.mean == pytest.approx(0.6)
    assert spread.std == pytest.approx(0.1)
    assert (spread.low, spread.high) == (0.5, 0.7)
    assert spread.se == pytest.approx(0.03)
    assert spread.noise == pytest.approx(2 * math.sqrt(2) * 0.1)
    assert spread_reading(spread) == ("spread 0.100 (min 0.500, max 0.700) vs se 0.030: a gain below ~0.283 is "
                                      "within harness noise (2√2 × spread, two evaluations' difference at 2 sd)")
    assert spread.to_dict()["std"] == pytest.approx(0.1)


def test_identical_repeats_have_no_spread():
    spread = repeat_spread([3, 4], [0.25, 0.25], [0.05, float("nan")])
    assert spread.std == 0.0 and spread.noise == 0.0
    assert spread.se == pytest.approx(0.05)  # an undefined se (one episode) is left out
    assert spread_reading(spread, greedy=True).endswith("greedy decoding (eval.temperature 0), the seed changes "
                                                        "no episode")


def test_one_repeat_and_bad_input():
    assert spread_reading(repeat_spread([0], [0.4], [0.1])).startswith("one repeat: se 0.100")
    assert repeat_spread([0], [0.4], [0.1]).std == 0.0
    with pytest.raises(ValueError, match="one seed, mean and se per repeat"):
        repeat_spread([0, 1], [0.4], [0.1])
    with pytest.raises(ValueError):
        repeat_spread([], [], [])
