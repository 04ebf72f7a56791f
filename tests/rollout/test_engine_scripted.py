"""The rollout engine with a scripted backend, the real search-QA environment and BM25."""

import dataclasses

import pytest

from ponder.config import RolloutConfig, SamplingConfig
from ponder.envs.data import load_search_qa
from ponder.envs.search_qa import TRUNCATION_MARK, SearchQAEnvFactory, SearchQAOptions, build_messages
from ponder.envs.synthetic import TaskGenConfig
from ponder.models import tiny_tokenizer
from ponder.rewards import exact_match
from ponder.rollout import Generation, RolloutEngine, ScriptedBackend
from ponder.tools.retrieval import build_retriever
from ponder.types import ToolCall, Turn

ROOMY = SamplingConfig(temperature=0.0, max_new_tokens_per_turn=512, max_total_tokens=4096)
UNCLOSED_SEARCH_OBSERVATION = (
    "\n\n<information>error: unclosed <search> (generation cut off?); "
    "search with <search>query</search> or answer with <answer>text</answer></information>\n\n"
)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def data():
    return load_search_qa(SearchQAOptions(taskgen=TaskGenConfig(seed=0, n_people=30, n_train=24, n_eval=4)))


@pytest.fixture(scope="module")
def retriever(data):
    return build_retriever("bm25", data.corpus)


@pytest.fixture(scope="module")
def tasks(data):
    """One task of each kind: two searches, one search, none."""
    first = {}
    for task in data.train:
        first.setdefault(task.kind, task)
    return [first["multi_hop"], first["single_hop"], first["in_prompt"]]


def factory(retriever, tok, max_obs_tokens=256, max_turns=4):
    return SearchQAEnvFactory(
        retriever, topk=2, max_turns=max_turns, max_obs_tokens=max_obs_tokens, tokenizer=tok
    )


def engine(tok, scripts, env_factory, batch_size=3, group_size=2, sampling=ROOMY):
    config = RolloutConfig(batch_size=batch_size, group_size=group_size, sampling=sampling)
    return RolloutEngine(ScriptedBackend(tok, scripts), env_factory, config)


def oracle_scripts(tasks):
    return {task.id: task.oracle_actions for task in tasks}


def prompt_ids(tok, task):
    text = tok.apply_chat_template(build_messages(task), tokenize=False, add_generation_prompt=True)
    return tok.encode(text, add_special_tokens=False)


def without_timings(trajectory):
    """The trajectory with tool wall times zeroed: they are the only run-to-run difference."""
    turns = [
        dataclasses.replace(
            turn, tool_results=[dataclasses.replace(r, elapsed_s=0.0) for r in turn.tool_results]
        )
        for turn in trajectory.turns
    ]
    return dataclasses.replace(trajectory, turns=turns)


def decode_where(tok, trajectory, mask_value):
    ids = [i for i, m in zip(trajectory.response_ids, trajectory.loss_mask) if m == mask_value]
    return tok.decode(ids, skip_special_tokens=False)


@pytest.fixture(scope="module")
def oracle_run(tok, retriever, tasks):
    done = []
    trajectories, stats = engine(tok, oracle_scripts(tasks), factory(retriever, tok)).run(tasks, done.append)
    return trajectories, stats, done


def test_tasks_cover_every_kind(tasks):
    assert [t.kind for t in tasks] == ["multi_hop", "single_hop", "in_prompt"]
    assert [len(t.oracle_actions) for t in tasks] == [3, 2, 1]


def test_mask_separates_actions_from_observations(tok, tasks, oracle_run):
    trajectories, _, _ = oracle_run
    for trajectory in trajectories:
        trajectory.check()
        observations = "".join(turn.observation or "" for turn in trajectory.turns)
        actions = "".join(turn.action for turn in trajectory.turns)
        assert decode_where(tok, trajectory, 0) == observations
        # every oracle action ends on a stop string, so the backend appended no EOS
        assert decode_where(tok, trajectory, 1) == actions
        assert trajectory.old_logprobs == [0.0] * len(trajectory.response_ids)


