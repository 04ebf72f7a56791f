"""The demo pipeline on the tiny model: stages, saved SFT weights, and reusing one
warm-up for another RL variant (`--sft-from`)."""

import json
import math
import shutil

import pytest
import torch

from ponder.cli import main
from ponder.config import ConfigError, load_recipe
from ponder.eval import evaluate, held_out_recipe
from ponder.eval.gain import (
    StagePair, load_stage_pair, paired_gain, reward_weights, runs_table, search_split, searches_by_kind, stage_gain,
)
from ponder.fileio import dumps_strict
from ponder.models.adapters import saved_weights
from ponder.train.checkpoint import latest_checkpoint
from ponder.jobs.demo import load_sft_run, run_demo
from ponder.jobs.demo_table import demo_table
from ponder.models.prepare import prepare_policy
from ponder.types import Trajectory, load_trajectories

TINY = [
    "model.name=tiny",
    "env.max_turns=3",
    "env.options.max_invalid_actions=1",
    "env.options.max_obs_tokens=16",
    "env.options.taskgen.n_people=20",
    "env.options.taskgen.n_train=16",
    "env.options.taskgen.n_eval=4",
    "rollout.group_size=2",
    "rollout.batch_size=8",
    "rollout.sampling.max_new_tokens_per_turn=256",  # tiny-tokenizer oracle actions run to ~100 tokens
    "lora.r=4",
    "sft.steps=2",
    "sft.batch_size=2",
    "sft.examples=4",
    "sft.task_kinds=[single_hop]",
    "sft.behaviour=oracle",
    "train.steps=1",
    "train.tasks_per_step=2",
    "train.save_every=1",
    "algo.micro_batch_size=4",
    "eval.episodes=4",
]


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "first"
    results = run_demo(load_recipe(None, TINY), out, say=lambda _: None)
    return out, results


def test_demo_writes_every_stage_and_the_sft_weights(first):
    out, results = first
    assert set(results["stages"]) == {"oracle", "base", "sft", "rl"}
    assert results["stages"]["oracle"]["em"] == 1.0
    assert json.loads((out / "results.json").read_text()) == json.loads(dumps_strict(results))  # strict JSON: NaN -> null
    weights = saved_weights(out / "sft")  # PEFT's layout: adapter_config.json + adapter_model.safetensors
    assert weights and all("lora_" in name for name in weights)
    assert (out / "sft" / "adapter_config.json").is_file()
    for stage in ("oracle", "base", "sft", "rl"):
        assert (out / f"eval-{stage}.parquet").is_file()
    sft, rl = results["stages"]["sft"]["reward"], results["stages"]["rl"]["reward"]
    assert results["rl_gain"]["gain"] == pytest.approx(rl - sft)  # one episode per task: the paired mean
    assert results["verdict"].startswith(f"RL − SFT: {rl - sft:+.3f} (paired se ")


def test_sft_from_reuses_the_warm_up_weights_and_evaluations(first, tmp_path):
    out, results = first
    # group_size is RL-only (evaluation samples one episode per task), so it may differ
    overrides = ["optim.lr=0", "optim.weight_decay=0", "algo.advantage=rloo", "rollout.group_size=3"]
    again = run_demo(load_recipe(None, TINY + overrides), tmp_path / "rloo", say=lambda _: None, sft_from=out)
    for stage in ("oracle", "base", "sft"):  # compared as strict JSON: NaN standard errors are null there
        assert dumps_strict(again["stages"][stage], sort_keys=True) == dumps_strict(results["stages"][stage], sort_keys=True)
        # the reused trajectories are copied, so `ponder gain` can pair them with RL's
        assert (tmp_path / "rloo" / f"eval-{stage}.parquet").read_bytes() == (out / f"eval-{stage}.parquet").read_bytes()
    assert "sft" not in again["timing_s"] and "eval:base" not in again["timing_s"]
    # with lr 0 the RL run's weights are exactly the reused SFT weights
    trained = saved_weights(latest_checkpoint(tmp_path / "rloo" / "rl"))
    sft = saved_weights(out / "sft")
    assert trained.keys() == sft.keys()
    assert all(torch.equal(trained[name], sft[name]) for name in sft)


