"""The demo pipeline: evaluate → SFT warm-up → evaluate → RL → evaluate, all on the
same held-out tasks, with the oracle's score as the ceiling."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ponder.config import Recipe, load_recipe, save_recipe, to_dict
from ponder.eval import evaluate, held_out_recipe, summarise
from ponder.eval.contamination import summary_line
from ponder.eval.contamination_data import RUN_REPORT, check_and_write
from ponder.eval.gain import paired_by_task, verdict
from ponder.fileio import atomic_path, write_json_atomic
from ponder.jobs.parts import rl_trainer, warm_up
from ponder.models.adapters import MANIFEST, load_adapter_weights
from ponder.models.memory import peak_memory, release_memory
from ponder.models.prepare import prepare_policy
from ponder.rewards import score_trajectories
from ponder.rundir import RunDirError, recipe_changes
from ponder.runlog.plot import plot_run, plot_stages
from ponder.runlog.progress import item_progress, training_progress
from ponder.train.rl import check_recipe
from ponder.types import load_trajectories, save_trajectories
from ponder.wiring import build_env, build_reward

STAGES = ("base", "sft", "rl", "oracle")
# Each stage's metrics and time, rewritten as each one ends: what --resume reuses.
STAGES_FILE = "stages.json"


def run_demo(
    recipe: Recipe, run_dir: str | Path, say: Callable[[str], None] = print, sft_from: str | Path | None = None,
    resume: bool = False, skip_oracle: bool = False, contamination_embeddings: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Run every stage; writes results.json, recipe.yaml, metrics and plots to run_dir.

    sft_from: a finished demo run whose SFT weights and before/after-SFT evaluations
    are reused (its recipe must match in everything but the RL settings), so RL
    variants can be compared from one warm-up.
    resume: continue the demo in run_dir, made with the same recipe: the stages it
    measured (evaluations with their episodes, the finished SFT warm-up) are reused,
    RL resumes from its latest checkpoint, and only what is missing runs.
    skip_oracle: leave the oracle's evaluation (the ceiling) out.
    contamination_embeddings: the contamination check of the training split against the
    held-out tasks (run_dir/contamination.json, one line said, its totals in results.json)
    adds the embedding signal to its n-gram ones.
    """
    check_recipe(recipe)  # a typo fails here, not at the stage that reads it
    run_dir = Path(run_dir)
    if resume and sft_from is not None:
        raise ValueError("--sft-from starts a new demo; give it without --resume")
    done = measured_stages(run_dir, recipe) if resume else {"stages": {}, "timing_s": {}}
    previous = load_sft_run(sft_from, recipe) if sft_from is not None else None
    run_dir.mkdir(parents=True, exist_ok=True)
    save_recipe(recipe, run_dir / "recipe.yaml")
    started = time.perf_counter()
    policy = prepare_policy(recipe)
    eval_recipe = held_out_recipe(recipe)
    results: dict[str, Any] = {"stages": {}, "timing_s": {}, "eval_temperature": recipe.eval.temperature}
    results["memory/peak_gb"] = {}  # each stage's end: the process's peaks so far (ponder estimate --versus)
    results["contamination"] = _contamination(eval_recipe, policy, run_dir, say, contamination_embeddings)

    def stage(name: str, fn: Callable[[], Any]) -> Any:
        tick = time.perf_counter()
        say(f"{name} …")
        value = fn()
        results["memory/peak_gb"][name] = peak_memory()
        release_memory()
        results["timing_s"][name] = time.perf_counter() - tick
        return value

    def record() -> None:
        write_json_atomic(run_dir / STAGES_FILE, {"stages": results["stages"], "timing_s": results["timing_s"]})

    def held_out(name: str, oracle: bool = False) -> None:
        if name in done["stages"] and (run_dir / f"eval-{name}.parquet").is_file():  # --resume: measured
            metrics = results["stages"][name] = done["stages"][name]
            results["timing_s"][f"eval:{name}"] = done["timing_s"].get(f"eval:{name}", 0.0)
            say(f"eval {name}: reward {metrics['reward']:.3f} (measured before, reused)")
            record()
            return
        with item_progress(f"eval {name}", eval_recipe.eval.episodes) as advance:
            result = stage(f"eval:{name}", lambda: evaluate(eval_recipe, policy, advance, oracle=oracle))
        save_trajectories(result.trajectories, run_dir / f"eval-{name}.parquet")
        metrics = results["stages"][name] = result.metrics
        parts = [f"{key} {value:.3f}" for key, value in metrics.get("components", {}).items() if value == value]
        say(f"eval {name}: reward {metrics['reward']:.3f}  " + "  ".join(parts[:4]))
        record()

    if previous is not None and previous.stages:
        results["stages"].update(stage("reuse", lambda: _reused_evaluations(previous, run_dir, recipe, policy)))
    else:  # a fresh run, or a reused warm-up whose episodes would differ: evaluate again
        if not skip_oracle:
            held_out("oracle", oracle=True)
        held_out("base")
    if previous is not None:
        load_adapter_weights(policy.model, previous.weights)
        results["sft_from"] = str(sft_from)
        if not previous.stages:
            held_out("sft")
    elif recipe.sft.steps > 0:
        if resume and (run_dir / "sft" / MANIFEST).is_file():  # warmed up before the demo stopped
            load_adapter_weights(policy.model, run_dir / "sft")
            results["timing_s"]["sft"] = done["timing_s"].get("sft", 0.0)
            say("sft: warmed up before, reused")
        else:
            shutil.rmtree(run_dir / "sft", ignore_errors=True)  # a warm-up cut short (only under --resume)
            with item_progress("SFT steps", recipe.sft.steps) as advance:
                stage("sft", lambda: warm_up(recipe, policy, run_dir / "sft", advance))
            record()
        held_out("sft")
    if recipe.train.steps > 0:
        if "rl" in done["stages"] and (run_dir / "eval-rl.parquet").is_file():  # trained and measured
            results["timing_s"]["rl"] = done["timing_s"].get("rl", 0.0)
        else:
            stage("rl", lambda: _train_rl(recipe, run_dir / "rl", policy, resume))
        held_out("rl")
        if "sft" in results["stages"]:
            results.update(_rl_gain(run_dir))
        plot_run(run_dir)  # the RL and SFT curves, each in its stage's plots/
    results["timing_s"]["total"] = time.perf_counter() - started
    plot_stages(results, run_dir / "stages.png")
    write_json_atomic(run_dir / "results.json", results)
    return results


