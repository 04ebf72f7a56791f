"""ponder's lean Llama-family decoder against the transformers model it replaces."""

import pytest
import torch

from ponder.config import SamplingConfig
from ponder.models import Policy, tiny_policy, tiny_tokenizer
from ponder.rollout import GenerationRequest, HFBackend
from ponder.rollout.kv import SlabCache
from ponder.rollout.llama_decode import LlamaDecoder, attention_slots, lean_decoder


def tiny_qwen2() -> Policy:
    """A tiny Qwen2: biases on q, k and v, which Llama lacks."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config).eval()
        for layer in model.model.layers:
            torch.nn.init.normal_(layer.self_attn.q_proj.bias, std=0.5)
            torch.nn.init.normal_(layer.self_attn.k_proj.bias, std=0.5)
    return Policy(model, tokenizer, "qwen2-tiny", torch.device("cpu"))


def both_forwards(policy: Policy, lean: LlamaDecoder, input_ids, attention_mask, position_ids, caches):
    """The transformers model's and the lean decoder's logits on the same call."""
    with torch.no_grad():
        kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True)
        expected = policy.model(past_key_values=caches[0], **kwargs).logits
        actual = lean(past_key_values=caches[1], **kwargs).logits
    return expected, actual


@pytest.mark.parametrize("kernel", ["blas", "onednn"])
@pytest.mark.parametrize("architecture", ["llama+lora", "qwen2"])
def test_logits_equal_the_transformers_model_through_prefill_and_decode(architecture, kernel, trained_lora,
                                                                        monkeypatch):
    monkeypatch.setenv("PONDER_MATMUL", kernel)  # sgemm throughout, or every matrix in the blocked layout
    policy = trained_lora(tiny_policy(seed=0)) if architecture == "llama+lora" else tiny_qwen2()
    lean = lean_decoder(policy.model)
    packed = kernel == "onednn"
    assert [lean.head.packed, lean.layers[0].gate_up.packed, lean.layers[0].qkv.packed] == [packed] * 3
    assert isinstance(lean, LlamaDecoder)
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, 300, (3, 7), generator=generator)
    attention_mask = torch.ones(3, 7, dtype=torch.long)
    attention_mask[0, :3] = 0  # a left-padded row
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    layers = policy.model.config.num_hidden_layers
    caches = [SlabCache(layers, 12, [None] * 3, 0) for _ in range(2)]
    expected, actual = both_forwards(policy, lean, input_ids, attention_mask, position_ids, caches)
    real = attention_mask.bool()
    assert expected.abs().max() > 0.1  # not a degenerate all-zero comparison
    assert torch.allclose(actual[real], expected[real], atol=1e-5)
    assert torch.isfinite(actual).all()  # padding positions stay finite (no empty softmax row)
    for _ in range(4):  # decode steps write into the same caches (and grow past capacity 12)
        input_ids = torch.randint(5, 300, (3, 1), generator=generator)
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(3, 1)], dim=1)
        position_ids = position_ids[:, -1:] + 1
        expected, actual = both_forwards(policy, lean, input_ids, attention_mask, position_ids, caches)
        assert torch.allclose(actual, expected, atol=1e-5)


def test_the_decoder_snapshots_the_weights_it_was_built_from(trained_lora):
    policy = trained_lora(tiny_policy(seed=0))
    lean = lean_decoder(policy.model)
    ids = torch.tensor([[5, 6, 7]])
    mask, positions = torch.ones_like(ids), torch.arange(3).unsqueeze(0)
    layers = policy.model.config.num_hidden_layers
    before = lean(ids, mask, positions, SlabCache(layers, 3, [None], 0)).logits
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.add_(1.0)
    after = lean(ids, mask, positions, SlabCache(layers, 3, [None], 0)).logits
    rebuilt = lean_decoder(policy.model)(ids, mask, positions, SlabCache(layers, 3, [None], 0)).logits
    assert torch.equal(before, after)  # a training step does not leak into a running rollout
    assert not torch.allclose(before, rebuilt, atol=1e-3)  # the backend's refresh() picks it up


def test_greedy_generation_is_the_same_with_either_decoder(trained_lora):
    policy = trained_lora(tiny_policy(seed=0))
    tokenizer = policy.tokenizer
    contexts = ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<think>I need to search"]
    requests = [GenerationRequest(f"r{i}", tokenizer.encode(c), 9) for i, c in enumerate(contexts)]
    runs = {}
    for decoder in ("auto", "transformers"):
        backend = HFBackend(policy, SamplingConfig(temperature=0.0, decoder=decoder), seed=0)
        runs[decoder] = (type(backend.sampling_model()).__name__, backend.generate(requests, []))
    assert runs["auto"][0] == "LlamaDecoder" and runs["transformers"][0] != "LlamaDecoder"
    lean, reference = runs["auto"][1], runs["transformers"][1]
    assert [g.token_ids for g in lean] == [g.token_ids for g in reference]
    for a, b in zip(lean, reference):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


@pytest.mark.parametrize("decoder", ["auto", "transformers"])
def test_refresh_frees_the_old_sampling_copy(trained_lora, decoder):
    import weakref

    backend = HFBackend(trained_lora(tiny_policy(seed=0)), SamplingConfig(decoder=decoder), seed=0)
    old = weakref.ref(backend.sampling_model())
    backend.refresh()  # the lean decoder goes by reference counting, a transformers copy by gc.collect
    assert old() is None and backend.sampling_model() is not None


def test_models_it_does_not_cover_fall_back_to_transformers():
    policy = tiny_policy(seed=0)
    policy.model.config.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    assert lean_decoder(policy.model) is None
    backend = HFBackend(policy, SamplingConfig(temperature=0.0), seed=0)
    assert type(backend.sampling_model()).__name__ == "LlamaForCausalLM"


def test_unknown_decoder_name_is_refused():
    with pytest.raises(ValueError, match="rollout.sampling.decoder: unknown 'vllm'; valid: auto, transformers"):
        HFBackend(tiny_policy(seed=0), SamplingConfig(decoder="vllm"))


def test_attention_slots_by_hand():
    # Row 0: one padded past slot, one real past slot, then two new tokens.
    # Row 1: two real past slots; its first new token is padding (left-padded new tokens).
    attention_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 1]])
    visible = attention_slots(attention_mask, new_tokens=2)
    assert visible.shape == (2, 1, 2, 4)
    expected = torch.tensor(
        [
            [[0, 1, 1, 0], [0, 1, 1, 1]],
            [[1, 1, 1, 0], [1, 1, 0, 1]],  # the padding token sees its own slot, nobody else does
        ],
        dtype=torch.bool,
    )
    assert torch.equal(visible[:, 0], expected)


def test_bf16_matrices_stay_close_to_fp32_and_keep_the_cache_fp32(trained_lora):
    """matmul_dtype bfloat16: matrices stored in bf16 (each product's input rounded to it),
    logits returned in float32 within bf16 rounding of the fp32 decoder's; the cache
    and the attention stay float32."""
    policy = trained_lora(tiny_policy(seed=0))
    exact, rounded = lean_decoder(policy.model), lean_decoder(policy.model, torch.bfloat16)
    assert rounded.layers[0].gate_up.dtype == torch.bfloat16
    assert exact.layers[0].gate_up.dtype == torch.float32
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, 300, (2, 6), generator=generator)
    mask = torch.ones(2, 6, dtype=torch.long)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    layers = policy.model.config.num_hidden_layers
    caches = [SlabCache(layers, 8, [None] * 2, 0) for _ in range(2)]
    expected = exact(input_ids, mask, positions, caches[0]).logits
    actual = rounded(input_ids, mask, positions, caches[1]).logits
    assert actual.dtype == torch.float32 and caches[1].layers[0].keys.dtype == torch.float32
    gap = (actual - expected).abs().max()
    assert 0 < gap < 0.05 * expected.abs().max()  # rounded, not exact, and close


def test_sampling_dtype_auto_follows_the_cpus_bf16_instructions():
    from ponder.models.cpu_matmul import has_bf16_instructions
    from ponder.rollout.hf import sampling_dtype

    assert has_bf16_instructions(["avx512f", "avx512_bf16"]) and has_bf16_instructions(["amx_bf16"])
    assert not has_bf16_instructions(["avx512f", "avx512bw", "avx2"])
    policy = tiny_policy(seed=0)
    assert sampling_dtype("float32", policy) == torch.float32
    assert sampling_dtype("bfloat16", policy) == torch.bfloat16
    with pytest.raises(ValueError, match="rollout.sampling.dtype: unknown 'fp8'"):
        sampling_dtype("fp8", policy)
    bf16 = HFBackend(policy, SamplingConfig(dtype="bfloat16"))
    assert not bf16.logprobs_match_trainer
    assert HFBackend(policy, SamplingConfig(dtype="float32")).logprobs_match_trainer
    requests = [GenerationRequest(f"r{i}", [5, 6, 7 + i], 6) for i in range(3)]
    generations = bf16.generate(requests, [])
    assert all(len(g.token_ids) == len(g.logprobs) > 0 for g in generations)
    assert all(lp <= 0 and lp == lp for g in generations for lp in g.logprobs)


def test_precisions_default_to_the_models_own():
    """A bf16 model (a GPU's) samples and trains its base in bf16 unless a recipe asks
    otherwise: no silent fp32 copy reading twice the bytes (found on an H200)."""
    from dataclasses import replace

    from ponder.config import LoraConfig
    from ponder.models.cpu_matmul import matmul_dtype
    from ponder.rollout.hf import sampling_dtype

    assert SamplingConfig().dtype == LoraConfig().base_matmul_dtype == "model"
    policy = tiny_policy(seed=0)
    assert sampling_dtype("model", policy) == torch.float32
    bf16 = replace(policy, model=policy.model.to(torch.bfloat16))
    assert sampling_dtype("model", bf16) == torch.bfloat16
    assert sampling_dtype("float32", bf16) == torch.float32  # asked for: an upcast copy
    assert matmul_dtype("model", "lora.base_matmul_dtype", torch.bfloat16, torch.device("cuda")) == torch.bfloat16