def test_sft_from_under_a_grammar_reuses_the_weights_and_evaluates_again(first, tmp_path):
    """rollout.constrain reaches no warm-up (it replays demonstrations), so the weights
    are reused; the evaluations were sampled without the grammar, so they run again."""
    out, _ = first
    overrides = ["optim.lr=0", "rollout.constrain.kind=regex", "rollout.constrain.source=<answer>[a-z]{1,4}</answer>"]
    again = run_demo(load_recipe(None, TINY + overrides), tmp_path / "c", say=lambda _: None, sft_from=out)
    assert "sft" not in again["timing_s"] and "eval:base" in again["timing_s"] and "eval:sft" in again["timing_s"]
    episodes = load_trajectories(tmp_path / "c" / "eval-sft.parquet")
    assert all(turn.action.startswith("<answer>") for t in episodes for turn in t.turns)


def test_sft_from_with_another_reward_rescores_the_warm_up_episodes(first, tmp_path):
    """The warm-up's stored episodes scored with the new reward (a reward reads finished
    episodes): the same tokens, new rewards, nothing generated again."""
    out, results = first
    overrides = ["optim.lr=0", "reward.terms.format=0.5"]
    again = run_demo(load_recipe(None, TINY + overrides), tmp_path / "fmt", say=lambda _: None, sft_from=out)
    assert "reuse" in again["timing_s"] and "eval:sft" not in again["timing_s"] and "sft" not in again["timing_s"]
    for stage in ("oracle", "base", "sft"):
        old, new = results["stages"][stage], again["stages"][stage]
        assert new["components"]["format"] == pytest.approx(old["components"]["format"])
        assert new["reward"] == pytest.approx(old["reward"] + 0.4 * old["components"]["format"])  # weight 0.1 -> 0.5
        assert new["rescored_from"] == str(out)
        before = load_trajectories(out / f"eval-{stage}.parquet")
        after = load_trajectories(tmp_path / "fmt" / f"eval-{stage}.parquet")
        assert [t.response_ids for t in after] == [t.response_ids for t in before]
        for b, a in zip(before, after):
            assert a.reward == pytest.approx(b.reward + 0.4 * b.breakdown["format"])


def test_sft_from_with_a_judged_reward_evaluates_the_warm_up_again(first):
    """A self-judge scores with the policy, whose weights differ between the stages: its
    evaluations cannot be re-scored afterwards, they run again."""
    out, _ = first
    judged = load_sft_run(out, load_recipe(None, TINY + ["reward.judge.weight=1", "reward.judge.self_judge=true"]))
    assert judged.stages == {} and not judged.rescore
    assert load_sft_run(out, load_recipe(None, TINY + ["reward.terms.format=0.5"])).rescore


def test_sft_from_with_another_sampler_reuses_the_warm_up(first):
    """The vLLM backend samples the same policy: an RL variant on it reuses the warm-up's
    weights and evaluations; a change to the sampling itself is another warm-up."""
    out, results = first
    sampler = ["rollout.backend=vllm", "rollout.vllm_retries=0", "rollout.vllm_weight_sync=merged"]
    reused = load_sft_run(out, load_recipe(None, TINY + sampler))
    assert sorted(reused.stages) == ["base", "oracle", "sft"] and not reused.rescore
    for stage, metrics in reused.stages.items():  # strict JSON: NaN standard errors are null there
        assert dumps_strict(metrics, sort_keys=True) == dumps_strict(results["stages"][stage], sort_keys=True)
    with pytest.raises(ValueError, match="section 'rollout' differs"):
        load_sft_run(out, load_recipe(None, TINY + ["rollout.sampling.max_new_tokens_per_turn=7"]))
    with pytest.raises(ValueError, match="section 'rollout' differs"):  # the evaluations' sampler
        load_sft_run(out, load_recipe(None, TINY + ["rollout.sampling.dtype=bfloat16"]))
    # the RL update's precision and its sampling temperature (evaluation samples at
    # eval.temperature) are RL's own: the warm-up's weights and evaluations still hold
    assert not load_sft_run(out, load_recipe(None, TINY + ["lora.base_matmul_dtype=bfloat16"])).rescore
    hotter = load_sft_run(out, load_recipe(None, TINY + ["rollout.sampling.temperature=1.3"]))
    assert sorted(hotter.stages) == ["base", "oracle", "sft"] and not hotter.rescore


