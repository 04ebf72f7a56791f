"""Constrained sampling (ponder.rollout.constrain) on the tiny tokenizer and model: the
mask at each step against a hand-derived one, a batch mixing constrained and free
rows, recorded logprobs against the masked recomputation, and outputs that always
validate."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ponder.config import SamplingConfig
from ponder.models.tiny import tiny_policy, tiny_tokenizer
from ponder.rollout.backend import GenerationRequest
from ponder.rollout.constrain import MAX_SOURCE_BYTES, Constraint, ConstraintError, Grammars, mask_logits
from ponder.rollout.hf import HFBackend


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(seed=0)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def _grammars(tokenizer) -> Grammars:
    return Grammars(tokenizer, [tokenizer.convert_tokens_to_ids("<|im_end|>")], len(tokenizer))


def _texts(tokenizer) -> dict[int, str]:
    special = set(tokenizer.all_special_ids)
    return {i: tokenizer.decode([i]) for i in range(len(tokenizer)) if i not in special}


def test_the_mask_is_every_token_that_keeps_a_match_possible(tokenizer):
    """(ab|ac): a token may come first when its text is a non-empty prefix of "ab" or
    "ac"; after "a" only what completes one; after "ab" only the end of turn."""
    grammars, texts = _grammars(tokenizer), _texts(tokenizer)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    matcher = grammars.matcher(Constraint.regex("(ab|ac)"))
    words = ("ab", "ac")

    def by_hand(done: str) -> set[int]:
        return {i for i, text in texts.items() if text and any(w.startswith(done + text) for w in words)}

    assert set(matcher.allowed().nonzero()[0]) == by_hand("") and by_hand("") >= {tokenizer.encode("a")[0]}
    matcher.advance(tokenizer.encode("a")[0])
    assert set(matcher.allowed().nonzero()[0]) == by_hand("a")
    matcher.advance(tokenizer.encode("b")[0])
    assert set(matcher.allowed().nonzero()[0]) == {eos}  # complete: only the end of turn
    assert matcher.accepting()


def test_masked_logits_leave_free_rows_alone_and_forbid_the_rest(tokenizer):
    grammars = _grammars(tokenizer)
    matcher = grammars.matcher(Constraint.regex("b"))
    logits = torch.randn(2, len(tokenizer), generator=torch.Generator().manual_seed(0))
    free = logits[1].clone()
    mask_logits(logits, [matcher, None])
    assert torch.equal(logits[1], free)
    allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert allowed and all(tokenizer.decode([i]) == "b" for i in allowed)


def test_compiled_once_per_constraint(tokenizer):
    grammars = _grammars(tokenizer)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    first, second = grammars.matcher(Constraint.json_schema(schema)), grammars.matcher(Constraint.json_schema(schema))
    assert grammars.compiled == 1 and first is not second
    first.advance(tokenizer.encode("{")[0])  # each row has its own state
    assert not torch.equal(torch.from_numpy(first.allowed()), torch.from_numpy(second.allowed()))


@pytest.mark.parametrize("constraint, problem", [
    (Constraint.regex("a("), "regex"),
    (Constraint.json_schema({"type": "nope"}), "json_schema: Invalid type"),
    (Constraint.regex("[^\\s\\S]"), "regex: no text matches it"),
    (Constraint("grammar", "x"), "valid: json_schema, regex, lark"),
    (Constraint.regex("a" * (MAX_SOURCE_BYTES + 1)), f"at most {MAX_SOURCE_BYTES}"),
])  # fmt: skip
def test_a_constraint_that_cannot_be_met_is_one_line(tokenizer, constraint, problem):
    with pytest.raises(ConstraintError, match=problem) as raised:
        _grammars(tokenizer).matcher(constraint)
    assert "\n" not in str(raised.value)


def _backend(policy, temperature=1.0, decoder="auto"):
    return HFBackend(policy, SamplingConfig(temperature=temperature, decoder=decoder), seed=3, reuse_kv=False)


def test_rows_of_different_grammars_and_none_share_a_batch(policy):
    context = policy.tokenizer.encode("hello")
    answer = Constraint.regex("<answer>[0-9]+</answer>")
    flag = Constraint.json_schema({"enum": [True, False]})
    requests = [GenerationRequest("a", context, 24, answer), GenerationRequest("b", context, 12),
                GenerationRequest("c", context, 12, flag)]  # fmt: skip
    answered, free, flagged = _backend(policy).generate(requests, [])
    assert answered.finish_reason == "eos" and answered.text.startswith("<answer>")
    assert answered.text.endswith("</answer>") and answered.text[8:-9].isdigit()
    assert flagged.finish_reason == "eos" and json.loads(flagged.text) in (True, False)
    assert free.finish_reason == "length" and len(free.token_ids) == 12
    # the free row was drawn from the model's own distribution, untouched by the others' masks
    ids = torch.tensor([context + free.token_ids])
    with torch.no_grad():
        logits = policy.model(ids).logits[0, len(context) - 1 : -1].float()
    unmasked = torch.log_softmax(logits, -1).gather(-1, torch.tensor(free.token_ids).unsqueeze(-1)).squeeze(-1)
    assert free.logprobs == pytest.approx(unmasked.tolist(), abs=2e-4)


@pytest.mark.parametrize("decoder", ["auto", "transformers", "static"])
def test_recorded_logprobs_are_the_masked_distributions(policy, decoder):
    """Each token's logprob is log-softmax of the logits with the grammar's mask at that
    step: the distribution it was drawn from, which a trainer recomputes by replaying
    the grammar over the sampled tokens."""
    context = policy.tokenizer.encode("tell me")
    constraint = Constraint.json_schema({"type": "object", "properties": {"k": {"enum": ["yes", "no"]}},
                                         "required": ["k"], "additionalProperties": False})  # fmt: skip
    generation = _backend(policy, decoder=decoder).generate([GenerationRequest("a", context, 32, constraint)], [])[0]
    assert json.loads(generation.text)["k"] in ("yes", "no")
    ids = torch.tensor([context + generation.token_ids])
    with torch.no_grad():
        logits = policy.model(ids).logits[0, len(context) - 1 : -1].float()
    grammars = _grammars(policy.tokenizer)
    matcher = grammars.matcher(constraint)
    expected = []
    for step, token in enumerate(generation.token_ids):
        masked = mask_logits(logits[step : step + 1].clone(), [matcher])
        expected.append(float(torch.log_softmax(masked, -1)[0, token]))
        if not matcher.done:
            matcher.advance(token)
    assert generation.logprobs == pytest.approx(expected, abs=2e-4)
    assert sum(generation.logprobs) > float(torch.log_softmax(logits, -1).gather(
        -1, torch.tensor(generation.token_ids).unsqueeze(-1)).sum())  # the mask moved mass onto these tokens


_LEAF = st.one_of(
    st.just({"type": "integer", "minimum": 0, "maximum": 99}),
    st.just({"type": "boolean"}),
    st.just({"type": "string", "maxLength": 6}),
    st.lists(st.sampled_from(["red", "green", "a b", "x\"y"]), min_size=1, max_size=3, unique=True).map(
        lambda values: {"enum": values}),
    st.just({"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "maxItems": 3}),
)
_SCHEMA = st.recursive(_LEAF, lambda inner: st.dictionaries(
    st.sampled_from(["a", "b", "c"]), inner, min_size=1, max_size=3).map(lambda props: {
        "type": "object", "properties": props, "required": sorted(props), "additionalProperties": False}),
    max_leaves=4)  # fmt: skip


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=_SCHEMA, seed=st.integers(0, 1000))
def test_every_constrained_output_validates(policy, schema, seed):
    backend = HFBackend(policy, SamplingConfig(temperature=1.0), seed=seed, reuse_kv=False)
    request = GenerationRequest("a", policy.tokenizer.encode("json:"), 120, Constraint.json_schema(schema))
    generation = backend.generate([request], [])[0]
    if generation.finish_reason == "length":  # a long string cut at the cap: a prefix of a valid one
        return
    assert generation.finish_reason == "eos"
    jsonschema.validate(json.loads(generation.text), schema)


def test_a_triggered_constraint_is_free_until_the_call_opens_then_governs_it(policy):
    """tool_choice auto: text is free; once `<tool_call>` is written the call's grammar
    masks the rest (a row of the hf backend, fed tokens by hand)."""
    from ponder.rollout.constrain import tool_calls
    from ponder.rollout.hf import _Row
    from ponder.types import ToolSpec

    tokenizer = policy.tokenizer
    tool = ToolSpec("add", "adds", {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"],
                                    "additionalProperties": False})  # fmt: skip
    constraint = tool_calls([tool], strict=True, opened=True)
    backend = _backend(policy)
    (row,) = backend._rows([GenerationRequest("k", tokenizer.encode("hi"), 80, constraint)])
    assert row.matcher is None and row.waiting  # free at first
    for token in tokenizer.encode("Let me add. ", add_special_tokens=False):
        backend._record(row, token, 0.0, [])
    assert row.matcher is None and row.waiting  # no call opened: still free
    for token in tokenizer.encode("<tool_call>", add_special_tokens=False):
        backend._record(row, token, 0.0, [])
    assert row.matcher is not None and not row.waiting
    allowed = row.matcher.allowed()
    assert allowed[tokenizer.encode("\n", add_special_tokens=False)[0]]
    assert not allowed[tokenizer.encode("hello", add_special_tokens=False)[0]]  # no free text inside a call
    for token in tokenizer.encode('\n{"name": "add", "arguments": {"x": 3}}\n</tool_call>', add_special_tokens=False):
        assert row.matcher.allowed()[token]
        backend._record(row, token, 0.0, [])
    assert row.matcher.accepting()
    (compact,) = backend._rows([GenerationRequest("k2", tokenizer.encode("hi"), 80, constraint)])
    for token in tokenizer.encode('<tool_call>{"name": "add", "arguments": {"x": 3}}</tool_call>', add_special_tokens=False):
        assert compact.matcher is None or compact.matcher.allowed()[token]  # no newlines around the JSON: fine too
        backend._record(compact, token, 0.0, [])
    assert compact.matcher.accepting()


@pytest.mark.parametrize("decoder", ["auto", "transformers"])
def test_constrained_rows_also_report_the_unmasked_logprobs(policy, decoder):
    """Generation.policy_logprobs: the sampled tokens under the policy's own distribution
    (what a trainer that does not replay the grammar recomputes); free rows have none."""
    from ponder.models.logprobs import token_logprobs

    context = policy.tokenizer.encode("hello there")
    digits = GenerationRequest("a", context, 12, Constraint.regex("[0-9]{12}"))
    constrained, free = _backend(policy, decoder=decoder).generate([digits, GenerationRequest("b", context, 12)], [])
    ids = torch.tensor([context + constrained.token_ids])
    with torch.no_grad():
        recomputed = token_logprobs(policy.model, ids, torch.ones_like(ids))[0, len(context) - 1 :]
    assert (recomputed - torch.tensor(constrained.policy_logprobs)).abs().max() < 1e-4
    assert (recomputed - torch.tensor(constrained.logprobs)).abs().max() > 0.1  # the masked ones differ
    assert free.policy_logprobs is None


def test_the_trainer_replays_a_triggered_constraint_as_it_was_sampled(policy):
    """Rows of a triggered constraint (free until the trigger, then a grammar), each row
    its own (or none) as rollout.constrain `tools` gives each episode: the masks the
    trainer rebuilds from the sampled tokens (ConstraintMasks) give back the recorded,
    masked logprobs, so the importance ratio at the sampling weights is 1."""
    from ponder.models.forward import forward_policy
    from ponder.rollout.constrain import constraint_masks

    tokenizer = policy.tokenizer
    digits, letters = Constraint("regex", "[0-9]{4}", trigger="e"), Constraint("regex", "[xyz]{3}", trigger="a")
    constraints = [digits, letters, None, digits]
    context = tokenizer.encode("say something")
    backend = HFBackend(policy, SamplingConfig(temperature=1.0), seed=0, reuse_kv=False)
    requests = [GenerationRequest(str(i), context, 24, c) for i, c in enumerate(constraints)]
    generations = backend.generate(requests, [])
    after = [g.text.split(c.trigger, 1)[1] for g, c in zip(generations, constraints) if c and c.trigger in g.text]
    assert any(re.fullmatch("[0-9]{1,4}|[xyz]{1,3}", text) for text in after)  # a grammar took over
    width = len(context) + max(len(g.token_ids) for g in generations)
    input_ids = torch.full((len(generations), width), tokenizer.pad_token_id)
    attention, loss_mask = torch.zeros_like(input_ids), torch.zeros((len(generations), width - 1))
    recorded = torch.zeros((len(generations), width - 1))
    for row, g in enumerate(generations):
        n = len(context) + len(g.token_ids)
        input_ids[row, :n] = torch.tensor(context + g.token_ids)
        attention[row, :n] = 1
        loss_mask[row, len(context) - 1 : n - 1] = 1
        recorded[row, len(context) - 1 : n - 1] = torch.tensor(g.logprobs)
    masks = constraint_masks(policy)(input_ids, loss_mask, constraints)
    with torch.no_grad():
        replayed, _, _ = forward_policy(policy.model, input_ids, attention, 1.0, None, loss_mask, masks=masks)
        free, _, _ = forward_policy(policy.model, input_ids, attention, 1.0, None, loss_mask)
    on = loss_mask.bool()
    assert (replayed[on] - recorded[on]).abs().max() < 2e-4
    assert (free[on] - recorded[on]).abs().max() > 0.1  # the switched-on rows were masked
    assert constraint_masks(policy)(input_ids, loss_mask, [None] * 4) is None
