"""The estimate's formulas on a configuration small enough to count by hand: 2 layers,
hidden 8, 2 heads of 4, 1 KV head, intermediate 16, vocabulary 10, tied embeddings."""

import pytest

from ponder.estimate import formulas as f

SHAPE = f.ModelShape(vocab_size=10, hidden_size=8, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4,
                     intermediate_size=16)  # fmt: skip


def test_parameter_count_by_hand():
    # embedding 10*8 = 80; a layer: q 8*8 + k 8*4 + v 8*4 + o 8*8 = 192, gate/up/down 3 * 8*16 = 384,
    # two norms 16 -> 592; two layers 1184; final norm 8; tied head 0
    assert f.parameter_count(SHAPE) == 80 + 2 * 592 + 8 == 1272
    untied = f.ModelShape(**{**SHAPE.__dict__, "tied_embeddings": False})
    assert f.parameter_count(untied) == 1272 + 80
    assert f.matmul_parameters(SHAPE) == 2 * 576 + 80  # the head multiplies even when tied


def test_lora_and_adam_state_by_hand():
    targets = f.lora_targets(SHAPE, "all-linear")
    assert targets == list(f.LINEAR_MODULES)
    # r=2: q 2(8+8)=32, k 2(8+4)=24, v 24, o 32, gate/up/down 2(8+16)=48 each -> 256 a layer
    assert f.lora_parameter_count(SHAPE, 2, targets, layers=2) == 512
    assert f.lora_parameter_count(SHAPE, 2, f.lora_targets(SHAPE, ["q_proj", "v_proj"]), layers=1) == 56
    # exp_avg + exp_avg_sq in float32, one 4-byte step per tensor (A and B of 7 modules x 2 layers)
    assert f.adam_state_bytes(512, 28, 4) == 2 * 512 * 4 + 4 * 28 == 4208
    with pytest.raises(ValueError, match="c_attn"):
        f.lora_targets(SHAPE, ["c_attn"])


def test_kv_cache_bytes_batch_3_by_10_tokens():
    # 3 rows x 10 tokens x 2 layers x (k and v) x 1 head x 4 dims x 4 bytes
    assert f.kv_cache_bytes(SHAPE, batch=3, tokens=10, bytes_per_value=4) == 3 * 10 * 2 * 2 * 1 * 4 * 4 == 1920
    assert f.kv_cache_bytes(SHAPE, 3, 10, 2) == 960


def test_activation_bytes_by_hand():
    # a layer keeps 4h + 2q + 2kv + 4 inner = 32 + 16 + 8 + 64 = 120 values a token
    assert f.layer_activation_values(SHAPE) == 120
    # 1 row x 10 tokens x 2 layers x 120 x 4 B, plus logits (4 B) and log-softmax (4 B) at 3 positions
    assert f.activation_bytes(SHAPE, 1, 10, 4, trained_layers=2, logit_tokens=3) == 9600 + 3 * 10 * 8 == 9840
    # checkpointing: each layer's input (h) and one layer recomputed
    assert f.activation_bytes(SHAPE, 1, 10, 4, 2, checkpointing=True, logit_tokens=0) == 10 * (2 * 8 + 120) * 4
    assert f.activation_bytes(SHAPE, 2, 10, 4, 2, logit_tokens=3) == 2 * 9840  # linear in rows


def test_flops_by_hand():
    # blocks 2 * 2 layers * 576 * 10 tokens = 23040; head 2 * 80 * 10 = 1600; attention 2 * 2 * 2 * 4 * 10² = 3200
    assert f.forward_flops(SHAPE, 1, 10) == 23040 + 1600 + 3200
    assert f.forward_flops(SHAPE, 1, 10, logit_tokens=0) == 23040 + 3200
    forward = f.forward_flops(SHAPE, 1, 10)
    assert f.train_flops(SHAPE, 1, 10, full=True, trained_layers=2) == 3 * forward  # the 6N rule
    assert f.train_flops(SHAPE, 1, 10, full=False, trained_layers=2, lora_parameters=512) == 2 * forward + 6 * 10 * 512
    assert f.train_flops(SHAPE, 1, 10, full=False, trained_layers=1) == forward + (forward - 1600) / 2 + 1600


def test_decode_is_bandwidth_bound_at_small_batches():
    # 1 GB of weights at 1 GB/s: a second a step, however fast the arithmetic
    assert f.decode_seconds(5, 10**9, 0, 1, 2e9, 1e9, 1e15) == pytest.approx(5.0)
    # a huge batch at slow arithmetic: compute-bound
    assert f.decode_seconds(1, 10**9, 0, 1000, 2e9, 1e12, 1e9) == pytest.approx(2000.0)


def test_shape_from_a_config_dict():
    config = {"vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
              "num_key_value_heads": 1, "intermediate_size": 16, "tie_word_embeddings": True, "model_type": "llama"}
    assert f.shape_from_config(config) == SHAPE
    gpt2 = f.shape_from_config({"vocab_size": 10, "n_embd": 8, "n_layer": 2, "n_head": 2, "model_type": "gpt2"})
    assert (gpt2.intermediate_size, gpt2.num_kv_heads, gpt2.gated_mlp) == (32, 2, False)
    assert f.shape_from_config({**config, "model_type": "qwen2"}).qkv_bias