def test_mask_segments_follow_the_turns_in_order(tok, tasks, oracle_run):
    trajectories, _, _ = oracle_run
    for trajectory in trajectories:
        task = next(t for t in tasks if t.id == trajectory.task_id)
        assert trajectory.prompt_ids == prompt_ids(tok, task)
        assert [turn.action for turn in trajectory.turns] == task.oracle_actions
        position = 0
        for turn in trajectory.turns:
            for text, count, mask_value in [
                (turn.action, turn.n_action_tokens, 1),
                (turn.observation or "", turn.n_observation_tokens, 0),
            ]:
                segment = slice(position, position + count)
                assert trajectory.loss_mask[segment] == [mask_value] * count
                assert tok.decode(trajectory.response_ids[segment], skip_special_tokens=False) == text
                position += count
        assert position == len(trajectory.response_ids)


def test_observations_hold_the_retrieved_gold_facts(tasks, oracle_run):
    trajectories, _, _ = oracle_run
    for trajectory in trajectories:
        task = next(t for t in tasks if t.id == trajectory.task_id)
        searches = [turn for turn in trajectory.turns if turn.tool_calls]
        assert len(searches) == {"multi_hop": 2, "single_hop": 1, "in_prompt": 0}[task.kind]
        for turn in searches:
            assert turn.observation.startswith("\n\n<information>Doc 1 (Title: ")
            assert turn.observation.endswith("</information>\n\n")
            assert TRUNCATION_MARK not in turn.observation
            assert [r.is_error for r in turn.tool_results] == [False]
        for turn, hop in zip(searches, task.metadata["hops"]):
            query = turn.action.split("<search>")[1].split("</search>")[0]
            assert turn.tool_calls[0].arguments == {"query": query}
            # the best hit is the document of the entity searched for, and it states the hop's object
            assert turn.observation.split("\n")[2].startswith(f"<information>Doc 1 (Title: {query}) ")
            assert hop["object"] in turn.observation
        if searches:
            assert task.answers[0] in searches[-1].observation
        assert trajectory.turns[-1].observation is None
        assert trajectory.turns[-1].answer == task.answers[0]


def test_oracle_episodes_score_full_exact_match(tasks, oracle_run):
    trajectories, _, _ = oracle_run
    by_id = {t.id: t for t in tasks}
    assert [exact_match(t, by_id[t.task_id]) for t in trajectories] == [1.0] * 6


def test_order_groups_and_stop_reasons(tasks, oracle_run):
    trajectories, stats, done = oracle_run
    expected_ids = [task.id for task in tasks for _ in range(2)]
    assert [t.task_id for t in trajectories] == expected_ids
    assert [t.group_id for t in trajectories] == expected_ids
    assert [t.stop_reason for t in trajectories] == ["answer"] * 6
    # a deterministic backend gives identical copies
    assert without_timings(trajectories[0]) == without_timings(trajectories[1])
    assert trajectories[0] is not trajectories[1]
    assert stats.episodes == 6 and len(done) == 6
    assert sorted(map(id, done)) == sorted(map(id, trajectories))  # the callback saw each episode once


def test_metrics_equal_hand_counts(tok, tasks, oracle_run):
    trajectories, stats, _ = oracle_run
    for trajectory in trajectories:
        task = next(t for t in tasks if t.id == trajectory.task_id)
        n_searches = len(task.oracle_actions) - 1
        action_tokens = sum(len(tok.encode(a, add_special_tokens=False)) for a in task.oracle_actions)
        assert trajectory.metrics["turns"] == float(len(task.oracle_actions))
        assert trajectory.metrics["searches"] == float(n_searches)  # search-QA's own metric
        assert trajectory.metrics["tool_calls"] == float(n_searches)
        assert trajectory.metrics.get("tool_calls/search", 0.0) == float(n_searches)  # the engine's, per tool
        assert trajectory.metrics["generated_tokens"] == float(action_tokens)
        assert trajectory.metrics["response_tokens"] == float(len(trajectory.response_ids))
        assert trajectory.metrics["prompt_tokens"] == float(len(prompt_ids(tok, task)))
        assert trajectory.metrics["parse_errors"] == 0.0
        assert trajectory.metrics["tool_errors"] == 0.0
        assert trajectory.metrics["answered"] == 1.0
        assert [t.n_action_tokens for t in trajectory.turns] == [
            len(tok.encode(a, add_special_tokens=False)) for a in task.oracle_actions
        ]
    assert stats.generated_tokens == sum(t.metrics["generated_tokens"] for t in trajectories)


