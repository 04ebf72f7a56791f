"""The staged pipeline's sections (`ponder pipeline run`): a Recipe plus its data, SFT,
selection, continual-learning, agent-reward and DPO settings.

Plain data: imports nothing of ponder beyond the recipe's sections.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ponder.config.sections import Recipe

@dataclass
class DataConfig:
    """Conversational data for the pipeline's `sft` and `dpo` stages (TRL's formats).

    sft_path: JSONL, Parquet or a saved `datasets` directory of rows {"messages",
        "tools"?, "task_type"?}; empty = the warm-up's replayed demonstrations
        (sft.behaviour / sft.oracle_fraction), converted to conversations.
    preference_path: rows {"prompt", "chosen", "rejected"}; empty = sample
        dpo.samples_per_prompt responses per task and rank them with agent_reward.
    tool_style: how tools and tool turns become text: `inline` (the search-QA
        protocol: tool output inside the assistant turn, exactly as the env renders
        it), `hermes` (tools in the system prompt, <tool_call>/<tool_response>) or
        `template` (the tokenizer's own chat template with `tools=`).
    task_weights: task type -> sampling weight of the SFT sampler (missing = 1).
    eval_fraction: share of the SFT examples held out for the eval loss.
    max_examples: cap on SFT examples read (0 = all).
    """

    sft_path: str = ""
    preference_path: str = ""
    tool_style: str = "inline"
    task_weights: dict = field(default_factory=dict)
    eval_fraction: float = 0.1
    max_examples: int = 0


@dataclass
class SFTTrainerConfig:
    """The pipeline's SFT stage on conversations (loss on assistant tokens only).

    steps: optimizer steps.
    batch_size / micro_batch_size: examples per optimizer step, split into
        micro_batch_size chunks (gradient accumulation; the loss is the exact token
        mean over the whole batch).
    lr / warmup_steps / schedule: AdamW peak LR, linear warm-up, then `cosine`,
        `linear` or `constant`.
    max_grad_norm: clip the global gradient norm (0 = off), as optim.max_grad_norm for RL.
    packing: concatenate short examples into one row (off: one example per row).
    eval_every: eval loss on the held-out examples every N steps (0 = only at the end).
    save_every: checkpoint cadence (always at the end).
    """

    steps: int = 0
    batch_size: int = 8
    micro_batch_size: int = 4
    lr: float = 3e-4
    warmup_steps: int = 2
    schedule: str = "cosine"
    max_grad_norm: float = 1.0
    packing: bool = False
    eval_every: int = 0
    save_every: int = 10


@dataclass
class SelectionConfig:
    """Coreset selection of the SFT examples before training.

    strategy: `none`, `random`, `loss_topk` (highest loss under the current
        model), `diversity` (k-center greedy on embeddings) or `hybrid`.
    target_size: examples to keep (0 = keep all, same as `none`).
    embedder: `minilm` (all-MiniLM-L6-v2) or `hashing` (bag of hashed words, no model).
    hybrid_loss_share: share of the target `hybrid` fills by loss, the rest by diversity.
    """

    strategy: str = "none"
    target_size: int = 0
    embedder: str = "minilm"
    hybrid_loss_share: float = 0.5


@dataclass
class ContinualConfig:
    """Continual learning across stages or task families (ponder.train.continual_methods).

    method: `naive` (plain sequential fine-tuning), `replay` (rehearsal), `ewc`,
        `si` (Synaptic Intelligence), `mas` (Memory Aware Synapses), `agem`
        (A-GEM), `derpp` (DER++) or `lora_per_task` (an adapter per family);
        empty = chosen from the fields below: `ewc` when ewc_lambda is positive,
        else `replay` when replay_capacity is, else `naive`.
    replay_capacity: buffer size (reservoir sampling): the rehearsal buffer of
        `replay` (and of `ewc`, `si`, `mas` when > 0), the episodic memory of
        `agem` and `derpp`; 0 = no buffer.
    replay_ratio: share of each batch drawn from the rehearsal buffer once it
        holds examples (`agem` and `derpp` read their memory separately).
    ewc_lambda: EWC penalty weight λ, (λ/2)·Σ F (θ − θ*)² (0 = off).
    fisher_examples: examples of the previous task that estimate EWC's diagonal
        Fisher and MAS's importance.
    si_c: SI's penalty weight c, c·Σ Ω (θ − θ*)².
    si_xi: SI's damping ξ in Ω = ω / (Δ² + ξ).
    mas_lambda: MAS's penalty weight λ, λ·Σ Ω (θ − θ*)².
    memory_batch_size: examples drawn from the memory per step: A-GEM's
        reference-gradient batch, each of DER++'s two batches.
    derpp_alpha: DER++'s weight of the logit-matching (MSE) term.
    derpp_beta: DER++'s weight of the NLL on buffered examples.
    derpp_topk: logits stored per assistant position of a buffered example: its
        top-k (values and ids; 0 = the whole vocabulary).
    lora_router: how `lora_per_task` picks an adapter at evaluation: `task` (the
        family's own) or `centroid` (nearest mean prompt state of the base model).
    lora_merge: merge the per-family adapters at the end with this method of
        `ponder merge` (`linear`, `ties`, `dare_ties` …, on the full task
        vectors) and score the merged model too; empty = no merge.
    lora_merge_density: the merge's kept fraction: TIES's density, DARE's
        1 − drop rate (`ponder merge`'s parameters).
    """

    method: str = ""
    replay_capacity: int = 0
    replay_ratio: float = 0.25
    ewc_lambda: float = 0.0
    fisher_examples: int = 16
    si_c: float = 1.0
    si_xi: float = 1e-3
    mas_lambda: float = 1.0
    memory_batch_size: int = 4
    derpp_alpha: float = 0.5
    derpp_beta: float = 0.5
    derpp_topk: int = 64
    lora_router: str = "task"
    lora_merge: str = ""
    lora_merge_density: float = 1.0


@dataclass
class AgentRewardConfig:
    """Composite agent reward (ponder.rewards.agent): weights, then named penalties.

    completion: the final answer is right (exact match).
    tool_f1: F1 of the called tools against the task's target tools.
    efficiency: optimal steps / steps taken (capped at 1).
    timing: called a tool exactly when one was needed.
    format: protocol compliance.
    wrong_tool, redundant_call, format_error and timeout are penalties (usually
    negative weights), charged per occurrence.
    wrong_tool: a tool outside the targets.
    redundant_call: a repeated call, or calls past the optimal count.
    format_error: a malformed turn.
    timeout: the episode ended without an answer.
    """

    completion: float = 1.0
    tool_f1: float = 0.2
    efficiency: float = 0.2
    timing: float = 0.2
    format: float = 0.1
    wrong_tool: float = -0.2
    redundant_call: float = -0.1
    format_error: float = -0.1
    timeout: float = -0.2


@dataclass
class DPOConfig:
    """Preference optimisation (the pipeline's `dpo` stage).

    The reference is the base model with adapters disabled.
    prompts: training tasks to sample preferences for.
    samples_per_prompt / temperature: K responses each, sampled at temperature; a
        (best, worst) pair is kept only when best > worst by the agent reward.
    loss: `sigmoid`, `hinge` or `ipo`.
    beta: inverse temperature of the implicit reward.
    label_smoothing: assumed share of flipped labels (conservative DPO; sigmoid only).
    reference_free: compare policy log-ratios without the reference.
    rpo_alpha: weight of the chosen response's per-token NLL added to the loss (RPO;
        TRL's rpo_alpha), 0 = plain DPO.
    steps / batch_size / micro_batch_size / lr / warmup_steps: the optimisation
        (pairs per step, cycled when steps need more; cosine schedule).
    max_grad_norm: clip the global gradient norm (0 = off), as optim.max_grad_norm for RL.
    save_every: checkpoint cadence.
    """

    prompts: int = 32
    samples_per_prompt: int = 4
    temperature: float = 1.0
    loss: str = "sigmoid"
    beta: float = 0.1
    label_smoothing: float = 0.0
    reference_free: bool = False
    rpo_alpha: float = 0.0
    steps: int = 8
    batch_size: int = 8
    micro_batch_size: int = 4
    lr: float = 5e-5
    warmup_steps: int = 1
    max_grad_norm: float = 1.0
    save_every: int = 4


@dataclass
class PipelineConfig:
    """The staged pipeline (`ponder pipeline run`).

    stages: in order, from `warmup` (demonstrations of section `sft`, trained
        like `sft`), `sft` (section `sft_trainer`), `dpo` or `rl` (sections
        `train`/`algo`), `eval` (writes the per-stage table). Each training stage
        merges the previous stages' adapters into the base and trains fresh ones.
    eval_before: evaluate the untrained policy first (the table's baseline row).
    eval_each: evaluate on held-out tasks after every training stage.
    out: run directory; each stage writes out/NN-stage/ and a `done.json` marker.
    """

    stages: list = field(default_factory=lambda: ["sft", "dpo", "eval"])
    eval_before: bool = True
    eval_each: bool = True
    out: str = "runs/pipeline"


@dataclass
class PipelineRecipe(Recipe):
    """A Recipe plus the pipeline sections above."""

    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sft_trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    continual: ContinualConfig = field(default_factory=ContinualConfig)
    agent_reward: AgentRewardConfig = field(default_factory=AgentRewardConfig)
    dpo: DPOConfig = field(default_factory=DPOConfig)
