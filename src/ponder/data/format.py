"""Conversations → token ids with a loss mask on assistant tokens only.

Each piece of the rendered conversation is tokenised on its own and the ids are
concatenated, the way the rollout engine builds episodes, so the mask is exact
(no offset mapping) and `inline` reproduces the engine's token ids.

Styles:
- `inline`: the search-QA protocol. Everything before the first assistant turn is
  the chat-templated prompt; assistant turns (loss) and tool outputs (no loss)
  follow as plain text inside one assistant message, as the env renders them.
- `hermes`: ChatML with the tools as JSON in the system prompt (Hermes / Qwen),
  assistant calls as `<tool_call>{json}</tool_call>`, tool outputs as a `tool`
  turn holding `<tool_response>`. Loss covers the assistant content, its calls
  and its `<|im_end|>`, not the role header.
- `template`: the tokenizer's chat template with `tools=`; assistant spans are the
  differences between successive prefix renderings.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ponder.data.records import Conversation, call_arguments, call_name
from ponder.registry import Registry
from ponder.types import Trajectory

#: data.tool_style -> the renderer (formatter, conversation) -> [(text, trainable)]
#: (registered below, after ChatFormatter's methods it names)
STYLES: Registry[Callable[[Any, Conversation], list[tuple[str, bool]]]] = Registry("tool style")
HERMES_SYSTEM = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags. You may call one or more functions to assist with the user query. "
    "Don't make assumptions about what values to plug into functions. Here are the available tools: "
    "<tools>{tools}</tools> For each function call return a json object with function name and "
    'arguments within <tool_call></tool_call> XML tags as follows:\n<tool_call>\n{{"name": '
    '<function-name>, "arguments": <args-dict>}}\n</tool_call>'
)


@dataclass
class TokenizedExample:
    """input_ids [T] and loss_mask [T] (1 = an assistant token to learn)."""

    input_ids: list[int]
    loss_mask: list[int]
    task_type: str = "general"
    id: str = ""

    def to_trajectory(self) -> Trajectory:
        """A Trajectory whose first token is the prompt, so train.batch.collate aligns it."""
        rest = len(self.input_ids) - 1
        return Trajectory(
            self.id,
            self.input_ids[:1],
            self.input_ids[1:],
            self.loss_mask[1:],
            [0.0] * rest,
            group_id=self.id,
        )


class ChatFormatter:
    """Renders conversations for one tokenizer in one style (see the module docstring)."""

    def __init__(self, tokenizer: Any, style: str = "hermes") -> None:
        STYLES.check(style)
        self.tokenizer = tokenizer
        self.style = style

    def __call__(self, conversation: Conversation) -> TokenizedExample:
        segments = STYLES.get(self.style)(self, conversation)
        ids: list[int] = []
        mask: list[int] = []
        for text, trainable in segments:
            piece = self.tokenizer.encode(text, add_special_tokens=False) if text else []
            ids += piece
            mask += [int(trainable)] * len(piece)
        return TokenizedExample(ids, mask, conversation.task_type, conversation.id)

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
        """Ids of `messages` followed by the assistant header: what generation continues."""
        segments = self.render_prompt(messages, tools)
        return [i for text, _ in segments for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def render_prompt(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> list[tuple[str, bool]]:
        if self.style == "inline":
            return [(self._template_text(messages, tools, generation_prompt=True), False)]
        if self.style == "template":
            return [(self._template_text(messages, tools, generation_prompt=True), False)]
        return self._hermes_messages(messages, tools) + [("<|im_start|>assistant\n", False)]

    def _inline(self, conversation: Conversation) -> list[tuple[str, bool]]:
        messages = conversation.messages
        first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        segments = self.render_prompt(messages[:first], conversation.tools)
        for message in messages[first:]:
            segments.append((message.get("content") or "", message["role"] == "assistant"))
        return segments

    def _hermes(self, conversation: Conversation) -> list[tuple[str, bool]]:
        return self._hermes_messages(conversation.messages, conversation.tools)

    def _hermes_messages(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> list[tuple[str, bool]]:
        messages = _with_tool_system_prompt(messages, tools)
        segments: list[tuple[str, bool]] = []
        for message in messages:
            role, content = message["role"], message.get("content") or ""
            if role == "assistant":
                body = content + _hermes_calls(message)
                segments += [("<|im_start|>assistant\n", False), (body + "<|im_end|>", True), ("\n", False)]
            elif role == "tool":
                text = f"<|im_start|>tool\n<tool_response>\n{content}\n</tool_response><|im_end|>\n"
                segments.append((text, False))
            else:
                segments.append((f"<|im_start|>{role}\n{content}<|im_end|>\n", False))
        return segments

    def _template(self, conversation: Conversation) -> list[tuple[str, bool]]:
        messages, tools = conversation.messages, conversation.tools
        if tools and "tools" not in (self.tokenizer.chat_template or ""):
            raise ValueError(
                "tool style 'template': this tokenizer's chat template does not take tools=; use 'hermes'"
            )
        segments: list[tuple[str, bool]] = []
        done = ""
        for index, message in enumerate(messages):
            if message["role"] == "assistant":
                header = self._template_text(messages[:index], tools, generation_prompt=True)
                segments.append((_suffix(header, done), False))
                done = header
            full = self._template_text(messages[: index + 1], tools, generation_prompt=False)
            segments.append((_suffix(full, done), message["role"] == "assistant"))
            done = full
        return segments

    def _template_text(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], generation_prompt: bool
    ) -> str:
        if not messages:
            return ""
        options: dict[str, Any] = {"tools": tools} if tools and self.style == "template" else {}
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt, **options
        )


STYLES.add("inline", ChatFormatter._inline)
STYLES.add("hermes", ChatFormatter._hermes)
STYLES.add("template", ChatFormatter._template)


def _suffix(text: str, prefix: str) -> str:
    if not text.startswith(prefix):
        raise ValueError(
            "tool style 'template': the chat template does not render conversations prefix by prefix"
        )
    return text[len(prefix) :]


def _with_tool_system_prompt(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    if not tools:
        return messages
    specs = " ".join(json.dumps(t if "function" in t else {"type": "function", "function": t}) for t in tools)
    block = HERMES_SYSTEM.format(tools=specs)
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": block + "\n\n" + (messages[0].get("content") or "")}] + messages[
            1:
        ]
    return [{"role": "system", "content": block}] + messages


def _hermes_calls(message: dict[str, Any]) -> str:
    """`<tool_call>` blocks for calls not already written in the content (by their raw text)."""
    content = message.get("content") or ""
    blocks = []
    for call in message.get("tool_calls") or []:
        raw = (call.get("function") or call).get("raw") or call.get("raw")
        if raw and raw in content:
            continue
        payload = json.dumps({"name": call_name(call), "arguments": call_arguments(call)})
        blocks.append(f"<tool_call>\n{payload}\n</tool_call>")
    return ("\n" if content and blocks else "") + "\n".join(blocks)


def pack(examples: list[TokenizedExample], max_tokens: int) -> list[TokenizedExample]:
    """Greedily concatenate consecutive examples into rows of at most max_tokens ids.

    Attention is not blocked at the seams (TRL's plain packing); an example longer
    than max_tokens stays a row of its own.
    """
    rows: list[TokenizedExample] = []
    for example in examples:
        last = rows[-1] if rows else None
        if last is not None and len(last.input_ids) + len(example.input_ids) <= max_tokens:
            last.input_ids = last.input_ids + example.input_ids
            last.loss_mask = last.loss_mask + example.loss_mask
            last.id = f"{last.id}+{example.id}"
            continue
        rows.append(
            TokenizedExample(list(example.input_ids), list(example.loss_mask), example.task_type, example.id)
        )
    return rows
