"""bench/plots.py: the median step split and the two pictures from result records."""

from __future__ import annotations

from bench.plots import main, median_phases


def _step(gen: float, logprob: float, update: float) -> dict[str, float]:
    return {"generation_s": gen, "logprob_s": logprob, "update_s": update, "other_s": 0.01}


def test_median_phases_takes_each_phase_median_separately():
    steps = [_step(4.0, 0.8, 2.0), _step(5.0, 0.7, 2.4), _step(3.0, 0.9, 2.2)]
    assert median_phases(steps) == [4.0, 0.8, 2.2, 0.01]


def test_plots_are_written_from_result_files(tmp_path):
    import json

    roofline = {"model": "m", "threads": 2, "generation": [
        {"batch": 1, "tokens_per_s": 30.0, "roofline_tokens_per_s": 50.0, "fraction_of_roofline": 0.6},
        {"batch": 8, "tokens_per_s": 120.0, "roofline_tokens_per_s": 400.0, "fraction_of_roofline": 0.3},
    ]}  # fmt: skip
    runs = {"ponder": {"steps": [_step(4.0, 0.8, 2.0)]}, "trl": {"steps": [_step(5.0, 0.9, 2.6)]}}
    grpo = {"workloads": {"single": {"runs": runs}}}
    (tmp_path / "r.json").write_text(json.dumps(roofline))
    (tmp_path / "g.json").write_text(json.dumps(grpo))
    assert main(["--roofline", str(tmp_path / "r.json"), "--grpo", str(tmp_path / "g.json"), "--out", str(tmp_path)]) == 0
    for name in ("bench-roofline.png", "bench-step-split.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_missing_result_file_is_one_line_naming_it(tmp_path):
    import pytest

    with pytest.raises(SystemExit, match="missing.json: cannot read benchmark results"):
        main(["--roofline", str(tmp_path / "missing.json"), "--out", str(tmp_path)])
