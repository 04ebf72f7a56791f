"""Constrained sampling: a token mask per row from a grammar, advanced token by token.

A `Constraint` is what a request asks its reply to be: a JSON Schema, a regex, or a
Lark grammar (llguidance's EBNF dialect, which can embed JSON Schemas with `%json`).
llguidance compiles it against the tokenizer and computes, at every step, which
tokens may come next; ponder only glues that into its decoders. Why llguidance
(measured side by side with xgrammar 0.2.8 on the embedded model's 49k vocabulary,
bench/constrained_decoding.py): a mask in 0.01 ms (xgrammar 0.0075 ms), a schema
compiled in 2.5 ms (xgrammar 10 ms), and a 3 MB wheel with no dependencies where
xgrammar pulls in triton and tvm-ffi.

`Grammars` holds one tokenizer's compiled constraints, cached by their source, so a
schema sent with every request compiles once; each row gets a fresh `Matcher` copied
from the cached one. `mask_logits` sets the logits of every token a row's grammar
forbids to -inf (rows without a constraint are untouched), so the sampler's softmax
is the masked, renormalised distribution: the one the token is actually drawn from,
and the one its recorded logprob belongs to.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

KINDS = ("json_schema", "regex", "lark")
# Compiled constraints kept per tokenizer (LRU); a schema costs a few ms to compile.
CACHE_SIZE = 256
# The most calls one forced reply may hold.
MAX_PARALLEL_CALLS = 8
# The largest grammar source accepted (a 1 MB schema is refused with this in the message).
MAX_SOURCE_BYTES = 256_000


class ConstraintError(ValueError):
    """A constraint that cannot be compiled or met; the message names why."""


@dataclass(frozen=True)
class Constraint:
    """kind: `json_schema`, `regex` or `lark`; source: the schema as JSON text, the
    regex, or the Lark grammar. Build with `json_schema`, `regex` or `lark`.

    trigger: "" (the whole reply matches the grammar), or text that switches it on:
    the reply is free until it writes `trigger`, and what follows must match the
    grammar (`tool_choice: auto`: the model chooses whether to call, and a call it
    opens is well-formed). Decoders activate it as they sample (rollout/hf.py)."""

    kind: str
    source: str
    trigger: str = ""

    @classmethod
    def json_schema(cls, schema: dict[str, Any]) -> Constraint:
        return cls("json_schema", json.dumps(schema, sort_keys=True, ensure_ascii=False))

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        return cls("regex", pattern)

    @classmethod
    def lark(cls, grammar: str) -> Constraint:
        return cls("lark", grammar)

    def grammar(self) -> str:
        """llguidance's grammar text for this constraint."""
        import llguidance

        if self.kind not in KINDS:
            raise ConstraintError(f"constraint kind '{self.kind}': valid: {', '.join(KINDS)}")
        if len(self.source.encode()) > MAX_SOURCE_BYTES:
            raise ConstraintError(f"{self.kind} of {len(self.source.encode())} bytes: at most {MAX_SOURCE_BYTES}")
        if self.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(self.source)
        if self.kind == "lark":
            return llguidance.LLMatcher.grammar_from_lark(self.source)
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(self.source, defaults=JSON_OPTIONS)
        except ValueError as err:
            raise ConstraintError(f"json_schema: {err}") from None


TOOL_OPEN = "<tool_call>"  # where a Hermes call opens (tool_calls' trigger under tool_choice auto)

# Compact JSON (no free whitespace): a small model given room for spaces fills it.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def action_constraint(config: Any, tools: list[Any] | None = None) -> Constraint | None:
    """The constraint of a recipe's rollout.constrain (a ConstrainConfig) for an episode
    offered `tools` (ToolSpecs), or None: kind `tools` is `tool_calls` of the episode's
    own tools, switched on where the model opens a call (none without tools)."""
    if config.kind == "none":
        return None
    if config.kind == "tools":
        return tool_calls(tools, None, config.strict, config.parallel, opened=True) if tools else None
    if config.kind == "json_schema" and isinstance(config.source, dict):
        return Constraint.json_schema(config.source)
    return Constraint(config.kind, config.source)