def test_sft_from_with_more_turns_evaluates_the_warm_up_again(first, tmp_path):
    """More turns per episode: the same SFT weights, evaluations run again."""
    out, results = first
    again = run_demo(load_recipe(None, TINY + ["optim.lr=0", "env.max_turns=5"]), tmp_path / "turns",
                     say=lambda _: None, sft_from=out)  # fmt: skip
    assert "eval:sft" in again["timing_s"] and "sft" not in again["timing_s"]  # evaluated, not trained
    assert again["stages"]["sft"]["episodes"] == results["stages"]["sft"]["episodes"]


def test_sft_from_refuses_a_run_with_another_warm_up(first, tmp_path):
    out, _ = first
    recipe = load_recipe(None, TINY + ["env.options.max_obs_tokens=24"])
    with pytest.raises(ValueError, match=r"recipe.yaml: section 'env' differs from this recipe"):
        run_demo(recipe, tmp_path / "other", say=lambda _: None, sft_from=out)
    with pytest.raises(ValueError, match=r"env.max_turns 2 is below the warm-up's 3"):
        run_demo(load_recipe(None, TINY + ["env.max_turns=2"]), tmp_path / "fewer", say=lambda _: None, sft_from=out)
    kept_out = load_recipe(None, TINY + ["train.val_tasks=2", "train.val_outside_sft=true"])
    with pytest.raises(ValueError, match=r"train.val_outside_sft needs the warm-up to have kept out the same split"):
        run_demo(kept_out, tmp_path / "kept", say=lambda _: None, sft_from=out)  # its warm-up saw every task
    with pytest.raises(FileNotFoundError, match=r"ponder.json: missing; --sft-from needs a finished run"):
        run_demo(load_recipe(None, TINY), tmp_path / "x", say=lambda _: None, sft_from=tmp_path)
    with pytest.raises(ValueError, match=r"rollout.sampling.dtype: unknown 'fp8'"):  # before any work
        run_demo(load_recipe(None, TINY + ["rollout.sampling.dtype=fp8"]), tmp_path / "typo", say=lambda _: None)
    assert not (tmp_path / "typo").exists()


def test_paired_gain_hand_computed():
    g = paired_gain([0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0])
    # differences 1, 0, 0, 1: mean 0.5, sample std sqrt(1/3), se sqrt(1/3)/2
    assert (g.n, g.before, g.after, g.gain) == (4, 0.5, 1.0, 0.5)
    assert g.se_paired == pytest.approx(math.sqrt(1 / 3) / 2)
    assert g.se_unpaired == pytest.approx(math.sqrt(1 / 3) / 2)  # the after-scores do not vary
    assert g.z == pytest.approx(0.5 / (math.sqrt(1 / 3) / 2))


def test_verdict_says_whether_the_gain_is_more_than_two_paired_se():
    from ponder.eval.gain import Gain, paired_by_task, verdict

    helped = verdict(Gain(4, 0.5, 1.0, 0.5, 0.2, 0.3))
    assert helped == "RL − SFT: +0.500 (paired se 0.200, 4 tasks): RL helped on this run (gain > 2 se)"
    assert verdict(Gain(4, 0.5, 0.7, 0.2, 0.2, 0.3)).endswith("within noise on this run (|gain| ≤ 2 se)")
    assert verdict(Gain(4, 0.5, 0.0, -0.5, 0.2, 0.3)).endswith("RL hurt on this run (loss > 2 se)")
    # pairing is by task id, whatever the order of the episodes
    before = [Trajectory("a", [], reward=0.0), Trajectory("b", [], reward=1.0)]
    after = [Trajectory("b", [], reward=1.0), Trajectory("a", [], reward=1.0)]
    assert paired_by_task(before, after).gain == 0.5


