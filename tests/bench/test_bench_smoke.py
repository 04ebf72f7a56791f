"""The benchmark scripts' --smoke modes end to end (tiny model, a few tokens), so the
harness cannot rot. Slow: several processes each import torch (and TRL)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _run(script, tmp_path, *args):
    env = dict(os.environ, PONDER_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--smoke", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


@pytest.mark.skipif(
    importlib.util.find_spec("trl") is None, reason="trl is not installed (the `bench` extra)"
)
def test_grpo_vs_trl_smoke(tmp_path):
    out = tmp_path / "results.json"
    stdout = _run("grpo_vs_trl.py", tmp_path, "--threads", "1", "--out", str(out))
    assert "correctness gate PASS" in stdout and "| ponder/TRL |" in stdout
    results = json.loads(out.read_text())
    assert results["gate"]["passed"] and set(results["workloads"]) == {"single", "tool"}
    for workload in results["workloads"].values():
        for system in ("ponder", "trl"):
            run = workload["runs"][system]
            assert len(run["steps"]) == 2  # --smoke: 1 warm-up + 2 measured steps
            assert all(step["completion_tokens"] > 0 and step["step_s"] > 0 for step in run["steps"])
            assert all(step["threads"] == 1 for step in run["steps"])
            assert run["peak_rss_mb"] > 100


def test_roofline_smoke(tmp_path):
    out = tmp_path / "roofline.json"
    stdout = _run("roofline.py", tmp_path, "--threads", "1", "--out", str(out))
    assert "peak fp32 matmul" in stdout
    measured = json.loads(out.read_text())
    assert measured["matmul_flops_per_s"] > 1e8 and measured["bandwidth"]["read_bytes_per_s"] > 1e8
    assert [row["batch"] for row in measured["generation"]] == [1, 2]
    assert all(0 < row["fraction_of_roofline"] < 1 for row in measured["generation"])
    assert 0 < measured["training"]["fraction_of_compute_roofline_6p"] < 1


def test_decode_kernels_smoke(tmp_path):
    stdout = _run("decode_kernels.py", tmp_path, "--threads", "1")
    rows = [line.split(" | ") for line in stdout.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    names = [row[1] for row in rows]
    assert names == ["q|k|v", "o", "gate|up", "down", "head", "all"] * 2  # both batch sizes, every matrix
    speedups = [float(row[-1].rstrip("x |")) for row in rows]
    assert all(speedup > 0 for speedup in speedups)  # both kernels timed (ms are printed rounded)


def test_lora_linear_smoke(tmp_path):
    stdout = _run("lora_linear.py", tmp_path, "--threads", "1")
    assert "gradients equal within" in stdout
    rows = {line.split(" | ")[0].lstrip("| "): float(line.split(" | ")[1]) for line in stdout.splitlines()
            if line.startswith("| PEFT") or line.startswith("| ponder")}
    assert set(rows) == {"PEFT's Linear", "ponder's fused LoRA linear"} and all(ms > 0 for ms in rows.values())


def test_constrained_decoding_smoke(tmp_path):
    out = tmp_path / "constrained.json"
    stdout = _run("constrained_decoding.py", tmp_path, "--out", str(out))
    results = json.loads(out.read_text())
    assert [row["batch"] for row in results["rows"]] == [1, 2] and "compile a schema" in stdout
    assert all(row["free_tok_s"] > 0 and row["constrained_tok_s"] > 0 for row in results["rows"])
    assert results["cached_ms"] < results["compile_ms"]


def test_structured_outputs_smoke(tmp_path):
    out = tmp_path / "structured.json"
    stdout = _run("structured_outputs.py", tmp_path, "--out", str(out))
    results = json.loads(out.read_text())
    assert results["tool_choice at temperature 1"] == {**results["tool_choice at temperature 1"], "valid": 3}
    assert "streamed and whole greedy calls agree: 2/2" in stdout


@pytest.mark.skipif(importlib.util.find_spec("tinker") is None, reason="tinker is not installed (the `tinker` extra)")
def test_tinker_parity_smoke(tmp_path):
    out = tmp_path / "parity.json"
    stdout = _run("tinker_parity.py", tmp_path, "--out", str(out))
    assert "largest weight difference after 2 steps" in stdout
    result = json.loads(out.read_text())
    assert [s["step"] for s in result["steps"]] == [0, 1]
    for step in result["steps"]:  # the client's numbers are ponder's SFT step's, to float noise
        assert step["tinker_loss"] == pytest.approx(step["ponder_loss"], abs=1e-5)
        assert step["tinker_grad_norm"] == pytest.approx(step["ponder_grad_norm"], rel=1e-4)
    assert result["max_weight_diff"] < 1e-4
