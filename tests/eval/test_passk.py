"""pass@k's unbiased estimator against its closed form, and its interval."""

from math import comb

import pytest

from ponder.eval.passk import pass_at_k, pass_at_k_with_ci, wilson_interval


@pytest.mark.parametrize("n,c,k", [(10, 3, 1), (10, 3, 5), (20, 0, 4), (20, 20, 4), (7, 2, 6), (50, 10, 10), (5, 1, 5)])
def test_matches_the_closed_form(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))


def test_pass_at_1_is_the_success_rate_and_large_n_is_stable():
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    assert 0.0 < pass_at_k(10_000, 1, 10) < 1.0


def test_bad_counts_are_refused():
    with pytest.raises(ValueError):
        pass_at_k(5, 6, 1)
    with pytest.raises(ValueError):
        pass_at_k(5, 2, 6)


def test_mean_over_tasks_with_an_interval_around_it():
    report = pass_at_k_with_ci([4, 4, 4, 4], [0, 1, 2, 4], k=2)
    expected = [1 - comb(4 - c, 2) / comb(4, 2) for c in (0, 1, 2, 4)]
    assert report["pass@k"] == pytest.approx(sum(expected) / 4)
    assert report["low"] <= report["pass@k"] <= report["high"]
    assert report["tasks"] == 4
    # task order does not change the estimate
    assert pass_at_k_with_ci([4, 4, 4, 4], [4, 2, 1, 0], k=2)["pass@k"] == pytest.approx(report["pass@k"])


def test_wilson_interval_hand_value():
    low, high = wilson_interval(5, 10)
    assert low == pytest.approx(0.2366, abs=1e-3) and high == pytest.approx(0.7634, abs=1e-3)
    assert wilson_interval(0, 10)[0] == pytest.approx(0.0, abs=1e-12)
