"""The benchmark's workloads and bookkeeping, without TRL: the calculator, the reward,
prompts identical to `apply_chat_template(tools=...)`, tool turns that append exactly
the chat template's tokens through ponder's real rollout engine, and a report that
drops its ratio column when the correctness gate failed."""

import pytest

from bench.common import BenchConfig, emit, median_spread, paired_ratios, parse_record
from bench.grpo_vs_trl import table
from bench.workloads import (
    TOOL_SYSTEM,
    TOOL_TEMPLATE,
    EnvFactory,
    arithmetic_tasks,
    calculator,
    episode_reward,
    number_reward,
    tool_system_prompt,
)
from ponder.config import RolloutConfig, SamplingConfig
from ponder.models import tiny_tokenizer
from ponder.rollout import RolloutEngine, ScriptedBackend
from ponder.tools.parsers import HermesParser


@pytest.fixture(scope="module")
def tokenizer():
    tok = tiny_tokenizer()
    tok.chat_template = TOOL_TEMPLATE
    return tok


def test_calculator_evaluates_arithmetic_and_rejects_anything_else():
    assert calculator("12 * (3 + 4)") == "84"
    assert calculator("7 / 2") == "3.5"
    assert calculator("-3 + 10") == "7"
    for bad in ("__import__('os')", "2 ** 8", "1 / 0", "x + 1", "1 +"):
        with pytest.raises(ValueError):
            calculator(bad)


def test_number_reward_reads_the_last_number():
    assert number_reward("The answer is 85.", "85") == 1.0
    assert number_reward("85, no wait, 86", "85") == 0.0
    assert number_reward("", "1") == 0.0
    assert number_reward("3.0", "3") == 1.0


def test_tasks_are_seeded_and_tool_oracles_compute_the_answer():
    first, again = arithmetic_tasks("tool", 5, seed=3), arithmetic_tasks("tool", 5, seed=3)
    assert [t.question for t in first] == [t.question for t in again]
    assert [t.question for t in arithmetic_tasks("tool", 5, seed=4)] != [t.question for t in first]
    for task in first:
        call = HermesParser().parse(task.oracle_actions[0]).calls[0]
        assert call.name == "calculator"
        assert calculator(**call.arguments) == task.answers[0]
    single = arithmetic_tasks("single", 3, seed=0)[0]
    a, b = (int(x) for x in single.question.removeprefix("What is ").removesuffix("?").split(" + "))
    assert single.answers == [str(a + b)]


def test_tool_prompt_equals_the_templates_tools_rendering(tokenizer):
    system = tool_system_prompt(tokenizer)
    question = [{"role": "user", "content": "What is 1 + 2?"}]
    ponder_text = tokenizer.apply_chat_template(
        [{"role": "system", "content": system}] + question, tokenize=False, add_generation_prompt=True
    )
    trl_text = tokenizer.apply_chat_template(
        [{"role": "system", "content": TOOL_SYSTEM}] + question,
        tools=[calculator],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert ponder_text == trl_text
    assert '"name": "calculator"' in system and system.startswith(TOOL_SYSTEM)


def test_tool_episode_tokens_are_the_chat_templates(tokenizer):
    """Scripted oracle actions through ponder's engine and the bench's ToolUseEnv give
    exactly the rendered conversation, with the tool turn masked out."""
    task = arithmetic_tasks("tool", 1, seed=0)[0]
    sampling = SamplingConfig(max_new_tokens_per_turn=1000, max_total_tokens=100000)
    engine = RolloutEngine(
        ScriptedBackend(tokenizer, {task.id: task.oracle_actions}),
        EnvFactory("tool", tokenizer, 3),
        RolloutConfig(batch_size=1, group_size=1, sampling=sampling),
    )
    (episode,), _ = engine.run([task])
    call = HermesParser().parse(task.oracle_actions[0]).calls[0]
    conversation = [
        {"role": "system", "content": TOOL_SYSTEM},
        {"role": "user", "content": task.question},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "calculator", "arguments": call.arguments}}
            ],
        },
        {"role": "tool", "name": "calculator", "content": task.answers[0]},
        {"role": "assistant", "content": task.answers[0]},
    ]
    rendered = tokenizer.apply_chat_template(conversation, tools=[calculator], tokenize=False)
    assert tokenizer.decode(episode.prompt_ids + episode.response_ids) + "\n" == rendered
    observation = episode.turns[0].observation
    assert observation.startswith("\n<|im_start|>user\n<tool_response>\n" + task.answers[0])
    masked = [t for t, m in zip(episode.response_ids, episode.loss_mask) if m == 0]
    assert tokenizer.decode(masked) == observation
    assert episode_reward(episode, task) == (1.0, {"correct": 1.0})
    assert episode.metrics["tool_calls"] == 1.0


def test_in_order_sampler_cycles_through_the_tasks():
    from ponder.train.sampler import TaskSampler

    tasks = arithmetic_tasks("single", 3, seed=0)
    sampler = TaskSampler(tasks, seed=5, shuffle=False)
    ids = [t.id for t in sampler.next_batch(2) + sampler.next_batch(2)]
    assert ids == ["add-0", "add-1", "add-2", "add-0"]


def test_protocol_records_survive_leading_output(capsys):
    emit({"event": "step", "step_s": 1.5})
    line = capsys.readouterr().out
    assert parse_record("Loading: 100%\r" + line) == {"event": "step", "step_s": 1.5}
    assert parse_record("some library chatter") is None


def test_statistics_and_config_validation():
    assert median_spread([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)
    assert paired_ratios([2.0, 3.0], [4.0, 1.5]) == [0.5, 2.0]
    with pytest.raises(ValueError, match="unpaired"):
        paired_ratios([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="unknown loss_type 'ppo'"):
        BenchConfig(loss_type="ppo")
    assert BenchConfig.from_json(BenchConfig(workload="tool", steps=7).to_json()).steps == 7


def test_report_drops_ratios_when_the_gate_failed():
    cell = {"ponder": (1.0, 1.0, 1.0), "trl": (2.0, 2.0, 2.0), "ratio": (0.5, 0.5, 0.5)}
    keys = [
        "step_s",
        "generation_s",
        "logprob_s",
        "update_s",
        "other_s",
        "completion_tokens",
        "tokens_per_s",
        "generation_tokens_per_s",
        "tool_calls_per_episode",
        "reward_mean",
        "peak_rss_mb",
    ]
    summary = {key: cell for key in keys}
    assert "ponder/TRL" in table(summary, with_ratios=True) and "0.500" in table(summary, with_ratios=True)
    hidden = table(summary, with_ratios=False)
    assert "ponder/TRL" not in hidden and "0.500" not in hidden
