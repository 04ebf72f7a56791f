"""The staged pipeline: warmup → sft → dpo or rl → eval, from one PipelineRecipe.

Each stage writes out/NN-stage/. A training stage starts from the base with the
finished stages' adapters merged in (applied and merged in order, so "adapters
disabled" is the previous stage's policy, the reference DPO and RL KL need), trains
fresh adapters (or every weight when lora.enabled is false), saves them in the
stage directory (PEFT's layout, see models.adapters), then writes `done.json` (its report and, with eval_each, its held-out
evaluation). On a re-run a stage with `done.json` is skipped (its weights are
merged in); an interrupted one resumes from its latest checkpoint.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from ponder.config import PipelineRecipe
from ponder.data import (
    ChatFormatter,
    Conversation,
    PreferencePair,
    TokenizedExample,
    load_conversations,
    load_preferences,
    preference_from_trajectories,
    successful_conversations,
    write_jsonl,
)
from ponder.envs.base import EnvSpec, Opening, opening_of
from ponder.eval.agent_metrics import agent_metrics
from ponder.fileio import write_json_atomic, write_text_atomic
from ponder.jobs.parts import rl_trainer
from ponder.models import Policy, load_policy
from ponder.models.adapters import load_adapter_weights, save_trained
from ponder.models.prepare import fresh_trainable
from ponder.rewards import format_compliance
from ponder.rewards.agent import AgentReward
from ponder.runlog.progress import item_progress
from ponder.train.continual_methods import CONTINUAL_METHODS, ContinualMethod, build_method, check_continual
from ponder.train.dpo import (
    DPOTrainer,
    PreferenceExample,
    sample_preferences,
    with_group_size,
)
from ponder.train.selection import select_coreset
from ponder.train.sft import SFTInputs, SFTTrainer, build_demonstrations, warmup_config
from ponder.wiring import build_env, sft_tasks

STAGES = ("warmup", "sft", "dpo", "rl", "eval")
TRAINING_STAGES = ("warmup", "sft", "dpo", "rl")
DONE = "done.json"
EXAMPLES = "examples.jsonl"  # the warm-up's demonstrations, TRL conversational format
PAIRS = "pairs.jsonl"  # a DPO stage's preference pairs, TRL preference format


@dataclass
class Context:
    """What every stage reads: the recipe, its environment (ponder.wiring), a printer."""

    recipe: PipelineRecipe
    out: Path
    say: Callable[[str], None] = print
    env: EnvSpec | None = None
    stage_results: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    contamination: dict[str, Any] = field(default_factory=dict)  # the check's totals (contamination_data)

    def spec(self, policy: Policy) -> EnvSpec:
        """The environment, built once (every stage's policy shares one tokenizer)."""
        if self.env is None:
            self.env = build_env(self.recipe, policy.tokenizer)
        return self.env

    def train_tasks(self, policy: Policy) -> list:
        return self.spec(policy).train

    def agent_reward(self) -> AgentReward:
        return AgentReward.from_config(self.recipe.agent_reward, format_compliance)

    def factory(self, policy: Policy) -> Callable[[], Any]:
        return self.spec(policy).factory

    def opening(self, policy: Policy, task: Any) -> Opening:
        """What the environment shows at the start of `task`: the conversation's prompt and tools."""
        return opening_of(self.factory(policy)().reset(task))

    def conversations(self, policy: Policy, demos: list, tasks: list) -> list:
        """Successful episodes as TRL conversational rows, prompts and tools as the env showed them."""
        tools = self.opening(policy, tasks[0]).tools if tasks else []
        prompt_of = lambda task: self.opening(policy, task).messages  # noqa: E731
        return successful_conversations(demos, {t.id: t for t in tasks}, prompt_of, tools)


def check_pipeline(recipe: PipelineRecipe) -> None:
    """Fail on a bad stage list or name before any model loads."""
    from ponder.algos.dpo import PREFERENCE_LOSSES
    from ponder.data.format import STYLES
    from ponder.train.rl import check_recipe
    from ponder.train.selection import STRATEGIES

    stages = recipe.pipeline.stages
    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages:
        raise ValueError(f"pipeline.stages: unknown {unknown or 'empty list'}; valid: {', '.join(STAGES)}")
    if "dpo" in stages and "rl" in stages:
        raise ValueError("pipeline.stages: choose `dpo` or `rl`, not both")
    if len(set(stages)) != len(stages):
        raise ValueError(f"pipeline.stages: a stage is listed twice in {stages}")
    PREFERENCE_LOSSES.check(recipe.dpo.loss, "dpo.loss")
    STYLES.check(recipe.data.tool_style, "data.tool_style")
    STRATEGIES.check(recipe.selection.strategy, "selection.strategy")
    _check_continual(recipe)
    check_recipe(recipe)
    # Data files are read once here too: a broken or unusable file fails before any stage writes
    if "sft" in stages and recipe.data.sft_path:
        load_conversations(recipe.data.sft_path, recipe.data.max_examples)
    if "dpo" in stages and recipe.data.preference_path:
        load_preferences(recipe.data.preference_path)


def stage_plan(recipe: PipelineRecipe) -> list[tuple[str, str]]:
    """(stage, directory name) in run order; the base evaluation comes first."""
    names = (["eval-base"] if recipe.pipeline.eval_before else []) + list(recipe.pipeline.stages)
    return [(name, f"{index:02d}-{name}") for index, name in enumerate(names)]


def run_pipeline(
    recipe: PipelineRecipe, out: str | Path, say: Callable[[str], None] = print,
    contamination_embeddings: bool = False,
) -> list[tuple[str, dict]]:  # fmt: skip
    """Run (or resume) every stage; returns [(stage, its evaluation metrics)].
    Before the stages, the training data is checked against the held-out tasks
    (out/contamination.json, one line said; contamination_embeddings adds the
    embedding signal to the n-gram ones)."""
    check_pipeline(recipe)
    ctx = Context(recipe, Path(out), say)
    ctx.out.mkdir(parents=True, exist_ok=True)
    _record_recipe(recipe, ctx.out)
    policy = load_policy(
        recipe.model.name, recipe.model.dtype, recipe.model.device, recipe.model.rope_scaling
    )
    ctx.contamination = check_contamination_of(ctx, policy, contamination_embeddings)
    for name, dirname in stage_plan(recipe):
        stage_dir = ctx.out / dirname
        done = stage_dir / DONE
        if done.is_file():
            say(f"stage {dirname}: done, skipped")
            report = json.loads(done.read_text())
            if name in TRAINING_STAGES:
                policy = merge_stage(policy, stage_dir, recipe)
        else:
            say(f"stage {dirname}: running")
            tick = time.perf_counter()
            policy, report = _run_stage(name, ctx, policy, stage_dir)
            report["wall_s"] = time.perf_counter() - tick
            write_json_atomic(done, report, default=float)
        if "eval" in report:
            ctx.stage_results.append((name.replace("eval-", ""), report["eval"]))
    return ctx.stage_results


def _record_recipe(recipe: PipelineRecipe, out: Path) -> None:
    """Write out/recipe.yaml; a run continued in `out` must have been started with the same recipe."""
    import yaml

    from ponder.config import to_dict

    text = yaml.safe_dump(to_dict(recipe), sort_keys=False)
    saved = out / "recipe.yaml"
    if saved.is_file():
        theirs, ours = yaml.safe_load(saved.read_text()), yaml.safe_load(text)
        changed = [key for key in ours if ours[key] != theirs.get(key)]
        if changed:
            raise ValueError(f"{saved}: the run was started with a different recipe (section {changed[0]}); "
                             "use --overwrite or another --out")  # fmt: skip
        return
    write_text_atomic(saved, text)


def check_contamination_of(ctx: Context, policy: Policy, embeddings: bool = False) -> dict[str, Any]:
    """The training data the stages read (the environment's train split, and the SFT
    and preference files they train on) against the held-out tasks the evaluations
    score; the report in out/, one line said, the totals returned. A continued run
    (same recipe, _record_recipe) keeps the check it started with."""
    from ponder.eval.contamination import summary_line
    from ponder.eval.contamination_data import RUN_REPORT, check_and_write, read_items

    if (ctx.out / RUN_REPORT).is_file():
        return json.loads((ctx.out / RUN_REPORT).read_text())["summary"]
    recipe, spec = ctx.recipe, ctx.spec(policy)
    files = [path for stage, path in (("sft", recipe.data.sft_path), ("dpo", recipe.data.preference_path))
             if stage in recipe.pipeline.stages and path]  # fmt: skip
    more_train = [item for path in files for item in read_items(path, "train")]
    held_out = spec.split(recipe.eval.split)[: recipe.eval.episodes]
    report = check_and_write(spec.train, held_out, ctx.out / RUN_REPORT, embeddings, more_train)
    ctx.say(summary_line(report))
    return report.summary()


def _run_stage(name: str, ctx: Context, policy: Policy, stage_dir: Path) -> tuple[Policy, dict[str, Any]]:
    stage_dir.mkdir(parents=True, exist_ok=True)
    if name == "eval-base":
        return policy, {"eval": evaluate_stage(ctx, policy, stage_dir)}
    if name == "eval":
        table = stage_table_markdown(ctx.stage_results)
        write_text_atomic(stage_dir / "table.md", table)
        write_json_atomic(ctx.out / "results.json", ctx.stage_results, sort_keys=False, default=float)
        return policy, {"table": table}
    torch.manual_seed(ctx.recipe.train.seed)  # the same fresh adapters when an interrupted stage restarts
    trainable = fresh_trainable(policy, ctx.recipe)
    runner = {"warmup": run_warmup, "sft": run_sft, "dpo": run_dpo, "rl": run_rl}[name]
    report = runner(ctx, trainable, stage_dir)
    save_trained(trainable, stage_dir)
    merged = merged_policy(trainable, ctx.recipe, stage_dir)
    if ctx.recipe.pipeline.eval_each:
        report["eval"] = evaluate_stage(ctx, merged, stage_dir)
    return merged, report


def merged_policy(policy: Policy, recipe: PipelineRecipe, stage_dir: Path) -> Policy:
    """The adapters folded into the weights (a plain model again), frozen; the stage's
    directory joins the policy's stack (what later stages' adapters sit on)."""
    model = policy.model.merge_and_unload() if recipe.lora.enabled else policy.model
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    model.eval()
    if not recipe.lora.enabled:  # a full fine-tune is a new base of its own
        return replace(policy, model=model, base=str(stage_dir), stack=())
    return replace(policy, model=model, stack=(*policy.stack, str(stage_dir)))


def merge_stage(policy: Policy, stage_dir: Path, recipe: PipelineRecipe) -> Policy:
    """Apply a finished stage's saved weights to `policy` and merge them in."""
    trainable = fresh_trainable(policy, recipe)
    load_adapter_weights(trainable.model, stage_dir)
    return merged_policy(trainable, recipe, stage_dir)


def evaluate_stage(ctx: Context, policy: Policy, stage_dir: Path) -> dict[str, Any]:
    """Held-out evaluation: the recipe's metrics plus the agent metrics; trajectories saved."""
    from ponder.eval import evaluate, held_out_recipe, save_result

    recipe = held_out_recipe(ctx.recipe)
    with item_progress("eval episodes", recipe.eval.episodes) as advance:
        result = evaluate(recipe, policy=policy, on_episode_done=advance)
    save_result(result, recipe, stage_dir / "eval")
    metrics = {k: v for k, v in result.metrics.items() if isinstance(v, (int, float))}
    if ctx.contamination:  # how far the held-out tasks overlap the training data
        metrics["contamination_flagged"] = ctx.contamination["flagged"]
        metrics["contamination_share"] = ctx.contamination["share"]
    tasks_by_id = {t.id: t for t in result.tasks}
    reward = ctx.agent_reward()
    metrics.update(agent_metrics(result.trajectories, tasks_by_id, reward))
    # per task, so two stages can be compared pairwise on the same held-out tasks
    metrics["per_task_agent_reward"] = {
        t.task_id: reward(t, tasks_by_id[t.task_id])[0] for t in result.trajectories
    }
    ctx.say("  eval: " + ", ".join(f"{k}={metrics[k]:.3f}" for k in ("success", "agent_reward", "reward")))
    return metrics


def _train_tasks(ctx: Context, policy: Policy, count: int, seed: int) -> list:
    from ponder.train.sampler import TaskSampler

    tasks = ctx.train_tasks(policy)
    return TaskSampler(tasks, seed, stratify=True).next_batch(min(count, len(tasks)))


def run_warmup(ctx: Context, policy: Policy, stage_dir: Path) -> dict[str, Any]:
    """The demonstration warm-up (section `sft`) with the SFT trainer's loop."""
    recipe = ctx.recipe
    tasks = sft_tasks(recipe, ctx.spec(policy))
    demos = build_demonstrations(
        tasks, recipe.sft.behaviour, ctx.factory(policy), policy, recipe, recipe.sft.oracle_fraction
    )
    # TRL's conversational format; a later stage's replay buffer / EWC data
    conversations = ctx.conversations(policy, demos, tasks)
    write_jsonl(stage_dir / EXAMPLES, conversations)
    cfg = warmup_config(recipe.sft, recipe.algo.micro_batch_size, recipe.sft_trainer.save_every)
    trainer = SFTTrainer(policy, SFTInputs(demos), cfg, stage_dir, recipe.train.seed)
    start = trainer.resume()
    history = _train_with_progress(trainer, "warm-up steps", cfg.steps)
    return {
        "demonstrations": len(demos),
        "of_tasks": len(tasks),
        "resumed_from": start,
        "last": _last(history),
    }


def sft_examples(ctx: Context, policy: Policy) -> tuple[list, list[TokenizedExample], dict[str, Any]]:
    """The SFT stage's conversations and tokenised examples, with what was skipped."""
    recipe = ctx.recipe
    if recipe.data.sft_path:
        conversations, load = load_conversations(recipe.data.sft_path, recipe.data.max_examples)
        report: dict[str, Any] = {"source": recipe.data.sft_path, "load": load.to_dict()}
    else:
        tasks = _train_tasks(ctx, policy, recipe.data.max_examples or recipe.sft.examples, recipe.train.seed + 1)
        sft = recipe.sft
        demos = build_demonstrations(tasks, sft.behaviour, ctx.factory(policy), policy, recipe, sft.oracle_fraction)
        conversations = ctx.conversations(policy, demos, tasks)
        source = f"{sft.behaviour} demonstrations ({sft.oracle_fraction:.0%} oracle)"
        report = {"source": source, "load": {"read": len(tasks), "kept": len(conversations)}}
    formatter = ChatFormatter(policy.tokenizer, recipe.data.tool_style)
    limit = recipe.rollout.sampling.max_total_tokens
    kept_conversations, examples, too_long = [], [], 0
    for conversation in conversations:
        example = formatter(conversation)
        if len(example.input_ids) > limit or not any(example.loss_mask):
            too_long += 1
            continue
        kept_conversations.append(conversation)
        examples.append(example)
    report["skipped_too_long_or_empty"] = too_long
    if not examples:
        raise ValueError(f"sft: no example fits rollout.sampling.max_total_tokens={limit}")
    return kept_conversations, examples, report


def run_sft(ctx: Context, policy: Policy, stage_dir: Path) -> dict[str, Any]:
    """Conversational SFT: load/convert → hold out eval → coreset → (replay, EWC) → train."""
    recipe = ctx.recipe
    conversations, examples, report = sft_examples(ctx, policy)
    order = list(range(len(examples)))
    random.Random(recipe.train.seed).shuffle(order)
    n_eval = round(recipe.data.eval_fraction * len(order)) if len(order) > 1 else 0
    eval_rows, train_rows = order[:n_eval], order[n_eval:]
    candidates = [conversations[i] for i in train_rows], [examples[i] for i in train_rows]
    kept, report["selection"] = select_coreset(policy, *candidates, recipe.selection, recipe.train.seed)
    inputs = SFTInputs(
        [examples[train_rows[i]] for i in kept],
        [examples[i] for i in eval_rows],
        dict(recipe.data.task_weights),
        pack_tokens=recipe.rollout.sampling.max_total_tokens,
    )  # fmt: skip
    method = _continual(ctx, policy, stage_dir)
    if method is not None:  # rehearsal buffer, its ratio, the method's step hook
        inputs = replace(inputs, **method.sft_inputs())
    trainer = SFTTrainer(policy, inputs, recipe.sft_trainer, stage_dir, recipe.train.seed)
    report["resumed_from"] = trainer.resume()
    history = _train_with_progress(trainer, "SFT steps", recipe.sft_trainer.steps)
    report.update(
        {"train_examples": len(inputs.train), "eval_examples": len(inputs.eval), "last": _last(history)}
    )
    return report


def _check_continual(recipe: PipelineRecipe) -> None:
    """continual.method, for the sft stage: the earlier task is the warm-up, which has
    finished, so a method that must watch its training (SI) or keeps an adapter per
    task (the stages chain adapters already) does not apply."""
    name = check_continual(recipe.continual)
    for trait, why in (("needs_path", "accumulates its importance while the earlier task trains"),
                       ("isolates", "keeps an adapter per task; the stages already train fresh adapters")):  # fmt: skip
        if CONTINUAL_METHODS.trait(name, trait):
            raise ValueError(f"continual.method {name}: {why}, so the pipeline cannot run it after the "
                             "warm-up; use it in a task sequence (docs/guide/pipeline.md)")  # fmt: skip


def _continual(ctx: Context, policy: Policy, stage_dir: Path) -> ContinualMethod | None:
    """The continual-learning method with the warm-up's examples as the earlier task
    (consolidated, in its buffer), when configured and present."""
    cfg = ctx.recipe.continual
    previous = sorted(ctx.out.glob(f"*-warmup/{EXAMPLES}"))
    if not previous or check_continual(cfg) == "naive":
        return None
    # the inline style gives back each episode's exact token ids and loss mask
    formatter = ChatFormatter(policy.tokenizer, "inline")
    examples = [formatter(conversation) for conversation in load_conversations(previous[0])[0]]
    method = build_method(cfg, ctx.recipe.train.seed, ctx.recipe.sft_trainer.micro_batch_size, stage_dir)
    method.begin(policy)
    method.end_family(policy, 0, examples)
    return method


def run_dpo(ctx: Context, policy: Policy, stage_dir: Path) -> dict[str, Any]:
    """Preference pairs (file, or sampled and ranked with the agent reward), then DPO.
    Sampled pairs are kept in TRL's preference format (pairs.jsonl), so an
    interrupted stage trains on the pairs it sampled."""
    recipe = ctx.recipe
    pairs_file, report_file = stage_dir / PAIRS, stage_dir / "pairs-report.json"
    if pairs_file.is_file():
        rows, _ = load_preferences(pairs_file)
        report = json.loads(report_file.read_text())
    else:
        rows, report = _preference_rows(ctx, policy)
        write_json_atomic(report_file, report, default=float)
        write_jsonl(pairs_file, rows)  # last: its presence means both files are complete
    # a sampled pair is re-tokenised exactly as it was generated (inline style)
    style = recipe.data.tool_style if recipe.data.preference_path else "inline"
    formatter = ChatFormatter(policy.tokenizer, style)
    pairs = [_formatted_pair(formatter, row) for row in rows]
    trainer = DPOTrainer(policy, pairs, recipe.dpo, stage_dir, recipe.train.seed)
    report["resumed_from"] = trainer.resume()
    report["last"] = _last(_train_with_progress(trainer, "DPO steps", recipe.dpo.steps))
    return report


def _preference_rows(ctx: Context, policy: Policy) -> tuple[list[PreferencePair], dict[str, Any]]:
    recipe = ctx.recipe
    if recipe.data.preference_path:
        rows, load = load_preferences(recipe.data.preference_path, recipe.data.max_examples)
        return rows, {"source": recipe.data.preference_path, "load": load.to_dict(), "pairs": len(rows)}
    from ponder.rollout import HFBackend, RolloutEngine, build_engine

    rollout = with_group_size(recipe.rollout, recipe.dpo.samples_per_prompt, recipe.dpo.temperature)

    def engine_for(samples: int) -> RolloutEngine:
        backend = HFBackend(policy, rollout.sampling, seed=recipe.train.seed)
        return build_engine(backend, ctx.factory(policy), replace(rollout, group_size=samples))

    tasks = _train_tasks(ctx, policy, recipe.dpo.prompts, recipe.train.seed + 2)
    sampled, report = sample_preferences(policy, tasks, engine_for, ctx.agent_reward(), recipe.dpo)
    by_id = {t.id: t for t in tasks}
    rows = [
        preference_from_trajectories(best, worst, by_id[best.task_id], *_prompt_and_tools(ctx, policy, by_id[best.task_id]))
        for best, worst in sampled
    ]  # fmt: skip
    return rows, report


def _prompt_and_tools(ctx: Context, policy: Policy, task: Any) -> tuple[list, list]:
    opening = ctx.opening(policy, task)
    return opening.messages, opening.tools


def _formatted_pair(formatter: ChatFormatter, row: PreferencePair) -> PreferenceExample:
    def side(messages: list) -> TokenizedExample:
        return formatter(Conversation(row.prompt + messages, row.tools, row.task_type, row.id))

    return PreferenceExample(side(row.chosen), side(row.rejected))


def run_rl(ctx: Context, policy: Policy, stage_dir: Path) -> dict[str, Any]:
    """The RL trainer (any registered estimator) with the agent reward, resumable."""

    trainer = rl_trainer(ctx.recipe, stage_dir, policy=policy, reward=ctx.agent_reward())
    start = trainer.resume()
    _train_with_progress(trainer, "RL steps", ctx.recipe.train.steps)
    return {"resumed_from": start, "steps": trainer.step}


def _train_with_progress(trainer: Any, label: str, steps: int) -> Any:
    """trainer.train(on_step) under a progress bar over the steps still to run."""
    with item_progress(label, max(0, steps - trainer.step)) as advance:
        return trainer.train(advance)


def _last(history: list[dict[str, float]]) -> dict[str, float]:
    return dict(history[-1]) if history else {}


def stage_table_markdown(stages: list[tuple[str, dict[str, Any]]]) -> str:
    """One row per stage (what each stage bought on the held-out tasks), then the
    agent-reward gain of each stage over the one before, paired by task."""
    from ponder.eval.agent_metrics import STAGE_COLUMNS, paired_difference, stage_table_rows

    header = "| stage | " + " | ".join(STAGE_COLUMNS) + " |"
    rule = "|" + "---|" * (len(STAGE_COLUMNS) + 1)
    lines = [header, rule] + ["| " + " | ".join(row) + " |" for row in stage_table_rows(stages)]
    gains = []
    for (before, old), (after, new) in itertools.pairwise(stages):
        per_task = "per_task_agent_reward"
        mean, se, n = paired_difference(old.get(per_task, {}), new.get(per_task, {}))
        if n:
            gains.append(f"| {after} − {before} | {mean:+.3f} | {se:.3f} | {n} |")
    if gains:
        lines += ["", "| agent reward gain | mean | paired se | tasks |", "|---|---|---|---|"] + gains
    return "\n".join(lines) + "\n"
