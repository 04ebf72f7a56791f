"""The benchmark's correctness gate on the tiny model: ponder's GRPO loss and
gradients equal TRL's GRPOTrainer for each matching loss type, a deliberate mismatch
fails it, and TRL reads the benchmark template's tool calls. Needs the `bench` extra."""

import pytest

pytest.importorskip("trl", reason="trl is not installed (the `bench` extra: make bench-setup)")

from bench.gate import TOLERANCE, run_gate  # noqa: E402
from bench.workloads import TOOL_SYSTEM, TOOL_TEMPLATE, arithmetic_tasks, calculator, task_messages  # noqa: E402
from ponder.models import tiny_policy  # noqa: E402


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    policy = tiny_policy()
    policy.model.save_pretrained(path)
    policy.tokenizer.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize(
    ("loss_type", "aggregation", "temperature"),
    [
        ("dapo", "token_mean", 1.0),
        ("grpo", "seq_mean_token_mean", 0.7),
        ("dr_grpo", "seq_mean_token_sum_norm", 1.0),
    ],
)
def test_ponder_loss_and_gradients_equal_trls(tiny_dir, loss_type, aggregation, temperature):
    result = run_gate(
        tiny_dir, loss_type=loss_type, beta=0.04, temperature=temperature, lora_r=4, lora_alpha=8
    )
    assert result.passed, result.line()
    assert result.aggregation == aggregation
    assert result.tensors == 28  # 2 layers × 7 linear modules × (A, B)
    assert result.loss_rel <= TOLERANCE and result.grad_rel_global <= TOLERANCE
    assert result.grad_rel_max <= TOLERANCE  # per tensor too, on the 2-layer model
    assert abs(result.loss_trl) > 1e-3  # a real loss, not two zeros agreeing
    assert result.logprob_max_abs_diff < 1e-5
    # float32 as benchmarked: ponder's rounding no worse than TRL's own (or within tolerance)
    assert 0 < result.fp32_ponder_error <= max(TOLERANCE, result.fp32_trl_error)
    assert result.fp32_grad_rel < 1e-4


def test_a_mismatched_loss_fails_the_gate(tiny_dir):
    result = run_gate(tiny_dir, loss_type="grpo", lora_r=4, lora_alpha=8, ponder_aggregation="token_mean")
    assert not result.passed
    assert result.loss_rel > 1e-3
    assert "FAIL" in result.line()


def test_trl_parses_the_benchmark_templates_tool_calls():
    from trl.chat_template_utils import add_response_schema, parse_response

    from ponder.models import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = TOOL_TEMPLATE
    tokenizer = add_response_schema(tokenizer)
    task = arithmetic_tasks("tool", 1, seed=0)[0]
    prompt = tokenizer.apply_chat_template(
        task_messages(task, TOOL_SYSTEM),
        tools=[calculator],
        tokenize=True,
        add_generation_prompt=True,
        return_dict=False,
    )
    ids = tokenizer.encode(task.oracle_actions[0], add_special_tokens=False) + [tokenizer.eos_token_id]
    message = parse_response(
        tokenizer, ids, prefix=prompt, tools=[calculator]
    )  # as GRPOTrainer._generate calls it
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "calculator"
    assert calculator(**call["function"]["arguments"]) == task.answers[0]
