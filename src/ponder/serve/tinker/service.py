"""The state of a Tinker-compatible server and the checks of every request.

Sessions, training clients (serve/tinker/training.py), sampling sessions
(serve/tinker/sampling.py) and checkpoints (serve/tinker/checkpoints.py) live here.
Each handler takes a request already parsed into the `tinker` package's own type,
checks everything it names (the session, the model id, the loss, each datum's shapes
and token ids, the checkpoint path) and either refuses it at once — ValueError (400),
LookupError (404), Stale (410), each one line — or queues the work on the worker
(serve/tinker/futures.py) and answers with the future's id, as the Tinker service does.
"""

from __future__ import annotations

import random
import re
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ponder.models.loading import Policy, load_policy
from ponder.models.memory import release_memory
from ponder.serve.tinker.checkpoints import CheckpointStore, check_name, parse
from ponder.serve.tinker.futures import Job, Result, Worker
from ponder.serve.tinker.losses import TINKER_LOSSES, TinkerLoss, loss_config
from ponder.serve.tinker.sampling import SampleCall, Samplers, Stale
from ponder.serve.tinker.training import LoraLayout, LossBatch, TrainedModel, lora_copy, read_manifest
from ponder.serve.tinker.wire import DatumArrays, ForwardBackwardCall

MAX_RANK = 256
MAX_SAMPLES = 256


@dataclass
class TinkerConfig:
    """`ponder tinker-serve`'s settings.

    model: the base model served (smollm2-135m, tiny, a local HF model directory);
        clients name it as `base_model`.
    host / port: where to listen (loopback by default). api_key: required in the
        X-API-Key header when set (the `tinker` client sends $TINKER_API_KEY there).
    state_dir: checkpoints (runs/MODEL_ID/...) and the tokenizer copy get_tokenizer loads.
    device / dtype: as ponder loads models (models/loading.py). seed: the samplers' RNG.
    max_tokens: a sample request's max_tokens when it gives none.
    max_body_bytes: larger requests get 413. token_budget: tokens per forward_backward
        micro-batch (rows × longest row). max_live_samplers: sampling copies kept in
        memory; max_kept_snapshots: snapshots a training client keeps samplable.
    poll_s: how long a retrieve_future waits for its result before answering try-again.
    """

    model: str = "smollm2-135m"
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    state_dir: str = "tinker-state"
    device: str = "auto"
    dtype: str = "float32"
    seed: int = 0
    max_tokens: int = 256
    max_body_bytes: int = 64_000_000
    token_budget: int = 2048
    max_live_samplers: int = 2
    max_kept_snapshots: int = 4
    poll_s: float = 30.0