class Matcher:
    """One row's place in its grammar: which tokens may come next, and the step."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self._matcher = matcher
        self.vocab_size = vocab_size

    def allowed(self) -> np.ndarray:
        """A bool [vocab_size]: the tokens the grammar allows next (only the end of
        turn once it is complete)."""
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little")[: self.vocab_size].astype(bool)

    def advance(self, token: int) -> None:
        """Take the sampled token; a token the mask forbade is an error of the caller."""
        if not self._matcher.consume_token(token):
            raise ConstraintError(f"token {token} is not allowed here: {self._matcher.get_error()}")

    @property
    def done(self) -> bool:
        """The grammar has ended (only the end-of-turn token was left to sample)."""
        return self._matcher.is_stopped()

    def accepting(self) -> bool:
        return self._matcher.is_accepting()


class Grammars:
    """One tokenizer's compiled constraints (see module docstring). `eos_ids`: the
    tokens that end a turn, the only ones allowed once a grammar is complete;
    `vocab_size`: the width of the model's logits."""

    def __init__(self, tokenizer: Any, eos_ids: list[int], vocab_size: int) -> None:
        import llguidance.hf

        self.vocab_size = vocab_size
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=sorted(eos_ids))
        self._compiled: OrderedDict[Constraint, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.compiled = 0  # how many constraints were compiled (the rest came from the cache)

    def matcher(self, constraint: Constraint) -> Matcher:
        """A fresh matcher at the start of `constraint`'s grammar."""
        with self._lock:
            initial = self._compiled.get(constraint)
            if initial is None:
                initial = self._compile(constraint)
                self._compiled[constraint] = initial
                if len(self._compiled) > CACHE_SIZE:
                    self._compiled.popitem(last=False)
            self._compiled.move_to_end(constraint)
            return Matcher(initial.deep_copy(), self.vocab_size)

    def _compile(self, constraint: Constraint) -> Any:
        import llguidance

        grammar = constraint.grammar()
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if not matcher.is_error():
            matcher.compute_bitmask()  # a grammar no text matches fails at its first mask
        if matcher.is_error():
            error = matcher.get_error().splitlines()[0]
            raise ConstraintError(f"{constraint.kind}: " + ("no text matches it" if "NoExtension" in error else error))
        self.compiled += 1
        return matcher


_GRAMMARS: weakref.WeakKeyDictionary[Any, Grammars] = weakref.WeakKeyDictionary()
_GRAMMARS_LOCK = threading.Lock()


def grammars_for(tokenizer: Any, eos_ids: list[int] | set[int], vocab_size: int) -> Grammars:
    """The `Grammars` of `tokenizer` (made once per tokenizer and logits width)."""
    with _GRAMMARS_LOCK:
        grammars = _GRAMMARS.get(tokenizer)
        if grammars is None or grammars.vocab_size != vocab_size:
            grammars = Grammars(tokenizer, list(eos_ids), vocab_size)
            _GRAMMARS[tokenizer] = grammars
        return grammars


def mask_logits(logits: torch.Tensor, matchers: list[Matcher | None]) -> torch.Tensor:
    """logits [B, V] with every token row b's matcher forbids at -inf (in place; rows
    whose matcher is None are left as they are). Returns logits. The constrained rows'
    masks are unpacked and applied together: one pass over the batch, not one a row."""
    rows = [row for row, matcher in enumerate(matchers) if matcher is not None]
    if not rows:
        return logits
    width = logits.shape[-1]
    bits = np.stack([np.frombuffer(matchers[row]._matcher.compute_bitmask(), dtype=np.uint8) for row in rows])
    allowed = np.zeros((len(rows), width), dtype=bool)
    known = min(width, matchers[rows[0]].vocab_size)
    allowed[:, :known] = np.unpackbits(bits, axis=1, bitorder="little")[:, :known].astype(bool)
    forbidden = torch.from_numpy(~allowed).to(logits.device)
    index = torch.tensor(rows, device=logits.device)
    logits[index] = logits[index].masked_fill(forbidden, float("-inf"))
    return logits


def tool_calls(tools: list[Any], name: str | None = None, strict: bool = True, parallel: bool = True,
               opened: bool = False) -> Constraint:  # fmt: skip
    """The reply is one or more Hermes tool calls (`<tool_call>\\n{"name": …, "arguments":
    …}\\n</tool_call>`, the format ponder's parser reads) to one of `tools` (ToolSpecs),
    or to the one named `name`, each call's arguments matching its tool's JSON Schema.
    strict=False compiles the schemas leniently (keywords llguidance does not implement
    are ignored, not refused). `parallel` allows up to MAX_PARALLEL_CALLS calls (a model
    that repeats itself would otherwise call until max_tokens). `opened`: free text
    until the model opens a call (`trigger` TOOL_OPEN), the calls constrained from there."""
    offered = [tool for tool in tools if name is None or tool.name == name]
    if not offered:
        raise ConstraintError(f"tool_choice names {name!r}, which is not among the tools offered")
    calls = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
              "properties": {"name": {"const": tool.name}, "arguments": tool.parameters}}
             for tool in offered]  # fmt: skip
    options = {**JSON_OPTIONS, "lenient": not strict}
    schema = {**(calls[0] if len(calls) == 1 else {"anyOf": calls}), "x-guidance": options}
    call = json.dumps(schema, sort_keys=False, ensure_ascii=False)
    more = f"{{0,{MAX_PARALLEL_CALLS - 1}}}"
    if opened:  # the opening is written (by the model's choice): the grammar starts after it,
        # with or without newlines around the JSON, since a model trained on either writes either
        repeat = f' ("\\n"? call){more}' if parallel else ""
        return Constraint("lark", f'start: first{repeat}\nfirst: "\\n"? body "\\n"? "</tool_call>"\n'
                                  f'call: "{TOOL_OPEN}" first\nbody: %json {call}\n', trigger=TOOL_OPEN)  # fmt: skip
    repeat = f' ("\\n" call){more}' if parallel else ""
    return Constraint.lark(f'start: call{repeat}\ncall: "{TOOL_OPEN}\\n" body "\\n</tool_call>"\nbody: %json {call}\n')