def _contamination(recipe: Recipe, policy: Any, run_dir: Path, say: Callable[[str], None],
                   embeddings: bool) -> dict[str, Any]:  # fmt: skip
    """The training split against the held-out tasks the evaluations score: the report
    in run_dir, one line said, the totals returned."""
    with build_env(recipe, policy.tokenizer) as spec:  # for its tasks; no episode runs
        train, held_out = spec.train, spec.split(recipe.eval.split)[: recipe.eval.episodes]
    report = check_and_write(train, held_out, run_dir / RUN_REPORT, embeddings)
    say(summary_line(report))
    return report.summary()


def measured_stages(run_dir: Path, recipe: Recipe) -> dict[str, Any]:
    """What a demo in run_dir measured ({"stages", "timing_s"}: STAGES_FILE, or the
    results.json of a finished one), after checking it ran `recipe` (--resume)."""
    saved = run_dir / "recipe.yaml"
    if not saved.is_file():
        raise RunDirError(f"{run_dir}: no demo to resume (no recipe.yaml); start it without --resume")
    changes = recipe_changes(to_dict(load_recipe(saved)), to_dict(recipe), allowed=())
    if changes:
        more = f" (and {len(changes) - 1} more)" if len(changes) > 1 else ""
        raise RunDirError(f"--resume with a changed recipe: {changes[0]}{more}; give the recipe and overrides "
                          f"of {saved}, or reuse its warm-up for other RL settings with --sft-from {run_dir} "
                          "--out NEW")  # fmt: skip
    for name in (STAGES_FILE, "results.json"):
        if (run_dir / name).is_file():
            record = json.loads((run_dir / name).read_text())
            return {"stages": record.get("stages", {}), "timing_s": record.get("timing_s", {})}
    return {"stages": {}, "timing_s": {}}


def _rl_gain(run_dir: Path) -> dict[str, Any]:
    """RL's paired gain over SFT on the held-out tasks, and the one-line verdict."""
    before, after = (load_trajectories(run_dir / f"eval-{stage}.parquet") for stage in ("sft", "rl"))
    gain = paired_by_task(before, after)
    summary = {"gain": gain.gain, "se_paired": gain.se_paired, "n": gain.n}
    return {"rl_gain": summary, "verdict": verdict(gain)}