class TinkerService:
    """One server's sessions, models, samplers and checkpoints (see module doc)."""

    def __init__(self, config: TinkerConfig, base: Policy) -> None:
        self.config = config
        self.bases = {config.model: base}
        self.state_dir = Path(config.state_dir).resolve()
        self.store = CheckpointStore(self.state_dir)
        self.worker = Worker()
        self.samplers = Samplers(self.bases, config.seed, config.max_live_samplers, config.max_kept_snapshots)
        self.sessions: dict[str, dict[str, Any]] = {}
        self.models: dict[str, TrainedModel] = {}
        self.tokenizer_dirs = {name: self._save_tokenizer(name, policy) for name, policy in self.bases.items()}
        self._lock = threading.RLock()

    @classmethod
    def load(cls, config: TinkerConfig) -> TinkerService:
        return cls(config, load_policy(config.model, dtype=config.dtype, device=config.device))

    def close(self) -> None:
        self.worker.stop()

    def _save_tokenizer(self, name: str, policy: Policy) -> str:
        """A copy of the base's tokenizer that `AutoTokenizer.from_pretrained` loads
        offline: get_info names it as the tokenizer id, so get_tokenizer() works."""
        directory = self.state_dir / "tokenizers" / re.sub(r"[^A-Za-z0-9._-]+", "_", name)
        policy.tokenizer.save_pretrained(directory)
        return str(directory)

    # -- sessions and server information ----------------------------------------------

    def client_config(self, types: Any) -> dict[str, Any]:
        """The feature flags the client reads first: API keys (no token exchange), httpx's
        own transport, forward_backward chunks one after another, no zstd, losses and
        polling the plain way."""
        return types.ClientConfigResponse(
            pjwt_auth_enabled=False, use_pyqwest_transport=False, parallel_fwdbwd_chunks=False,
            proto_compress_fwdbwd=False, custom_loss_server_side=False, sample_use_retrieve_futures=False,
            sample_join_sampling_session=False,
        ).model_dump(mode="json")  # fmt: skip

    def capabilities(self) -> dict[str, Any]:
        models = [{"model_name": name, "max_context_length": context_limit(policy), "trainable": True,
                   "sampleable": True} for name, policy in self.bases.items()]  # fmt: skip
        return {"supported_models": models}

    def create_session(self) -> dict[str, Any]:
        session_id = f"session-{uuid.uuid4().hex[:16]}"
        with self._lock:
            self.sessions[session_id] = {"finished": False}
        return {"type": "create_session", "session_id": session_id}

    def _open_session(self, session_id: str) -> None:
        session = self.sessions.get(session_id)
        if session is None:
            raise LookupError(f"unknown session {session_id!r}: the client creates one first")
        if session["finished"]:
            raise Stale(f"session {session_id} has finished")

    def heartbeat(self, session_id: str) -> dict[str, Any]:
        self._open_session(session_id)
        return {"type": "session_heartbeat"}

    def finish(self, session_id: str) -> dict[str, Any]:
        """The client closed its session: its training clients and samplers are let go
        (after the work already queued for them); its checkpoints stay on disk."""
        with self._lock:
            if session_id not in self.sessions:
                raise LookupError(f"unknown session {session_id!r}")
            self.sessions[session_id]["finished"] = True
        self.worker.submit(Job(lambda: self._release(session_id)))
        return {}

    def _release(self, session_id: str) -> Result:
        with self._lock:
            for model_id in [m for m in self.models if m.startswith(f"{session_id}:")]:
                del self.models[model_id]
        self.samplers.release(f"{session_id}:")
        release_memory()
        return Result(json={})

    def _base(self, name: str | None) -> Policy:
        if name not in self.bases:
            served = ", ".join(self.bases)
            raise LookupError(f"unknown base model {name!r}: this server serves {served} (ponder tinker-serve --model)")
        return self.bases[name]

    def model(self, model_id: str) -> TrainedModel:
        trained = self.models.get(model_id)
        if trained is None:
            raise LookupError(f"unknown model_id {model_id!r}: create it with create_lora_training_client first")
        return trained

    def submit(self, job: Job) -> dict[str, Any]:
        return {"request_id": self.worker.submit(job)}

    # -- training clients ------------------------------------------------------------

    def create_model(self, request: Any) -> dict[str, Any]:
        """CreateModelRequest: a LoRA training client on a served base model."""
        self._open_session(request.session_id)
        base = self._base(request.base_model)
        layout = self._layout(request.lora_config)
        if getattr(request.optimizer_config, "type", "adamw") != "adamw":
            raise ValueError(f"optimizer {request.optimizer_config.type!r}: this server trains with Adam (adamw) only")
        model_id = f"{request.session_id}:train:{request.model_seq_id}"
        if model_id in self.models:
            raise ValueError(f"model {model_id} already exists in this session")
        seed = request.lora_config.seed
        seed = random.SystemRandom().randrange(2**31) if seed is None else seed

        def run() -> Result:
            self._add_model(TrainedModel(model_id, request.base_model, lora_copy(base, layout, seed), layout, seed))
            return Result(json={"type": "create_model", "model_id": model_id})

        return self.submit(Job(run))

    @staticmethod
    def _layout(lora: Any) -> LoraLayout:
        if lora is None:
            raise ValueError("this server trains LoRA adapters only: give lora_config (create_lora_training_client)")
        if not 1 <= lora.rank <= MAX_RANK:
            raise ValueError(f"LoRA rank {lora.rank}: give 1 to {MAX_RANK}")
        if not (lora.train_attn or lora.train_mlp):
            raise ValueError("train_attn and train_mlp are both off: this server adapts attention and MLP layers "
                             "(the unembedding gets no adapter)")  # fmt: skip
        return LoraLayout(lora.rank, lora.train_attn, lora.train_mlp, lora.train_unembed)

    def _add_model(self, trained: TrainedModel) -> None:
        with self._lock:
            self.models[trained.model_id] = trained

    def get_info(self, model_id: str) -> dict[str, Any]:
        trained = self.model(model_id)
        config = trained.policy.model.config
        data = {"arch": getattr(config, "model_type", None), "model_name": trained.base_model,
                "tokenizer_id": self.tokenizer_dirs[trained.base_model]}  # fmt: skip
        return {"type": "get_info", "model_id": model_id, "model_data": data, "is_lora": True,
                "lora_rank": trained.layout.rank, "model_name": trained.base_model}  # fmt: skip

    def forward_backward(self, call: ForwardBackwardCall) -> dict[str, Any]:
        """A forward_backward (or forward) request, checked here, computed on the worker."""
        trained = self.model(call.model_id)
        if call.loss_fn not in TINKER_LOSSES.names():
            valid = ", ".join(TINKER_LOSSES.names())
            raise ValueError(f"unknown loss function {call.loss_fn!r}; this server has: {valid}")
        loss = TINKER_LOSSES.get(call.loss_fn)
        config = loss_config(loss, call.loss_fn, call.loss_fn_config)
        if not call.data:
            raise ValueError("forward_backward needs at least one datum")
        vocab = trained.policy.model.config.vocab_size
        data = [_loss_batch(i, d, loss, call.loss_fn, vocab, context_limit(trained.policy))
                for i, d in enumerate(call.data)]  # fmt: skip

        def run() -> Result:
            from ponder.serve.tinker.wire import encode_forward_backward_output

            outputs, total = trained.forward_backward(data, loss, config, call.forward_only, self.config.token_budget)
            return Result(proto=encode_forward_backward_output(outputs, {"loss:sum": total}))

        return self.submit(Job(run))

    def optim_step(self, request: Any, types: Any) -> dict[str, Any]:
        trained = self.model(request.model_id)
        params = request.optim_params
        if not isinstance(params, types.AdamParams):
            raise ValueError(f"optimizer {getattr(params, 'type', type(params).__name__)!r}: this server steps "
                             "with Adam only (AdamParams)")  # fmt: skip
        if not (params.learning_rate >= 0 and 0 <= params.beta1 < 1 and 0 <= params.beta2 < 1 and params.eps > 0):
            raise ValueError(f"AdamParams out of range: {params} (learning_rate >= 0, betas in [0, 1), eps > 0)")

        def run() -> Result:
            metrics = trained.optim_step(params.learning_rate, (params.beta1, params.beta2), params.eps,
                                         params.weight_decay, params.grad_clip_norm)  # fmt: skip
            return Result(json={"type": "optim_step", "metrics": metrics})

        return self.submit(Job(run))

    # -- checkpoints -----------------------------------------------------------------

    def save_weights(self, request: Any) -> dict[str, Any]:
        """save_state: the adapter and the optimizer's state under tinker://MODEL/weights/NAME."""
        trained = self.model(request.model_id)
        path = f"tinker://{trained.model_id}/weights/{check_name(request.path or f'step-{trained.steps:06d}')}"
        directory = self.store.directory(parse(path))
        if (directory / "tinker.json").is_file() and not request.overwrite:
            raise ValueError(f"{path} exists: pass overwrite=True to replace it")

        def run() -> Result:
            trained.save(directory, with_optimizer=True)
            self.samplers.replaced(path)
            return Result(json={"type": "save_weights", "path": path})

        return self.submit(Job(run))

    def save_weights_for_sampler(self, request: Any) -> dict[str, Any]:
        """Named: the adapter under tinker://MODEL/sampler_weights/NAME (saving a name
        again replaces it; samplers opened on the old weights go stale). Unnamed
        (save_weights_and_get_sampling_client): a sampling session on a snapshot."""
        trained = self.model(request.model_id)
        if request.path is None:
            if request.sampling_session_seq_id is None:
                raise ValueError("save_weights_for_sampler needs a path (a name) or a sampling_session_seq_id")
            session_id = f"{trained.model_id.split(':train:')[0]}:sample:{request.sampling_session_seq_id}"

            def snapshot() -> Result:
                self.samplers.publish_snapshot(trained, session_id)
                return Result(json={"type": "save_weights_for_sampler", "sampling_session_id": session_id})

            return self.submit(Job(snapshot))
        path = f"tinker://{trained.model_id}/sampler_weights/{check_name(request.path)}"
        directory = self.store.directory(parse(path))

        def named() -> Result:
            trained.save(directory, with_optimizer=False)
            self.samplers.publish_path(trained, path, directory)
            return Result(json={"type": "save_weights_for_sampler", "path": path})

        return self.submit(Job(named))

    def load_weights(self, request: Any) -> dict[str, Any]:
        """load_state into a training client, or a new training client from a checkpoint
        (create_training_client_from_state*: session_id and model_seq_id given)."""
        parsed, directory = self.store.existing(request.path)
        manifest = read_manifest(directory)
        if request.optimizer and not manifest.get("optimizer"):
            raise ValueError(f"{request.path} holds no optimizer state (save it with save_state)")
        layout = LoraLayout(**manifest["lora"])
        if request.model_id is not None:
            trained = self.model(request.model_id)
            if (trained.base_model, trained.layout) != (manifest["base_model"], layout):
                raise ValueError(f"{request.path} is a rank-{layout.rank} adapter of {manifest['base_model']}; "
                                 f"{trained.model_id} is rank {trained.layout.rank} on {trained.base_model}")  # fmt: skip
            create = None
        else:
            if request.session_id is None or request.model_seq_id is None:
                raise ValueError("load_weights needs model_id, or session_id and model_seq_id")
            self._open_session(request.session_id)
            if request.base_model not in (None, manifest["base_model"]):
                raise ValueError(f"{request.path} was trained on {manifest['base_model']}, not {request.base_model}")
            model_id = f"{request.session_id}:train:{request.model_seq_id}"
            create = (model_id, self._base(manifest["base_model"]))
        return self.submit(Job(lambda: self._load(request, manifest, layout, directory, create)))

    def _load(self, request: Any, manifest: dict, layout: LoraLayout, directory: Path, create: Any) -> Result:
        if create is None:
            trained = self.model(request.model_id)
        else:
            model_id, base = create
            seed = int(manifest.get("seed", 0) or 0)
            trained = TrainedModel(model_id, manifest["base_model"], lora_copy(base, layout, seed), layout, seed)
        trained.load(directory, with_optimizer=request.optimizer)
        if create is not None:
            self._add_model(trained)
        return Result(json={"type": "load_weights", "path": request.path, "model_id": trained.model_id})

    # -- sampling --------------------------------------------------------------------

    def create_sampling_session(self, request: Any) -> dict[str, Any]:
        self._open_session(request.session_id)
        session_id = f"{request.session_id}:sample:{request.sampling_session_seq_id}"
        if request.model_path is not None:
            _, directory = self.store.existing(request.model_path)
            session = self.samplers.open_path(session_id, request.model_path, directory)
            if request.base_model not in (None, session.base_model):
                raise ValueError(f"{request.model_path} was trained on {session.base_model}, not {request.base_model}")
        else:
            self._base(request.base_model)
            self.samplers.open(session_id, request.base_model, f"base:{request.base_model}")
        return {"type": "create_sampling_session", "sampling_session_id": session_id}

    def get_sampler(self, sampler_id: str) -> dict[str, Any]:
        session = self.samplers.sessions.get(sampler_id)
        if session is None:
            raise LookupError(f"unknown sampler {sampler_id!r}")
        return {"sampler_id": sampler_id, "base_model": session.base_model, "model_path": session.model_path}

    def asample(self, request: Any) -> dict[str, Any]:
        """A sample request on a sampling session, checked (see sample_call)."""
        if request.sampling_session_id is None:
            raise ValueError("send sampling_session_id: create a sampling client first (create_sampling_client)")
        session = self.samplers.session(request.sampling_session_id)
        call = self._sample_call(request, session.source, self._base(session.base_model))
        reply = self.submit(self.samplers.job(call))
        call.sequence_ids[:] = [f"{reply['request_id']}:{i}" for i in range(call.num_samples)]
        return {**reply, "sample_sequence_ids": call.sequence_ids}

    def _sample_call(self, request: Any, source: str, base: Policy) -> SampleCall:
        prompt = _prompt_tokens(request.prompt, base.model.config.vocab_size)
        params = request.sampling_params
        _refuse_unsupported(request, params)
        if not 1 <= request.num_samples <= MAX_SAMPLES:
            raise ValueError(f"num_samples {request.num_samples}: give 1 to {MAX_SAMPLES}")
        max_tokens = self.config.max_tokens if params.max_tokens is None else params.max_tokens
        limit = context_limit(base)
        if max_tokens < 1 or len(prompt) + max_tokens > limit:
            raise ValueError(f"prompt of {len(prompt)} tokens + max_tokens {max_tokens} exceeds the model's "
                             f"context of {limit} (max_tokens must be >= 1)")  # fmt: skip
        last_n = request.prompt_logprobs_last_n
        if last_n is not None and not 1 <= last_n <= len(prompt) - 1:
            raise ValueError(f"prompt_logprobs_last_n {last_n}: give 1 to len(prompt) - 1 = {len(prompt) - 1}")
        stop_strings, stop_ids = _stops(params.stop, base.model.config.vocab_size)
        return SampleCall(request.sampling_session_id, source, prompt, request.num_samples, max_tokens,
                          float(params.temperature), float(params.top_p), stop_strings, stop_ids, params.seed,
                          bool(request.prompt_logprobs), last_n, [])  # fmt: skip


