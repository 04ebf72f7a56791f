"""`ponder tinker-serve` on 127.0.0.1 with the tiny model, driven by the real `tinker`
client: copies of the cookbook's SFT and RL loops (tinker_cookbook 0.6.1's
recipes/sl_loop.py and recipes/rl_loop.py, their data and renderer replaced by the
tiny tokenizer's chat template), each number checked against ponder's own functions
at the same weights, the checkpoint and sampler paths, and every refusal."""

from __future__ import annotations

import importlib
import json
import re
import time
from pathlib import Path

import httpx
import pytest
import torch

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402
from tinker.types.tensor_data import TensorData  # noqa: E402

from ponder.algos import LossConfig, demonstration_nll, policy_loss  # noqa: E402
from ponder.cli import main  # noqa: E402
from ponder.models.logprobs import token_logprobs, trainable_snapshot, weights_swapped  # noqa: E402
from ponder.serve.tinker import TinkerConfig, TinkerService  # noqa: E402
from ponder.serve.tinker.checkpoints import parse  # noqa: E402
from ponder.serve.tinker.server import build_tinker_server  # noqa: E402
from ponder.serve.tinker.training import LoraLayout, lora_copy  # noqa: E402

from ..uvicorn_thread import loopback_socket, serving  # noqa: E402

API_KEY = "tml-ponder-test"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tinker"
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "The answer is 5."}],
    [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}],
    [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi there!"}],
    [{"role": "user", "content": "What is 4 * 2?"}, {"role": "assistant", "content": "It is 8."}],
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    patch = pytest.MonkeyPatch()
    patch.setenv("TINKER_TELEMETRY", "0")  # the client's diagnostics would only add traffic here
    config = TinkerConfig(model="tiny", device="cpu", state_dir=str(tmp_path_factory.mktemp("tinker")),
                          api_key=API_KEY, max_kept_snapshots=2, poll_s=5.0, token_budget=64)  # fmt: skip
    service = TinkerService.load(config)
    uvicorn_server = build_tinker_server(service, "warning")
    with serving(uvicorn_server, loopback_socket()) as port:
        service.url = f"http://127.0.0.1:{port}"
        yield service
    service.close()
    patch.undo()


@pytest.fixture(scope="module")
def client(server):
    service_client = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    yield service_client
    service_client.close("success").result()


def conversation_to_datum(messages: list[dict], tokenizer) -> types.Datum:
    """The cookbook's conversation_to_datum (supervised/data.py) with the chat template
    as renderer: weight 1 on the assistant's reply and its end-of-turn token, inputs
    and targets shifted by one, weights normalised to sum to 1 (reduction "mean")."""
    prompt = tokenizer.encode(tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True),
                              add_special_tokens=False)  # fmt: skip
    reply = tokenizer.encode(messages[-1]["content"], add_special_tokens=False) + [tokenizer.eos_token_id]
    tokens, weights = prompt + reply, [0.0] * len(prompt) + [1.0] * len(reply)
    weights = torch.tensor(weights[1:]) / sum(weights[1:])
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"weights": TensorData.from_torch(weights),
                                       "target_tokens": TensorData(data=tokens[1:], dtype="int64",
                                                                   shape=[len(tokens) - 1])})  # fmt: skip


def compute_mean_nll(logprobs_list, weights_list) -> float:
    """The cookbook's supervised/common.py compute_mean_nll."""
    total = sum(float(lp.to_torch().dot(w.to_torch())) for lp, w in zip(logprobs_list, weights_list))
    return -total / sum(float(w.to_torch().sum()) for w in weights_list)


def ponder_sft_loss(model, batch: list[types.Datum]) -> torch.Tensor:
    """The same loss by ponder's own SFT pieces: token_logprobs over each full sequence
    and demonstration_nll (token mean over the reply), summed over the examples."""
    total = torch.zeros(())
    for datum in batch:
        ids = torch.tensor([datum.model_input.to_ints() + datum.loss_fn_inputs["target_tokens"].tolist()[-1:]])
        logprobs = token_logprobs(model, ids, torch.ones_like(ids))
        mask = (datum.loss_fn_inputs["weights"].to_torch() > 0).long().unsqueeze(0)
        total = total + demonstration_nll(logprobs, mask, float(mask.sum()))
    return total