def _reused_evaluations(previous: _SFTRun, run_dir: Path, recipe: Recipe, policy: Any) -> dict[str, Any]:
    """The warm-up's evaluations, their episodes copied into run_dir (so `ponder gain
    RUN_DIR` pairs them with RL's) or, with another reward, re-scored with `recipe`'s
    (a reward reads finished episodes; generation never saw it). Their metrics."""
    if not previous.rescore:
        for name in previous.stages:
            if (previous.source / f"eval-{name}.parquet").is_file():
                with atomic_path(run_dir / f"eval-{name}.parquet") as tmp:
                    shutil.copyfile(previous.source / f"eval-{name}.parquet", tmp)
        return previous.stages
    with build_env(recipe, policy.tokenizer) as spec:  # for its tasks and reward; no episode runs
        tasks_by_id = {task.id: task for task in spec.eval}
        reward = build_reward(recipe, spec, policy)
        stages = {}
        for name, metrics in previous.stages.items():
            trajectories = load_trajectories(previous.source / f"eval-{name}.parquet")
            score_trajectories(trajectories, tasks_by_id, reward)
            save_trajectories(trajectories, run_dir / f"eval-{name}.parquet")
            stages[name] = {**metrics, **summarise(trajectories, tasks_by_id), "rescored_from": str(previous.source)}
    return stages


@dataclass
class _SFTRun:
    source: Path  # the warm-up's run directory
    weights: Path  # the SFT stage's adapter directory
    stages: dict[str, Any]  # its evaluations; empty when they must run again
    rescore: bool = False  # scored with another reward: re-score its stored episodes


# Sections an RL variant may change when it reuses another run's warm-up (tracking
# only says where metrics go; a changed reward re-scores the warm-up's evaluations),
# and single keys of other sections: group_size (evaluation always samples one
# episode per task), the sampling temperature (evaluation samples at eval.temperature)
# and the sampler (the backend draws from the same policy; the warm-up's evaluations
# stay the ones it made, and the RL stage's are made by the new backend: `ponder eval`
# the result to compare with one sampler).
RL_SECTIONS = ("algo", "optim", "train", "tracking", "reward", "teacher")  # teacher: scores RL episodes only
RL_KEYS = {"rollout": ("group_size", "backend", "vllm_weight_sync", "vllm_url", "vllm_python",
                       "vllm_timeout_s", "vllm_retries", "vllm_start_timeout_s", "sampling.temperature",
                       "constrain"),  # the warm-up replays demonstrations: no grammar reaches it
           "lora": ("base_matmul_dtype",)}  # the training products' precision, not the adapter


def _warm_up_settings(recipe: dict[str, Any]) -> dict[str, Any]:
    """The recipe (as a dict) without what only RL reads (`a.b` names a nested key)."""
    kept = {name: dict(section) for name, section in recipe.items() if name not in RL_SECTIONS}
    for name, keys in RL_KEYS.items():
        for key in keys:
            *parents, leaf = key.split(".")
            node = kept.get(name, {})
            for parent in parents:  # copied on the way down: the recipe itself is left as it was
                node[parent] = node = dict(node.get(parent) or {})
            node.pop(leaf, None)
    return kept


def _kept_out(train: dict[str, Any]) -> tuple | None:
    """What decides the validation split a warm-up left out of its demonstrations."""
    return (train["val_tasks"], sorted(train["task_kinds"])) if train["val_outside_sft"] else None


def _more_turns(theirs: dict[str, Any], ours: dict[str, Any], run_dir: Path) -> bool:
    """Whether `ours` allows more turns per episode than the warm-up's recipe, with
    env.max_turns then set equal in both (in place). More turns leave the warm-up's
    demonstrations as they were (a demonstration ends on its answer, within the old
    limit) but change what an episode may do, so its evaluations are run again; fewer
    turns could have cut a demonstration short and are refused."""
    mine, saved = ours.get("env", {}).get("max_turns"), theirs.get("env", {}).get("max_turns")
    if mine is None or saved is None or mine == saved:
        return False
    if mine < saved:
        raise ValueError(f"{run_dir / 'recipe.yaml'}: env.max_turns {mine} is below the warm-up's {saved}; "
                         "reuse allows more turns, not fewer")  # fmt: skip
    ours["env"]["max_turns"] = saved
    return True