def test_observations_are_truncated_to_the_token_budget(tok, retriever, tasks):
    single = tasks[1]
    trajectories, _ = engine(
        tok, oracle_scripts([single]), factory(retriever, tok, max_obs_tokens=16), group_size=1
    ).run([single])
    observation = trajectories[0].turns[0].observation
    content = trajectories[0].turns[0].tool_results[0].content
    assert content.endswith(TRUNCATION_MARK)
    assert len(tok.encode(content.removesuffix(TRUNCATION_MARK), add_special_tokens=False)) <= 16
    assert observation == f"\n\n<information>{content}</information>\n\n"


def test_search_past_max_turns_stops_with_max_turns(tok, retriever, tasks):
    task = tasks[1]
    scripts = {task.id: [f"<search>{task.question} {i}</search>" for i in range(6)]}
    backend = ScriptedBackend(tok, scripts)
    config = RolloutConfig(batch_size=3, group_size=1, sampling=ROOMY)
    (trajectory,), _ = RolloutEngine(backend, factory(retriever, tok, max_turns=4), config).run([task])
    assert trajectory.stop_reason == "max_turns"
    assert len(trajectory.turns) == 4
    assert backend.turns_served == {f"{task.id}#0": 4}
    assert trajectory.turns[-1].observation is None  # nothing is appended after the last action
    assert [t.observation is not None for t in trajectory.turns] == [True, True, True, False]
    assert trajectory.metrics["searches"] == 4.0
    assert trajectory.metrics["answered"] == 0.0
    assert trajectory.loss_mask[-1] == 1  # the response ends on the last action
    assert exact_match(trajectory, task) == 0.0


def test_tiny_token_budget_stops_with_max_tokens(tok, retriever, tasks):
    task = tasks[1]
    n_prompt = len(prompt_ids(tok, task))
    sampling = dataclasses.replace(ROOMY, max_total_tokens=n_prompt + 10)
    (trajectory,), _ = engine(
        tok, oracle_scripts([task]), factory(retriever, tok), group_size=1, sampling=sampling
    ).run([task])
    assert trajectory.stop_reason == "max_tokens"
    assert trajectory.response_ids == tok.encode(task.oracle_actions[0], add_special_tokens=False)[:10]
    assert trajectory.loss_mask == [1] * 10
    assert len(trajectory.turns) == 1
    assert trajectory.turns[0].observation is None  # the observation did not fit
    assert trajectory.turns[0].error is not None  # the cut action was malformed
    assert len(trajectory.prompt_ids) + len(trajectory.response_ids) <= sampling.max_total_tokens


def test_observation_that_does_not_fit_ends_the_episode(tok, retriever, tasks):
    task = tasks[1]
    n_prompt = len(prompt_ids(tok, task))
    n_action = len(tok.encode(task.oracle_actions[0], add_special_tokens=False))
    sampling = dataclasses.replace(ROOMY, max_total_tokens=n_prompt + n_action + 5)
    (trajectory,), _ = engine(
        tok, oracle_scripts([task]), factory(retriever, tok), group_size=1, sampling=sampling
    ).run([task])
    assert trajectory.stop_reason == "max_tokens"
    assert trajectory.loss_mask == [1] * n_action
    assert trajectory.turns[0].action == task.oracle_actions[0]
    assert trajectory.turns[0].tool_calls and trajectory.turns[0].observation is None
    assert trajectory.turns[0].n_observation_tokens == 0


def test_prompt_longer_than_the_budget_generates_nothing(tok, retriever, tasks):
    task = tasks[1]
    sampling = dataclasses.replace(ROOMY, max_total_tokens=len(prompt_ids(tok, task)))
    backend = ScriptedBackend(tok, oracle_scripts([task]))
    config = RolloutConfig(batch_size=2, group_size=2, sampling=sampling)
    trajectories, stats = RolloutEngine(backend, factory(retriever, tok), config).run([task])
    assert [t.stop_reason for t in trajectories] == ["max_tokens", "max_tokens"]
    assert all(t.response_ids == [] and t.turns == [] for t in trajectories)
    assert dict(backend.turns_served) == {}
    assert stats.generated_tokens == 0