def test_sft_loop_lowers_the_loss_with_ponders_numbers(server, client):
    """recipes/sl_loop.py: linear LR decay, AdamParams(beta2=0.95, eps=1e-8),
    forward_backward(cross_entropy) then optim_step each batch, train_mean_nll logged."""
    training_client = client.create_lora_training_client(base_model="tiny", rank=8, seed=3)
    training_client = training_client.result()
    info = training_client.get_info()
    assert (info.model_data.model_name, info.lora_rank, info.is_lora) == ("tiny", 8, True)
    tokenizer = training_client.get_tokenizer()  # the copy get_info names, loaded offline
    assert tokenizer.encode("What is 2 + 3?") == server.bases["tiny"].tokenizer.encode("What is 2 + 3?")
    batch = [conversation_to_datum(messages, tokenizer) for messages in CONVERSATIONS]
    model = server.models[training_client.model_id].policy.model
    first = training_client.forward(batch, loss_fn="cross_entropy").result()
    with torch.no_grad():
        expected = ponder_sft_loss(model, batch)
    assert first.metrics["loss:sum"] == pytest.approx(float(expected), rel=1e-5)
    n_steps, learning_rate, nlls = 6, 5e-3, []
    for step in range(n_steps):
        adam_params = tinker.AdamParams(learning_rate=learning_rate * max(0.0, 1.0 - step / n_steps),
                                        beta1=0.9, beta2=0.95, eps=1e-8)  # fmt: skip
        fwd_bwd_future = training_client.forward_backward(batch, loss_fn="cross_entropy")
        optim_step_future = training_client.optim_step(adam_params)
        fwd_bwd_result = fwd_bwd_future.result()
        optim_result = optim_step_future.result()
        assert optim_result.metrics["learning_rate"] == pytest.approx(adam_params.learning_rate)
        train_logprobs = [x["logprobs"] for x in fwd_bwd_result.loss_fn_outputs]
        train_weights = [d.loss_fn_inputs["weights"] for d in batch]
        nlls.append(compute_mean_nll(train_logprobs, train_weights))
        assert [len(lp.tolist()) for lp in train_logprobs] == [d.model_input.length for d in batch]
    assert nlls[-1] < nlls[0] - 0.3, nlls
    assert all(later < earlier for earlier, later in zip(nlls, nlls[1:])), nlls
    with torch.no_grad():  # the weights after the last step, scored both ways
        after = ponder_sft_loss(model, batch)
    assert training_client.forward(batch, "cross_entropy").result().metrics["loss:sum"] == pytest.approx(
        float(after), rel=1e-5)


