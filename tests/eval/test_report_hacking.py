"""The run report draws the reward-hacking rates an RL run logs."""

from ponder.eval.report_html.figures import curve_figures


def test_hacking_rates_get_their_panels():
    records = [{"step": s, "reward/mean": 0.1 * s, "hacking/format_gaming": 0.05 * s, "hacking/repetition": 0.0,
                "hacking/length_reward_corr": 0.2, "hacking/length_gaming": 0.0} for s in (1, 2, 3)]  # fmt: skip
    titles = [figure["title"] for figure in curve_figures([("run", records)])]
    assert "reward hacking" in titles and "hacking trends" in titles
    assert "reward hacking" not in [f["title"] for f in curve_figures([("run", [{"step": 1, "reward/mean": 0.0}])])]