def test_malformed_action_gets_an_error_observation_and_the_episode_continues(tok, retriever, tasks):
    task = tasks[1]
    scripts = {task.id: ["<search>unclosed"] + task.oracle_actions}
    (trajectory,), _ = engine(tok, scripts, factory(retriever, tok), group_size=1).run([task])
    first = trajectory.turns[0]
    assert first.action == "<search>unclosed"
    assert first.error.startswith("unclosed <search>")
    assert first.tool_calls == [] and first.tool_results == []
    assert first.observation == UNCLOSED_SEARCH_OBSERVATION
    assert len(trajectory.turns) == 3
    assert trajectory.stop_reason == "answer"
    assert exact_match(trajectory, task) == 1.0
    assert trajectory.metrics["parse_errors"] == 1.0
    assert trajectory.metrics["searches"] == 1.0
    # no stop string in the malformed action: the scripted backend ended it with EOS
    assert first.n_action_tokens == len(tok.encode("<search>unclosed", add_special_tokens=False)) + 1
    assert decode_where(tok, trajectory, 1) == "<search>unclosed<|im_end|>" + "".join(task.oracle_actions)
    assert decode_where(tok, trajectory, 0) == "".join(t.observation or "" for t in trajectory.turns)


def test_max_invalid_actions_ends_the_episode_at_the_nth_malformed_action(tok, retriever, tasks):
    task = tasks[1]  # needs one search: the valid search in between does not count
    scripts = {task.id: ["<search>unclosed", task.oracle_actions[0], "no tags at all", *task.oracle_actions[1:]]}
    env_factory = dataclasses.replace(factory(retriever, tok), max_invalid_actions=2)
    (trajectory,), _ = engine(tok, scripts, env_factory, group_size=1).run([task])
    assert [t.action for t in trajectory.turns] == scripts[task.id][:3]
    assert trajectory.stop_reason == "invalid"
    assert trajectory.turns[-1].observation is None and trajectory.final_answer is None
    assert trajectory.metrics["parse_errors"] == 2.0


class BrokenRetriever:
    """A retriever whose index is gone."""

    def __init__(self) -> None:
        self.calls = 0

    def search(self, queries, topk):
        self.calls += 1
        raise RuntimeError("index offline")


def test_failing_retriever_gives_an_error_observation(tok, tasks):
    task = tasks[1]
    broken = BrokenRetriever()
    (trajectory,), _ = engine(tok, oracle_scripts([task]), factory(broken, tok), group_size=1).run([task])
    first = trajectory.turns[0]
    assert broken.calls == 1
    assert (
        first.observation
        == "\n\n<information>error: search raised RuntimeError: index offline</information>\n\n"
    )
    assert [(r.is_error, r.name) for r in first.tool_results] == [(True, "search")]
    assert trajectory.stop_reason == "answer"  # the episode went on to its next scripted turn
    assert trajectory.metrics["tool_errors"] == 1.0
    assert trajectory.metrics["searches"] == 1.0


class CountingBackend:
    """Records the requests of every generate call, then lets a ScriptedBackend answer."""

    def __init__(self, inner: ScriptedBackend) -> None:
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.calls: list[list[str]] = []

    def generate(self, requests, stop_strings):
        self.calls.append([r.key for r in requests])
        return self.inner.generate(requests, stop_strings)


@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_small_batches_run_every_episode_exactly_once(tok, retriever, tasks, oracle_run, batch_size):
    backend = CountingBackend(ScriptedBackend(tok, oracle_scripts(tasks)))
    config = RolloutConfig(batch_size=batch_size, group_size=2, sampling=ROOMY)
    done = []
    trajectories, stats = RolloutEngine(backend, factory(retriever, tok), config).run(tasks, done.append)
    assert all(1 <= len(call) <= batch_size for call in backend.calls)
    requests = [key for call in backend.calls for key in call]
    expected = {f"{task.id}#{s}": len(task.oracle_actions) for task in tasks for s in range(2)}
    assert {key: requests.count(key) for key in set(requests)} == expected
    assert all(len(set(call)) == len(call) for call in backend.calls)  # one action per episode per round
    assert len(done) == 6 and stats.episodes == 6
    # batching does not change any episode
    assert list(map(without_timings, trajectories)) == list(map(without_timings, oracle_run[0]))


