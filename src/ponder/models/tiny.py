"""A tiny randomly initialised Llama-style model and a byte-level BPE tokenizer,
built in-process with no download. Used by trainer and rollout tests.

The tokenizer speaks ChatML (`<|im_start|>`, `<|im_end|>`) like SmolLM2, so the same
prompts, tags and masks work on both.
"""

from __future__ import annotations

import torch

from ponder.models.loading import Policy, _ensure_pad_token, resolve_device

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Text the BPE merges are learned from: the protocol's tags and ordinary words,
# so tags become a few tokens each, as in real tokenizers.
_TRAINING_TEXT = [
    "<think>I need to search for this.</think>\n<search>query</search>",
    "<information>Doc 1 (Title: name) contents</information>",
    "<answer>the answer</answer>",
    "Answer the question. Search with <search>query</search> and answer with <answer>text</answer>.",
    "In which city was the person born? What year was the company founded?",
    "system user assistant tool Thought: Action: Action Input: Observation: Final Answer:",
    '<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>',
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'\"()[]{}<>/\\-_=+*&^%$#@~`|",
]


def tiny_tokenizer(vocab_size: int = 512):
    """A deterministic byte-level BPE tokenizer with ChatML special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_TRAINING_TEXT * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    _ensure_pad_token(tokenizer)
    return tokenizer


def tiny_config(tokenizer, hidden_size: int = 64, num_layers: int = 2):
    """The tiny model's LlamaConfig for `tokenizer` (what tiny_policy builds; no weights)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )


def tiny_policy(seed: int = 0, hidden_size: int = 64, num_layers: int = 2, device: str = "cpu") -> Policy:
    """A randomly initialised 2-layer Llama with the tiny tokenizer (seeded, no download)."""
    from transformers import LlamaForCausalLM

    tokenizer = tiny_tokenizer()
    config = tiny_config(tokenizer, hidden_size, num_layers)
    with torch.random.fork_rng():  # building a model must not shift the caller's RNG
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    target = resolve_device(device)
    model.to(target)
    model.eval()
    return Policy(model=model, tokenizer=tokenizer, name="tiny", device=target)