def context_limit(policy: Policy) -> int:
    return int(getattr(policy.model.config, "max_position_embeddings", 0) or 1 << 20)


def _loss_batch(index: int, datum: DatumArrays, loss: TinkerLoss, loss_fn: str, vocab: int, limit: int) -> LossBatch:
    """A datum as tensors, or ValueError naming the datum and what is wrong with it."""
    n = len(datum.tokens)
    if n == 0:
        raise ValueError(f"datum {index}: model_input is empty")
    if n > limit:
        raise ValueError(f"datum {index}: {n} tokens exceed the model's context of {limit}")
    needed = {"target_tokens", *loss.required}
    missing = sorted(needed - set(datum.inputs))
    unknown = sorted(set(datum.inputs) - needed - set(loss.optional))
    if missing or unknown:
        takes = ", ".join(sorted(needed) + [f"{k} (optional)" for k in loss.optional])
        problem = f"lacks {missing}" if missing else f"has {unknown}, which {loss_fn} does not read"
        raise ValueError(f"datum {index}: loss_fn_inputs {problem} ({loss_fn} takes {takes})")
    for name, values in datum.inputs.items():
        if values.size != n:
            raise ValueError(f"datum {index}: loss_fn_inputs[{name!r}] has {values.size} values for {n} input "
                             "tokens (one per model_input position)")  # fmt: skip
        if not np.isfinite(values).all():
            raise ValueError(f"datum {index}: loss_fn_inputs[{name!r}] holds NaN or infinite values")
    tokens = np.asarray(datum.tokens, dtype=np.int64)
    targets = datum.inputs["target_tokens"]
    for name, ids in (("model_input", tokens), ("target_tokens", targets)):
        if np.any(ids != np.round(ids)) or ids.min() < 0 or ids.max() >= vocab:
            raise ValueError(f"datum {index}: {name} holds ids outside the vocabulary [0, {vocab})")
    inputs = {k: torch.tensor(datum.inputs.get(k, np.full(n, v)), dtype=torch.float32)
              for k, v in {**{k: 0.0 for k in loss.required}, **loss.optional}.items()}  # fmt: skip
    return LossBatch(torch.from_numpy(tokens), torch.from_numpy(targets.astype(np.int64)), inputs)


