"""A session's calls as token-exact trajectories (ponder.rollout.segments), on hand-built
ids and on the tiny model's real chat template."""

from __future__ import annotations

import pytest

from ponder.models.chat import encode_chat
from ponder.models.loading import load_policy
from ponder.rollout.segments import Call, segment_trajectory, segments, spliced_prompt

EOS = 9


def call(name: str, prompt: list[int], completion: list[int], reward: float | None = None) -> Call:
    return Call(name, prompt, completion, [-0.5] * len(completion), text=name, reward=reward)


def test_calls_that_extend_merge_into_one_trajectory_with_masks_by_hand() -> None:
    first = call("a", [1, 2, 3], [4, 5, EOS])
    second = call("b", [1, 2, 3, 4, 5, EOS, 6, 7], [8, EOS], reward=0.5)  # a tool result (6, 7), then the reply
    (run,) = segments([first, second])
    trajectory = segment_trajectory(run, "t", decode=lambda ids: f"<{ids}>")
    assert trajectory.prompt_ids == [1, 2, 3]
    assert trajectory.response_ids == [4, 5, EOS, 6, 7, 8, EOS]
    assert trajectory.loss_mask == [1, 1, 1, 0, 0, 1, 1]
    assert trajectory.old_logprobs == [-0.5, -0.5, -0.5, 0.0, 0.0, -0.5, -0.5]
    assert [t.action for t in trajectory.turns] == ["a", "b"]
    assert trajectory.turns[0].observation == "<[6, 7]>" and trajectory.turns[0].n_observation_tokens == 2
    assert [t.reward for t in trajectory.turns] == [None, 0.5]


def test_a_rewritten_history_starts_a_new_segment() -> None:
    first = call("a", [1, 2, 3], [4, EOS])
    summarised = call("b", [1, 2, 7], [8, EOS])  # the program dropped its earlier turn
    third = call("c", [1, 2, 7, 8, EOS, 6], [5, EOS])
    runs = segments([first, summarised, third])
    assert [[c.id for c in run] for run in runs] == [["a"], ["b", "c"]]
    assert segment_trajectory(runs[1], "t").loss_mask == [1, 1, 0, 1, 1]


def test_segments_do_not_depend_on_the_logprob_values() -> None:  # invariance: only ids decide
    calls = [call("a", [1], [2]), call("b", [1, 2, 3], [4])]
    changed = [Call(c.id, c.prompt_ids, c.completion_ids, [-9.0] * len(c.completion_ids)) for c in calls]
    assert [[c.id for c in r] for r in segments(calls)] == [[c.id for c in r] for r in segments(changed)]


@pytest.fixture(scope="module")
def tokenizer():
    return load_policy("tiny", device="cpu").tokenizer


def test_spliced_prompt_reads_the_sampled_ids_back(tokenizer) -> None:
    eos = {tokenizer.convert_tokens_to_ids("<|im_end|>")}
    first = [{"role": "user", "content": "What is 2+3?"}]
    prompt = encode_chat(tokenizer, first)
    # the policy's reply, ending its turn itself
    sampled = tokenizer.encode("The answer", add_special_tokens=False) + [min(eos)]
    last = Call("c0", prompt, sampled, [0.0] * len(sampled))
    following = first + [{"role": "assistant", "content": "The answer"}, {"role": "user", "content": "Sure?"}]
    ids, drift = spliced_prompt(tokenizer, eos, last, first, following)
    assert ids[: len(prompt) + len(sampled)] == prompt + sampled
    assert ids == encode_chat(tokenizer, following) and not drift  # a faithful reply: the same ids as afresh


def test_drift_is_reported_when_the_template_would_retokenise_the_reply(tokenizer) -> None:
    eos = {tokenizer.convert_tokens_to_ids("<|im_end|>")}
    first = [{"role": "user", "content": "Name a colour."}]
    prompt = encode_chat(tokenizer, first)
    pieces = [tokenizer.convert_tokens_to_ids(t) for t in tokenizer.tokenize("red")]
    spelt = [tokenizer.convert_tokens_to_ids(c) for c in "red"]  # r, e, d: the same text, other ids
    assert spelt != pieces
    last = Call("c0", prompt, spelt + [min(eos)], [0.0] * 4)
    following = first + [{"role": "assistant", "content": "red"}, {"role": "user", "content": "Another."}]
    ids, drift = spliced_prompt(tokenizer, eos, last, first, following)
    assert drift and ids[len(prompt) : len(prompt) + 4] == spelt + [min(eos)]
    assert ids[-5:] == encode_chat(tokenizer, following)[-5:]  # the new turns as the template writes them


def test_no_splice_when_the_history_was_edited(tokenizer) -> None:
    eos = {tokenizer.convert_tokens_to_ids("<|im_end|>")}
    first = [{"role": "user", "content": "Hi"}]
    last = Call("c0", encode_chat(tokenizer, first), [min(eos)], [0.0])
    edited = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": ""}, {"role": "user", "content": "x"}]
    assert spliced_prompt(tokenizer, eos, last, first, edited) is None


def test_a_later_call_still_splices_after_an_earlier_reply_drifted(tokenizer) -> None:
    eos = {tokenizer.convert_tokens_to_ids("<|im_end|>")}
    end = min(eos)
    spelt = [tokenizer.convert_tokens_to_ids(c) for c in "red"]  # the reply "red", spelt letter by letter
    turns = [{"role": "user", "content": "Name a colour."}]
    first = Call("c0", encode_chat(tokenizer, turns), spelt + [end], [0.0] * 4)
    second_turns = turns + [{"role": "assistant", "content": "red"}, {"role": "user", "content": "Another."}]
    second_ids, drift = spliced_prompt(tokenizer, eos, first, turns, second_turns)
    blue = tokenizer.encode("blue", add_special_tokens=False) + [end]
    second = Call("c1", second_ids, blue, [0.0] * len(blue))
    third_turns = second_turns + [{"role": "assistant", "content": "blue"}, {"role": "user", "content": "Thanks."}]
    third_ids, drift_again = spliced_prompt(tokenizer, eos, second, second_turns, third_turns)
    assert drift and not drift_again
    assert third_ids[: len(second_ids) + len(blue)] == second_ids + blue  # still on the recorded ids
    assert [[c.id for c in run] for run in segments([first, second, Call("c2", third_ids, [end], [0.0])])] == [
        ["c0", "c1", "c2"]]
