"""Context compaction (rollout.context) on hand-built episodes: the tiny tokenizer's
chat template, a scripted policy and an environment that answers every action, so
every segment's prompt, mask and log-prob can be checked by hand."""

from __future__ import annotations

import pytest

from ponder.agent.window import SUMMARY_HEADING, dropped_note
from ponder.config import ConstrainConfig, ContextConfig, RolloutConfig, SamplingConfig
from ponder.models import tiny_tokenizer
from ponder.models.chat import encode_chat
from ponder.rollout import Generation, RolloutEngine, ScriptedBackend
from ponder.rollout.compaction import kept_ids, summary_block, turn_spans, without_eos
from ponder.train.segment_batch import segment_bounds
from ponder.types import Task, Trajectory, Turn

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Count."}]
TASK = Task("t", "Count.", ["done"])


class Counter:
    """Shows `obs k: found found …` after action k until action `turns`, which ends the
    episode."""

    stop_strings: list[str] = []

    def __init__(self, turns: int) -> None:
        self.turns, self.count = turns, 0

    def reset(self, task: Task) -> list[dict[str, str]]:
        return [dict(m) for m in MESSAGES]

    def step(self, action: str) -> tuple[str | None, bool, dict]:
        self.count += 1
        if self.count >= self.turns:
            return None, True, {"stop_reason": "answer"}
        return f"obs {self.count}: " + "found " * 6, False, {}


class Recording(ScriptedBackend):
    """The scripted policy, with a distinct log-prob per token and every request's
    context recorded: (context ids, sampled ids, their log-probs) per call. A request
    whose context ends with the summary instruction gets `summary`."""

    def __init__(self, tokenizer, script: list[str], summary: str = "") -> None:
        super().__init__(tokenizer, {"t": script})
        self.calls: list[tuple[list[int], list[int], list[float]]] = []
        self.instruction, self.summary = ids(tokenizer, ContextConfig().instruction), summary

    def _one(self, request, stop_strings):
        if request.context_ids[-len(self.instruction) :] == self.instruction:
            token_ids = ids(self.tokenizer, self.summary) + [self.tokenizer.eos_token_id]
            generation = Generation(token_ids, [], self.summary, "eos")
        else:
            generation = super()._one(request, stop_strings)
        base = -(len(self.calls) + 1) / 10
        logprobs = [base - i / 100 for i in range(len(generation.token_ids))]
        self.calls.append((list(request.context_ids), list(generation.token_ids), logprobs))
        return Generation(generation.token_ids, logprobs, generation.text, generation.finish_reason)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


SCRIPT = [f"search {k} " + "the answer " * 3 for k in range(10)]  # 11 ids each with the end token


def rollout(tok, script, turns, window, total=4096, action=24, summary="", **context):
    config = RolloutConfig(batch_size=1, group_size=1,
                           sampling=SamplingConfig(temperature=0.0, max_new_tokens_per_turn=action,
                                                   max_total_tokens=total),
                           context=ContextConfig(max_tokens=window, **context))  # fmt: skip
    backend = Recording(tok, script, summary)
    (trajectory,), _ = RolloutEngine(backend, lambda: Counter(turns), config).run([TASK])
    return trajectory, backend.calls


def policy_runs(trajectory: Trajectory) -> list[int]:
    """Where each run of policy tokens (loss_mask 1) starts in the response."""
    mask = trajectory.loss_mask
    return [j for j, m in enumerate(mask) if m and (j == 0 or not mask[j - 1])]


def assert_sampled_under_segments(trajectory: Trajectory, calls) -> None:
    """Every generation's tokens sit in the response with its log-probs and loss 1, and
    the context it was sampled after is its segment's prompt + the response since the
    segment began: what the trainer scores it under."""
    starts = policy_runs(trajectory)
    assert len(starts) == len(calls)
    bounds = segment_bounds(trajectory)
    for start, (context, ids, logprobs) in zip(starts, calls):
        prompt, segment_start, _ = [b for b in bounds if b[1] <= start][-1]
        assert context == prompt + trajectory.response_ids[segment_start:start]
        assert trajectory.response_ids[start : start + len(ids)] == ids
        assert trajectory.old_logprobs[start : start + len(ids)] == logprobs
        assert trajectory.loss_mask[start : start + len(ids)] == [1] * len(ids)


def ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_turn_spans_and_kept_ids_skip_the_summary_block_by_hand() -> None:
    turns = [Turn(0, "a", n_action_tokens=2, n_observation_tokens=1),
             Turn(1, "b", n_action_tokens=1, n_summary_tokens=3, n_observation_tokens=2),
             Turn(2, "c", n_action_tokens=2)]
    response = [10, 11, 20, 12, 30, 31, 32, 21, 22, 13, 14]
    assert turn_spans(turns) == [(slice(0, 2), slice(2, 3)), (slice(3, 4), slice(7, 9)), (slice(9, 11), slice(11, 11))]
    assert kept_ids(response, turns, 2) == [12, 21, 22, 13, 14]
    assert kept_ids(response, turns, 0) == []
    assert without_eos([5, 6, 9, 9], {9}) == [5, 6] and without_eos([9], {9}) == []


def test_summary_block_is_the_opening_plus_one_user_message_by_hand(tok) -> None:
    block = summary_block(tok, MESSAGES, "Heading:\n", [101, 102])
    expected = (encode_chat(tok, MESSAGES, add_generation_prompt=False) + ids(tok, "<|im_start|>user\n")
                + ids(tok, "Heading:\n") + [101, 102] + ids(tok, "<|im_end|>\n<|im_start|>assistant\n"))  # fmt: skip
    assert block == expected


def test_dropped_turns_restart_the_context_with_the_last_turn_kept(tok) -> None:
    prompt = len(encode_chat(tok, MESSAGES))
    # the opening, actions of 11 ids and observations of 30: three turns fill the window
    window = prompt + 120
    trajectory, calls = rollout(tok, SCRIPT, turns=10, window=window, summariser="drop", keep_last_turns=1)
    assert trajectory.stop_reason == "answer" and len(trajectory.turns) == 10
    assert len(trajectory.segments) >= 3 and trajectory.metrics["context/compactions"] == len(trajectory.segments)
    assert_sampled_under_segments(trajectory, calls)
    assert max(len(context) + len(sampled) for context, sampled, _ in calls) <= window
    # each restart by hand: the turns before the compacting one are dropped, its action
    # kept as it was sampled, its observation the first tokens of the new segment
    spans = turn_spans(trajectory.turns)
    for offset, restart in trajectory.segments:
        at = next(i for i, (_, observation) in enumerate(spans) if observation.start == offset)
        action = trajectory.response_ids[spans[at][0]]
        assert restart == summary_block(tok, MESSAGES, dropped_note(at, "turns"), []) + action
        assert action == ids(tok, SCRIPT[at]) + [tok.eos_token_id]
        observation = ids(tok, f"obs {at + 1}: " + "found " * 6)
        assert trajectory.response_ids[spans[at][1]] == observation
        assert trajectory.loss_mask[spans[at][1]] == [0] * len(observation)


def test_rule_summary_lists_the_left_out_turns_within_the_window(tok) -> None:
    prompt = len(encode_chat(tok, MESSAGES))
    window = prompt + 130
    trajectory, calls = rollout(tok, SCRIPT, turns=10, window=window, summariser="rule", keep_last_turns=2,
                                summary_max_tokens=40)  # fmt: skip
    assert trajectory.stop_reason == "answer" and len(trajectory.turns) == 10 and trajectory.segments
    assert_sampled_under_segments(trajectory, calls)
    assert max(len(context) + len(sampled) for context, sampled, _ in calls) <= window
    first = tok.decode(trajectory.segments[0][1])
    assert SUMMARY_HEADING + "assistant: search 0" in first


def test_the_policy_writes_the_summary_trained_as_an_action_and_carried_verbatim(tok) -> None:
    prompt = len(encode_chat(tok, MESSAGES))
    instruction = ids(tok, ContextConfig().instruction)
    window = prompt + len(instruction) + 110
    trajectory, calls = rollout(tok, SCRIPT, turns=10, window=window, summary="I searched.", summariser="policy",
                                keep_last_turns=1, summary_max_tokens=8)  # fmt: skip
    assert trajectory.stop_reason == "answer" and len(trajectory.turns) == 10 and len(trajectory.segments) >= 2
    assert_sampled_under_segments(trajectory, calls)
    summary = ids(tok, "I searched.") + [tok.eos_token_id]
    spans = turn_spans(trajectory.turns)
    for (offset, restart), turn in zip(trajectory.segments, [t for t in trajectory.turns if t.n_summary_tokens]):
        assert turn.n_summary_tokens == len(instruction) + len(summary)
        action = spans[turn.index][0]
        block = slice(action.stop, action.stop + turn.n_summary_tokens)
        assert trajectory.response_ids[block] == instruction + summary
        assert trajectory.loss_mask[block] == [0] * len(instruction) + [1] * len(summary)
        assert offset == block.stop  # the new segment begins with the observation after the summary
        # the summary as it was sampled, without its end token (the message closes it)
        assert restart == summary_block(tok, MESSAGES, SUMMARY_HEADING, summary[:-1]) + trajectory.response_ids[action]
    assert trajectory.metrics["context/empty_summaries"] == 0.0


