"""The GPU's static-shape decode steps (rollout.graph_decode), run eagerly on the CPU
against the lean decoder they replay: same logits, same generations."""

import pytest
import torch

from ponder.config import SamplingConfig
from ponder.models import tiny_policy
from ponder.rollout import GenerationRequest, HFBackend
from ponder.rollout.graph_decode import GraphStep
from ponder.rollout.kv import SlabCache
from ponder.rollout.llama_decode import lean_decoder

from .test_llama_decode import tiny_qwen2


@pytest.mark.parametrize(
    "architecture,compiled",
    [("llama+lora", False), ("qwen2", False), pytest.param("qwen2", True, marks=pytest.mark.slow)],
)
def test_static_steps_give_the_lean_decoders_logits(architecture, compiled, trained_lora):
    """Eager, and compiled by torch.compile (inductor's C++ backend here, Triton on a GPU)."""
    policy = trained_lora(tiny_policy(seed=0)) if architecture == "llama+lora" else tiny_qwen2()
    lean, plain = lean_decoder(policy.model), lean_decoder(policy.model, pack=False)
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, 300, (3, 6), generator=generator)
    attention_mask = torch.ones(3, 6, dtype=torch.long)
    attention_mask[0, :2] = 0  # a left-padded row
    attention_mask[2, :4] = 0
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    layers = policy.model.config.num_hidden_layers
    reference_cache, static_cache = SlabCache(layers, 11, [None] * 3, 0), SlabCache(layers, 11, [None] * 3, 0)
    lean(input_ids, attention_mask, positions, reference_cache)
    lean(input_ids, attention_mask, positions, static_cache)
    step = GraphStep.after_prefill(plain, static_cache, attention_mask, positions[:, -1:] + 1, compiled)
    next_position = positions[:, -1:] + 1
    for _ in range(5):  # fills the cache's 11 slots
        tokens = torch.randint(5, 300, (3,), generator=generator)
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(3, 1)], dim=1)
        expected = lean(tokens.unsqueeze(-1), attention_mask, next_position, reference_cache).logits[:, -1]
        actual = step(tokens)
        next_position = next_position + 1
        assert expected.abs().max() > 0.1
        assert torch.allclose(actual, expected, atol=1e-5)
        assert torch.equal(step.attention_mask().long(), attention_mask)
    with pytest.raises(RuntimeError, match="the cache's 11 slots are full"):
        step(tokens)


@pytest.mark.parametrize("static", ["static", pytest.param("compiled", marks=pytest.mark.slow)])
def test_static_decoding_generates_what_the_lean_decoder_does_over_two_turns(static, trained_lora):
    policy = trained_lora(tiny_policy(seed=0))
    encode = policy.tokenizer.encode
    prompts = ["<|im_start|>user\nhi<|im_end|>\n", "<think>I need to search", "a", "<answer>Paris"]
    lengths = [2, 9, 9, 4]  # rows end at different steps: at 4 of 4 live rows, the batch is compacted
    runs = {}
    for decoder in ("auto", static):
        backend = HFBackend(policy, SamplingConfig(temperature=0.0, decoder=decoder), seed=0)
        first = backend.generate([GenerationRequest(f"e{i}", encode(p), n)
                                  for i, (p, n) in enumerate(zip(prompts, lengths))], [])  # fmt: skip
        assert len(backend.store) == 4  # every episode's past is kept for its next turn
        second = backend.generate([GenerationRequest(f"e{i}", encode(p) + g.token_ids + encode(" ok"), 5)
                                   for i, (p, g) in enumerate(zip(prompts, first))], [])  # fmt: skip
        runs[decoder] = first + second
    assert [len(g.token_ids) for g in runs[static][:4]] == lengths
    assert [g.token_ids for g in runs[static]] == [g.token_ids for g in runs["auto"]]
    for a, b in zip(runs[static], runs["auto"]):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert a.finish_reason == b.finish_reason


def test_bfloat16_weights_with_float32_adapters_decode_in_bfloat16(trained_lora):
    """On a GPU the base is bf16 and PEFT's LoRA weights fp32: the merged weights are
    stored in the base's dtype, and the static steps' logits follow the transformers
    model's within bf16 rounding."""
    policy = trained_lora(tiny_policy(seed=0))
    policy.model.base_model.model.to(torch.bfloat16)
    for name, param in policy.model.named_parameters():
        if "lora_" in name:
            param.data = param.data.float()
    lean = lean_decoder(policy.model, pack=False)
    assert lean.layers[0].qkv.weight.dtype == torch.bfloat16
    ids = torch.tensor([[5, 6, 7, 8]])
    mask, positions = torch.ones_like(ids), torch.arange(4).unsqueeze(0)
    layers = policy.model.config.num_hidden_layers
    cache = SlabCache(layers, 6, [None], 0)
    lean(ids[:, :3], mask[:, :3], positions[:, :3], cache)
    step = GraphStep.after_prefill(lean, cache, mask[:, :3], positions[:, 2:3] + 1)
    actual = step(ids[:, 3])
    with torch.no_grad():
        expected = policy.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
    assert actual.dtype == torch.bfloat16
    assert torch.allclose(actual.float(), expected.float(), atol=0.05)


def test_static_steps_refuse_packed_matrices():
    policy = tiny_policy(seed=0)
    packed = lean_decoder(policy.model)
    packed.pack = True  # as built for the CPU decoder, whether or not a matrix won packing
    with pytest.raises(ValueError, match="pack=False"):
        GraphStep(packed, [], torch.ones(1, 4, dtype=torch.bool), torch.tensor([2]), 2)


def test_a_failed_compilation_decodes_uncompiled_with_one_warning(monkeypatch):
    """No working compiler (here inductor's C++ one; on a GPU, Triton): the step warns,
    gives the uncompiled step's logits, and the process stops trying to compile."""
    import torch._dynamo
    import torch._inductor.config as inductor

    from ponder.rollout import graph_decode

    monkeypatch.setattr(graph_decode, "_COMPILE_FAILED", [])
    graph_decode._step_functions.cache_clear()
    torch._dynamo.reset()
    policy = tiny_qwen2()
    plain = lean_decoder(policy.model, pack=False)
    ids = torch.randint(5, 300, (2, 4), generator=torch.Generator().manual_seed(3))
    mask, positions = torch.ones_like(ids), torch.arange(4).expand(2, 4)
    layers = policy.model.config.num_hidden_layers
    steps = []
    for compiled in (False, True):
        cache = SlabCache(layers, 8, [None] * 2, 0)
        plain(ids, mask, positions, cache)
        steps.append(GraphStep.after_prefill(plain, cache, mask, positions[:, -1:] + 1, compiled))
    tokens = torch.tensor([7, 9])
    with inductor.patch({"cpp.cxx": ("/nonexistent/c++",), "fx_graph_cache": False}):
        with pytest.warns(UserWarning, match=r"torch.compile failed \(.*No working C\+\+ compiler"):
            actual = steps[1](tokens)
    assert torch.equal(actual, steps[0](tokens))
    assert not steps[1].compiled and len(graph_decode._COMPILE_FAILED) == 1
    again = graph_decode.step_functions(plain.heads, plain.kv_heads, plain.head_dim, plain.eps, True)
    assert again.layer is steps[0].functions.layer  # the uncompiled functions, not another try
    graph_decode._step_functions.cache_clear()
    torch._dynamo.reset()
