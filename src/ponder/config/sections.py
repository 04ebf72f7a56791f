"""The recipe's sections: typed, nested dataclasses, one per YAML section. Every
field is documented once, here, in its class docstring (ponder.config.load reads YAML
into them).

Plain data: imports nothing of ponder.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

@dataclass
class RopeScalingConfig:
    """model.rope_scaling: a longer context than the model was trained on (models/rope.py).

    type: `none`, `linear` (position interpolation), `dynamic` (dynamic NTK) or `yarn`.
    factor: how many times the trained length (max_position_embeddings) to reach.
    original_max_position_embeddings: the trained length, when not the config's.
    beta_fast, beta_slow: YaRN's ramp bounds in rotations (default 32 and 1).
    """

    type: str = "none"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None

    def __post_init__(self) -> None:
        if self.type not in ("none", "linear", "dynamic", "yarn"):
            raise ValueError(f"rope_scaling.type must be none, linear, dynamic or yarn, got {self.type!r}")
        if self.factor < 1:
            raise ValueError(f"rope_scaling.factor must be >= 1, got {self.factor}")


@dataclass
class ModelConfig:
    """Which policy to load.

    name: `smollm2-135m` (embedded default), `tiny` (random test model), a local
        HF model directory, or a hub id (needs network).
    dtype: `auto` (bfloat16 on a GPU that has it, else float32), `float32`,
        `bfloat16` or `float16`.
    device: `auto` (cuda when available, else cpu), `cpu` or `cuda`.
    gradient_checkpointing: recompute each layer's activations in the backward pass
        instead of keeping them (less memory for longer sequences, ~30% more compute;
        worth it on a GPU whose memory bounds the batch).
    activation_offload: keep the activations the backward pass reads (with
        checkpointing, only each layer's input) in pinned host memory instead of the
        GPU's, copied back in the backward pass (torch.autograd.graph.save_on_cpu):
        less GPU memory for the time of the copies. Nothing to gain on a CPU.
    rope_scaling: RoPE scaling for a longer context (RopeScalingConfig); applied on
        load, so evaluation and training both see it.
    """

    name: str = "smollm2-135m"
    dtype: str = "auto"
    device: str = "auto"
    gradient_checkpointing: bool = False
    activation_offload: bool = False
    rope_scaling: RopeScalingConfig = field(default_factory=RopeScalingConfig)


@dataclass
class SamplingConfig:
    """How the policy samples.

    temperature: 0 means greedy. Logprobs are recorded at this temperature.
    top_p: nucleus sampling mass (1.0 = off).
    max_new_tokens_per_turn: cap on one model action.
    max_total_tokens: cap on prompt + response; the episode stops when reached. With
        rollout.context on it counts the opening prompt and the whole response (every
        segment's), and rollout.context.max_tokens caps what the policy reads at once.
    decoder: `auto` decodes Llama-family models with ponder's lean forward (fused
        weights: rollout/llama_decode.py; packed on the CPU; on a GPU its decode
        steps compiled by torch.compile and replayed from CUDA graphs:
        rollout/graph_decode.py), anything else with the transformers model;
        `transformers` always uses the transformers model; `static` runs the
        static-shape steps uncompiled (CUDA graphs on a GPU, eagerly elsewhere);
        `compiled` compiles them on any device (inductor's C++ backend on a CPU:
        tests). Compiling costs ~10 s once per process on a GPU and a few seconds
        for each new batch shape; it made batch-1 decode 1.3x faster on an H200.
    dtype: the precision the sampling copy computes in: `model` (the default: the
        model's own, bf16 on a GPU), `float32`, `bfloat16`, or `auto`: bfloat16 for a
        float32 model on a CPU with bf16 instructions (AVX-512 BF16 or AMX; ~1.4x the
        fp32 decode's tokens/s, docs/results/benchmarks.md), else the model's. When it
        differs from the trainer's precision the trainer takes the old log-probs
        from its own forward and corrects with a truncated importance weight
        (`algo.tis_cap`), as for vLLM; the gap is logged as rollout/logprob_mismatch.
        A vLLM server that ponder starts (rollout.backend vllm) computes in it too.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens_per_turn: int = 96
    max_total_tokens: int = 1024
    decoder: str = "auto"
    dtype: str = "model"


WEIGHT_SYNCS = ("merged", "adapter")
SUMMARISERS = ("rule", "policy", "drop")
# Short enough to show as its default in the recipe reference's 80 columns.
SUMMARY_INSTRUCTION = "\n\n[Window full. Summarise what you found and what is left.]\n\n"


@dataclass
class ContextConfig:
    """rollout.context: context compaction, for episodes longer than the window the policy
    reads (rollout/compaction.py). When an episode's context, the next observation and one
    more action would not fit in max_tokens, the context starts again: the opening prompt,
    a summary of the turns it leaves out (a user message), the last keep_last_turns turns'
    own token ids, then the observation. The response stays one stream of tokens; each
    restart is recorded (Trajectory.segments) and the trainer scores every token under the
    context it was sampled in. Episodes that never fill the window run as without it.

    max_tokens: the window: the most tokens one context holds (prompt and response); 0 =
        off (rollout.sampling.max_total_tokens then ends a long episode).
    keep_last_turns: turns carried over verbatim (the current action among them); fewer
        when they do not fit.
    summariser: `rule`: one line per left-out message, its role and the start of its text
        (the agent runtime's extractive summary); `policy`: `instruction` is appended and
        the policy writes the summary, whose tokens are trained as actions under the old
        context and carried into the new one as they were sampled (an empty one falls back
        to the rule's, counted as context/empty_summaries); `drop`: no summary, a one-line
        note of how many turns were left out.
    summary_max_tokens: cap on a summary (the rule's keeps its newest lines; the policy
        samples at most this many tokens).
    instruction: what the policy summariser is told (environment text, loss 0).
    """

    max_tokens: int = 0
    keep_last_turns: int = 2
    summariser: str = "rule"
    summary_max_tokens: int = 64
    instruction: str = SUMMARY_INSTRUCTION

    def __post_init__(self) -> None:
        if self.summariser not in SUMMARISERS:
            valid = ", ".join(SUMMARISERS)
            raise ValueError(f"rollout.context.summariser: unknown '{self.summariser}'; valid: {valid}")
        if self.max_tokens < 0 or self.keep_last_turns < 0 or self.summary_max_tokens < 1:
            raise ValueError("rollout.context: max_tokens and keep_last_turns must be >= 0 and summary_max_tokens "
                             f">= 1, got {self.max_tokens}, {self.keep_last_turns} and {self.summary_max_tokens}")


@dataclass
class ConstrainConfig:
    """rollout.constrain: every action sampled to match a grammar (rollout/constrain.py).
    The logprobs recorded are those of the masked distribution the tokens were drawn
    from, and the trainer applies the same masks again, so the importance ratio at the
    sampling weights stays exactly 1.

    kind: `none`, `regex`, `json_schema` or `lark` (llguidance's EBNF, which may embed
        JSON Schemas with `%json`) for every action; or `tools`: each episode's own
        tools (those its environment offers), the action free until the model opens
        a `<tool_call>`, the call then sampled to name one of them with arguments of
        its schema (a refusal in plain text stays possible).
    source: the regex, the JSON Schema (a mapping, or JSON text) or the Lark grammar
        (not used by `tools`).
    strict: `tools`: arguments must match the schemas exactly; false compiles them
        leniently (schema keywords the grammar library lacks are ignored, not refused).
    parallel: `tools`: several calls in one action (up to 8); false: one.
    """

    kind: str = "none"
    source: str | dict[str, Any] = ""
    strict: bool = True
    parallel: bool = True

    def __post_init__(self) -> None:
        if self.kind not in ("none", "regex", "json_schema", "lark", "tools"):
            raise ValueError(f"rollout.constrain.kind: unknown '{self.kind}'; valid: json_schema, lark, none, "
                             "regex, tools")  # fmt: skip
        if self.kind not in ("none", "tools") and not self.source:
            raise ValueError(f"rollout.constrain.source: a {self.kind} is needed with kind {self.kind}")


@dataclass
class RolloutConfig:
    """Batched multi-turn rollout.

    batch_size: episodes generated together in one batch.
    group_size: episodes per task (G in GRPO); each group shares a group_id.
    seed: sampling seed.
    sampling: see SamplingConfig.
    backend: `hf` (ponder's CPU decoder or transformers, in this process) or `vllm`
        (a vLLM server reached over HTTP, token ids in and out; docs/results/vllm.md).
    vllm_weight_sync: how a LoRA policy's new weights reach the vLLM server after
        an update: `merged` (the adapter merged into the base weights, reloaded into
        the server in place: no LoRA kernels; on vLLM-CPU, whose LoRA kernels gather
        a copy of the adapter per token, generation ~5x faster, docs/results/vllm.md) or
        `adapter` (saved in PEFT's layout and loaded under a new name: no full
        checkpoint written per update, for large models on a GPU). Full fine-tuning
        always reloads its weights in place. In-place reloads use vLLM's
        development endpoints (`VLLM_SERVER_DEV_MODE=1`: set for a server ponder
        starts; a server at vllm_url must be started with it).
    vllm_url: a running vLLM server's base URL (e.g. http://127.0.0.1:8000); unset =
        ponder starts one on 127.0.0.1 with vllm_python and stops it at exit.
    vllm_python: the python of vLLM's own venv (`make vllm-venv`).
    vllm_timeout_s / vllm_retries: per-request timeout, and extra attempts after a
        timeout, connection error or 5xx (backoff 0.5 s, 1 s, 2 s …).
    vllm_start_timeout_s: how long a server ponder starts may take to come up.
    constrain: see ConstrainConfig (the `hf` backend only).
    context: context compaction for episodes longer than the window (ContextConfig).
    """

    batch_size: int = 16
    group_size: int = 1
    seed: int = 0
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    backend: str = "hf"
    vllm_weight_sync: str = "merged"
    vllm_url: str | None = None
    vllm_python: str = ".venv-vllm/bin/python"
    vllm_timeout_s: float = 300.0
    vllm_retries: int = 2
    vllm_start_timeout_s: float = 600.0
    constrain: ConstrainConfig = field(default_factory=ConstrainConfig)
    context: ContextConfig = field(default_factory=ContextConfig)

    def __post_init__(self) -> None:
        if self.vllm_weight_sync not in WEIGHT_SYNCS:
            valid = ", ".join(WEIGHT_SYNCS)
            raise ValueError(f"rollout.vllm_weight_sync: unknown '{self.vllm_weight_sync}'; valid: {valid}")
        window, sampling = self.context.max_tokens, self.sampling
        if window and not sampling.max_new_tokens_per_turn < window <= sampling.max_total_tokens:
            raise ValueError(f"rollout.context.max_tokens ({window}) must exceed rollout.sampling."
                             f"max_new_tokens_per_turn ({sampling.max_new_tokens_per_turn}) and stay within "
                             f"max_total_tokens ({sampling.max_total_tokens}), which caps the whole episode")
        if window and self.context.summariser == "policy" and self.constrain.kind != "none":
            raise ValueError("rollout.context.summariser policy: a summary is free text, which the trainer's "
                             f"replay of rollout.constrain ({self.constrain.kind}) would mask as an action; "
                             "use rule or drop")

    def uncapped(self) -> RolloutConfig:
        """The same rollout with no cap on an action or an episode and no compaction: a
        scripted replay (demonstrations, the oracle) runs whole; the caps bound what the
        policy may generate, not what it should learn from."""
        sampling = replace(self.sampling, max_new_tokens_per_turn=1 << 16, max_total_tokens=1 << 20)
        return replace(self, sampling=sampling, context=replace(self.context, max_tokens=0))


@dataclass
class EnvConfig:
    """The environment (see ponder.envs.base for the protocol).

    kind: a registered environment (search_qa, math, code, function_calling …;
        `mixture`: several at once, each part an env section of its own under
        env.options.parts) or an import path `module:attribute` to your own builder
        or environment class.
    options: that environment's own options, checked when it is built (each
        documents its own in its builder; search_qa's corpus, tasks, taskgen,
        retriever, max_obs_tokens and max_invalid_actions are listed in
        docs/guide/environments.md).
    train_tasks / eval_tasks: task files (JSONL, Parquet or a saved `datasets`
        directory) or `hf:NAME[:CONFIG]:SPLIT` (a `datasets` dataset already in the
        local cache, or a local directory of data files; read offline) replacing the
        environment's own tasks; empty = its own.
    columns: task field → the dataset's column for it, e.g. `{question: problem,
        answers: solution, kind: level, id: uid}` (`a.b`: a nested column); fields:
        id, question, answers, kind, context, oracle_actions. A single answer (text
        or a number) becomes a one-item list; rows without an id are numbered after
        their file or split from 0 (train-0, train-1 …).
    transform: `module:function` called on every dataset row (a dict, its own
        columns) before the mapping, returning the row to use (None drops it).
    format: the task files' layout: `ponder` (ponder's task schema), `verl` (verl's
        RL Parquet: `prompt` messages, `reward_model.ground_truth`, `data_source`,
        `extra_info.index`), `trl` (TRL's prompt-only or conversational `prompt`,
        optional `completion`, other columns kept for TRL reward functions) or
        `auto` (told apart by the columns). docs/guide/data.md has each.
    mcp_servers: MCP servers whose tools the environment gets in place of its own
        tools of the same name (math's `calculator`, search-QA's `search`), each
        `{name, command: [words]}` (stdio) or `{name, url}` (streamable HTTP), plus
        optional `tools`, `timeout_s`, `connect_timeout_s`, `env`, `cwd`, `screen` (see
        ponder.tools.mcp.client.McpServerSpec; docs/guide/tools.md, "MCP").
    max_turns: model actions per episode before it is stopped (the default of an
        environment that has no max_turns option of its own; a mixture's parts may
        each set their own).
    """

    kind: str = "search_qa"
    options: dict[str, Any] = field(default_factory=dict)
    train_tasks: str = ""
    eval_tasks: str = ""
    columns: dict[str, str] = field(default_factory=dict)
    transform: str = ""
    format: str = "auto"
    mcp_servers: list = field(default_factory=list)
    max_turns: int = 4


@dataclass
class ShapingConfig:
    """Reward-hacking penalties (ponder.rewards.hacking): each nonzero one adds a
    component `shaping/<name>` (1 when its detector fires; judge_unverified: the
    judge's score) with weight -penalty.

    guess: a right answer with wrong or absent work (math: no true shown step or
        calculator result reaches it, or a shown step is false).
    hedging: the final answer holds two or more distinct numbers ("12 or 13").
    format_gaming: a protocol tag with nothing in it (`<think></think>`).
    repetition: the actions' repeated word n-gram ratio (n = repetition_n) is at
        least repetition_threshold (a degenerate loop).
    repetition_n / repetition_threshold: the n-gram length and the repeated share
        at which the `repetition` detector fires.
    truncation: the episode ran into the token limit.
    repeated_call: one identical tool call (tool and arguments, spaces normalised:
        the same `<calculator>` expression) made repeated_call_k times or more, or
        an episode the environment stopped for it (env.options.max_repeated_calls).
    repeated_call_k: the count at which the `repeated_call` detector fires (3: two
        identical calls pass).
    judge_unverified: charges penalty x the `judge` component's score on episodes
        whose `verified` one is 0 (paid but wrong); at 1 the judge pays only where
        the verifier agrees.
    window: RL steps over which the trend detectors (length gaming, judge
        exploitation) fit their slopes.
    judge / verified: the breakdown components the judge-exploitation detector
        compares (a judge's score and the verifier's).
    The detectors' rates go to the RL metrics (`hacking/*`) whatever the penalties.
    """

    guess: float = 0.0
    hedging: float = 0.0
    format_gaming: float = 0.0
    repetition: float = 0.0
    truncation: float = 0.0
    repeated_call: float = 0.0
    judge_unverified: float = 0.0
    repetition_n: int = 4
    repetition_threshold: float = 0.5
    repeated_call_k: int = 3
    window: int = 5
    judge: str = "judge"
    verified: str = "correct"


@dataclass
class JudgeConfig:
    """An LLM-as-judge reward component `judge` (ponder.rewards.judge).

    weight: its weight in the composite reward (0 = no judge).
    url: an OpenAI-compatible API root serving the judge (`ponder serve`, vLLM),
        e.g. http://127.0.0.1:8000/v1. model: the model name to ask for there.
    api_key_env: the environment variable holding the API key ("" = none).
    self_judge: the policy being trained judges its own episodes (self-rewarding;
        no url). HACKABLE: the optimised model sets its own reward.
    rubric: the pointwise prompt with {question} {response} {reference} {low} {high}
        ("" = the built-in one, which asks for "Score: N").
    scale_min / scale_max: the score scale; scores map onto [0, 1].
    pairwise: judge the response against the task's reference in both orders
        (position-bias control) instead of scoring it alone.
    on_unparsable: `none` (the episode is unscorable, counted) or `error` (stop);
        a reply with no score, two scores or one out of range is never a 0.
    max_tokens: tokens the judge may write.
    """

    weight: float = 0.0
    url: str = ""
    model: str = "default"
    api_key_env: str = ""
    self_judge: bool = False
    rubric: str = ""
    scale_min: int = 1
    scale_max: int = 10
    pairwise: bool = False
    on_unparsable: str = "none"
    max_tokens: int = 64


@dataclass
class RewardConfig:
    """Weights of the composite reward (total = sum of weight x component).

    terms: component name → weight, over the environment's own components at its
        default weights (search_qa: em 1, f1 0, format 0.1, search_cost -0.05; math:
        correct 1, format 0.1 …; docs/guide/environments.md): a name here sets that
        component's weight, or adds a component: one the environment defines, a
        registered one (ponder.rewards.REWARDS, e.g. `turn_rewards`, the sum of the
        environment's per-turn rewards; `search_cost_if_correct`, searches of right
        answers only; `search_cost_excess`, searches beyond the task's needed hops;
        `plan_kept`, 1 when the searches match the lookup count the first thought
        opens with) or an import path `module:function` to your own
        (trajectory, task) -> float | None.
    shaping: reward-hacking penalties (ShapingConfig).
    judge: an LLM-as-judge component `judge` (JudgeConfig).
    """

    terms: dict[str, float] = field(default_factory=dict)
    shaping: ShapingConfig = field(default_factory=ShapingConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)


@dataclass
class EvalConfig:
    """Evaluation runs.

    episodes: how many held-out tasks to run (from the eval split).
    temperature: 0 = greedy decoding; > 0 = one sampled episode per task at this
        temperature (seeded with rollout.seed, so two evaluations of different
        policies draw the same random numbers): the policy RL actually optimises.
    batch_size: episodes generated together during evaluation; 0 = rollout.batch_size.
        Decoding a small model on CPU is memory-bound, so a large batch (e.g. every
        episode at once) is several times faster per episode.
    out: output directory for trajectories.parquet and metrics.json.
    split: the tasks evaluated: `eval` (held out, the default) or `train` (those RL
        and SFT draw from: how well the policy does on what it trained on).
    """

    episodes: int = 32
    temperature: float = 0.0
    batch_size: int = 0
    out: str = "runs/eval"
    split: str = "eval"


@dataclass
class LoraConfig:
    """LoRA adapters (PEFT). The reference policy is the base with adapters disabled.

    enabled: False = full fine-tuning (then a KL term needs a frozen copy: not kept).
    r / alpha / dropout: adapter rank, scaling numerator, dropout.
    target_modules: "all-linear" or a list of module names (e.g. [q_proj, v_proj]).
    last_n_layers: adapt only the top N transformer layers (0 = all). Backward then
        stops at layer L-N, which makes a CPU update step several times cheaper.
    base_matmul_dtype: the precision of the frozen base's matrix products in training
        (SFT, DPO, the RL update): `model` (the default: the model's own), `float32`,
        `bfloat16` (a bf16 copy of each frozen weight, inputs rounded to bf16, outputs,
        LoRA and the loss in fp32), or `auto`: bfloat16 for a float32 model on a CPU
        with bf16 instructions (AVX-512 BF16 or AMX), else the model's
        (models/lora_fused.py).
    """

    enabled: bool = True
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: str | list = "all-linear"
    last_n_layers: int = 0
    base_matmul_dtype: str = "model"


@dataclass
class OptimConfig:
    """AdamW with warm-up then a schedule.

    lr: peak learning rate. weight_decay: AdamW decay.
    warmup_steps: linear warm-up from 0 over this many optimizer steps.
    schedule: `constant`, `linear` (decay to 0) or `cosine` (decay to 0) after warm-up.
    max_grad_norm: clip the global gradient norm (0 = off).
    """

    lr: float = 1e-4
    weight_decay: float = 0.0
    warmup_steps: int = 0
    schedule: str = "constant"
    max_grad_norm: float = 1.0


@dataclass
class AlgoConfig:
    """The RL algorithm, as configuration (the trainer never branches on names).

    advantage: `grpo`, `rloo`, `reinforce`, `gae` (PPO, needs the value head) or
        `turn` (turn-level credit: search cost at its turn, outcome at the last,
        baselines per turn position) or `togo` (each turn's reward-to-go against the
        task's baseline).
    loss: `ppo` (clipped surrogate), `vanilla` (policy gradient) or `importance_sampling`
        (-exp(logp - logp_sampler) x A, unclipped: Tinker's loss of that name).
    aggregation: `token_mean`, `seq_mean_token_mean` or `seq_mean_token_sum_norm`.
    norm_by_std: GRPO/turn std normalisation (False = Dr. GRPO).
    std_scope: `group` (GRPO: each group's std) or `batch` (one std over the batch's
        group-centred rewards; keeps how much a group's rewards differ).
    gamma / lam: discount and GAE lambda (gamma also discounts turns for `turn`).
    clip_low / clip_high: PPO ratio clip below/above 1 (clip-higher: 0.28 above).
    norm_constant: divisor for `seq_mean_token_sum_norm` (e.g. max response tokens).
    kl_coef: KL coefficient against the reference (0 = no KL, no reference pass).
    kl_reference: the reference policy: `start` (the policy as this RL run began:
        the SFT warm-up a demo's RL continues, as TRL's and verl's reference model)
        or `base` (the base model, adapters disabled). With fresh LoRA adapters the
        two are the same policy.
    kl_estimator: `k1`, `k2` or `k3`. kl_in_reward: penalise rewards instead of a loss term.
    kl_target / kl_horizon: if set, adapt kl_coef towards kl_target KL, over a
        horizon of kl_horizon episodes.
    entropy_coef: entropy bonus weight. value_coef / value_clip: PPO value loss.
    epochs: optimisation passes over each batch of episodes.
    mini_batch_size: episodes per optimizer step (0 = the whole batch).
    micro_batch_size: episodes per forward/backward (gradient accumulation).
    logprob_micro_batch_size: episodes per no-grad forward (reference logprobs, old
        values; verl's `log_prob_micro_batch_size`); 0 = micro_batch_size. A no-grad
        pass keeps no activations, so it can take larger batches than the update.
    clip_c: PPO dual-clip bound (> 1) for negative advantages; null = off.
    std_eps: added to the std before dividing advantages by it.
    baseline_momentum: reinforce's running-mean baseline momentum.
    whiten_gae: normalise GAE advantages over the batch (verl does it always).
    group_filter: which sampled groups a step learns from (ponder.algos.filters):
        `none`, or `informative` (DAPO's dynamic sampling: groups whose rewards are
        all equal carry no signal; they are dropped and fresh tasks sampled in their
        place, up to max_refills more rollouts per step).
    max_refills: the most extra rollouts a step makes to replace dropped groups.
    max_staleness: with train.async_rollouts, the most updates the weights that
        sampled a step's episodes may lag the weights they train (the ratio is taken
        against the sampler's logprobs, the behaviour policy's). The pipeline keeps
        one step in flight, so the lag is 1: it needs max_staleness >= 1.
    tis_cap: with a sampler whose kernels are not the trainer's (rollout.backend
        vllm), the trainer recomputes the old log-probs and weights each token's loss
        by min(exp(old − sampler), tis_cap) (truncated importance sampling); null = no
        weight. The hf backend's log-probs are the trainer's: nothing is recomputed.
    sft_coef: weight of the SFT loss on the recipe's warm-up demonstrations (section
        `sft`: the same tasks and replies) added to every optimizer step, sft_rows
        demonstrations a step in seeded shuffled epochs (InstructGPT's PPO-ptx): it
        holds what the warm-up taught, such as when to decline, while RL moves the
        rest; 0 = off (no demonstrations built).
    sft_rows: demonstrations in each optimizer step's SFT loss (with sft_coef > 0).
    distill_coef: on-policy distillation from the recipe's `teacher`: the teacher
        scores every sampled token and coef x (log p_teacher - log p_student) is added
        to each policy token's advantage (ponder.algos.distill.opd_advantage), beside
        the reward's; with advantage `none`, distillation alone. 0 = off.
    (ponder.algos.AdvantageConfig and LossConfig document each in full.)
    """

    advantage: str = "grpo"
    loss: str = "ppo"
    aggregation: str = "token_mean"
    norm_by_std: bool = True
    std_scope: str = "group"
    gamma: float = 1.0
    lam: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    norm_constant: float = 1.0
    kl_coef: float = 0.0
    kl_reference: str = "start"
    kl_estimator: str = "k3"
    kl_in_reward: bool = False
    kl_target: float | None = None
    kl_horizon: int = 1000
    entropy_coef: float = 0.0
    value_coef: float = 0.5
    value_clip: float = 0.2
    epochs: int = 1
    mini_batch_size: int = 0
    micro_batch_size: int = 4
    logprob_micro_batch_size: int = 0
    clip_c: float | None = None
    std_eps: float = 1e-6
    baseline_momentum: float = 0.9
    whiten_gae: bool = False
    group_filter: str = "none"
    max_refills: int = 2
    tis_cap: float | None = 2.0
    max_staleness: int = 1
    sft_coef: float = 0.0
    sft_rows: int = 4
    distill_coef: float = 0.0


@dataclass
class TrainConfig:
    """The RL run.

    steps: RL steps (each: rollout, reward, advantage, update).
    tasks_per_step: tasks sampled per step (each rolled out rollout.group_size times).
    task_kinds: train only on these task kinds (empty = all).
    stratify: every batch interleaves the task kinds (see ponder.train.sampler).
    curriculum: how a step's tasks are spread over the task kinds
        (ponder.algos.curriculum): `none` (shuffled epochs, stratify applies) or
        `informative` (more tasks of the kinds whose sampled groups still differ in
        reward, i.e. carry a gradient; each kind keeps curriculum_floor of its uniform
        share). curriculum_momentum: weight of the past in each kind's running rate.
    curriculum_floor: the share of its uniform share of tasks that every kind keeps
        under the `informative` curriculum.
    shuffle: false = tasks in list order, cycling (no shuffled epochs).
    seed: seeds python, numpy, torch and sampling.
    eval_every / eval_episodes: evaluation cadence and size (0 = never). With
        val_tasks the evaluation is on the validation split (and chooses the
        weights); without it, on eval_episodes held-out test tasks (a curve only).
    val_tasks: training tasks held out of RL as a validation split (0 = none), used
        by eval_every for model selection (ponder.train.validation).
    val_outside_sft: keep the validation split out of the SFT warm-up's
        demonstrations too (else the warm-up may have memorised its answers, which
        favours step 0), drawn with seed 0 whatever train.seed, so RL seeds that
        share one warm-up share the split.
    outside_sft: RL draws only from training tasks the SFT warm-up did not
        demonstrate (wiring.sft_tasks: sft.examples, sft.kind_examples): questions whose
        answers the warm-up has not memorised. Not with val_outside_sft.
    patience: stop after this many validation evaluations without a new best (0 = never).
    keep_best: end on the best validation weights (kept in RUN_DIR/best), not the last.
    save_every: checkpoint every N steps (always at the end).
    out: run directory.
    stop_grace_s: after SIGINT/SIGTERM the run stops at the end of the current step
        (with a checkpoint); if the step has not finished this many seconds later, it
        stops at once (the last checkpoint resumes). 0 = wait for the step.
    ray_workers: rollout workers (Ray actors, one CPU each) when `ponder train --ray`
        runs the rollouts; each holds its own policy copy (ponder.train.ray.rollouts).
    ray_env_workers: environment workers (Ray actors) that host the episodes'
        environments and run their tools, with health checks and restart
        (ponder.train.ray.env_pool); 0 = the environments run inside the rollout workers.
    ray_learner: under --ray, the learner (update, evaluation, checkpoints, metrics)
        runs in a Ray actor, placed on a GPU when the model wants one; the driver
        only orchestrates. false = the learner is the driver process.
    async_rollouts: sample step k+1's episodes while step k updates (from the weights
        before that update: one step off-policy, bounded by algo.max_staleness).
        false = exactly on-policy. A resumed async run samples its first step on-policy.
    agent_timeout_s: the longest one episode of an agent program may run through the
        gateway (env.kind gateway); past it the episode fails (reward 0) and the run goes on.
    """

    steps: int = 20
    tasks_per_step: int = 8
    task_kinds: list = field(default_factory=list)
    stratify: bool = False
    curriculum: str = "none"
    curriculum_floor: float = 0.25
    curriculum_momentum: float = 0.5
    shuffle: bool = True
    seed: int = 0
    eval_every: int = 0
    eval_episodes: int = 32
    val_tasks: int = 0
    val_outside_sft: bool = False
    outside_sft: bool = False
    patience: int = 0
    keep_best: bool = True
    save_every: int = 5
    out: str = "runs/train"
    stop_grace_s: float = 10.0
    ray_workers: int = 2
    ray_env_workers: int = 0
    ray_learner: bool = True
    async_rollouts: bool = False
    agent_timeout_s: float = 300.0


@dataclass
class SFTConfig:
    """Supervised warm-up on replayed demonstration episodes (loss on policy tokens only).

    steps / batch_size / lr / warmup_steps: the SFT optimisation (AdamW, linear
        warm-up over warmup_steps, then a constant LR).
    max_grad_norm: clip the global gradient norm (0 = off), as optim.max_grad_norm for RL.
    task_kinds: which task kinds to take demonstrations from (empty = all).
    behaviour: `oracle` (optimal actions), `always_search` (searches before every
        answer, even when the answer is in the prompt) or `search_once` (searches
        exactly once whatever the question): deliberately sub-optimal warm-ups that
        leave RL headroom (see ponder.train.sft.demonstration_actions).
    oracle_fraction: share of the demonstrations (drawn with train.seed) that follow
        the oracle instead of `behaviour`, so the warm-up policy samples every
        strategy and RL can learn when each one pays.
    examples: demonstrations to build (cycled over steps).
    kind_examples: task kind -> at most this many demonstrations of that kind (the
        first ones of the training split; kinds not named: no cap), so a kind's
        share of the warm-up is set apart from its share of the training split
        (e.g. RL under train.outside_sft then sees that kind's other questions).
    """

    steps: int = 0
    batch_size: int = 8
    lr: float = 3e-4
    warmup_steps: int = 2
    max_grad_norm: float = 1.0
    task_kinds: list = field(default_factory=list)
    behaviour: str = "oracle"
    oracle_fraction: float = 0.0
    examples: int = 128
    kind_examples: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for kind, count in self.kind_examples.items():
            if type(count) is not int or count < 0:
                raise ValueError(f"sft.kind_examples: '{kind}' expects a count >= 0, got {count!r}")


@dataclass
class TrackingConfig:
    """Where an RL run's metrics go besides run_dir/metrics.jsonl, the source of truth
    (plots, reports and resume read only that file; see ponder.runlog.tracking).

    trackers: back-ends, any of `tensorboard` (event files in run_dir/tb: scalars,
        the advantage histogram, sampled episodes as text), `wandb` (Weights &
        Biases, offline only: files in run_dir/wandb that `wandb sync` uploads later)
        and `auto` (tensorboard when it is installed, else none). Both need
        ponder[tracking] when named. Empty = metrics.jsonl alone.
    samples_every: every N RL steps, a table of sampled episodes (question, response,
        reward) goes to the trackers (0 = never).
    samples: episodes in that table (the first of the step's batch).
    project: the wandb project name.
    """

    trackers: list = field(default_factory=lambda: ["auto"])
    samples_every: int = 5
    samples: int = 4
    project: str = "ponder"


@dataclass
class ImproveConfig:
    """Rejection-sampling fine-tuning / STaR rounds (`ponder improve`, train/improve.py).

    rounds: sample → keep verified → SFT (section `sft`: steps, batch_size, lr) → evaluate.
    samples: answers sampled per training task each round (K, at rollout.sampling).
    tasks: training tasks per round (the first of the training split; 0 = all).
    rationalize: STaR's rationalisation: a task with no verified sample is retried
        with its answer as a hint; a hinted answer that verifies is kept and trained
        on without the hint.
    hint: the hint appended to the question ({answer}: the first gold answer).
    max_per_task: distinct verified responses kept per task.
    drop_guesses: leave out verified responses whose work does not reach the answer
        (rewards.hacking.answer_guessing): a hint invites writing the answer alone.
    verified: the reward component that says an answer is right (1 = verified).
    eval_episodes: held-out tasks evaluated (greedy) before the first and after each round.
    """

    rounds: int = 3
    samples: int = 4
    tasks: int = 64
    rationalize: bool = True
    hint: str = "(Hint: the answer is {answer}; show the steps that reach it.)"
    max_per_task: int = 2
    drop_guesses: bool = True
    verified: str = "correct"
    eval_episodes: int = 64


@dataclass
class TeacherConfig:
    """teacher: the model that scores the student's tokens (algo.distill_coef).

    model: a ponder run, stage or checkpoint directory, a Hugging Face model directory
        or `smollm2-135m`; or the URL of an OpenAI-compatible server that returns
        prompt logprobs (`ponder serve`, vLLM), e.g. http://127.0.0.1:8000/v1, its key
        in $PONDER_TEACHER_API_KEY; or a mapping {task kind: any of those} for one
        teacher per kind (a kind with none is not distilled), e.g. {math: runs/math,
        search_qa: runs/qa}; with env.kind mixture a key may name a part (its
        kinds `math/…` without a teacher of their own). It must share the student's
        tokenizer (refused otherwise). "" = none.
    dtype: an in-process teacher's weights' dtype (`auto`: the student's).
    served_model: a URL teacher's model name ("" = the server's first).
    loss: how the teacher's scores train the student (ponder.algos.distill):
        `opd` (on-policy distillation: coef x (log p_teacher - log p_student) joins
        each sampled token's advantage), `gkd` (generalised JSD between the full
        next-token distributions at the sampled positions, a loss term weighted by
        algo.distill_coef; in-process teachers) or `topk` (forward KL on the teacher's
        top_k tokens, renormalised; any teacher, a URL one through its top logprobs).
    beta: gkd's interpolation: 0 forward KL, 1 reverse KL, between the JSD (0.5).
    top_k: tokens per position for `topk` (20).
    """

    model: str | dict[str, str] = ""
    dtype: str = "auto"
    served_model: str = ""
    loss: str = "opd"
    beta: float = 0.5
    top_k: int = 20


@dataclass
class Recipe:
    """A whole job: model, environment, rollout, reward, evaluation, training."""

    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    improve: ImproveConfig = field(default_factory=ImproveConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