def test_an_empty_policy_summary_falls_back_to_the_rule_and_the_episode_goes_on(tok) -> None:
    prompt = len(encode_chat(tok, MESSAGES))
    window = prompt + len(ids(tok, ContextConfig().instruction)) + 110
    trajectory, calls = rollout(tok, SCRIPT, turns=10, window=window, summary="", summariser="policy",
                                keep_last_turns=1, summary_max_tokens=24)  # fmt: skip
    assert trajectory.stop_reason == "answer" and len(trajectory.turns) == 10
    assert trajectory.metrics["context/empty_summaries"] == trajectory.metrics["context/compactions"] >= 2
    assert SUMMARY_HEADING + "assistant: search 0" in tok.decode(trajectory.segments[0][1])
    assert_sampled_under_segments(trajectory, calls)  # the empty summary's end token is trained too
    assert sum(t.n_summary_tokens for t in trajectory.turns) > 0


def test_without_compaction_the_same_episode_is_cut_at_the_window(tok) -> None:
    prompt = len(encode_chat(tok, MESSAGES))
    cut, _ = rollout(tok, SCRIPT, turns=10, window=0, total=prompt + 100)
    assert cut.stop_reason == "max_tokens" and len(cut.turns) == 3 and not cut.segments
    assert "context/compactions" not in cut.metrics
    whole, _ = rollout(tok, SCRIPT, turns=10, window=prompt + 100, summariser="drop")
    assert whole.stop_reason == "answer" and len(whole.turns) == 10
    assert len(whole.prompt_ids) + len(whole.response_ids) > 3 * (prompt + 100)  # the episode outgrew the window


def test_a_total_cap_still_ends_a_compacting_episode(tok) -> None:
    prompt = len(encode_chat(tok, MESSAGES))
    capped, _ = rollout(tok, SCRIPT, turns=10, window=prompt + 100, total=prompt + 250, summariser="drop")
    assert capped.stop_reason == "max_tokens" and capped.segments and len(capped.turns) < 10
    assert len(capped.prompt_ids) + len(capped.response_ids) <= prompt + 250


def test_episodes_that_fit_are_the_same_with_and_without_compaction(tok) -> None:
    plain, _ = rollout(tok, SCRIPT, turns=3, window=0)
    fitted, _ = rollout(tok, SCRIPT, turns=3, window=500)
    assert fitted.response_ids == plain.response_ids and fitted.loss_mask == plain.loss_mask
    assert not fitted.segments and fitted.metrics["context/compactions"] == 0.0


def test_segments_survive_a_parquet_row_and_bad_offsets_are_refused(tok) -> None:
    prompt = len(encode_chat(tok, MESSAGES))
    trajectory, _ = rollout(tok, SCRIPT, turns=10, window=prompt + 100, summariser="drop")
    again = Trajectory.from_row(trajectory.to_row())
    assert again.segments == trajectory.segments and again.segments
    trajectory.segments.append((1, [1]))
    with pytest.raises(ValueError, match="segment offsets .* must increase"):
        trajectory.check()


def test_bad_context_settings_fail_naming_the_problem(tok) -> None:
    with pytest.raises(ValueError, match="summariser: unknown 'llm'; valid: rule, policy, drop"):
        ContextConfig(summariser="llm")
    with pytest.raises(ValueError, match="summary_max_tokens >= 1"):
        ContextConfig(summary_max_tokens=0)
    sampling = SamplingConfig(max_new_tokens_per_turn=64, max_total_tokens=512)
    for window in (64, 513):
        with pytest.raises(ValueError, match=rf"max_tokens \({window}\) must exceed"):
            RolloutConfig(sampling=sampling, context=ContextConfig(max_tokens=window))
    with pytest.raises(ValueError, match="summary is free text"):
        RolloutConfig(sampling=sampling, context=ContextConfig(max_tokens=256, summariser="policy"),
                      constrain=ConstrainConfig(kind="tools"))  # fmt: skip
    prompt = len(encode_chat(tok, MESSAGES))
    with pytest.raises(ValueError, match=f"holds not even task t's opening prompt \\({prompt} tokens\\)"):
        rollout(tok, SCRIPT, turns=1, window=prompt + 20)
