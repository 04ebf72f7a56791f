"""A recipe's estimate: its numbers (SFT steps and batch, tasks per step, group
size, token caps, micro-batches, LoRA, dtype, backend) put through the formulas for
one device type and count. Pure: the model's shape and the device come in.

Stages follow `ponder demo` / `ponder train`: an SFT warm-up (sft.steps), RL steps
(rollout → no-grad passes → update; train.eval_every evaluations among them), and
the held-out evaluations before and after each training stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ponder.config import Recipe
from ponder.estimate import formulas as f
from ponder.estimate.devices import Device

LEAN_DECODER_TYPES = ("llama", "qwen2")  # rollout/llama_decode.py holds a fused copy of these
CPU_RUNTIME_BYTES = 600_000_000  # Python, torch, transformers and tokenizers resident before any model
GPU_RUNTIME_BYTES = 500_000_000  # the CUDA context and kernels, outside torch's allocator
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Tokens:
    """Tokens of one episode: episode (prompt + response: a training row) and decode
    (those the policy generates; the loss's positions), and where they come from."""

    episode: int
    decode: int
    source: str = "the recipe's caps (rollout.sampling.max_total_tokens; env.max_turns x max_new_tokens_per_turn)"


@dataclass
class Line:
    """One row of the estimate: key (JSON), label (table), value (bytes or seconds), detail."""

    key: str
    label: str
    value: float
    detail: str = ""


@dataclass
class Estimate:
    """Everything `ponder estimate` prints."""

    model: dict[str, Any]
    device: Device
    devices: int
    tokens: Tokens
    memory: list[Line] = field(default_factory=list)
    peaks: list[Line] = field(default_factory=list)
    times: list[Line] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)

    def value(self, key: str) -> float:
        return next(line.value for line in [*self.memory, *self.peaks, *self.times] if line.key == key)


@dataclass(frozen=True)
class Precision:
    """Bytes per value: weights (and activations, KV cache), the sampling copy's
    matrices, and whether training keeps a bf16 copy of the frozen base."""

    weights: int
    sampling: int
    base_copy: bool


def recipe_tokens(recipe: Recipe) -> Tokens:
    sampling = recipe.rollout.sampling
    decode = min(recipe.env.max_turns * sampling.max_new_tokens_per_turn, sampling.max_total_tokens)
    return Tokens(sampling.max_total_tokens, decode)


def precision(recipe: Recipe, device: Device) -> Precision:
    """model.dtype, rollout.sampling.dtype and lora.base_matmul_dtype on `device`
    (`auto`: bf16 on a bf16 GPU; on a CPU bf16 matrices only with bf16 instructions)."""
    name = recipe.model.dtype
    if name == "auto":
        weights = 2 if (not device.is_cpu and device.bf16) else 4
    else:
        weights = BYTES.get(name, 4)
    narrow_cpu = device.is_cpu and device.bf16 and weights == 4  # a float32 model on a bf16 CPU

    def matrices(setting: str) -> int:
        if setting in BYTES:
            return BYTES[setting]
        return 2 if setting == "auto" and narrow_cpu else weights

    sampling = matrices(recipe.rollout.sampling.dtype)
    base = matrices(recipe.lora.base_matmul_dtype)
    return Precision(weights, sampling, recipe.lora.enabled and base == 2 and weights == 4)


@dataclass(frozen=True)
class Trainable:
    """What the optimizer holds: parameters, their tensors, bytes per value; the
    layers that backward runs through and the LoRA modules per layer."""

    parameters: int
    tensors: int
    bytes_per_value: int
    layers: int
    lora_modules: int = 0
    rank: int = 0

    @property
    def bytes(self) -> int:
        return self.parameters * self.bytes_per_value


def trainable(recipe: Recipe, shape: f.ModelShape, weights: int) -> Trainable:
    """LoRA's adapters (float32, as PEFT keeps them) or every weight (full fine-tuning)."""
    lora = recipe.lora
    if not lora.enabled:
        tensors = 2 + shape.num_layers * (len(f.layer_linears(shape)) + 2) + (0 if shape.tied_embeddings else 1)
        tensors += 3 * shape.num_layers if shape.qkv_bias else 0
        return Trainable(f.parameter_count(shape), tensors, weights, shape.num_layers)
    layers = min(lora.last_n_layers, shape.num_layers) if lora.last_n_layers > 0 else shape.num_layers
    targets = f.lora_targets(shape, lora.target_modules)
    count = f.lora_parameter_count(shape, lora.r, targets, layers)
    return Trainable(count, 2 * len(targets) * layers, 4, layers, len(targets), lora.r)