def test_one_optim_step_is_a_torch_adamw_step(server, client):
    training_client = client.create_lora_training_client(base_model="tiny", rank=4, seed=11).result()
    served = server.models[training_client.model_id].policy.model
    local = lora_copy(server.bases["tiny"], LoraLayout(rank=4), seed=11).model  # the same seed: the same start
    for (name, theirs), mine in zip(trainable_snapshot(served).items(), trainable_snapshot(local).values()):
        torch.testing.assert_close(theirs, mine, rtol=0, atol=0, msg=name)
    batch = [conversation_to_datum(messages, training_client.get_tokenizer()) for messages in CONVERSATIONS]
    params = tinker.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    training_client.forward_backward(batch, "cross_entropy").result()
    training_client.optim_step(params).result()
    trainable = [p for p in local.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ponder_sft_loss(local, batch).backward()
    optimizer.step()
    moved = 0
    for (name, theirs), mine in zip(trainable_snapshot(served).items(), trainable_snapshot(local).values()):
        torch.testing.assert_close(theirs, mine, rtol=0, atol=1e-6, msg=name)
        moved += int((mine != 0).any())
    assert moved == len(trainable)


def lower_half_reward(tokens: list[int]) -> float:
    """The RL test's reward: the share of sampled tokens in the lower half of the
    vocabulary (the tiny model's text is noise, so the reward is read from its tokens)."""
    return sum(1 for t in tokens if t < 256) / max(len(tokens), 1)


def test_rl_loop_samples_rewards_and_steps_with_ponders_numbers(server, client):
    """recipes/rl_loop.py: each batch a sampler on the current weights, group_size samples
    per prompt, advantages centred per group (all-zero groups skipped), datums padded
    with ob_len zeros, forward_backward(importance_sampling), optim_step. The tiny
    model can hardly move its near-uniform output (its reward stays near 0.5), so each
    step is checked on its own objective: the surrogate loss on the batch it trained on
    falls. Reward going up is the embedded model's demo (docs/guide/tinker.md)."""
    training_client = client.create_lora_training_client(base_model="tiny", rank=8, seed=5).result()
    tokenizer = training_client.get_tokenizer()
    model = server.models[training_client.model_id].policy.model
    prompts = [types.ModelInput.from_ints(tokenizer.encode(tokenizer.apply_chat_template(
        [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True), add_special_tokens=False))
        for q in ("Count to three.", "Pick a number.", "Say a word.")]  # fmt: skip
    sampling_params = types.SamplingParams(max_tokens=8, stop=[tokenizer.eos_token_id])
    adam_params = types.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-8)
    for batch_idx in range(4):
        weights_now = trainable_snapshot(model)
        sampling_client = training_client.save_weights_and_get_sampling_client().result()
        futures = [sampling_client.sample(prompt=p, num_samples=6, sampling_params=sampling_params) for p in prompts]
        datums, batch_rewards, sampled = [], [], []
        for future, prompt in zip(futures, prompts):
            sample_result = future.result()
            tokens_G = [list(s.tokens) for s in sample_result.sequences]
            logprobs_G = [list(s.logprobs) for s in sample_result.sequences]
            assert len({s.sequence_id for s in sample_result.sequences}) == 6
            rewards_G = [lower_half_reward(t) for t in tokens_G]
            mean_reward = sum(rewards_G) / len(rewards_G)
            batch_rewards.append(mean_reward)
            advantages_G = [r - mean_reward for r in rewards_G]
            if all(a == 0.0 for a in advantages_G):
                continue
            for sampled_tokens, logprobs, advantage in zip(tokens_G, logprobs_G, advantages_G):
                ob_len = prompt.length - 1
                model_input = prompt.append(types.EncodedTextChunk(tokens=sampled_tokens[:-1]))
                loss_fn_inputs = {
                    "target_tokens": TensorData.from_torch(torch.tensor([0] * ob_len + sampled_tokens)),
                    "logprobs": TensorData.from_torch(torch.tensor([0.0] * ob_len + logprobs)),
                    "advantages": TensorData.from_torch(torch.tensor([0.0] * ob_len + [advantage] * (
                        model_input.length - ob_len))),
                }  # fmt: skip
                datums.append(types.Datum(model_input=model_input, loss_fn_inputs=loss_fn_inputs))
                sampled.append((prompt.to_ints(), sampled_tokens, logprobs, advantage))
        assert 0.0 < sum(batch_rewards) / len(batch_rewards) < 1.0
        fwd_bwd_future = training_client.forward_backward(datums, loss_fn="importance_sampling")
        optim_step_future = training_client.optim_step(adam_params)
        fwd_bwd_result, _ = fwd_bwd_future.result(), optim_step_future.result()
        expected, trainer_logprobs = ponder_is_loss(model, weights_now, sampled)
        assert fwd_bwd_result.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4, abs=1e-5)
        for output, (prompt_ids, tokens, logprobs, _), mine in zip(fwd_bwd_result.loss_fn_outputs, sampled,
                                                                   trainer_logprobs):  # fmt: skip
            served = torch.tensor(output["logprobs"].tolist()[len(prompt_ids) - 1 :])
            torch.testing.assert_close(served, mine, rtol=0, atol=1e-5)
            # the sampler's log-probs are the trainer's at the sampled weights: the ratio starts at 1
            torch.testing.assert_close(torch.tensor(logprobs), mine, rtol=0, atol=1e-4)
        after = training_client.forward(datums, loss_fn="importance_sampling").result().metrics["loss:sum"]
        assert after < fwd_bwd_result.metrics["loss:sum"] - 1e-3, (batch_idx, after)