def test_paired_gain_invariances():
    before, after = [0.2, 0.9, -0.1, 0.4, 1.1], [0.3, 1.0, 0.5, 0.4, 1.0]
    g = paired_gain(before, after)
    shuffled = paired_gain([before[i] for i in (3, 0, 4, 1, 2)], [after[i] for i in (3, 0, 4, 1, 2)])
    shifted = paired_gain([b + 7 for b in before], [a + 7 for a in after])
    for other in (shuffled, shifted):
        assert other.gain == pytest.approx(g.gain)
        assert other.se_paired == pytest.approx(g.se_paired)
        assert other.se_unpaired == pytest.approx(g.se_unpaired)
    with pytest.raises(ValueError, match="equal lengths, got 5 and 4"):
        paired_gain(before, after[:4])


def test_stage_gain_pools_runs_and_splits_by_kind(first):
    out, results = first
    pair = load_stage_pair(out, "base", "sft")
    assert len(pair.before) == len(pair.after) == results["stages"]["sft"]["episodes"]
    assert [t.task_id for t in pair.before] == [t.task_id for t in pair.after]
    assert pair.needed == [{"single_hop": 1, "multi_hop": 2, "in_prompt": 0}[k] for k in pair.kinds]
    one = stage_gain([pair])
    assert one.before == pytest.approx(results["stages"]["base"]["reward"])
    assert one.after == pytest.approx(results["stages"]["sft"]["reward"])
    twice = stage_gain([pair, pair])  # the same run twice is no new evidence: pooled by task
    assert (twice.n, twice.gain, twice.se_paired) == (one.n, pytest.approx(one.gain), pytest.approx(one.se_paired))
    by_kind = [stage_gain([pair], kind) for kind in sorted(set(pair.kinds))]
    assert sum(g.n for g in by_kind) == one.n
    assert sum(g.gain * g.n for g in by_kind) / one.n == pytest.approx(one.gain)
    with pytest.raises(FileNotFoundError, match="eval-nope.parquet: missing"):
        load_stage_pair(out, "nope", "sft")
    # one reward component instead of the total (`ponder gain --metric em`)
    em = stage_gain([load_stage_pair(out, "base", "sft", metric="em")])
    assert em.before == pytest.approx(results["stages"]["base"]["components"]["em"])
    assert em.after == pytest.approx(results["stages"]["sft"]["components"]["em"])
    with pytest.raises(ValueError, match=r"eval-base.parquet: episode of task '.+' has no reward component 'nope'"):
        load_stage_pair(out, "base", "sft", metric="nope")
    # weights over components (`ponder gain --reward-of RECIPE`): the run's own weights give its totals
    weights = reward_weights(out / "recipe.yaml")
    assert weights == {"em": 1.0, "f1": 0.0, "format": 0.1, "search_cost": -0.05}  # TINY's reward
    own = stage_gain([load_stage_pair(out, "base", "sft", metric=weights)])
    assert (own.before, own.after) == (pytest.approx(one.before), pytest.approx(one.after))
    doubled = stage_gain([load_stage_pair(out, "base", "sft", metric={"em": 2.0, "format": 0.2, "search_cost": -0.2})])
    assert doubled.gain == pytest.approx(2 * one.gain)  # hand-computed: every weight doubled
    with pytest.raises(ValueError, match=r"has no reward component 'plan_kept'"):
        load_stage_pair(out, "base", "sft", metric={**weights, "plan_kept": 0.1})


def test_gain_versus_a_control_reads_the_baseline_from_the_control(first, tmp_path, capsys):
    """--versus: each run's RL evaluation paired with its control's; a control whose RL
    evaluation is this run's SFT one gives exactly the run's RL − SFT gain."""
    out, results = first
    control = tmp_path / "control"
    control.mkdir()
    shutil.copy(out / "recipe.yaml", control / "recipe.yaml")
    shutil.copy(out / "eval-sft.parquet", control / "eval-rl.parquet")
    versus = stage_gain([load_stage_pair(out, "rl", "rl", versus=control)])
    assert versus.gain == pytest.approx(results["rl_gain"]["gain"])
    assert versus.before == pytest.approx(results["stages"]["sft"]["reward"])
    assert main(["gain", str(out), "--versus", str(control)]) == 0
    assert "rl vs control" in capsys.readouterr().out
    assert main(["gain", str(out), str(out), "--versus", str(control)]) == 2
    assert "--versus names 1 run(s) for 2 RUN_DIR(s)" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="eval-sft.parquet: missing"):
        load_stage_pair(out, "sft", "rl", versus=control)


