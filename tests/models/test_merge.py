"""Model merging: the arithmetic on hand-built tensors, then `ponder merge` end to end
on LoRA adapters of the tiny model (full-weight and PEFT merges, loading the result)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ponder.cli import main
from ponder.models.adapters import load_trained, save_trained
from ponder.models.loading import load_policy
from ponder.models.merge import dare, dare_drop, linear, merge_deltas, ties, trim

from ..tiny_lora import random_lora


def test_linear_is_the_weighted_sum_and_normalised_the_weighted_mean():
    a, b = torch.tensor([1.0, -2.0, 4.0]), torch.tensor([3.0, 2.0, 0.0])
    assert torch.equal(linear([a, b], [2.0, 1.0]), torch.tensor([5.0, -2.0, 8.0]))
    assert torch.allclose(linear([a, b], [3.0, 1.0], normalize=True), torch.tensor([1.5, -1.0, 3.0]))


def test_trim_keeps_the_largest_magnitudes():
    delta = torch.tensor([0.1, -5.0, 2.0, -0.3, 4.0, 0.0])
    assert torch.equal(trim(delta, 0.5), torch.tensor([0.0, -5.0, 2.0, 0.0, 4.0, 0.0]))
    assert torch.equal(trim(delta, 1.0), delta)


def test_ties_elects_signs_by_mass_and_averages_only_the_agreeing_values():
    # Three task vectors, density 1 (no trim), equal weights. Worked by hand:
    # elem 0: 2, 3, -1 → sum 4 > 0 → mean of {2, 3} = 2.5
    # elem 1: -4, 1, 1 → sum -2 < 0 → only -4 agrees → -4
    # elem 2: 0, 0, 5 → +, one voter → 5
    # elem 3: 1, -1, 0 → sum 0 → sign 0, nobody agrees → 0
    t1 = torch.tensor([2.0, -4.0, 0.0, 1.0])
    t2 = torch.tensor([3.0, 1.0, 0.0, -1.0])
    t3 = torch.tensor([-1.0, 1.0, 5.0, 0.0])
    assert torch.allclose(ties([t1, t2, t3], [1.0, 1.0, 1.0], density=1.0), torch.tensor([2.5, -4.0, 5.0, 0.0]))
    # Weights move the election and the mean: elem 1 with t2, t3 at weight 3 → -4+3+3 > 0,
    # mean over t2, t3 = (3·1 + 3·1) / 6 = 1.
    weighted = ties([t1, t2, t3], [1.0, 3.0, 3.0], density=1.0)
    assert weighted[1].item() == pytest.approx(1.0)
    # density 0.5 keeps 2 of 4 per vector: t1 → [2,-4,0,0], t2 → [3,1,0,-1]→[3,0,0,-1]
    # (|1| ties with |-1|: topk keeps one; both are below |3|), t3 → [-1,1,5,0]→[0,0,5,0]+one of ±1.
    trimmed = ties([t1, t2, t3], [1.0, 1.0, 1.0], density=0.5)
    assert trimmed[0].item() == pytest.approx(2.5) and trimmed[2].item() == pytest.approx(5.0)


def test_dare_rescaling_keeps_the_expectation():
    delta = torch.linspace(-1.0, 1.0, 64)
    generator = torch.Generator().manual_seed(0)
    draws = torch.stack([dare_drop(delta, 0.7, generator) for _ in range(4000)])
    kept = (draws != 0).float().mean().item()
    assert kept == pytest.approx(0.3, abs=0.01)
    # Survivors are scaled by 1/(1-p) exactly, and the mean over draws is the input.
    nonzero = draws[draws != 0]
    ratio = nonzero / delta.expand_as(draws)[draws != 0]
    assert torch.allclose(ratio, torch.full_like(ratio, 1 / 0.3))
    assert torch.allclose(draws.mean(0), delta, atol=0.05)


def test_dare_linear_with_no_drop_is_linear_and_dare_ties_elects():
    a, b = torch.tensor([1.0, -2.0]), torch.tensor([3.0, 1.0])
    assert torch.equal(dare([a, b], [1.0, 1.0], 0.0), linear([a, b], [1.0, 1.0]))
    assert torch.allclose(dare([a, b], [1.0, 1.0], 0.0, sign_election=True), torch.tensor([2.0, -2.0]))


@pytest.mark.parametrize("method", ["linear", "task_arithmetic", "ties", "dare_linear", "dare_ties"])
def test_one_model_at_weight_one_is_returned_unchanged(method):
    delta = torch.randn(5, 7, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(merge_deltas(method, [delta], [1.0], density=1.0, drop_rate=0.0), delta)


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="unknown merge method 'slerp'"):
        merge_deltas("slerp", [torch.zeros(2)], [1.0])


def _adapter(tmp_path: Path, seed: int) -> Path:
    return save_trained(random_lora(seed), tmp_path / f"adapter{seed}")


def _config(tmp_path: Path, method: str, sources: list[Path], merge_on: str = "full", **params) -> Path:
    path = tmp_path / f"{method}-{merge_on}.yaml"
    models = "".join(f"  - {{model: {s}, weight: 1.0}}\n" for s in sources)
    extra = "".join(f"  {k}: {v}\n" for k, v in params.items())
    path.write_text(f"merge_method: {method}\nbase_model: tiny\nmerge_on: {merge_on}\nmodels:\n{models}"
                    f"parameters:\n  seed: 0\n{extra}out: {tmp_path / (method + '-' + merge_on)}\n")  # fmt: skip
    return path


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in load_trained(path).model.state_dict().items()}


def test_merging_one_adapter_full_returns_its_weights(tmp_path):
    source = _adapter(tmp_path, 1)
    assert main(["merge", str(_config(tmp_path, "ties", [source]))]) == 0
    merged, expected = _weights(tmp_path / "ties-full"), _weights(source)
    assert json.loads((tmp_path / "ties-full" / "ponder.json").read_text())["kind"] == "full"
    assert all(torch.allclose(merged[k], expected[k], atol=1e-6) for k in expected)


def test_task_arithmetic_full_adds_the_task_vectors(tmp_path):
    one, two = _adapter(tmp_path, 1), _adapter(tmp_path, 2)
    assert main(["merge", str(_config(tmp_path, "task_arithmetic", [one, two]))]) == 0
    base = {k: v.detach() for k, v in load_policy("tiny").model.state_dict().items()}
    a, b, merged = _weights(one), _weights(two), _weights(tmp_path / "task_arithmetic-full")
    name = next(k for k in base if "q_proj" in k)
    assert not torch.allclose(a[name], base[name])
    assert torch.allclose(merged[name], base[name] + (a[name] - base[name]) + (b[name] - base[name]), atol=1e-5)


def test_lora_merge_is_a_loadable_adapter_equal_to_the_sum(tmp_path):
    one, two = _adapter(tmp_path, 1), _adapter(tmp_path, 2)
    assert main(["merge", str(_config(tmp_path, "task_arithmetic", [one, two], merge_on="lora"))]) == 0
    out = tmp_path / "task_arithmetic-lora"
    assert {"adapter_config.json", "adapter_model.safetensors", "ponder.json"} <= {p.name for p in out.iterdir()}
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 8  # cat: ranks side by side
    base = {k: v.detach() for k, v in load_policy("tiny").model.state_dict().items()}
    a, b, merged = _weights(one), _weights(two), _weights(out)
    name = next(k for k in base if "v_proj" in k)
    assert torch.allclose(merged[name], a[name] + b[name] - base[name], atol=1e-5)


@pytest.mark.parametrize("method", ["ties", "dare_ties", "dare_linear"])
def test_lora_merge_methods_write_an_adapter(tmp_path, method):
    one, two = _adapter(tmp_path, 1), _adapter(tmp_path, 2)
    config = _config(tmp_path, method, [one, two], merge_on="lora", density=0.5, drop_rate=0.3)
    assert main(["merge", str(config)]) == 0
    policy = load_trained(tmp_path / f"{method}-lora")
    assert policy.model(torch.tensor([[1, 2, 3]])).logits.isfinite().all()


def test_bad_config_is_one_line_naming_file_and_key(tmp_path, capsys):
    source = _adapter(tmp_path, 1)
    config = _config(tmp_path, "ties", [source], density=1.5)
    assert main(["merge", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(config) in err and "parameters.density" in err
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"merge_method: slerp\nmodels: [{{model: {source}}}]\nout: {tmp_path / 'x'}\n")
    assert main(["merge", str(bad)]) == 2
    assert "merge_method" in capsys.readouterr().err
    bad.write_text(f"merge_method: ties\nbase_model: tiny\nmodels: [{{model: {tmp_path / 'nope'}}}]\n"
                   f"out: {tmp_path / 'x'}\n")  # fmt: skip
    assert main(["merge", str(bad)]) == 2
    assert "models[0].model" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_existing_output_is_refused_without_overwrite(tmp_path, capsys):
    source = _adapter(tmp_path, 1)
    config = _config(tmp_path, "linear", [source])
    assert main(["merge", str(config)]) == 0
    assert main(["merge", str(config)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["merge", str(config), "--overwrite"]) == 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".linear-full")]  # no staging left


def test_a_trained_base_subtracts_itself_and_lora_mode_refuses_it(tmp_path, capsys):
    # base_model a trained run (a shared warm-up): the task vectors are source − warm-up.
    warm, source = _adapter(tmp_path, 1), _adapter(tmp_path, 2)
    config = _config(tmp_path, "task_arithmetic", [source], scale=0.5)
    config.write_text(config.read_text().replace("base_model: tiny", f"base_model: {warm}"))
    assert main(["merge", str(config)]) == 0
    out = tmp_path / "task_arithmetic-full"
    w, s, merged = _weights(warm), _weights(source), _weights(out)
    name = next(k for k in w if "q_proj" in k)
    assert not torch.allclose(w[name], s[name])
    assert torch.allclose(merged[name], w[name] + 0.5 * (s[name] - w[name]), atol=1e-5)
    assert json.loads((out / "ponder.json").read_text())["base_model"] == "tiny"  # what it loads on
    lora = _config(tmp_path, "ties", [source], merge_on="lora")
    lora.write_text(lora.read_text().replace("base_model: tiny", f"base_model: {warm}"))
    assert main(["merge", str(lora)]) == 2
    assert "base_model" in capsys.readouterr().err and not (tmp_path / "ties-lora").exists()