def sampling_copy(recipe: Recipe, shape: f.ModelShape, bytes_per_value: int) -> tuple[int, str]:
    """The sampler's own copy of the matrices (ponder's lean decoder: fused, LoRA
    merged), bytes and why; 0 where generation runs on the model itself or in vLLM."""
    sampling = recipe.rollout.sampling
    if recipe.rollout.backend == "vllm":
        return 0, "rollout.backend vllm: the weights live in the vLLM server (not counted here)"
    lean = (shape.model_type in LEAN_DECODER_TYPES and sampling.decoder != "transformers"
            and recipe.model.rope_scaling.type == "none")  # fmt: skip
    if not lean:
        return 0, "decoded through the transformers model: no copy"
    return f.matmul_parameters(shape) * bytes_per_value, "ponder's decoder (fused, LoRA merged)"


@dataclass(frozen=True)
class Inputs:
    """What an estimate is made from: the recipe, its model's (and teacher's) shape,
    the device type and count, and the episode's tokens."""

    recipe: Recipe
    shape: f.ModelShape
    device: Device
    devices: int = 1
    tokens: Tokens | None = None
    teacher: f.ModelShape | None = None


def rl_episodes(recipe: Recipe) -> int:
    return recipe.train.tasks_per_step * recipe.rollout.group_size


def memory_lines(inputs: Inputs) -> list[Line]:
    """Every resident component, in bytes (0 where the recipe has none)."""
    return [*_state_lines(inputs), *_transient_lines(inputs)]


def _state_lines(inputs: Inputs) -> list[Line]:
    """What lives through training: weights, the trained parameters, their gradients
    and AdamW state, a value head, a KL reference snapshot, a teacher."""
    recipe, shape = inputs.recipe, inputs.shape
    p = precision(recipe, inputs.device)
    train, params, lora = trainable(recipe, shape, p.weights), f.parameter_count(shape), recipe.lora.enabled
    value_head = shape.hidden_size + 1 if _needs_values(recipe) else 0  # float32: weight, grad, AdamW's two
    algo = recipe.algo
    snapshot = algo.kl_coef > 0 and algo.kl_reference == "start" and (recipe.sft.steps > 0 or not lora)
    teacher = f.parameter_count(inputs.teacher) * p.weights if inputs.teacher else 0
    kind = f"LoRA r={train.rank}, {train.layers} layers" if lora else "full fine-tuning: the weights themselves"
    adam = f.adam_state_bytes(train.parameters, train.tensors, train.bytes_per_value)
    return [
        Line("weights", "weights", params * p.weights, f"{params / 1e6:.1f}M x {p.weights} B"),
        Line("base_copy", "bf16 copy of the frozen base", f.matmul_parameters(shape) * 2 if p.base_copy else 0,
             "lora.base_matmul_dtype"),
        Line("trainable", "trainable parameters", train.bytes if lora else 0, f"{train.parameters / 1e6:.2f}M, {kind}"),
        Line("gradients", "gradients", train.bytes, "as the trainable parameters"),
        Line("optimizer", "AdamW state", adam, f"2 x trainable + a step per tensor ({train.tensors})"),
        Line("value_head", "value head (+grad, AdamW)", 16 * value_head + 2 * f.ADAM_STEP_BYTES if value_head else 0,
             "algo.advantage gae"),
        Line("reference", "KL reference snapshot", train.bytes if snapshot else 0, "algo.kl_reference start"),
        Line("teacher", "teacher weights", teacher, "teacher.model"),
    ]  # fmt: skip