def warm_up_weights(run_dir: str | Path, recipe: Recipe) -> tuple[Path, bool]:
    """A run's SFT weights (RUN_DIR/sft) and whether `recipe` allows more turns than
    its warm-up did, after checking that its recipe differs from `recipe` only in RL
    settings (RL_SECTIONS, RL_KEYS) and perhaps a larger env.max_turns."""
    run_dir = Path(run_dir)
    weights = _sft_weights(run_dir)
    for path in (weights / MANIFEST, run_dir / "recipe.yaml"):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing; --sft-from needs a finished run with an SFT stage")
    # through load_recipe: keys added to ponder since that run was saved take their defaults
    saved = to_dict(load_recipe(run_dir / "recipe.yaml"))
    if recipe.train.val_outside_sft and _kept_out(saved["train"]) != _kept_out(to_dict(recipe)["train"]):
        raise ValueError(f"{run_dir / 'recipe.yaml'}: train.val_outside_sft needs the warm-up to have kept out the "
                         "same split (train.val_outside_sft, val_tasks and task_kinds as this recipe's)")  # fmt: skip
    theirs = _warm_up_settings(saved)
    ours = _warm_up_settings(to_dict(recipe))
    more_turns = _more_turns(theirs, ours, run_dir)
    for section in ours:
        if ours[section] != theirs.get(section):
            raise ValueError(f"{run_dir / 'recipe.yaml'}: section '{section}' differs from this recipe; reuse needs the same warm-up")
    return weights, more_turns


def _sft_weights(run_dir: Path) -> Path:
    """RUN_DIR/sft, or for a demo that itself started from another run's warm-up
    (results.json's `sft_from`, whose weights it did not copy) that run's."""
    seen = set()
    while not (run_dir / "sft" / MANIFEST).is_file() and (run_dir / "results.json").is_file():
        seen.add(run_dir.resolve())
        source = json.loads((run_dir / "results.json").read_text()).get("sft_from")
        if not source or Path(source).resolve() in seen:
            break
        run_dir = Path(source)
    return run_dir / "sft"


def copy_warm_up(weights: Path, run_dir: Path) -> Path:
    """Copy a warm-up's weights into RUN_DIR/sft (whole or not at all), so the run
    resumes from them like from its own warm-up."""
    target = run_dir / "sft"
    partial = run_dir / "sft.partial"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(weights, partial)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


def load_sft_run(run_dir: str | Path, recipe: Recipe) -> _SFTRun:
    """The SFT weights and pre-RL evaluations of a finished demo run (or of a shared
    warm-up, train/shared_warmup.py, whose evaluations run again), after checking
    that its recipe differs from `recipe` only in RL settings (RL_SECTIONS, RL_KEYS)
    and perhaps a larger env.max_turns (then its weights are reused and its
    evaluations run again). With another reward its evaluations' stored episodes
    are re-scored (run again when a judge model scores them)."""
    run_dir = Path(run_dir)
    weights, more_turns = warm_up_weights(run_dir, recipe)
    results = run_dir / "results.json"
    # A warm-up with no evaluations (`ponder warmup`'s, or `ponder train`'s run), episodes
    # that may now run longer, or another grammar to sample them under (rollout.constrain):
    # the evaluations run again.
    saved = to_dict(load_recipe(run_dir / "recipe.yaml"))
    if not results.is_file() or more_turns or saved["rollout"]["constrain"] != to_dict(recipe)["rollout"]["constrain"]:
        return _SFTRun(run_dir, weights, {})
    stages = json.loads(results.read_text())["stages"]
    kept = {name: stages[name] for name in ("oracle", "base", "sft") if name in stages}
    if saved["reward"] == to_dict(recipe)["reward"]:
        return _SFTRun(run_dir, weights, kept)
    # Another reward: the same episodes, re-scored, unless a judge model scores them
    # (a self-judge is the policy, whose weights differ between the stages), or an
    # evaluation's episodes were not kept.
    stored = all((run_dir / f"eval-{name}.parquet").is_file() for name in kept)
    if recipe.reward.judge.weight == 0 and not recipe.reward.judge.self_judge and kept and stored:
        return _SFTRun(run_dir, weights, kept, rescore=True)
    return _SFTRun(run_dir, weights, {})


def _train_rl(recipe: Recipe, run_dir: Path, policy: Any, resume: bool = False) -> None:
    """RL from `policy`; resume: from run_dir's latest checkpoint, when there is one."""
    trainer = rl_trainer(recipe, run_dir, policy=policy)
    start = trainer.resume() if resume else 0
    with training_progress(recipe.train.steps, start) as on_step:
        trainer.train(on_step)