def ponder_is_loss(model, weights, sampled) -> tuple[float, list[torch.Tensor]]:
    """Σ over sampled tokens of ponder's importance_sampling loss at `weights` (prompt
    positions carry advantage 0 and add nothing), and each sample's token log-probs."""
    total, per_sample = 0.0, []
    with weights_swapped(model, weights), torch.no_grad():
        for prompt_ids, tokens, logprobs, advantage in sampled:
            ids = torch.tensor([prompt_ids + tokens])
            mine = token_logprobs(model, ids, torch.ones_like(ids))[:, len(prompt_ids) - 1 :]
            adv = torch.full_like(mine, advantage)
            loss, _ = policy_loss("importance_sampling", mine, torch.tensor([logprobs]), adv, torch.ones_like(adv))
            total += float(loss.sum())
            per_sample.append(mine[0])
    return total, per_sample


def test_ppo_and_a_client_side_custom_loss_match_ponder(server, client):
    training_client = client.create_lora_training_client(base_model="tiny", rank=4, seed=2).result()
    model = server.models[training_client.model_id].policy.model
    ids = training_client.get_tokenizer().encode("The answer is 42, because six times seven.")
    with torch.no_grad():
        trainer = token_logprobs(model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))
    gen = torch.Generator().manual_seed(0)
    sampler = trainer + 0.5 * torch.randn(trainer.shape, generator=gen)  # ratios well outside the clip
    advantages = torch.randn(trainer.shape, generator=gen)
    datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs={
        "target_tokens": ids[1:], "logprobs": sampler[0], "advantages": advantages[0]})  # fmt: skip
    config = {"clip_low_threshold": 0.7, "clip_high_threshold": 1.3}
    out = training_client.forward([datum], "ppo", loss_fn_config=config).result()
    training_client.forward_backward([datum], "importance_sampling").result()
    trainable = [p for p in model.parameters() if p.requires_grad]
    served_grads = [p.grad.clone() for p in trainable]
    server.models[training_client.model_id].optimizer.zero_grad(set_to_none=True)
    ids_t = torch.tensor([ids])
    mine = token_logprobs(model, ids_t, torch.ones_like(ids_t))
    is_loss, _ = policy_loss("importance_sampling", mine, sampler, advantages, torch.ones_like(advantages))
    for served, expected_grad in zip(served_grads, torch.autograd.grad(is_loss.sum(), trainable)):
        torch.testing.assert_close(served, expected_grad, rtol=1e-3, atol=1e-5)
    expected, _ = policy_loss("ppo", trainer, sampler, advantages, torch.ones_like(advantages),
                              LossConfig(clip_low=0.3, clip_high=0.3))  # fmt: skip
    assert out.metrics["loss:sum"] == pytest.approx(float(expected.sum()), rel=1e-5)
    weights = torch.linspace(0.0, 1.0, len(ids) - 1)
    weighted = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                           loss_fn_inputs={"target_tokens": ids[1:], "weights": weights})  # fmt: skip

    def neg_weighted_ll(data, logprobs_list):
        loss = sum(-(lp * d.loss_fn_inputs["weights"].to_torch()).sum() for d, lp in zip(data, logprobs_list))
        return loss, {"custom:sum": float(loss.detach())}

    custom = training_client.forward_backward_custom([weighted], neg_weighted_ll).result()
    assert custom.metrics["loss:sum"] == pytest.approx(float(-(trainer[0] * weights).sum()), rel=1e-5)
    server.models[training_client.model_id].optimizer.zero_grad(set_to_none=True)


