import itertools

import pytest

from ponder.config import RewardConfig
from ponder.rewards import CompositeReward, score_trajectories
from ponder.rewards.search import plan_kept, search_calls, search_calls_excess, search_calls_if_correct
from ponder.types import Task, ToolCall, Trajectory, Turn


def _episode(task_id="t", answer="the red barn", n_searches=2, tool_name="search"):
    turns = [
        Turn(index=i, action=f"<search>q{i}</search>", tool_calls=[ToolCall(tool_name, {"query": f"q{i}"})])
        for i in range(n_searches)
    ]
    turns.append(Turn(index=n_searches, action=f"<answer>{answer}</answer>", answer=answer))
    return Trajectory(task_id=task_id, prompt_ids=[1], turns=turns)


def test_search_calls_counts_only_search():
    trajectory = _episode(n_searches=3)
    trajectory.turns[1].tool_calls.append(ToolCall("calculator", {"expr": "1+1"}))
    trajectory.turns[2].tool_calls.append(ToolCall("search", {"query": "again"}))
    assert search_calls(trajectory, Task(id="t", question="q", answers=["a"])) == 4.0


def test_search_cost_if_correct_charges_right_answers_only():
    task = Task(id="t", question="q", answers=["red barn"])
    right, wrong = _episode(answer="the red barn", n_searches=2), _episode(answer="blue shed", n_searches=2)
    assert search_calls_if_correct(right, task) == 2.0  # em 1: its two searches
    assert search_calls_if_correct(wrong, task) == 0.0  # em 0: searching less would not pay
    assert search_calls_if_correct(right, Task(id="t", question="q", answers=[])) is None  # no golds
    reward = CompositeReward({"em": 1.0, "format": 0.1, "search_cost_if_correct": -0.1})
    # right: 1 + 0.1 - 0.1*2 = 0.9; wrong: 0 + 0.1 - 0 = 0.1, whatever its searches
    assert reward(right, task)[0] == pytest.approx(0.9)
    assert reward(wrong, task)[0] == pytest.approx(reward(_episode(answer="blue shed", n_searches=0), task)[0])


def test_search_cost_excess_charges_unneeded_searches_only():
    hops = {"hops": [{"r": 1}, {"r": 2}]}
    multi = Task(id="t", question="q", answers=["red barn"], metadata={**hops, "needs_search": True})
    single = Task(id="t", question="q", answers=["red barn"], metadata={"hops": [{"r": 1}], "needs_search": True})
    in_prompt = Task(id="t", question="q", answers=["red barn"], metadata={"hops": [{"r": 1}], "needs_search": False})
    two, three = _episode(n_searches=2), _episode(n_searches=3)
    assert [search_calls_excess(two, t) for t in (multi, single, in_prompt)] == [0.0, 1.0, 2.0]
    assert search_calls_excess(three, multi) == 1.0
    assert search_calls_excess(_episode(n_searches=1), multi) == 0.0  # too few: the answer reward's business
    assert search_calls_excess(two, Task(id="t", question="q", answers=["a"])) is None  # needs search, hops unknown
    reward = CompositeReward({"em": 1.0, "format": 0.1, "search_cost_excess": -0.1})
    # a right multi-hop answer after its two searches: 1 + 0.1, no cost; the same on single-hop: -0.1
    assert reward(two, multi)[0] == pytest.approx(1.1)
    assert reward(two, single)[0] == pytest.approx(1.0)
    # invariance: the cost depends on the search count, not on which turns searched or what
    shuffled = _episode(n_searches=2)
    shuffled.turns[0].tool_calls[0] = ToolCall("search", {"query": "something else"})
    assert search_calls_excess(shuffled, single) == search_calls_excess(two, single)


def _planned(plan, n_searches, answer="the red barn"):
    episode = _episode(answer=answer, n_searches=n_searches)
    episode.turns[0].action = f"<think>{plan} I need the company first.</think>\n" + episode.turns[0].action
    return episode


def test_plan_kept_when_the_searches_match_the_count_written_first():
    task = Task(id="t", question="q", answers=["red barn"], metadata={"hops": [{"r": 1}], "needs_search": True})
    assert plan_kept(_planned("Two lookups.", 2), task) == 1.0
    assert plan_kept(_planned("One lookup.", 1), task) == 1.0
    assert plan_kept(_planned("No lookup needed.", 0), task) == 1.0
    assert plan_kept(_planned("One lookup.", 2), task) == 0.0  # searched again after planning one
    assert plan_kept(_planned("Two lookups.", 1), task) == 0.0
    assert plan_kept(_episode(n_searches=1), task) == 0.0  # no count written
    assert plan_kept(_planned("Three lookups.", 3), task) == 0.0  # not a count the protocol has
    late = _episode(n_searches=1)
    late.turns[1].action = "<think>One lookup.</think>" + late.turns[1].action
    assert plan_kept(late, task) == 0.0  # the count must open the first thought
    assert plan_kept(Trajectory(task_id="t", prompt_ids=[1]), task) == 0.0
    # hand-computed: a right answer after two searches, 1 + 0.1 - 0.1*2, plus 0.1 when it planned two
    reward = CompositeReward({"em": 1.0, "format": 0.1, "search_cost": -0.1, "plan_kept": 0.1})
    assert reward(_planned("Two lookups.", 2), task)[0] == pytest.approx(1.0)
    assert reward(_planned("One lookup.", 2), task)[0] == pytest.approx(0.9)
    # invariance: it reads what the episode did, never what the task needs or the answer
    multi = Task(id="t", question="q", answers=["x"], metadata={"hops": [{"r": 1}, {"r": 2}], "needs_search": True})
    in_prompt = Task(id="t", question="q", answers=["x"], metadata={"needs_search": False})
    for episode in (_planned("One lookup.", 1), _planned("One lookup.", 2), _planned("Two lookups.", 2, "no")):
        assert plan_kept(episode, task) == plan_kept(episode, multi) == plan_kept(episode, in_prompt)


