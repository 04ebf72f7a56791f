"""What the agent asks a model for: the next message of a chat, optionally streamed.

Three kinds of policy sit behind one small protocol (`ChatPolicy.complete`):
- any rollout `GenerationBackend` (the `hf` backend over the embedded model or any HF
  model directory, the scripted backend in tests), wrapped by `BackendPolicy`, so the
  agent samples through exactly the code rollouts use;
- an OpenAI-compatible HTTP endpoint (`ponder.agent.openai_http.OpenAIPolicy`).
`load_chat_policy` picks one from a model name, a directory or a base URL.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ponder.models.chat import encode_chat
from ponder.rollout.backend import GenerationBackend, GenerationRequest, first_stop

TextCallback = Callable[[str], None]


class PolicyError(RuntimeError):
    """The model could not produce a message (endpoint down, bad reply); one line."""


@dataclass
class Completion:
    """One generated message.

    finish_reason: `stop` (a stop string), `eos` (end of turn), `length` (token cap).
    prompt_tokens: tokens the model read; completion_tokens: tokens it generated.
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str


class ChatPolicy(Protocol):
    name: str

    def count_tokens(self, text: str) -> int: ...

    def complete(
        self,
        messages: list[dict[str, Any]],
        stop: list[str],
        max_new_tokens: int,
        key: str,
        on_text: TextCallback | None = None,
        timeout_s: float | None = None,
        constraint: Any = None,
    ) -> Completion:
        """The next assistant action. `constraint` (a ponder.rollout.constrain.Constraint,
        passed only when the agent asks for one): what the action is sampled to match;
        a policy that cannot constrain its sampler (a remote endpoint) ignores it."""
        ...


class BackendPolicy:
    """A rollout GenerationBackend as a chat policy.

    Messages are rendered with the tokenizer's chat template and tokenised once; `key`
    is the backend's episode key (the scripted backend's script, the `hf` backend's KV
    cache). Streaming: with `stream_chunk_tokens > 0` and a callback, the action is
    generated in chunks of that many tokens, each continuing the last (the `hf` backend
    reuses its KV cache between them), and text is handed out as it is decoded;
    otherwise the whole action is generated at once and handed out in one piece.
    """

    def __init__(self, backend: GenerationBackend, name: str = "backend", stream_chunk_tokens: int = 0) -> None:
        self.backend = backend
        self.tokenizer = backend.tokenizer
        self.name = name
        self.stream_chunk_tokens = stream_chunk_tokens

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def render(self, messages: list[dict[str, Any]]) -> list[int]:
        """The prompt token ids: chat template with the assistant turn opened."""
        plain = [{"role": m["role"], "content": m.get("content") or ""} for m in messages]
        return encode_chat(self.tokenizer, plain)

    def complete(
        self,
        messages: list[dict[str, Any]],
        stop: list[str],
        max_new_tokens: int,
        key: str,
        on_text: TextCallback | None = None,
        timeout_s: float | None = None,
        constraint: Any = None,
    ) -> Completion:
        context = self.render(messages)
        # chunks would each start the grammar afresh: a constrained action is generated whole
        if on_text is None or self.stream_chunk_tokens <= 0 or constraint is not None:
            request = GenerationRequest(key, context, max_new_tokens, constraint)
            generation = self.backend.generate([request], stop)[0]
            if on_text is not None and generation.text:
                on_text(generation.text)
            n_new = len(generation.token_ids)
            return Completion(generation.text, len(context), n_new, generation.finish_reason)
        return self._streamed(context, stop, max_new_tokens, key, on_text)

    def _streamed(
        self, context: list[int], stop: list[str], max_new_tokens: int, key: str, on_text: TextCallback
    ) -> Completion:
        generated: list[int] = []
        shown, finish = "", "length"
        while len(generated) < max_new_tokens:
            chunk = min(self.stream_chunk_tokens, max_new_tokens - len(generated))
            request = GenerationRequest(key, context + generated, chunk)
            generation = self.backend.generate([request], stop)[0]
            generated.extend(generation.token_ids)
            text = self.tokenizer.decode(generated, skip_special_tokens=True)
            cut = first_stop(text, stop)  # a stop string may span two chunks
            ended = cut >= 0 or generation.finish_reason in ("stop", "eos")
            if cut >= 0:
                text, finish = text[:cut], "stop"
            elif generation.finish_reason in ("stop", "eos"):
                finish = generation.finish_reason
            # A multi-byte character split between chunks decodes as U+FFFD: hold it back.
            ready = text if ended else text.rstrip("\ufffd")
            if len(ready) > len(shown) and ready.startswith(shown):
                on_text(ready[len(shown) :])
                shown = ready
            if ended or not generation.token_ids:
                break
        text = self.tokenizer.decode(generated, skip_special_tokens=True)
        cut = first_stop(text, stop)
        return Completion(text[:cut] if cut >= 0 else text, len(context), len(generated), finish)


def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


def load_chat_policy(
    spec: str,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    device: str = "auto",
    stream_chunk_tokens: int = 8,
    api_model: str | None = None,
) -> ChatPolicy:
    """A chat policy from `spec`: an OpenAI-compatible base URL (`http://host:port/v1`),
    `smollm2-135m` (the embedded model), `tiny`, or a local Hugging Face model directory.

    Local models sample through the rollout `hf` backend; `api_model` is the model name
    sent to an endpoint.
    """
    if is_url(spec):
        from ponder.agent.openai_http import OpenAIPolicy

        return OpenAIPolicy(spec, model=api_model or "default", temperature=temperature, top_p=top_p)
    from ponder.config import SamplingConfig
    from ponder.models import load_policy
    from ponder.rollout.hf import HFBackend

    policy = load_policy(spec, device=device)
    sampling = SamplingConfig(temperature=temperature, top_p=top_p)
    return BackendPolicy(HFBackend(policy, sampling, seed=seed), name=spec, stream_chunk_tokens=stream_chunk_tokens)