def test_save_state_and_resume_with_the_optimizer(server, client):
    training_client = client.create_lora_training_client(base_model="tiny", rank=4, seed=7).result()
    batch = [conversation_to_datum(m, training_client.get_tokenizer()) for m in CONVERSATIONS[:2]]
    params = types.AdamParams(learning_rate=1e-2)
    training_client.forward_backward(batch, "cross_entropy").result()
    training_client.optim_step(params).result()
    path = training_client.save_state("resume-me").result().path
    assert path == f"tinker://{training_client.model_id}/weights/resume-me"
    directory = server.store.directory(parse(path))
    assert {"adapter_config.json", "adapter_model.safetensors", "ponder.json", "tinker.json",
            "optimizer.pt"} <= {p.name for p in directory.iterdir()}  # fmt: skip
    resumed = client.create_training_client_from_state_with_optimizer(path).result()
    assert resumed.get_info().lora_rank == 4
    for one in (training_client, resumed):
        one.forward_backward(batch, "cross_entropy").result()
        one.optim_step(params).result()
    original = trainable_snapshot(server.models[training_client.model_id].policy.model)
    again = trainable_snapshot(server.models[resumed.model_id].policy.model)
    for a, b in zip(original.values(), again.values()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
    with pytest.raises(tinker.BadRequestError, match="exists: pass overwrite=True"):
        training_client.save_state("resume-me").result()
    training_client.load_state(path).result()  # back to the saved weights, the optimizer reset
    reloaded = trainable_snapshot(server.models[training_client.model_id].policy.model)
    assert any(not torch.equal(a, b) for a, b in zip(reloaded.values(), original.values()))
    assert not server.models[training_client.model_id].optimizer.state
    weights_only = client.create_training_client_from_state(path).result()
    loaded = trainable_snapshot(server.models[weights_only.model_id].policy.model)
    assert server.models[weights_only.model_id].steps == 1 and not server.models[weights_only.model_id].optimizer.state
    assert any(not torch.equal(a, b) for a, b in zip(loaded.values(), original.values()))  # saved one step earlier
    for a, b in zip(loaded.values(), reloaded.values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_samplers_from_paths_go_stale_when_replaced(server, client):
    training_client = client.create_lora_training_client(base_model="tiny", rank=4, seed=9).result()
    prompt = types.ModelInput.from_ints(training_client.get_tokenizer().encode("Once upon a time"))
    greedy = types.SamplingParams(max_tokens=6, temperature=0.0, stop=[])
    path = training_client.save_weights_for_sampler("policy").result().path
    assert path == f"tinker://{training_client.model_id}/sampler_weights/policy"
    first = client.create_sampling_client(model_path=path).result()
    out = first.sample(prompt, 2, greedy).result()
    assert [s.stop_reason for s in out.sequences] == ["length", "length"]
    assert out.sequences[0].tokens == out.sequences[1].tokens  # greedy
    model = server.models[training_client.model_id].policy.model
    scored = first.compute_logprobs(prompt).result()
    ids = torch.tensor([prompt.to_ints()])
    with torch.no_grad():
        expected = token_logprobs(model, ids, torch.ones_like(ids))[0]
    assert scored[0] is None
    torch.testing.assert_close(torch.tensor(scored[1:]), expected, rtol=0, atol=1e-4)
    tail = first.compute_logprobs(prompt, prompt_logprobs_last_n=2).result()
    assert tail[:-2] == [None] * (len(tail) - 2) and tail[-2:] == pytest.approx(scored[-2:], abs=1e-6)
    text = training_client.get_tokenizer().decode(out.sequences[0].tokens)
    cut = first.sample(prompt, 1, types.SamplingParams(max_tokens=6, temperature=0.0, stop=[text[:2]])).result()
    assert cut.sequences[0].stop_reason == "stop" and len(cut.sequences[0].tokens) < 6  # a stop string
    training_client.save_weights_for_sampler("policy").result()  # the path now names new weights
    with pytest.raises(tinker.APIStatusError, match="410.*stale sampler.*was saved again") as caught:
        first.sample(prompt, 1, greedy).result()
    assert caught.value.status_code == 410
    assert client.create_sampling_client(model_path=path).result().sample(prompt, 1, greedy).result().sequences
    with pytest.raises(tinker.NotFoundError, match="no checkpoint at"):
        client.create_sampling_client(model_path=f"tinker://{training_client.model_id}/sampler_weights/nope").result()
    base = client.create_sampling_client(base_model="tiny").result()
    assert len(base.sample(prompt, 3, types.SamplingParams(max_tokens=4, seed=1)).result().sequences) == 3
    snapshots = [training_client.save_weights_and_get_sampling_client().result() for _ in range(3)]
    with pytest.raises(tinker.APIStatusError, match="410.*stale sampler.*keeps the last 2"):
        snapshots[0].sample(prompt, 1, greedy).result()  # this server keeps 2 snapshots per model
    assert snapshots[2].sample(prompt, 1, greedy).result().sequences[0].tokens


def raw(server, route: str, body: dict | bytes, key: str = API_KEY) -> httpx.Response:
    headers = {"X-API-Key": key}
    if isinstance(body, bytes):
        headers["Content-Type"] = "application/x-protobuf"
        return httpx.post(f"{server.url}{route}", content=body, headers=headers)
    return httpx.post(f"{server.url}{route}", json=body, headers=headers)


def test_bad_requests_get_a_4xx_and_a_one_line_reason(server, client):
    training_client = client.create_lora_training_client(base_model="tiny", rank=4).result()
    ids = training_client.get_tokenizer().encode("a short datum")
    datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})  # fmt: skip
    cases = [
        ("dro", [datum], "unknown loss function 'dro'; this server has: cross_entropy, importance_sampling, ppo"),
        ("cross_entropy", [types.Datum(model_input=datum.model_input, loss_fn_inputs={
            "target_tokens": ids[1:], "weights": [1.0, 1.0]})], "datum 0: loss_fn_inputs['weights'] has 2 values"),
        ("cross_entropy", [types.Datum(model_input=datum.model_input, loss_fn_inputs={"weights": [1.0] * (
            len(ids) - 1)})], "datum 0: loss_fn_inputs lacks ['target_tokens']"),
        ("importance_sampling", [datum], "lacks ['advantages', 'logprobs']"),
        ("cross_entropy", [types.Datum(model_input=types.ModelInput.from_ints([10**6] * 3), loss_fn_inputs={
            "target_tokens": [1, 2, 3]})], "model_input holds ids outside the vocabulary [0, "),
    ]  # fmt: skip
    for loss_fn, data, reason in cases:
        with pytest.raises(tinker.BadRequestError, match=re.escape(reason)) as caught:
            training_client.forward_backward(data, loss_fn).result()
        assert caught.value.status_code == 400 and "\n" not in caught.value.body["detail"]
    with pytest.raises(tinker.NotFoundError, match="unknown base model 'Qwen/Qwen3-8B': this server serves tiny"):
        client.create_lora_training_client(base_model="Qwen/Qwen3-8B").result()
    sampler = client.create_sampling_client(base_model="tiny").result()
    with pytest.raises(tinker.BadRequestError, match="top_k: not supported"):
        sampler.sample(types.ModelInput.from_ints(ids), 1, types.SamplingParams(max_tokens=2, top_k=5)).result()
    refused = [
        ("/api/v1/optim_step", {"model_id": "nope", "adam_params": {"learning_rate": 0.1}}, 404,
         "unknown model_id 'nope': create it with create_lora_training_client first"),
        ("/api/v1/get_info", {"model_id": "nope"}, 404, "unknown model_id 'nope'"),
        ("/api/v1/forward_backward", b"\xff\x00not protobuf", 400, "is not a ForwardBackwardRequest protobuf"),
        ("/api/v1/asample", {"sampling_session_id": "nope", "prompt": {"chunks": []},
                             "sampling_params": {}}, 404, "unknown sampling session 'nope'"),  # fmt: skip
        ("/api/v1/retrieve_future", {"request_id": "nope"}, 404, "unknown request_id 'nope'"),
        ("/api/v1/create_model", {"session_id": "nope", "model_seq_id": 0, "base_model": "tiny"}, 404,
         "unknown session 'nope'"),
        ("/api/v1/optim_step", {"model_id": training_client.model_id, "adam_params": {"learning_rate": -1.0}}, 400,
         "AdamParams out of range"),
        ("/api/v1/load_weights", {"model_id": training_client.model_id, "path": "s3://bucket/x", "optimizer": False},
         400, "is not a tinker path"),
        ("/api/v1/save_weights", {"model_id": training_client.model_id, "path": "../escape"}, 400,
         "checkpoint name '../escape'"),
        ("/api/v1/get_info", {"model_id": training_client.model_id, "extra": 1}, 400, "GetInfoRequest: extra"),
        ("/api/v1/no_such_route", {}, 404, "POST /api/v1/no_such_route: not a route of this server"),
    ]  # fmt: skip
    for route, body, status, reason in refused:
        reply = raw(server, route, body)
        assert reply.status_code == status, (route, reply.text)
        assert reason in reply.json()["detail"] and "\n" not in reply.json()["detail"], (route, reply.text)
    assert raw(server, "/api/v1/get_info", {"model_id": "nope"}, key="tml-wrong").status_code == 401
    with pytest.raises(tinker.AuthenticationError, match="missing or wrong API key"):
        tinker.ServiceClient(base_url=server.url, api_key="tml-wrong").create_lora_training_client(base_model="tiny")
    session = raw(server, "/api/v1/create_session", {"tags": [], "user_metadata": None, "sdk_version": "0.38.0"})
    session_id = session.json()["session_id"]
    assert raw(server, f"/api/v1/sessions/{session_id}/finish", {"reason": {"type": "success"}}).status_code == 200
    beat = raw(server, "/api/v1/session_heartbeat", {"session_id": session_id})
    assert beat.status_code == 410 and f"session {session_id} has finished" in beat.json()["detail"]


