"""The estimate's arithmetic: parameter counts, bytes and FLOPs of a decoder-only
transformer from its config, as pure functions of plain numbers.

The model is Llama-shaped (Llama, Qwen2, Mistral, SmolLM2): per layer q/k/v/o
projections with grouped KV heads, a gated MLP (gate, up, down), two RMSNorms; an
embedding and an LM head, tied or not. `shape_from_config` reads the usual config
keys of other decoders too (GPT-2's n_embd, n_layer …) and counts their two-matrix
MLP, so their figures are approximate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Llama-style linear layers of one block: the names PEFT's target_modules use.
LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# model_type values whose MLP is two matrices (up, down) rather than gated.
UNGATED = ("gpt2", "gpt_neox", "gptj", "opt", "phi", "falcon", "bloom", "starcoder", "gpt_bigcode")
ADAM_STEP_BYTES = 4  # torch's AdamW keeps one float32 `step` tensor per parameter tensor


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a model config the estimate uses.

    vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, head_dim,
    intermediate_size: the usual config fields (head_dim = hidden / heads unless the
    config says otherwise). tied_embeddings: the LM head is the embedding matrix.
    qkv_bias: q, k and v projections have biases (Qwen2). gated_mlp: gate, up and down
    matrices (False: up and down only). model_type: the config's, for the notes.
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    tied_embeddings: bool = True
    qkv_bias: bool = False
    gated_mlp: bool = True
    model_type: str = "llama"


def _first(config: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    if default is None:
        raise ValueError(f"model config has none of {', '.join(keys)}")
    return default


def shape_from_config(config: dict[str, Any]) -> ModelShape:
    """A ModelShape from a Hugging Face config.json's fields (a dict)."""
    hidden = int(_first(config, "hidden_size", "n_embd", "d_model"))
    heads = int(_first(config, "num_attention_heads", "n_head", "num_heads"))
    model_type = str(config.get("model_type", "llama"))
    return ModelShape(
        vocab_size=int(_first(config, "vocab_size")),
        hidden_size=hidden,
        num_layers=int(_first(config, "num_hidden_layers", "n_layer", "num_layers")),
        num_heads=heads,
        num_kv_heads=int(_first(config, "num_key_value_heads", "multi_query_group_num", default=heads)),
        head_dim=int(_first(config, "head_dim", default=hidden // heads)),
        intermediate_size=int(_first(config, "intermediate_size", "n_inner", "ffn_dim", default=4 * hidden)),
        tied_embeddings=bool(config.get("tie_word_embeddings", True)),
        qkv_bias=bool(config.get("attention_bias", model_type == "qwen2")),
        gated_mlp=model_type not in UNGATED,
        model_type=model_type,
    )


def layer_linears(shape: ModelShape) -> dict[str, tuple[int, int]]:
    """name -> (in_features, out_features) of one block's linear layers."""
    h, inner = shape.hidden_size, shape.intermediate_size
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    linears = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
               "gate_proj": (h, inner), "up_proj": (h, inner), "down_proj": (inner, h)}  # fmt: skip
    if not shape.gated_mlp:
        del linears["gate_proj"]
    return linears


def layer_matmul_parameters(shape: ModelShape) -> int:
    """Weights of one block's linear layers (biases and norms left out)."""
    return sum(d_in * d_out for d_in, d_out in layer_linears(shape).values())


def parameter_count(shape: ModelShape) -> int:
    """Every parameter, a tied LM head counted once (as model.parameters() does)."""
    per_layer = layer_matmul_parameters(shape) + 2 * shape.hidden_size  # + the two norms' weights
    if shape.qkv_bias:
        per_layer += (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim
    embedding = shape.vocab_size * shape.hidden_size
    head = 0 if shape.tied_embeddings else embedding
    return embedding + shape.num_layers * per_layer + shape.hidden_size + head  # + the final norm


def matmul_parameters(shape: ModelShape) -> int:
    """The weights one token's forward multiplies by: every block's linears and the
    LM head (tied or not); the embedding is a lookup. N in the 2·N FLOPs per token."""
    return shape.num_layers * layer_matmul_parameters(shape) + shape.vocab_size * shape.hidden_size


def lora_targets(shape: ModelShape, target_modules: str | list | tuple) -> list[str]:
    """The block's linear layers that `target_modules` ("all-linear" or names) adapts."""
    linears = layer_linears(shape)
    if target_modules == "all-linear":
        return list(linears)
    names = [target_modules] if isinstance(target_modules, str) else list(target_modules)
    unknown = [name for name in names if name not in LINEAR_MODULES]
    if unknown:
        raise ValueError(f"lora.target_modules: the estimate knows {', '.join(LINEAR_MODULES)}; "
                         f"not {', '.join(unknown)}")
    return [name for name in names if name in linears]


def lora_parameter_count(shape: ModelShape, rank: int, targets: list[str], layers: int) -> int:
    """A: r x in and B: out x r for every targeted linear of `layers` blocks."""
    linears = layer_linears(shape)
    return layers * sum(rank * (linears[name][0] + linears[name][1]) for name in targets)


def adam_state_bytes(trainable: int, tensors: int, bytes_per_value: int) -> int:
    """AdamW's exp_avg and exp_avg_sq (each the parameter's size and dtype) and a
    float32 step counter per parameter tensor."""
    return 2 * trainable * bytes_per_value + ADAM_STEP_BYTES * tensors


def kv_cache_bytes(shape: ModelShape, batch: int, tokens: int, bytes_per_value: int) -> int:
    """Keys and values of `batch` sequences of `tokens` positions in every layer."""
    return batch * tokens * shape.num_layers * 2 * shape.num_kv_heads * shape.head_dim * bytes_per_value


def layer_activation_values(shape: ModelShape, lora_modules: int = 0, rank: int = 0) -> int:
    """Values one block keeps per token for its backward pass: the residual input and
    the normed input of attention and of the MLP (4 h), q and k after rotary plus v
    (q + 2 kv), the attention output (q), the MLP's gate, up, activation and product
    (4 inner; 2 for an ungated MLP), and each LoRA's r-wide down-projection. Fused
    attention (SDPA) keeps no tokens x tokens matrix."""
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    mlp = (4 if shape.gated_mlp else 2) * shape.intermediate_size
    return 4 * shape.hidden_size + 2 * q + 2 * kv + mlp + lora_modules * rank


def activation_bytes(shape: ModelShape, rows: int, tokens: int, bytes_per_value: int, trained_layers: int,
                     checkpointing: bool = False, lora_modules: int = 0, rank: int = 0,
                     logit_tokens: int | None = None, entropy: bool = False) -> int:  # fmt: skip
    """What a training forward of rows x tokens keeps for backward: every trained
    layer's activations (with gradient checkpointing: each layer's input, and one
    layer's activations at a time while it is recomputed) and, at the logit_tokens
    positions the loss reads (default: every token), the LM head's logits in the
    model's dtype and their float32 copy for the log-sum-exp; with `entropy` (the RL
    update logs it) the softmax and its product with the logits, float32, beside them."""
    per_layer = layer_activation_values(shape, lora_modules, rank)
    values = trained_layers * (shape.hidden_size if checkpointing else per_layer)
    if checkpointing and trained_layers:
        values += per_layer
    per_entry = bytes_per_value + 4 + (8 if entropy else 0)
    logits = shape.vocab_size * per_entry * (tokens if logit_tokens is None else logit_tokens)
    return rows * (tokens * values * bytes_per_value + logits)


def forward_flops(shape: ModelShape, rows: int, tokens: int, logit_tokens: int | None = None) -> float:
    """A causal forward of rows x tokens: 2 FLOPs per weight per token through the
    blocks, the LM head at logit_tokens positions (default: every token; the training
    passes project only where the loss reads), and per layer 2·heads·head_dim·tokens²
    for QKᵀ and AV over the causal half."""
    head_tokens = tokens if logit_tokens is None else logit_tokens
    blocks = 2 * shape.num_layers * layer_matmul_parameters(shape) * tokens
    head = 2 * shape.vocab_size * shape.hidden_size * head_tokens
    attention = 2 * shape.num_layers * shape.num_heads * shape.head_dim * tokens**2
    return float(rows * (blocks + head + attention))


def train_flops(shape: ModelShape, rows: int, tokens: int, full: bool, trained_layers: int,
                checkpointing: bool = False, lora_parameters: int = 0,
                logit_tokens: int | None = None) -> float:  # fmt: skip
    """Forward + backward of rows x tokens. The backward's input gradients (the
    forward's cost again) run through the trained layers and the head; weight
    gradients cost as much once more for full fine-tuning (6·N per token in all) and
    are LoRA's own small products otherwise (about 4·N per token); checkpointing
    recomputes the trained layers' forward."""
    forward = forward_flops(shape, rows, tokens, logit_tokens)
    head_tokens = tokens if logit_tokens is None else logit_tokens
    head = 2.0 * rows * head_tokens * shape.vocab_size * shape.hidden_size
    share = trained_layers / shape.num_layers if shape.num_layers else 0.0
    layers = (forward - head) * share
    backward = (layers + head) * (2 if full else 1)
    recompute = layers if checkpointing else 0.0
    lora = 6.0 * rows * tokens * lora_parameters
    return forward + backward + recompute + lora


def compute_seconds(flops: float, flops_per_s: float) -> float:
    """A compute-bound pass at an achieved rate (peak x utilisation)."""
    return flops / flops_per_s


def decode_seconds(steps: int, weight_bytes: int, kv_bytes_per_row: float, batch: int, flops_per_token: float,
                   bytes_per_s: float, flops_per_s: float) -> float:  # fmt: skip
    """`steps` batched decode steps: each reads every weight once and each row's KV
    cache (kv_bytes_per_row at the average context), or computes 2·N per row,
    whichever takes longer (small batches are bandwidth-bound)."""
    read = (weight_bytes + batch * kv_bytes_per_row) / bytes_per_s
    compute = batch * flops_per_token / flops_per_s
    return steps * max(read, compute)


def batches(items: int, batch_size: int) -> int:
    return math.ceil(items / batch_size) if items > 0 else 0