def test_total_is_hand_computed_weighted_sum():
    task = Task(id="t", question="q", answers=["big red barn"])
    reward = CompositeReward({"em": 1.0, "f1": 0.5, "format": 0.1, "search_cost": -0.05})
    total, breakdown = reward(_episode(answer="the red barn"), task)
    # em 0, f1 0.8 (see test_qa), format 1, searches 2:
    # 1*0 + 0.5*0.8 + 0.1*1 - 0.05*2 = 0.4
    assert breakdown == pytest.approx({"em": 0.0, "f1": 0.8, "format": 1.0, "search_cost": 2.0})
    assert total == pytest.approx(0.4)


def test_from_config_reads_weights():
    reward = CompositeReward.from_config(RewardConfig(terms={"em": 2.0, "f1": 0.0, "format": 0.5, "search_cost": -0.1}))
    assert reward.weights == {"em": 2.0, "f1": 0.0, "format": 0.5, "search_cost": -0.1}
    task = Task(id="t", question="q", answers=["barn"])
    total, breakdown = reward(_episode(answer="Barn.", n_searches=1), task)
    # 2*1 + 0*1 + 0.5*1 - 0.1*1 = 2.4; zero-weight f1 is still reported
    assert total == pytest.approx(2.4)
    assert breakdown["f1"] == 1.0


def test_unknown_component_lists_valid_names():
    with pytest.raises(ValueError, match="bleu.*em, f1, format, plan_kept, search_cost"):
        CompositeReward({"em": 1.0, "bleu": 1.0})


def test_none_component_with_weight_makes_total_none():
    task = Task(id="t", question="q", answers=[])
    total, breakdown = CompositeReward({"em": 1.0, "format": 0.1})(_episode(), task)
    assert total is None
    assert breakdown == {"format": 1.0}


def test_none_component_with_zero_weight_is_dropped_but_total_kept():
    task = Task(id="t", question="q", answers=[])
    total, breakdown = CompositeReward({"em": 0.0, "format": 0.1, "search_cost": -0.05})(_episode(), task)
    assert total == pytest.approx(0.1 - 0.1)
    assert breakdown == {"format": 1.0, "search_cost": 2.0}


def test_total_invariant_to_weight_order_and_gold_order():
    golds = ["blue barn", "red barn", "the big red barn house"]
    weights = {"em": 1.0, "f1": 0.5, "format": 0.1, "search_cost": -0.05}
    results = set()
    for gold_order in itertools.permutations(golds):
        task = Task(id="t", question="q", answers=list(gold_order))
        for weight_order in itertools.permutations(weights.items()):
            total, _ = CompositeReward(dict(weight_order))(_episode(answer="red barn"), task)
            results.add(round(total, 12))
    assert results == {round(1.0 + 0.5 + 0.1 - 0.1, 12)}


def test_score_trajectories_fills_in_place():
    tasks = {"a": Task(id="a", question="q", answers=["barn"]), "b": Task(id="b", question="q", answers=[])}
    trajectories = [_episode("a", answer="barn", n_searches=0), _episode("b")]
    score_trajectories(trajectories, tasks, CompositeReward({"em": 1.0, "search_cost": -0.5}))
    assert trajectories[0].reward == 1.0
    assert trajectories[0].breakdown == {"em": 1.0, "search_cost": 0.0}
    assert trajectories[1].reward is None
    assert trajectories[1].breakdown == {"search_cost": 2.0}


def test_score_trajectories_unknown_task():
    with pytest.raises(KeyError, match="zzz"):
        score_trajectories([_episode("zzz")], {}, CompositeReward({"em": 1.0}))


def test_the_reward_config_names_no_environment_s_component():
    import dataclasses

    assert {f.name for f in dataclasses.fields(RewardConfig)} == {"terms", "shaping", "judge"}
    assert CompositeReward.from_config(RewardConfig()).weights == {}  # defaults come from an environment only
    defaults = {"correct": 1.0, "format": 0.1}
    reward = CompositeReward.from_config(RewardConfig(terms={"format": 0.5, "em": 1.0}), {"correct": search_calls}, defaults)
    assert reward.weights == {"correct": 1.0, "format": 0.5, "em": 1.0}  # terms set and add, in that order