def test_the_protobuf_output_carries_one_logprob_per_input_token(server, client):
    """The wire format directly: a forward's ForwardBackwardOutput as the client decodes it."""
    from tinker.proto.response_conv import deserialize_forward_backward_output

    from ponder.serve.tinker.wire import encode_forward_backward_output

    decoded = deserialize_forward_backward_output(encode_forward_backward_output(
        [torch.tensor([-1.0, -2.0]).numpy(), torch.tensor([-0.5]).numpy()], {"loss:sum": 3.5}))  # fmt: skip
    assert [o["logprobs"].tolist() for o in decoded.loss_fn_outputs] == [[-1.0, -2.0], [-0.5]]
    assert decoded.metrics == {"loss:sum": 3.5}


def test_the_command_refuses_a_model_it_cannot_load_in_one_line(capsys, tmp_path):
    code = main(["tinker-serve", "--model", "no-such-model", "--state-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "model 'no-such-model' not found" in err and len(err.splitlines()) == 1


def test_the_example_loops_run_against_the_server(server, tmp_path, monkeypatch):
    """examples/tinker/sl_loop.py, then rl_loop.py from its final state, at toy sizes."""
    monkeypatch.setenv("TINKER_API_KEY", API_KEY)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    sl_loop, rl_loop = importlib.import_module("sl_loop"), importlib.import_module("rl_loop")
    parts = importlib.import_module("cookbook_parts")
    config = parts.parse_config(sl_loop.Config, [f"base_url={server.url}", "model_name=tiny", "batch_size=4",
                                                 "max_steps=3", "save_every=2", "learning_rate=5e-3", "lora_rank=8",
                                                 f"log_path={tmp_path / 'sl'}", "n_examples=16"])  # fmt: skip
    sl_loop.main(config)
    rows = [json.loads(line) for line in (tmp_path / "sl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[-1]["train_mean_nll"] < rows[0]["train_mean_nll"]
    checkpoints = [json.loads(line) for line in (tmp_path / "sl" / "checkpoints.jsonl").read_text().splitlines()]
    assert [c["name"] for c in checkpoints] == ["000002", "final"] and checkpoints[-1]["sampler_path"]
    rl_config = rl_loop.Config(base_url=server.url, model_name="tiny", batch_size=2, group_size=3, max_tokens=8,
                               max_steps=2, log_path=str(tmp_path / "rl"), n_questions=8,
                               load_checkpoint_path=checkpoints[-1]["state_path"])  # fmt: skip
    rl_loop.main(rl_config)
    rows = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and all(0.0 <= r["reward/total"] <= 1.0 for r in rows)
    assert rl_loop.get_reward("so \\boxed{12}", "#### 12") == 1.0 and rl_loop.get_reward("12", "#### 12") == 0.0


def test_closing_a_session_lets_its_models_and_samplers_go(server):
    own = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    training_client = own.create_lora_training_client(base_model="tiny", rank=4).result()
    sampler = training_client.save_weights_and_get_sampling_client().result()
    path = training_client.save_weights_for_sampler("kept").result().path
    session_id = sampler._sampling_session_id
    own.close("success").result()
    deadline = time.monotonic() + 10  # the release runs on the worker, after the session's queued work
    while training_client.model_id in server.models and time.monotonic() < deadline:
        time.sleep(0.05)
    assert training_client.model_id not in server.models
    reply = raw(server, "/api/v1/asample", {"sampling_session_id": session_id, "prompt": {"chunks": [
        {"type": "encoded_text", "tokens": [1, 2]}]}, "sampling_params": {"max_tokens": 2}})  # fmt: skip
    assert reply.status_code == 410 and "its client session has finished" in reply.json()["detail"]
    assert server.store.existing(path)[1].is_dir()  # checkpoints stay on disk


def test_an_evicted_sampler_is_rebuilt_with_the_same_weights(server, client):
    """Two sampling copies stay in memory (max_live_samplers); older ones come back from
    the snapshot kept in memory or the sampler weights on disk, sampling the same."""
    training_client = client.create_lora_training_client(base_model="tiny", rank=4, seed=4).result()
    batch = [conversation_to_datum(m, training_client.get_tokenizer()) for m in CONVERSATIONS]
    prompt = types.ModelInput.from_ints(training_client.get_tokenizer().encode("Tell me"))
    greedy = types.SamplingParams(max_tokens=5, temperature=0.0, stop=[])
    samplers, first_outputs = [], []
    for step in range(2):
        training_client.forward_backward(batch, "cross_entropy").result()
        training_client.optim_step(types.AdamParams(learning_rate=5e-2)).result()
        named = client.create_sampling_client(
            model_path=training_client.save_weights_for_sampler(f"evict-{step}").result().path).result()
        snapshot = training_client.save_weights_and_get_sampling_client().result()
        samplers += [named, snapshot]
        first_outputs += [s.sample(prompt, 1, greedy).result().sequences[0] for s in (named, snapshot)]
    assert first_outputs[0].logprobs != first_outputs[2].logprobs  # the steps moved the weights
    for sampler, before in zip(samplers, first_outputs):  # the first two were evicted by the last two
        again = sampler.sample(prompt, 1, greedy).result().sequences[0]
        assert again.tokens == before.tokens
        assert again.logprobs == pytest.approx(before.logprobs, abs=1e-5)
    assert ("tiny", LoraLayout(rank=4)) in server.samplers._scaffolds  # rebuilt, not kept: the copy they load into
