"""`ponder estimate` through the command line: the table within 80 columns, the JSON's
shape, an unknown device, a bad recipe, and the CPU calibration kept in the cache dir."""

import json

import pytest

from ponder.cli import main
from ponder.estimate import formulas as f
from ponder.estimate import devices
from ponder.models.model_config import read_model_config

TINY = ["model.name=tiny", "lora.r=4", "sft.steps=2", "train.steps=2", "rollout.sampling.max_total_tokens=128"]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PONDER_CACHE_DIR", str(tmp_path / "cache"))  # no calibration of this machine's


def test_json_shape(capsys):
    assert main(["estimate", "recipes/demo.yaml", *TINY, "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"recipe", "model", "device", "devices", "tokens", "memory_bytes", "peak_bytes", "time_s",
                        "details", "fits", "assumptions"}  # fmt: skip
    shape = f.shape_from_config(read_model_config("tiny"))
    assert out["model"]["parameters"] == f.parameter_count(shape)
    assert out["memory_bytes"]["weights"] == 4 * f.parameter_count(shape)  # float32 on a CPU
    assert {"weights", "trainable", "gradients", "optimizer", "kv_rollout", "activations"} <= set(out["memory_bytes"])
    assert set(out["peak_bytes"]) == {"peak_sft", "peak_rollout", "peak_update", "peak_eval"}
    assert {"sft_s", "rollout_s", "update_s", "rl_s", "eval_s", "total_s"} <= set(out["time_s"])
    assert all(value >= 0 for value in out["time_s"].values())
    assert out["tokens"]["episode"] == 128 and out["device"]["name"] == "cpu"
    assert any("NOT CALIBRATED" in line for line in out["assumptions"])


def test_gpu_count_and_type(capsys):
    assert main(["estimate", "recipes/demo.yaml", *TINY, "--device", "H100", "--devices", "4", "--json"]) == 0
    four = json.loads(capsys.readouterr().out)
    assert main(["estimate", "recipes/demo.yaml", *TINY, "--device", "h100", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert four["device"]["label"].startswith("NVIDIA H100") and four["devices"] == 4
    assert four["memory_bytes"]["weights"] == one["memory_bytes"]["weights"]  # a policy copy on each device
    assert four["time_s"]["eval_s"] < one["time_s"]["eval_s"]  # evaluations spread over the devices
    assert four["time_s"]["update_s"] == one["time_s"]["update_s"]  # one learner
    assert not any("NOT CALIBRATED" in line for line in one["assumptions"])


def test_table_fits_80_columns(capsys):
    assert main(["estimate", "recipes/demo.yaml", *TINY, "--device", "a100"]) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= 80 for line in out.splitlines()), max(out.splitlines(), key=len)
    for heading in ("memory", "peak per stage", "time", "assumptions:", "AdamW state", "KV cache, rollouts"):
        assert heading in out


def test_unknown_device_is_one_line_naming_the_known_ones(capsys):
    assert main(["estimate", "recipes/demo.yaml", *TINY, "--device", "b300"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "unknown device 'b300'" in err and "h100" in err and "cpu" in err and "a100" in err


def test_a_bad_recipe_gives_the_recipe_error(capsys):
    assert main(["estimate", "recipes/demo.yaml", "sft.stepz=3"]) == 2
    assert "unknown key 'sft.stepz'" in capsys.readouterr().err
    assert main(["estimate", "no/such/recipe.yaml"]) == 2
    assert "cannot read recipe" in capsys.readouterr().err


def test_calibration_is_kept_and_used(capsys, monkeypatch):
    assert not devices.this_cpu()[1]
    measured = devices.calibrate_cpu(seconds=0.05, copy_mb=8)
    assert devices.calibration_file().is_file() and measured["matmul_gflops"] > 0 and measured["bandwidth_gbs"] > 0
    cpu, calibrated = devices.this_cpu()
    assert calibrated and cpu.fp32_tflops == pytest.approx(measured["matmul_gflops"] / 1e3)
    monkeypatch.setattr(devices, "calibrate_cpu", lambda: measured)  # the command's measurement, without the wait
    assert main(["estimate", "--calibrate"]) == 0
    assert "calibrated this CPU" in capsys.readouterr().err
    assert main(["estimate", "recipes/demo.yaml", *TINY, "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "calibrated" in out["device"]["label"] and not any("NOT CALIBRATED" in a for a in out["assumptions"])


def test_token_and_utilisation_overrides(capsys):
    assert main(["estimate", "recipes/demo.yaml", *TINY, "--device", "l4", "--json", "--episode-tokens", "64",
                 "--decode-tokens", "16", "--mfu", "0.5"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert (out["tokens"]["episode"], out["tokens"]["decode"], out["device"]["compute_util"]) == (64, 16, 0.5)
    assert main(["estimate", "recipes/demo.yaml", *TINY, "--device", "l4", "--mfu", "2"]) == 2
    assert "--mfu" in capsys.readouterr().err