def test_batch_is_refilled_as_episodes_finish(tok, retriever, tasks):
    backend = CountingBackend(ScriptedBackend(tok, oracle_scripts(tasks)))
    config = RolloutConfig(batch_size=2, group_size=2, sampling=ROOMY)
    RolloutEngine(backend, factory(retriever, tok), config).run(tasks)
    # 14 actions in all, 2 per call while at least 2 episodes remain
    multi, single, in_prompt = (f"{t.id}" for t in tasks)
    assert backend.calls == [
        [f"{multi}#0", f"{multi}#1"],
        [f"{multi}#0", f"{multi}#1"],
        [f"{multi}#0", f"{multi}#1"],
        [f"{single}#0", f"{single}#1"],
        [f"{single}#0", f"{single}#1"],
        [f"{in_prompt}#0", f"{in_prompt}#1"],
    ]


def test_per_sample_scripts_override_the_task_script(tok, retriever, tasks):
    task = tasks[1]
    scripts = {task.id: task.oracle_actions, f"{task.id}#1": ["<answer>wrong</answer>"]}
    trajectories, _ = engine(tok, scripts, factory(retriever, tok), group_size=3).run([task])
    assert [len(t.turns) for t in trajectories] == [2, 1, 2]
    assert [exact_match(t, task) for t in trajectories] == [1.0, 0.0, 1.0]
    assert {t.group_id for t in trajectories} == {task.id}


def test_running_out_of_script_raises(tok, retriever, tasks):
    task = tasks[1]
    with pytest.raises(IndexError, match=f"no turn 1 for episode '{task.id}#0'"):
        engine(tok, {task.id: task.oracle_actions[:1]}, factory(retriever, tok), group_size=1).run([task])


class AnswerBackend:
    """Answers every request at once, whatever the episode: a policy that never searches."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.requests = 0

    def generate(self, requests, stop_strings):
        self.requests += len(requests)
        ids = self.tokenizer.encode("<answer>x</answer>", add_special_tokens=False)
        return [Generation(list(ids), [0.0] * len(ids), "<answer>x</answer>", "stop") for _ in requests]


def test_a_task_listed_twice_is_rolled_out_twice(tok, retriever, tasks):
    backend = AnswerBackend(tok)
    config = RolloutConfig(batch_size=4, group_size=1, sampling=ROOMY)
    done = []
    try:
        trajectories, stats = RolloutEngine(backend, factory(retriever, tok), config).run(
            [tasks[0], tasks[0]], done.append
        )
    except ValueError:
        return  # rejecting duplicate task ids up front is a fix too
    assert backend.requests == 2 and len(done) == 2
    assert len(trajectories) == 2
    assert trajectories[0] is not trajectories[1]
    assert stats.episodes == 2


def test_each_search_s_cost_is_the_reward_of_the_turn_that_searched(tok, retriever, tasks):
    """Turn-level credit reads the search cost where it was spent, from the environment."""
    costly = dataclasses.replace(factory(retriever, tok), search_cost=-0.1)
    trajectories, _ = engine(tok, oracle_scripts(tasks), costly).run(tasks)
    for trajectory in trajectories:
        searches = [sum(c.name == "search" for c in turn.tool_calls) for turn in trajectory.turns]
        assert [turn.reward for turn in trajectory.turns] == pytest.approx([-0.1 * n for n in searches])
    assert any(turn.reward for t in trajectories for turn in t.turns)  # some oracle episodes search


class TwoToolEnv:
    """Not search-QA: each action calls the tools its words name; it counts `lookups` itself."""

    stop_strings: list = []

    def reset(self, task):
        self.turns = 0
        return [{"role": "user", "content": task.question}]

    def step(self, action):
        self.turns += 1
        calls = [ToolCall(name) for name in action.split()]
        done = self.turns == 2
        info = {"turn": Turn(self.turns - 1, action, tool_calls=calls), "metrics": {"lookups": 0.5 * len(calls)}}
        return (None if done else "ok"), done, info


def test_tool_calls_are_counted_per_tool_name_and_the_env_adds_its_own_metrics(tok, tasks):
    task = tasks[0]
    scripts = {task.id: ["calc calc notes", "search"]}
    (trajectory,), _ = engine(tok, scripts, TwoToolEnv, group_size=1).run([task])
    metrics = trajectory.metrics
    assert metrics["tool_calls"] == 4.0
    assert (metrics["tool_calls/calc"], metrics["tool_calls/notes"], metrics["tool_calls/search"]) == (2.0, 1.0, 1.0)
    assert metrics["lookups"] == 2.0  # 0.5 x 3 calls, then 0.5 x 1: summed over the turns
    assert "searches" not in metrics  # the engine names no environment's counts