def _scored(task_id: str, reward: float) -> Trajectory:
    return Trajectory(task_id, [1], reward=reward)


def test_stage_gain_clusters_runs_by_task_hand_computed():
    # two seeds from one warm-up: the same "before" episodes, two "after" evaluations
    before = [_scored("a", 0.0), _scored("b", 1.0), _scored("c", 0.0)]
    seed1 = StagePair(before, [_scored("a", 1.0), _scored("b", 1.0), _scored("c", 0.0)], ["k"] * 3)
    seed2 = StagePair(before, [_scored("a", 1.0), _scored("b", 0.0), _scored("c", 1.0)], ["k"] * 3)
    g = stage_gain([seed1, seed2])
    # per task: a 0 -> 1 (+1), b 1 -> 0.5 (-0.5), c 0 -> 0.5 (+0.5); mean 1/3
    # sd of (1, -0.5, 0.5) = sqrt(((2/3)^2 + (5/6)^2 + (1/6)^2) / 2) = sqrt(7/12); se = sqrt(7/36)
    assert (g.n, g.before, g.after) == (3, pytest.approx(1 / 3), pytest.approx(2 / 3))
    assert (g.gain, g.se_paired) == (pytest.approx(1 / 3), pytest.approx(math.sqrt(7 / 36)))
    # pooling the 6 pairs as independent would claim se sqrt(2/3)/sqrt(6) = 1/3 < 0.441
    assert g.se_paired > 0.44
    # invariant to the order of runs and of episodes within a run
    flipped = StagePair(before[::-1], seed2.after[::-1], ["k"] * 3)
    assert stage_gain([flipped, seed1]).se_paired == pytest.approx(g.se_paired)
    # a second sample of the warm-up's evaluation: each task's before averages the two
    # samples, the shared one counted once though two runs carry it
    shared = [StagePair(before, p.after, p.kinds, before_source="warm-up") for p in (seed1, seed2)]
    resampled = [_scored("a", 1.0), _scored("b", 1.0), _scored("c", 1.0)]
    h = stage_gain(shared, None, [("sft-seed-1", resampled)])
    assert (h.n, h.before) == (3, pytest.approx((0.5 + 1.0 + 0.5) / 3))  # a 0|1, b 1|1, c 0|1
    assert h.gain == pytest.approx(2 / 3 - 2 / 3)
    assert stage_gain(shared, "k", [("x", [_scored("z", 1.0)])]).n == 3  # tasks no run evaluated are ignored
    # a sampled group per task (`ponder eval --samples 2`): every episode is one more sample
    group = [_scored("a", 1.0), _scored("a", 1.0), _scored("b", 0.0), _scored("b", 0.0), _scored("c", 1.0)]
    assert stage_gain(shared, None, [("grouped", group)]).before == pytest.approx((2 / 3 + 1 / 3 + 1 / 2) / 3)


def test_searches_by_kind_hand_computed():
    def episodes(counts):
        return [Trajectory(f"t{i}", [], metrics={"searches": float(n)}) for i, n in enumerate(counts)]

    pair = StagePair(episodes([0, 1, 2, 2]), episodes([0, 0, 1, 3]), ["a", "a", "b", "b"])
    assert searches_by_kind([pair], "before") == {"a": 0.5, "b": 2.0}
    assert searches_by_kind([pair], "after", at_least=1) == {"a": 0.0, "b": 1.0}
    assert searches_by_kind([pair], "after", at_least=2) == {"a": 0.0, "b": 0.5}
    # pooling a run with itself changes no share
    assert searches_by_kind([pair, pair], "before", at_least=2) == searches_by_kind([pair], "before", at_least=2)