def opened(grammars: Grammars, tokenizer: Any, constraint: Constraint, action_ids: list[int]) -> tuple[bool, Matcher | None]:
    """A triggered constraint after the action's latest token: (whether the action's
    text has now written the trigger, the matcher that governs the rest), the text after
    the trigger in the same token fed in; the matcher is None where that text already
    breaks the grammar (the action stays free). The sampler (rollout/hf.py) and the
    trainer's replay (ConstraintMasks) both switch on here, so they agree token for token."""
    tail = tokenizer.decode(action_ids[-TRIGGER_WINDOW_TOKENS:], skip_special_tokens=False)
    if constraint.trigger not in tail:
        return False, None
    matcher = grammars.matcher(constraint)
    for token in tokenizer.encode(tail[tail.rindex(constraint.trigger) + len(constraint.trigger) :],
                                  add_special_tokens=False):  # fmt: skip
        if not matcher.allowed()[token]:
            return True, None
        matcher.advance(token)
    return True, matcher


# How many of an action's latest tokens are decoded to look for a trigger.
TRIGGER_WINDOW_TOKENS = 16


class ConstraintMasks:
    """The masks a batch's actions were sampled under, for the trainer to apply again:
    every run of policy tokens (loss_mask 1) in a row is one action, sampled under a
    fresh matcher of the row's constraint (switched on at its trigger, if it has one,
    as the sampler does: `opened`), so replaying the sampled tokens through the grammar
    gives each token's mask. Masked logprobs are then the distribution the token was
    drawn from (masked and renormalised), and the importance ratio at the sampling
    weights is exactly 1, as without a constraint.

    input_ids [B, L], loss_mask [B, L-1] (1 where input_ids[:, t+1] was sampled),
    constraints: one per row (None: the row was sampled freely)."""

    def __init__(self, grammars: Grammars, tokenizer: Any, input_ids: torch.Tensor, loss_mask: torch.Tensor,
                 constraints: list[Constraint | None]) -> None:  # fmt: skip
        self.grammars, self.tokenizer, self.constraints = grammars, tokenizer, constraints
        self.targets = input_ids[:, 1:].tolist()
        self.loss_mask = loss_mask.bool().tolist()

    def at(self, keep: torch.Tensor, width: int) -> torch.Tensor:
        """A bool [B, K, width]: the tokens allowed at each of the K positions `keep`
        (all of them where a row has no policy token, no constraint, or its grammar is
        not on)."""
        column = {position: k for k, position in enumerate(keep.tolist())}
        allowed = np.ones((len(self.targets), len(column), width), dtype=bool)
        for row, constraint in enumerate(self.constraints):
            if constraint is not None:
                self._replay(allowed[row], constraint, self.targets[row], self.loss_mask[row], column)
        return torch.from_numpy(allowed)

    def _replay(self, allowed: np.ndarray, constraint: Constraint, targets: list[int], policy: list[bool],
                column: dict[int, int]) -> None:  # fmt: skip
        """One row's masks (allowed [K, width], filled in place), action by action."""
        matcher: Matcher | None = None
        waiting = False
        action: list[int] = []
        for position, sampled in enumerate(policy):
            if not sampled:  # the action ended; the next one starts afresh
                matcher, waiting, action = None, False, []
                continue
            if not action:
                waiting = bool(constraint.trigger)
                matcher = None if waiting else self.grammars.matcher(constraint)
            if matcher is not None:
                known = min(allowed.shape[-1], matcher.vocab_size)
                allowed[column[position], :known] = matcher.allowed()[:known]
                allowed[column[position], known:] = False
            token = targets[position]
            action.append(token)
            if matcher is not None and not matcher.done:
                matcher.advance(token)
            elif waiting:
                waiting, matcher = opened(self.grammars, self.tokenizer, constraint, action)
                waiting = not waiting


def constraint_masks(policy: Any, eos_ids: Any = None) -> Any:
    """`masks_for(input_ids, loss_mask, constraints)` -> the ConstraintMasks of a batch
    whose rows were sampled under `constraints` (one per row, from each trajectory),
    for the policy's tokenizer (the grammars its sampler compiled); None when no row
    has one."""
    eos = eos_ids if eos_ids is not None else {policy.tokenizer.eos_token_id}

    def masks_for(input_ids: torch.Tensor, loss_mask: torch.Tensor, constraints: Any) -> ConstraintMasks | None:
        if not constraints or all(c is None for c in constraints):
            return None
        grammars = grammars_for(policy.tokenizer, eos, policy.model.config.vocab_size)
        return ConstraintMasks(grammars, policy.tokenizer, input_ids, loss_mask, list(constraints))

    return masks_for
