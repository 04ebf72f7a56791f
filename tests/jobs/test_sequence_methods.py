"""Every continual-learning method on a two-family sequence of the tiny LoRA model
(ponder.jobs.sequence with continual.method): the values each one promises."""

import json

import pytest
import torch

from ponder.config import ContinualConfig, LoraConfig, PipelineRecipe, SFTTrainerConfig, load_recipe
from ponder.data import ChatFormatter, Conversation
from ponder.jobs.pipeline import check_pipeline, run_pipeline
from ponder.jobs.sequence import Family, train_sequence
from ponder.models import apply_lora, tiny_policy
from ponder.models.adapters import find_trained, saved_weights, trainable_state
from ponder.train.continual_methods import build_method
from tests.jobs.test_pipeline import TINY as PIPELINE_TINY

STEPS = 4
SFT = SFTTrainerConfig(
    steps=STEPS, batch_size=2, micro_batch_size=2, lr=1e-2, warmup_steps=0, schedule="constant"
)


def _families(policy):
    formatter = ChatFormatter(policy.tokenizer, "hermes")

    def family(name, chats):
        examples = [
            formatter(Conversation([{"role": "user", "content": q}, {"role": "assistant", "content": a}]))
            for q, a in chats
        ]
        return Family(name, examples, examples)

    return [
        family("a", [("is the sky blue?", "yes"), ("is water wet?", "yes it is")]),
        family("b", [("is the sun cold?", "no"), ("is ice hot?", "no it is not")]),
    ]


def _run(tmp_path, **fields):
    torch.manual_seed(0)
    policy = apply_lora(tiny_policy(), LoraConfig(r=4, alpha=8))
    cfg = ContinualConfig(**fields)
    run_dir = tmp_path / (cfg.method or "legacy")
    method = build_method(cfg, 0, SFT.micro_batch_size, run_dir)
    result = train_sequence(policy, _families(policy), SFT, cfg, run_dir, say=lambda _: None, method=method)
    return policy, method, result, run_dir


def _distance_from_first_family(policy, run_dir):
    """Σ (θ − θ*)² of the trainable weights, θ* as saved when family a finished."""
    anchor = saved_weights(find_trained(run_dir / "0-a"))
    final = trainable_state(policy.model)
    return sum(float(((final[name] - anchor[name]) ** 2).sum()) for name in anchor)


def test_naive_fills_the_matrix_and_adds_nothing(tmp_path):
    _, _, result, _ = _run(tmp_path, method="naive")
    assert result.method == "naive" and len(result.accuracy) == 2 and len(result.history) == 2 * STEPS
    assert all(set(row) == {"sft/loss", "sft/grad_norm", "sft/lr", "sft/tokens"} for row in result.history)


def test_replay_mixes_the_first_family_into_the_second(tmp_path):
    _, _, result, _ = _run(tmp_path, method="replay", replay_capacity=4, replay_ratio=0.5)
    assert [row["sft/replayed"] for row in result.history] == [0.0] * STEPS + [1.0] * STEPS


@pytest.mark.parametrize(
    "method, fields, key",
    [("ewc", {"ewc_lambda": 1e4}, "sft/ewc_penalty"), ("si", {"si_c": 1e4}, "sft/si_penalty"),
     ("mas", {"mas_lambda": 1e4}, "sft/mas_penalty")],  # fmt: skip
)
def test_quadratic_penalties_are_positive_after_the_first_family_and_pull_weights_back(
    tmp_path, method, fields, key
):
    naive_policy, _, _, naive_dir = _run(tmp_path, method="naive")
    policy, state, result, run_dir = _run(tmp_path, method=method, **fields)
    first, second = result.history[:STEPS], result.history[STEPS:]
    assert all(row[key] == 0.0 for row in first)  # no earlier family, no anchor
    assert second[0][key] == pytest.approx(0.0, abs=1e-9)  # the second family starts at θ*
    assert all(row[key] > 0 for row in second[1:])
    importance = state.state.fisher if method == "ewc" else state.state.importance
    assert all(bool((value >= 0).all()) for value in importance.values())
    assert any(bool((value > 0).any()) for value in importance.values())
    # the same first family (penalty 0), so the same θ*; the penalty keeps the second family closer to it
    moved = _distance_from_first_family(policy, run_dir)
    assert moved < 0.75 * _distance_from_first_family(naive_policy, naive_dir)  # measured: 0.52, 0.05, 0.14


