import math

import pytest
import torch

from ponder.config import LoraConfig
from ponder.models import (
    ModelLoadError,
    adapters_disabled,
    apply_lora,
    entropy_from_logits,
    load_policy,
    logprobs_and_entropy,
    logprobs_from_logits,
    reference_logprobs,
    tiny_policy,
    tiny_tokenizer,
    token_logprobs,
    trainable_parameters,
)


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(seed=0)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def test_tiny_policy_is_deterministic_for_a_seed():
    first, second, other = tiny_policy(seed=3), tiny_policy(seed=3), tiny_policy(seed=4)
    a, b, c = first.model.state_dict(), second.model.state_dict(), other.model.state_dict()
    assert list(a) == list(b)
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert not torch.equal(
        a["model.layers.0.self_attn.q_proj.weight"], c["model.layers.0.self_attn.q_proj.weight"]
    )
    assert first.name == "tiny" and first.device == torch.device("cpu")
    assert not first.model.training


def test_tiny_policy_leaves_the_callers_rng_alone():
    torch.manual_seed(1234)
    expected = torch.rand(5)
    torch.manual_seed(1234)
    tiny_policy(seed=9)
    assert torch.equal(torch.rand(5), expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tiny_policy_leaves_the_callers_cuda_rng_alone():
    torch.cuda.manual_seed_all(1234)
    expected = torch.rand(5, device="cuda")
    torch.cuda.manual_seed_all(1234)
    tiny_policy(seed=9)
    assert torch.equal(torch.rand(5, device="cuda"), expected)


def test_tiny_tokenizer_is_deterministic(tokenizer):
    assert tiny_tokenizer().get_vocab() == tokenizer.get_vocab()
    assert len(tokenizer) == 512


@pytest.mark.parametrize(
    "text",
    [
        "<think>I need to search for this.</think>\n<search>Varo Quennick</search>",
        "\n\n<information>Doc 1 (Title: Varo) Varo is a city.</information>\n\n",
        "<answer> Zürich 1987 </answer>",
        "  leading spaces, tabs\tand unicode — 日本語 🦉 ",
    ],
)
def test_tiny_tokenizer_round_trips_text(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text


def test_tiny_tokenizer_learned_the_protocol_tags(tokenizer):
    # the BPE merges cover the tags: each is a few tokens, not one per byte
    for tag in ["<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>", "<information>"]:
        assert len(tokenizer.encode(tag, add_special_tokens=False)) <= 3, tag


def test_tiny_tokenizer_special_tokens(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False)
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nhi"


def test_tiny_tokenizer_chat_template(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Who founded Zufe Group?"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWho founded Zufe Group?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    without = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert without == text.removesuffix("<|im_start|>assistant\n")


# ---------------------------------------------------------------- logprob helpers


def test_logprobs_from_logits_hand_example():
    # logits [0, 2 ln 3] at temperature 2 are [0, ln 3]: probabilities 1/4 and 3/4
    logits = torch.tensor([[[0.0, 2 * math.log(3)], [0.0, 2 * math.log(3)]]])
    targets = torch.tensor([[0, 1]])
    out = logprobs_from_logits(logits, targets, temperature=2.0)
    assert out.shape == (1, 2)
    assert torch.allclose(out, torch.tensor([[math.log(1 / 4), math.log(3 / 4)]]), atol=1e-6)
    # temperature 1: probabilities 1/10 and 9/10
    assert torch.allclose(
        logprobs_from_logits(logits, targets), torch.tensor([[math.log(0.1), math.log(0.9)]]), atol=1e-6
    )
    # temperature 0 (greedy) scores under the untempered distribution
    assert torch.allclose(
        logprobs_from_logits(logits, targets, temperature=0.0), logprobs_from_logits(logits, targets)
    )


def test_logprobs_from_logits_is_float32_for_half_inputs():
    logits = torch.tensor([[[0.0, 2 * math.log(3)]]], dtype=torch.bfloat16)
    out = logprobs_from_logits(logits, torch.tensor([[1]]), temperature=2.0)
    assert out.dtype == torch.float32
    assert abs(out.item() - math.log(3 / 4)) < 1e-2


def test_entropy_of_uniform_logits_is_log_v():
    for vocab in (2, 7, 512):
        logits = torch.full((2, 3, vocab), 4.25)
        assert torch.allclose(entropy_from_logits(logits), torch.full((2, 3), math.log(vocab)), atol=1e-5)


def test_entropy_hand_example():
    logits = torch.tensor([[0.0, math.log(3)], [0.0, 100.0]])
    expected = torch.tensor([-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), 0.0])
    assert torch.allclose(entropy_from_logits(logits), expected, atol=1e-6)


def _left_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def _rows(tokenizer) -> list[list[int]]:
    texts = [
        "<think>short</think>",
        "<|im_start|>user\nIn which city was Varo born?<|im_end|>\n<|im_start|>assistant\n<search>Varo",
        "<answer>2019</answer> and a middle one",
    ]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def test_token_logprobs_on_left_padded_batch_equals_each_row_alone(policy):
    rows = _rows(policy.tokenizer)
    assert len({len(r) for r in rows}) == 3
    ids, mask = _left_pad(rows, policy.tokenizer.pad_token_id)
    with torch.no_grad():
        batched = token_logprobs(policy.model, ids, mask, temperature=0.7)
        width = ids.shape[1]
        assert batched.shape == (3, width - 1)
        for i, row in enumerate(rows):
            alone = token_logprobs(
                policy.model, torch.tensor([row]), torch.ones(1, len(row), dtype=torch.long), 0.7
            )
            assert alone.shape == (1, len(row) - 1)
            assert torch.allclose(batched[i, width - len(row) :], alone[0], atol=1e-5), i


def test_token_logprobs_position_ids_on_an_absolute_position_model(tokenizer):
    # Llama's rotary embeddings only see relative positions, so shifted position ids
    # cannot change its output; GPT-2's learned absolute positions can. A padded row
    # only matches the row alone if its first real token is at position 0.
    from transformers import GPT2Config, GPT2LMHeadModel

    state = torch.random.get_rng_state()
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2, n_positions=128)
    config.bos_token_id = config.eos_token_id = tokenizer.eos_token_id
    model = GPT2LMHeadModel(config).eval()
    torch.random.set_rng_state(state)
    rows = _rows(tokenizer)
    ids, mask = _left_pad(rows, tokenizer.pad_token_id)
    width = ids.shape[1]
    with torch.no_grad():
        batched = token_logprobs(model, ids, mask)
        naive = logprobs_from_logits(model(input_ids=ids, attention_mask=mask).logits[:, :-1], ids[:, 1:])
        for i, row in enumerate(rows):
            alone = token_logprobs(model, torch.tensor([row]), torch.ones(1, len(row), dtype=torch.long))[0]
            assert torch.allclose(batched[i, width - len(row) :], alone, atol=1e-5), i
            if len(row) < width:  # the default positions (0..T-1 counting the padding) are wrong
                assert (naive[i, width - len(row) :] - alone).abs().max() > 1e-3


def test_token_logprobs_attention_mask_hides_the_padding(policy):
    rows = _rows(policy.tokenizer)
    ids, mask = _left_pad(rows, policy.tokenizer.pad_token_id)
    shortest = min(range(3), key=lambda i: len(rows[i]))
    with torch.no_grad():
        masked = token_logprobs(policy.model, ids, mask)[shortest, -(len(rows[shortest]) - 1) :]
        unmasked = token_logprobs(policy.model, ids, torch.ones_like(mask))[
            shortest, -(len(rows[shortest]) - 1) :
        ]
    assert (masked - unmasked).abs().max() > 1e-3  # so the batch test above can fail


def test_token_logprobs_matches_logits_of_a_plain_forward(policy):
    row = _rows(policy.tokenizer)[2]
    ids = torch.tensor([row])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0]
        expected = torch.log_softmax(logits[:-1] / 2.0, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        got = token_logprobs(policy.model, ids, torch.ones_like(ids), temperature=2.0)[0]
    assert torch.allclose(got, expected, atol=1e-5)


def test_token_logprobs_lets_gradients_flow(policy):
    ids = torch.tensor([_rows(policy.tokenizer)[0]])
    out = token_logprobs(policy.model, ids, torch.ones_like(ids))
    assert out.requires_grad
    out.sum().backward()
    grad = policy.model.model.embed_tokens.weight.grad
    assert grad is not None and grad.abs().sum() > 0
    policy.model.zero_grad(set_to_none=True)


# ---------------------------------------------------------------- LoRA and reference


def test_reference_logprobs_ignore_perturbed_lora_weights(tokenizer):
    base = tiny_policy(seed=5)
    ids, mask = _left_pad(_rows(tokenizer), tokenizer.pad_token_id)
    real = mask[:, 1:].bool()
    with torch.no_grad():
        base_logprobs = token_logprobs(base.model, ids, mask)
    adapted = apply_lora(tiny_policy(seed=5), LoraConfig(r=4, alpha=8, dropout=0.0))
    trainable, total = trainable_parameters(adapted.model)
    lora_params = [(n, p) for n, p in adapted.model.named_parameters() if p.requires_grad]
    assert 0 < trainable < total
    assert lora_params and all("lora_" in n for n, _ in lora_params)  # only adapters train
    with torch.no_grad():
        # fresh LoRA (B = 0) is the identity
        assert torch.allclose(token_logprobs(adapted.model, ids, mask)[real], base_logprobs[real], atol=1e-5)
        generator = torch.Generator().manual_seed(0)
        for name, param in adapted.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
        on = token_logprobs(adapted.model, ids, mask)
        reference = reference_logprobs(adapted.model, ids, mask)
        on_again = token_logprobs(adapted.model, ids, mask)  # adapters are back on after the context
    assert (on[real] - base_logprobs[real]).abs().max() > 1e-2
    assert torch.allclose(reference[real], base_logprobs[real], atol=1e-5)
    assert torch.equal(on_again, on)
    assert not reference.requires_grad


def test_adapters_disabled_without_adapters_is_a_no_op(policy):
    ids = torch.tensor([_rows(policy.tokenizer)[1]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        plain = token_logprobs(policy.model, ids, mask)
        with adapters_disabled(policy.model):
            inside = token_logprobs(policy.model, ids, mask)
    assert torch.equal(plain, inside)
    assert torch.equal(reference_logprobs(policy.model, ids, mask), plain)


# ---------------------------------------------------------------- loading


def test_load_policy_tiny():
    loaded = load_policy("tiny", device="cpu")
    assert loaded.name == "tiny"
    assert loaded.device == torch.device("cpu")
    reference = tiny_policy(seed=0)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.equal(
            token_logprobs(loaded.model, ids, torch.ones_like(ids)),
            token_logprobs(reference.model, ids, torch.ones_like(ids)),
        )


@pytest.mark.parametrize("name", ["./no/such/model", "/no/such/model", "no/such/model", "nonsense"])
def test_load_policy_missing_path_is_a_one_line_error(name):
    with pytest.raises(ModelLoadError) as info:
        load_policy(name, device="cpu")
    message = str(info.value)
    assert name in message and "\n" not in message
    assert "tiny" in message  # says what would work


def test_load_policy_directory_without_config(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(ModelLoadError, match="no config.json") as info:
        load_policy(str(tmp_path), device="cpu")
    assert str(tmp_path) in str(info.value)


def test_load_policy_unknown_dtype():
    with pytest.raises(ModelLoadError, match="unknown dtype 'float64'"):
        load_policy("tiny", dtype="float64")


def test_load_policy_from_a_saved_directory(tmp_path, policy):
    policy.model.save_pretrained(tmp_path)
    policy.tokenizer.save_pretrained(tmp_path)
    loaded = load_policy(str(tmp_path), device="cpu")
    assert loaded.tokenizer.padding_side == "left"
    assert loaded.tokenizer.pad_token_id == policy.tokenizer.pad_token_id
    assert loaded.tokenizer.eos_token_id == policy.tokenizer.eos_token_id
    assert not loaded.model.training
    ids = torch.tensor([_rows(policy.tokenizer)[0]])
    with torch.no_grad():
        assert torch.equal(
            token_logprobs(loaded.model, ids, torch.ones_like(ids)),
            token_logprobs(policy.model, ids, torch.ones_like(ids)),
        )


def test_load_policy_broken_directory_is_a_model_load_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError) as info:
        load_policy(str(tmp_path), device="cpu")
    assert "\n" not in str(info.value)


def test_load_policy_invalid_config_json_is_a_model_load_error(tmp_path):
    (tmp_path / "config.json").write_text("not json")
    with pytest.raises(ModelLoadError, match="cannot load model") as info:
        load_policy(str(tmp_path), device="cpu")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("config", [
    '{"model_type": "llama", "hidden_size": "banana"}',  # a field of the wrong type
    '{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 3}',  # an architecture check
])  # fmt: skip
def test_load_policy_config_that_fails_validation_names_the_file(tmp_path, config):
    (tmp_path / "config.json").write_text(config)
    with pytest.raises(ModelLoadError, match="not a valid model config") as info:
        load_policy(str(tmp_path), device="cpu")
    assert str(tmp_path / "config.json") in str(info.value) and "\n" not in str(info.value)


def test_load_policy_tiny_honours_dtype():
    assert load_policy("tiny", dtype="bfloat16", device="cpu").model.dtype == torch.bfloat16


def test_lora_last_n_layers_adapts_only_the_top_layers():
    adapted = apply_lora(tiny_policy(seed=5), LoraConfig(r=4, alpha=8, last_n_layers=1))
    names = [name for name, p in adapted.model.named_parameters() if p.requires_grad]
    assert names and all(".layers.1." in name for name in names)
    assert len(names) == 14  # 7 linear modules x (lora_A, lora_B) in the top layer only


def test_logprobs_and_entropy_hand_example():
    # softmax([0, log 3]) = [1/4, 3/4]: log p(1) = log 0.75; H = -(0.25 log 0.25 + 0.75 log 0.75)
    logits = torch.tensor([[[0.0, math.log(3)]]])
    picked, entropy = logprobs_and_entropy(logits, torch.tensor([[1]]), with_entropy=True)
    assert torch.allclose(picked, torch.tensor([[math.log(0.75)]]), atol=1e-6)
    assert torch.allclose(entropy, torch.tensor([[-(0.25 * math.log(0.25) + 0.75 * math.log(0.75))]]), atol=1e-6)
    assert logprobs_and_entropy(logits, torch.tensor([[1]]), with_entropy=False)[1] is None


def test_logprobs_and_entropy_match_the_separate_helpers_and_ignore_a_shift():
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 5, 300, generator=generator) * 3).requires_grad_()
    targets = torch.randint(0, 300, (2, 5), generator=generator)
    picked, entropy = logprobs_and_entropy(logits, targets, with_entropy=True, entropy_grad=True)
    assert torch.allclose(picked, logprobs_from_logits(logits, targets), atol=1e-5)
    assert torch.allclose(entropy, entropy_from_logits(logits), atol=1e-5)
    (grad,) = torch.autograd.grad(entropy.sum(), logits)
    (expected,) = torch.autograd.grad(entropy_from_logits(logits).sum(), logits)
    assert torch.allclose(grad, expected, atol=1e-5)
    # softmax is shift-invariant per row: adding a constant changes neither output
    shifted = logprobs_and_entropy(logits.detach() + 7.5, targets, with_entropy=True)
    assert torch.allclose(shifted[0], picked, atol=1e-4) and torch.allclose(shifted[1], entropy, atol=1e-4)
    # without entropy_grad the entropy carries no gradient (the logprobs still do)
    picked, entropy = logprobs_and_entropy(logits, targets, with_entropy=True, entropy_grad=False)
    assert picked.requires_grad and not entropy.requires_grad


def test_a_device_the_machine_lacks_is_a_one_line_error():
    import torch

    from ponder.models.loading import resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"model.device='cuda': this machine has no CUDA GPU"):
            resolve_device("cuda")
    with pytest.raises(ValueError, match=r"model.device='gpu0': not a torch device"):
        resolve_device("gpu0")


def test_weights_swapped_sets_and_restores_even_on_error():
    from ponder.models import trainable_snapshot, weights_swapped

    layer = torch.nn.Linear(2, 1, bias=False)
    layer.bias = None
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 2.0]]))
    snapshot = trainable_snapshot(layer)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[3.0, 5.0]]))
    x = torch.tensor([[1.0, 1.0]])
    with weights_swapped(layer, snapshot):
        assert float(layer(x)) == 3.0  # 1 + 2: the snapshot's weights
    assert float(layer(x)) == 8.0  # 3 + 5: restored
    with pytest.raises(RuntimeError), weights_swapped(layer, snapshot):
        raise RuntimeError("inside")
    assert layer.weight.tolist() == [[3.0, 5.0]]
    snapshot["weight"].fill_(0.0)  # a snapshot is a copy, not a view of the parameter
    assert layer.weight.tolist() == [[3.0, 5.0]]