def _prompt_tokens(prompt: Any, vocab: int) -> list[int]:
    tokens: list[int] = []
    for chunk in prompt.chunks:
        if getattr(chunk, "type", None) != "encoded_text":
            kind = getattr(chunk, "type", "?")
            raise ValueError(f"the prompt has a {kind} chunk; this server samples from text tokens")
        tokens.extend(int(t) for t in chunk.tokens)
    if not tokens:
        raise ValueError("the prompt is empty")
    if min(tokens) < 0 or max(tokens) >= vocab:
        raise ValueError(f"the prompt holds token ids outside the vocabulary [0, {vocab})")
    return tokens


def _refuse_unsupported(request: Any, params: Any) -> None:
    asked = [name for name, on in (
        ("topk_prompt_logprobs", request.topk_prompt_logprobs > 0),
        ("topk_sample_logprobs", request.topk_sample_logprobs > 0),
        ("target_prompt_logprobs", request.target_prompt_logprobs is not None),
        ("prompt_alt_tokens_k", request.prompt_alt_tokens_k > 0),
        ("top_k", params.top_k not in (-1, 0)),
    ) if on]  # fmt: skip
    if asked:
        raise ValueError(f"{', '.join(asked)}: not supported by this server")
    if params.temperature < 0 or not 0 < params.top_p <= 1:
        raise ValueError(f"temperature {params.temperature} / top_p {params.top_p}: give temperature >= 0, "
                         "0 < top_p <= 1")  # fmt: skip


def _stops(stop: Any, vocab: int) -> tuple[tuple[str, ...], tuple[int, ...] | None]:
    """(stop strings, stop token ids) from SamplingParams.stop: None = the model's
    end-of-turn tokens; [] = none at all (generate to max_tokens); strings stop after
    the text appears (end-of-turn still stops); token ids replace end-of-turn."""
    if stop is None:
        return (), None
    if isinstance(stop, str):
        return (stop,), None
    items = list(stop)
    if not items:
        return (), ()
    if all(isinstance(s, str) for s in items):
        return tuple(items), None
    if all(isinstance(s, int) and 0 <= s < vocab for s in items):
        return (), tuple(items)
    raise ValueError(f"stop {items!r}: give strings, or token ids in [0, {vocab})")
