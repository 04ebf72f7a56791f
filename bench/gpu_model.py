"""A randomly initialised model of a real model's shape, for GPU throughput runs.

    python -m bench.gpu_model --shape qwen2.5-1.5b --out /tmp/qwen-1.5b-random

No weights leave a hub (this machine reaches none): the model is built from its
architecture's numbers (hidden size, layers, heads, vocabulary) with random
weights, and its tokenizer is a byte-level one with exactly the model's vocabulary
(byte_tokenizer), so every text encodes, every sampled id decodes, and throughput is
that of the real shape. Rewards on its output mean nothing; timings do.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Qwen2.5-1.5B's config.json, the numbers that set the cost of a token.
SHAPES = {
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                         max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
                         tie_word_embeddings=True),
    # a small one of the same family, for checking the scripts on a CPU
    "qwen-tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=512, max_position_embeddings=2048,
                      rope_theta=10_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True),
}  # fmt: skip
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer with `vocab_size` ids: the 256 byte symbols (any text
    encodes, one token per byte, as Qwen's tokenizer does for text it has no merge
    for), ChatML's special tokens, then filler words `Ġw…` that only sampling reaches.
    transformers rebuilds a `qwen2` model's tokenizer from vocab and merges, so the
    tokenizer is byte-level BPE like Qwen's, with no merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    vocab = {token: index for index, token in enumerate(symbols + SPECIALS)}
    vocab.update({f"Ġw{index}": index for index in range(len(vocab), vocab_size)})
    core = Tokenizer(models.BPE(vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(SPECIALS)
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHATML)  # fmt: skip


def build(shape: str, out: Path, device: str = "cpu", seed: int = 0) -> Path:
    """Write the random model (bfloat16 safetensors) and its tokenizer to `out`."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    if shape not in SHAPES:
        raise SystemExit(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    numbers = SHAPES[shape]
    tokenizer = byte_tokenizer(numbers["vocab_size"])
    config = Qwen2Config(**numbers, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=None)  # fmt: skip
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    (out / "shape.json").write_text(json.dumps({"shape": shape, "parameters": params, **numbers}))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen2.5-1.5b", choices=sorted(SHAPES))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cpu", help="where to initialise (cuda is much faster for 1.5B)")
    args = parser.parse_args(argv)
    print(build(args.shape, args.out, args.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