def test_search_split_separates_needed_from_extra_searches():
    def episodes(counts):
        return [Trajectory(f"t{i}", [], metrics={"searches": float(n)}) for i, n in enumerate(counts)]

    # kinds need 0, 1, 2 searches; before: 1, 2, 1 searches; after: 0, 1, 2
    pair = StagePair(episodes([1, 2, 1]), episodes([0, 1, 2]), ["in", "one", "two"], [0, 1, 2])
    before, after = search_split([pair], "before"), search_split([pair], "after")
    assert before == {"in": (0.0, 1.0), "one": (1.0, 1.0), "two": (1.0, 0.0), None: (2 / 3, 2 / 3)}
    assert after == {"in": (0.0, 0.0), "one": (1.0, 0.0), "two": (2.0, 0.0), None: (1.0, 0.0)}
    # needed + extra is the search count, so pooling a run with itself changes nothing
    assert search_split([pair, pair], "before") == before
    with pytest.raises(ValueError, match="needed searches"):
        search_split([StagePair(pair.before, pair.after, pair.kinds)], "before")


def test_runs_table_has_one_row_per_run_with_its_own_gain():
    def episodes(rewards, searches):
        return [Trajectory(f"t{i}", [], reward=r, metrics={"searches": float(n)})
                for i, (r, n) in enumerate(zip(rewards, searches))]

    better = StagePair(episodes([0.0, 1.0], [1, 1]), episodes([1.0, 1.0], [0, 2]), ["a", "b"])
    worse = StagePair(episodes([1.0, 1.0], [1, 1]), episodes([0.0, 1.0], [1, 1]), ["a", "b"])
    reward, searches = runs_table([better, worse], ["up", "down"], "sft", "rl").renderables
    cells = {column.header: list(column._cells) for column in reward.columns}
    assert cells["run"] == ["up", "down"]
    assert cells["gain"] == ["0.500", "-0.500"]
    cells = {column.header: list(column._cells) for column in searches.columns}
    assert cells["run"] == ["up", "down"]
    assert cells["a"] == ["1.00 → 0.00", "1.00 → 1.00"]
    assert cells["b"] == ["1.00 → 2.00", "1.00 → 1.00"]


def test_sampled_held_out_evaluation_is_seeded_and_differs_from_greedy():
    recipe = load_recipe(None, TINY + ["eval.temperature=1.0"])
    sampled = held_out_recipe(recipe)
    assert sampled.rollout.sampling.temperature == 1.0 and sampled.rollout.group_size == 1
    assert held_out_recipe(load_recipe(None, TINY)).rollout.sampling.temperature == 0.0
    assert sampled.rollout.batch_size == 8  # eval.batch_size 0 = rollout.batch_size
    assert held_out_recipe(load_recipe(None, TINY + ["eval.batch_size=3"])).rollout.batch_size == 3
    policy = prepare_policy(recipe)
    first, again = (evaluate(sampled, policy=policy).trajectories for _ in range(2))
    greedy = evaluate(held_out_recipe(load_recipe(None, TINY)), policy=policy).trajectories
    assert [t.response_ids for t in first] == [t.response_ids for t in again]
    assert [t.response_ids for t in first] != [t.response_ids for t in greedy]
    table = demo_table({"stages": {"base": summarise_stub()}, "eval_temperature": 1.0})
    assert table.title == "held-out tasks (4 episodes, sampled at temperature 1)"


def summarise_stub():
    """A stage's metrics as `ponder demo` stores them (values are arbitrary)."""
    row = {"episodes": 4, "reward": 0.5, "reward_se": 0.1, "em": 0.5, "format": 1.0, "searches_per_episode": 1.0}
    return {**row, "by_kind": {"single_hop": dict(row)}}


def test_negative_eval_batch_size_is_named_before_any_model_loads():
    with pytest.raises(ConfigError, match="key 'eval.batch_size' must be >= 0, got -1"):
        load_recipe(None, TINY + ["eval.batch_size=-1"])  # the recipe's range check, before anything loads
