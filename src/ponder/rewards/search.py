"""Search usage as a reward component; a negative weight turns it into a cost."""

from __future__ import annotations

import re

from ponder.rewards.qa import exact_match
from ponder.types import Task, Trajectory


def search_calls(trajectory: Trajectory, task: Task) -> float:
    """Number of tool calls named "search" across all turns."""
    return float(sum(call.name == "search" for turn in trajectory.turns for call in turn.tool_calls))


def search_calls_if_correct(trajectory: Trajectory, task: Task) -> float | None:
    """Searches of an episode whose answer is right (exact match), else 0: with a
    negative weight, a cost paid only for efficiency among right answers. A failed
    episode is not cheaper for searching less, so RL is not taught to drop a needed
    second search because most two-search attempts at a hard question fail."""
    correct = exact_match(trajectory, task)
    if correct is None:
        return None
    return search_calls(trajectory, task) * correct


def needs_search(task: Task) -> bool:
    """Whether the task's answer has to be looked up: `metadata["needs_search"]`, true
    when the task does not say (search-QA's in-prompt questions say false; so do the
    tasks of environments without search, for the agent reward's target tools)."""
    return bool(task.metadata.get("needs_search", True))


def searches_needed(task: Task) -> int | None:
    """The searches a task's reference solution makes: one per hop of a question that
    needs search, none when the fact is in the prompt; None when the task does not
    say (no `hops` in its metadata)."""
    if not needs_search(task):
        return 0
    hops = task.metadata.get("hops")
    return len(hops) if isinstance(hops, list) else None


def search_calls_excess(trajectory: Trajectory, task: Task) -> float | None:
    """Searches beyond the ones the task needs (max(0, searches - needed)): with a
    negative weight, a cost for unneeded searches only. A multi-hop question's second
    search costs nothing, a single-hop question's second search and any search of an
    in-prompt question do; the answer reward already pays for the needed ones. None
    for a task that does not say how many searches it needs."""
    needed = searches_needed(task)
    if needed is None:
        return None
    return max(0.0, search_calls(trajectory, task) - needed)


# The lookup counts a planned thought opens with (the search-QA world writes them into
# its oracle demonstrations under env.options.taskgen.plan; ponder.envs.synthetic.with_plan).
PLANS = ("No lookup needed.", "One lookup.", "Two lookups.")
PLAN_OPENING = re.compile(r"\s*<think>\s*(" + "|".join(re.escape(plan) for plan in PLANS) + ")")


def plan_kept(trajectory: Trajectory, task: Task) -> float:
    """1 when the episode's first thought opens with a lookup count (PLANS) and the
    episode then made exactly that many searches; 0 with no count or another number of searches.

    It reads only what the policy wrote and did, never what the task needs, so the
    outcome reward still decides which count pays. With a small positive weight the
    searches are tied to the count written before any search result was seen: a right
    multi-hop answer after "One lookup." and two searches scores below the same answer
    after "Two lookups.", and a second search after "One lookup." pays only where it
    turns a wrong answer right. In the demo it removed single-hop questions' redundant
    second searches; the count itself stayed one for every kind on most seeds
    (docs/results/search-qa.md, "What each change bought")."""
    opening = PLAN_OPENING.match(trajectory.turns[0].action) if trajectory.turns else None
    if opening is None:
        return 0.0
    return float(PLANS.index(opening.group(1)) == search_calls(trajectory, task))
