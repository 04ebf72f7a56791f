"""A program's recorded model calls as token-exact trajectories (the training gateway).

An agent program talks to the policy through OpenAI-style calls; each call is recorded
as the prompt ids the policy read, the completion ids it sampled and their logprobs
(`Call`). A session's calls become trajectories here, without re-tokenising anything
the policy sampled:

- `spliced_prompt`: when a call's messages are the previous call's messages, the reply,
  and new turns (tool results, a user turn), its prompt is built on the recorded ids —
  the previous prompt, the sampled completion, then the template's text for the new
  turns — so the policy reads its own tokens back, not a re-encoding of their text.
  Whether the template would have written the reply with other ids is reported (drift).
- `segments`: consecutive calls whose prompt extends the previous prompt + completion
  form one multi-turn segment; a call that does not (the program summarised, dropped or
  edited its history) starts a new one.
- `segment_trajectory`: one segment as a Trajectory: completions with loss_mask 1 and
  their recorded logprobs, every other token (the new turns between calls) with 0; one
  Turn per call, carrying the call's own reward when the program posted one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from ponder.models.chat import encode_chat
from ponder.types import ToolCall, Trajectory, Turn


@dataclass
class Call:
    """One model call of a session.

    prompt_ids: what the policy read (after the chat template); completion_ids: what it
    sampled, with logprobs[i] = log p(completion_ids[i]) under the sampling distribution.
    version: the weights version (training step) that served it. text: the completion
    as text. reward: a reward posted for this call (per-turn credit), if any.
    tool_calls: the calls the completion made (as the server read them for the program).
    """

    id: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    version: int = 0
    text: str = ""
    finish_reason: str = ""
    reward: float | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)


def spliced_prompt(
    tokenizer: Any, eos_ids: Collection[int], last: Call, last_messages: list[dict[str, Any]],
    messages: list[dict[str, Any]],
) -> tuple[list[int], bool] | None:  # fmt: skip
    """The prompt ids of `messages` built on `last`'s recorded ids (see module doc), and
    whether the template would have tokenised the sampled reply differently; None when
    `messages` are not `last_messages` + an assistant turn + more, or the template does
    not render a conversation as a prefix of its continuation (then encode afresh).

    messages are the plain {role, content} messages given to the chat template."""
    known = len(last_messages)
    if len(messages) <= known or messages[:known] != last_messages or messages[known].get("role") != "assistant":
        return None
    # the template's own ids for the last prompt, the reply and the rest: compared with each
    # other, never with the recorded ids (earlier replies in those may already differ: drift)
    asked = encode_chat(tokenizer, last_messages)
    head = encode_chat(tokenizer, messages[: known + 1], add_generation_prompt=False)
    full = encode_chat(tokenizer, messages)
    if head[: len(asked)] != asked or full[: len(head)] != head:
        return None
    reply = head[len(asked) :]  # the reply as the template writes it, its end of turn, a separator
    end = next((i for i, token in enumerate(reply) if token in eos_ids), None)
    if end is None:
        return None
    sampled = last.completion_ids
    closed = bool(sampled) and sampled[-1] in eos_ids  # the policy ended its turn itself
    ending = sampled if closed else sampled + [reply[end]]
    tail = reply[end + 1 :] if closed else reply[end:]
    return last.prompt_ids + sampled + tail + full[len(head) :], reply[: end + 1] != ending


def extends(previous: Call, call: Call) -> bool:
    """Whether `call`'s prompt starts with `previous`'s prompt and completion."""
    head = previous.prompt_ids + previous.completion_ids
    return len(call.prompt_ids) >= len(head) and call.prompt_ids[: len(head)] == head


def segments(calls: list[Call]) -> list[list[Call]]:
    """The calls in order, grouped into runs where each call extends the one before."""
    runs: list[list[Call]] = []
    for call in calls:
        if runs and extends(runs[-1][-1], call):
            runs[-1].append(call)
        else:
            runs.append([call])
    return runs


def segment_trajectory(
    calls: list[Call], task_id: str, decode: Callable[[list[int]], str] | None = None
) -> Trajectory:
    """One segment (calls that each extend the last) as a Trajectory (see module doc);
    `decode` turns the tokens between calls into each turn's observation text."""
    trajectory = Trajectory(task_id=task_id, prompt_ids=list(calls[0].prompt_ids), group_id=task_id)
    context = len(calls[0].prompt_ids)
    for index, call in enumerate(calls):
        between = call.prompt_ids[context:]
        if between:  # the turns the program added since the last completion: not the policy's
            trajectory.response_ids += between
            trajectory.loss_mask += [0] * len(between)
            trajectory.old_logprobs += [0.0] * len(between)
            previous = trajectory.turns[-1]
            previous.n_observation_tokens = len(between)
            previous.observation = decode(between) if decode is not None else None
        trajectory.response_ids += call.completion_ids
        trajectory.loss_mask += [1] * len(call.completion_ids)
        trajectory.old_logprobs += list(call.logprobs)
        trajectory.turns.append(Turn(index, call.text, tool_calls=list(call.tool_calls),
                                     n_action_tokens=len(call.completion_ids), reward=call.reward))  # fmt: skip
        context = len(call.prompt_ids) + len(call.completion_ids)
    trajectory.stop_reason = calls[-1].finish_reason
    trajectory.check()
    return trajectory