def _transient_lines(inputs: Inputs) -> list[Line]:
    """What a stage adds for its duration: the sampler's copy and KV caches, one
    micro-batch's activations, a no-grad pass's logits, and the process's runtime."""
    recipe, shape, tokens = inputs.recipe, inputs.shape, inputs.tokens or recipe_tokens(inputs.recipe)
    p = precision(recipe, inputs.device)
    train = trainable(recipe, shape, p.weights)
    copy, copy_note = sampling_copy(recipe, shape, p.sampling)
    rollout_batch = min(recipe.rollout.batch_size, -(-rl_episodes(recipe) // inputs.devices)) or 1
    eval_batch = min(recipe.eval.batch_size or recipe.rollout.batch_size, recipe.eval.episodes) or 1
    micro = recipe.algo.micro_batch_size
    logprob_rows = recipe.algo.logprob_micro_batch_size or micro
    no_grad = logprob_rows * tokens.decode * shape.vocab_size * (p.weights + 4) if _no_grad_passes(recipe, p) else 0
    def activations(entropy: bool) -> int:
        return f.activation_bytes(shape, micro, tokens.episode, p.weights, train.layers,
                                  recipe.model.gradient_checkpointing, train.lora_modules, train.rank,
                                  tokens.decode, entropy)  # fmt: skip

    cpu = inputs.device.is_cpu
    return [
        Line("sampling_copy", "sampling copy", copy, copy_note),
        Line("kv_rollout", "KV cache, rollouts", f.kv_cache_bytes(shape, rollout_batch, tokens.episode, p.weights),
             f"{rollout_batch} rows x {tokens.episode} tokens"),
        Line("kv_eval", "KV cache, evaluation", f.kv_cache_bytes(shape, eval_batch, tokens.episode, p.weights),
             f"{eval_batch} rows x {tokens.episode} tokens"),
        Line("activations_sft", "activations, SFT", activations(False),
             f"micro-batch {micro} x {tokens.episode} tokens"),
        Line("activations", "activations, RL update", activations(True), "the same, and the entropy's softmax"),
        Line("logits_no_grad", "logits, no-grad pass", no_grad,
             f"{logprob_rows} rows x {tokens.decode} positions x vocab"),
        Line("runtime", "runtime", CPU_RUNTIME_BYTES if cpu else GPU_RUNTIME_BYTES,
             "Python and libraries" if cpu else "CUDA context"),
    ]  # fmt: skip


def _needs_values(recipe: Recipe) -> bool:
    return recipe.algo.advantage == "gae"


def _no_grad_passes(recipe: Recipe, p: Precision) -> int:
    """Forwards without gradient per RL step: the KL reference, the value head's old
    values, and the old log-probs when the sampler's kernels are not the trainer's and
    the update's own forward cannot stand in (several epochs or mini-batches)."""
    algo = recipe.algo
    one_pass = algo.epochs == 1 and (algo.mini_batch_size == 0 or algo.mini_batch_size >= rl_episodes(recipe))
    foreign = recipe.rollout.backend == "vllm" or p.sampling != p.weights
    recompute = foreign and not (one_pass and not algo.kl_in_reward)
    return int(algo.kl_coef > 0) + int(_needs_values(recipe)) + int(recompute)


PEAKS = {
    "sft": ("peak, SFT step", ("weights", "base_copy", "trainable", "gradients", "optimizer", "activations_sft")),
    "rollout": ("peak, RL rollouts", ("weights", "base_copy", "trainable", "optimizer", "value_head", "reference",
                                      "teacher", "sampling_copy", "kv_rollout")),
    "update": ("peak, RL update", ("weights", "base_copy", "trainable", "gradients", "optimizer", "value_head",
                                   "reference", "teacher", "activations")),
    "eval": ("peak, evaluation", ("weights", "base_copy", "trainable", "sampling_copy", "kv_eval")),
}  # fmt: skip
SHORT = {"weights": "weights", "base_copy": "bf16 base", "trainable": "LoRA", "gradients": "grads",
         "optimizer": "AdamW", "value_head": "value head", "reference": "reference", "teacher": "teacher",
         "sampling_copy": "sampler", "kv_rollout": "KV", "kv_eval": "KV", "activations": "activations",
         "activations_sft": "activations",
         "logits_no_grad": "no-grad logits", "runtime": "runtime"}  # fmt: skip


def peak_lines(recipe: Recipe, memory: list[Line]) -> list[Line]:
    """Each stage's peak: the components resident together in it, plus the runtime.
    The training products' bf16 base copy is freed while the sampler holds its own;
    the update's transient is the larger of its activations and a no-grad pass's
    logits; with train.async_rollouts the next step's rollouts (sampler, KV) overlap it."""
    value = {line.key: line.value for line in memory}
    lines = []
    for key, (label, parts) in PEAKS.items():
        if key == "sft" and recipe.sft.steps == 0 or key in ("rollout", "update") and recipe.train.steps == 0:
            continue
        resident = [*parts, "runtime"]
        if key in ("rollout", "eval") and value["sampling_copy"]:
            resident.remove("base_copy")
        if key == "update" and value["logits_no_grad"] > value["activations"]:
            resident[resident.index("activations")] = "logits_no_grad"
        if key == "update" and recipe.train.async_rollouts:
            resident += ["sampling_copy", "kv_rollout"]
        resident = [part for part in resident if value[part]]
        total = sum(value[part] for part in resident)
        lines.append(Line(f"peak_{key}", label, total, " + ".join(SHORT[part] for part in resident)))
    return lines


def generation_seconds(inputs: Inputs, episodes: int, batch_size: int) -> float:
    """`episodes` spread over the devices, each device's share in batches of
    batch_size: every batch decodes tokens.decode steps (bandwidth- or compute-bound)
    and prefills the rest of the episode (prompt, observations: compute-bound)."""
    shape, device, tokens = inputs.shape, inputs.device, inputs.tokens or recipe_tokens(inputs.recipe)
    p = precision(inputs.recipe, device)
    share = -(-episodes // inputs.devices)
    if share == 0:
        return 0.0
    batch = min(batch_size, share)
    kv_row = f.kv_cache_bytes(shape, 1, tokens.episode // 2, p.weights)  # at the average context
    decode = f.decode_seconds(tokens.decode, f.matmul_parameters(shape) * p.sampling, kv_row, batch,
                              2.0 * f.matmul_parameters(shape), device.bytes_per_s(), device.flops_per_s(p.sampling))
    prefill = f.forward_flops(shape, share, max(tokens.episode - tokens.decode, 0), logit_tokens=0)
    return f.batches(share, batch_size) * decode + f.compute_seconds(prefill, device.flops_per_s(p.sampling))


def update_seconds(inputs: Inputs) -> tuple[float, float]:
    """One RL step's (no-grad passes, update) on the learner (one device): the
    reference / value / old-log-prob forwards and the teacher's, then algo.epochs
    forward+backward passes over the step's episodes (+ algo.sft_rows per optimizer step)."""
    recipe, shape, tokens = inputs.recipe, inputs.shape, inputs.tokens or recipe_tokens(inputs.recipe)
    p = precision(recipe, inputs.device)
    train, episodes, algo = trainable(recipe, shape, p.weights), rl_episodes(recipe), recipe.algo
    rate = inputs.device.flops_per_s(2 if p.weights == 2 or p.base_copy else 4)
    no_grad = _no_grad_passes(recipe, p) * f.forward_flops(shape, episodes, tokens.episode, tokens.decode)
    if inputs.teacher is not None:
        no_grad += f.forward_flops(inputs.teacher, episodes, tokens.episode, tokens.decode)
    optimizer_steps = algo.epochs * (f.batches(episodes, algo.mini_batch_size) if algo.mini_batch_size else 1)
    rows = algo.epochs * episodes + (optimizer_steps * algo.sft_rows if algo.sft_coef > 0 else 0)
    flops = f.train_flops(shape, rows, tokens.episode, not recipe.lora.enabled, train.layers,
                          recipe.model.gradient_checkpointing, train.parameters if recipe.lora.enabled else 0,
                          tokens.decode)  # fmt: skip
    return f.compute_seconds(no_grad, rate), f.compute_seconds(flops, rate)


def sft_step_seconds(inputs: Inputs) -> float:
    recipe, shape, tokens = inputs.recipe, inputs.shape, inputs.tokens or recipe_tokens(inputs.recipe)
    p = precision(recipe, inputs.device)
    train = trainable(recipe, shape, p.weights)
    flops = f.train_flops(shape, recipe.sft.batch_size, tokens.episode, not recipe.lora.enabled, train.layers,
                          recipe.model.gradient_checkpointing, train.parameters if recipe.lora.enabled else 0,
                          tokens.decode)  # fmt: skip
    return f.compute_seconds(flops, inputs.device.flops_per_s(2 if p.weights == 2 or p.base_copy else 4))


def time_lines(inputs: Inputs) -> list[Line]:
    """Seconds per stage: the SFT warm-up, an RL step's parts, the RL run, the held-out
    evaluations (base, after SFT, after RL: as `ponder demo` runs them)."""
    recipe = inputs.recipe
    sft, cfg = recipe.sft, recipe.train
    sft_step = sft_step_seconds(inputs) if sft.steps else 0.0
    rollout = generation_seconds(inputs, rl_episodes(recipe), recipe.rollout.batch_size) if cfg.steps else 0.0
    no_grad, update = update_seconds(inputs) if cfg.steps else (0.0, 0.0)
    eval_batch = recipe.eval.batch_size or recipe.rollout.batch_size
    one_eval = generation_seconds(inputs, recipe.eval.episodes, eval_batch)
    rl_evals = cfg.steps // cfg.eval_every if cfg.eval_every else 0
    rl_eval = generation_seconds(inputs, cfg.val_tasks or cfg.eval_episodes, eval_batch) if rl_evals else 0.0
    step = rollout + no_grad + update
    evaluations = 1 + int(sft.steps > 0) + int(cfg.steps > 0)
    rl_total = cfg.steps * step + rl_evals * rl_eval
    devices = f" on {inputs.devices} devices" if inputs.devices > 1 else ""
    episodes = rl_episodes(recipe)
    return [
        Line("sft_step_s", "SFT step", sft_step, f"{sft.batch_size} rows, forward + backward"),
        Line("sft_s", "SFT warm-up", sft.steps * sft_step, f"{sft.steps} steps"),
        Line("rollout_s", "RL rollouts, per step", rollout,
             f"{episodes} episodes{devices}, batch {recipe.rollout.batch_size}"),
        Line("no_grad_s", "RL no-grad passes, per step", no_grad, "reference, values, old log-probs, teacher"),
        Line("update_s", "RL update, per step", update, f"{recipe.algo.epochs} epoch(s) over {episodes} episodes"),
        Line("rl_step_s", "RL step", step, "rollouts + passes + update"),
        Line("rl_s", "RL run", rl_total, f"{cfg.steps} steps" + (f" + {rl_evals} evaluations" if rl_evals else "")),
        Line("eval_s", "one evaluation", one_eval, f"{recipe.eval.episodes} episodes{devices}, batch {eval_batch}"),
        Line("evals_s", "held-out evaluations", evaluations * one_eval, f"{evaluations} (base, after SFT, after RL)"),
        Line("total_s", "total", sft.steps * sft_step + rl_total + evaluations * one_eval, "model loading not counted"),
    ]  # fmt: skip


def assumptions(inputs: Inputs, calibrated: bool) -> list[str]:
    """What the figures rest on, in words."""
    device, tokens = inputs.device, inputs.tokens or recipe_tokens(inputs.recipe)
    p = precision(inputs.recipe, device)
    said = [
        f"device: {device.label} ({device.source}); peak {device.bf16_tflops:g} TFLOP/s bf16, "
        f"{device.fp32_tflops:g} fp32, {device.bandwidth_gbs:g} GB/s",
        f"utilisation: training and prefill at {device.compute_util:.0%} of peak FLOP/s, "
        f"decode at {device.bandwidth_util:.0%} of the bandwidth",
        f"tokens per episode: {tokens.episode}, {tokens.decode} generated; from {tokens.source}",
        f"precision: weights {p.weights} B, sampling matrices {p.sampling} B, LoRA and optimizer state fp32",
        "training FLOPs: 2 per weight per token forward, as much again for input gradients, and again for "
        "weight gradients when fully fine-tuned (~6N; LoRA ~4N); attention 2·heads·head_dim·T² per layer",
        "decode: each step reads every weight once and each row's KV cache at half the episode's context",
        "activations: a block keeps 4h + 2q + 2kv + 4·intermediate values per token (fused attention); logits "
        "only where the loss reads",
    ]
    if inputs.recipe.algo.advantage in ("grpo", "rloo"):
        said.append("the update runs every row; rows whose advantage is 0 (a group whose rewards tie) are "
                    "left out by ponder, so a real update can take less")  # fmt: skip
    if device.is_cpu and not calibrated:
        said.insert(0, "CPU NOT CALIBRATED: conservative default figures; run `ponder estimate --calibrate` once")
    if inputs.devices > 1:
        said.append(f"{inputs.devices} devices: rollouts and evaluations split across them (a policy copy each, "
                    "as Ray rollout workers hold; ponder does not yet place them on GPUs), the update on one "
                    "learner, as ponder's Ray learner runs it")  # fmt: skip
    return said


def estimate(inputs: Inputs, model: dict[str, Any], calibrated: bool = True) -> Estimate:
    """The whole estimate of `inputs` (model: name and counts for the header)."""
    memory = memory_lines(inputs)
    tokens = inputs.tokens or recipe_tokens(inputs.recipe)
    return Estimate(model, inputs.device, inputs.devices, tokens, memory, peak_lines(inputs.recipe, memory),
                    time_lines(inputs), assumptions(inputs, calibrated))  # fmt: skip


def tokens_with(recipe: Recipe, episode: int | None = None, decode: int | None = None,
                measured: Tokens | None = None) -> Tokens | None:  # fmt: skip
    """The episode's tokens: given ones (--episode-tokens, --decode-tokens) over a
    run's measured ones over the recipe's caps; None when nothing replaces the caps."""
    if episode is None and decode is None:
        return measured
    base = measured or recipe_tokens(recipe)
    if (episode is not None and episode < 1) or (decode is not None and decode < 1):
        raise ValueError("--episode-tokens and --decode-tokens must be at least 1")
    episode = episode if episode is not None else base.episode
    decode = min(decode if decode is not None else base.decode, episode)
    return Tokens(episode, decode, "--episode-tokens / --decode-tokens")