def test_si_accumulates_a_positive_path_integral_while_training(tmp_path):
    _, method, _, _ = _run(tmp_path, method="si", si_c=1.0)
    # consolidated twice: every step went downhill on the task's own loss for most weights
    total = sum(float(value.sum()) for value in method.state.importance.values())
    assert total > 0 and method.state.omega == {}


def test_agem_never_leaves_a_negative_dot_product_with_the_memory_gradient(tmp_path):
    _, _, result, _ = _run(tmp_path, method="agem", replay_capacity=4, memory_batch_size=2)
    first, second = result.history[:STEPS], result.history[STEPS:]
    assert all("sft/agem_dot" not in row for row in first)  # empty memory: the plain gradient
    for row in second:
        assert row["sft/agem_dot_after"] >= -1e-6 * max(1.0, abs(row["sft/agem_dot"]))
        if row["sft/agem_dot"] < 0:
            assert row["sft/agem_projected"] == 1.0
            assert row["sft/agem_dot_after"] == pytest.approx(0.0, abs=1e-5)
        else:
            assert row["sft/agem_projected"] == 0.0 and row["sft/agem_dot_after"] == row["sft/agem_dot"]
    assert any(row["sft/agem_projected"] == 1.0 for row in second)  # the families conflict at least once


def test_derpp_matches_the_stored_logits(tmp_path):
    fields = {"replay_capacity": 4, "memory_batch_size": 2, "derpp_topk": 8}
    _, method, result, _ = _run(tmp_path, method="derpp", **fields)
    second = result.history[STEPS:]
    assert second[0]["sft/derpp_mse"] < 1e-8  # the weights that stored the logits: nothing to match yet
    assert all(row["sft/derpp_mse"] > 0 for row in second[1:])
    assert all(row["sft/derpp_nll"] > 0 for row in second)
    stored = method.memory.items
    assert len(stored) == 4 and all(item.values.shape[-1] == 8 and item.index is not None for item in stored)


def test_lora_per_task_keeps_the_first_adapter_bit_identical(tmp_path):
    policy, method, result, run_dir = _run(tmp_path, method="lora_per_task")
    first_family = saved_weights(find_trained(run_dir / "0-a"))  # as it was when family a finished
    assert set(method.adapters[0]) == set(first_family)
    assert all(torch.equal(method.adapters[0][name], first_family[name]) for name in first_family)
    assert any(not torch.equal(method.adapters[0][n], method.adapters[1][n]) for n in first_family)
    assert result.accuracy[1][0] == result.accuracy[0][0]  # family a is scored with its own adapter
    assert result.token_accuracy[1][0] == result.token_accuracy[0][0]
    assert result.accuracy[0][1] == result.baseline[1]  # family b before its adapter: the base model
    assert result.merged == []


def test_lora_per_task_routes_by_prompt_and_merges_with_ponder_merge(tmp_path):
    fields = {"lora_router": "centroid", "lora_merge": "linear"}
    _, method, result, run_dir = _run(tmp_path, method="lora_per_task", **fields)
    assert sorted(method.centroids) == [0, 1] and (run_dir / "merged" / "ponder.json").is_file()
    assert len(result.merged) == 2 and all(0.0 <= value <= 1.0 for value in result.merged)


def test_the_pipeline_runs_a_method_after_the_warm_up_and_refuses_the_ones_it_cannot(tmp_path):
    def recipe(*extra):
        overrides = [o for o in PIPELINE_TINY if not o.startswith(("continual.", "pipeline.stages"))]
        return load_recipe(None, overrides + ["pipeline.stages=[warmup, sft]", *extra], cls=PipelineRecipe)

    for name, why in (("si", "accumulates its importance"), ("lora_per_task", "keeps an adapter per task")):
        with pytest.raises(ValueError, match=f"continual.method {name}: {why}"):
            check_pipeline(recipe(f"continual.method={name}"))
    with pytest.raises(ValueError, match="continual.method agem: set continual.replay_capacity > 0"):
        check_pipeline(recipe("continual.method=agem"))
    run_pipeline(recipe("continual.method=derpp", "continual.replay_capacity=4", "continual.memory_batch_size=1",
                        "pipeline.eval_before=false", "pipeline.eval_each=false"), tmp_path, say=lambda _: None)  # fmt: skip
    last = json.loads((tmp_path / "01-sft" / "done.json").read_text())["last"]
    assert last["sft/derpp_mse"] >= 0.0 and last["sft/derpp_nll"] > 0.0  # the warm-up's examples are the memory
