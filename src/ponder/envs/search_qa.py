"""Search-R1-style question answering: the model thinks, may `<search>` (results come
back in `<information>`), and ends with `<answer>`.

The environment knows no generation backend: it turns an action's text into an
observation through the shared tool step (parse → validate → call → observe).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ponder.config import Recipe
from ponder.envs.base import EnvContext, EnvSpec, Opening, register_env
from ponder.tools import Tool, ToolRegistry, run_tool_step
from ponder.tools.parsers import SearchR1Parser
from ponder.tools.builtin import make_corpus_search_tool
from ponder.tools.retrieval import Retriever
from ponder.types import Task

INSTRUCTIONS = (
    "Answer the question. Think in <think></think>. To look a fact up, write "
    "<search>query</search>; results come back in <information></information>. "
    "Give the final answer as <answer>answer</answer>, e.g. <answer>Paris</answer>."
)
TRUNCATION_MARK = " …[truncated]"


def search_tool(retriever: Retriever, topk: int) -> Tool:
    """The environment's `search` tool: the built-in corpus search over `retriever`."""
    return make_corpus_search_tool(retriever, topk, name="search")


def token_truncator(tokenizer: Any, max_tokens: int) -> Callable[[str], str]:
    """Cut text to max_tokens tokens of `tokenizer`, marking the cut."""

    def truncate(text: str) -> str:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= max_tokens:
            return text
        return tokenizer.decode(ids[:max_tokens], skip_special_tokens=True) + TRUNCATION_MARK

    return truncate


def build_messages(task: Task) -> list[dict[str, str]]:
    """System instructions plus the question (and its context passage, if any)."""
    question = task.question if not task.context else f"Context: {task.context}\nQuestion: {task.question}"
    return [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": question}]


@dataclass
class SearchQAEnv:
    """One episode. `step` returns (observation, done, info) with info["turn"] a Turn."""

    registry: ToolRegistry
    max_turns: int
    truncate: Callable[[str], str] | None = None
    tool_timeout_s: float | None = None
    max_invalid_actions: int = 0  # end the episode after this many malformed actions (0 = never)
    search_cost: float = 0.0  # the per-turn reward of each search: the reward's search_cost weight

    def __post_init__(self) -> None:
        self.parser = SearchR1Parser()
        self.stop_strings = list(self.parser.stop_strings)
        self.turn_index = 0
        self.invalid_actions = 0

    def reset(self, task: Task) -> Opening:
        self.turn_index = 0
        self.invalid_actions = 0
        return Opening(build_messages(task), self.registry.specs())

    def step(self, action: str) -> tuple[str | None, bool, dict[str, Any]]:
        outcome = run_tool_step(action, self.parser, self.registry, self.tool_timeout_s, self.truncate)
        parse = outcome.parse
        turn = outcome.turn(self.turn_index, action)
        self.turn_index += 1
        self.invalid_actions += parse.error is not None
        searches = sum(call.name == "search" for call in turn.tool_calls)
        # The search cost lands on the turn that searched (turn-level credit reads it there);
        # the episode's `searches` count (reports, plots, the demo table) is this env's metric
        info = {"turn": turn, "reward": self.search_cost * searches, "metrics": {"searches": float(searches)}}
        if parse.answer is not None:
            return None, True, {**info, "stop_reason": "answer"}
        if self.max_invalid_actions and self.invalid_actions >= self.max_invalid_actions:
            return None, True, {**info, "stop_reason": "invalid"}
        if self.turn_index >= self.max_turns:
            return None, True, {**info, "stop_reason": "max_turns"}
        turn.observation = outcome.observation
        return outcome.observation, False, info


@dataclass
class SearchQAEnvFactory:
    """Builds a fresh SearchQAEnv per episode around one shared retriever."""

    retriever: Retriever
    topk: int = 3
    max_turns: int = 4
    max_obs_tokens: int = 256
    tokenizer: Any = None
    max_invalid_actions: int = 0
    search_cost: float = 0.0
    search: Tool | None = None  # a search tool served from elsewhere (MCP); None = over `retriever`

    @classmethod
    def from_recipe(cls, recipe: Recipe, retriever: Retriever, tokenizer: Any) -> SearchQAEnvFactory:
        env = recipe.env
        search_cost = dict(recipe.reward.terms).get("search_cost", recipe.reward.search_cost)
        return cls(retriever, recipe.retriever.topk, env.max_turns, env.max_obs_tokens, tokenizer,
                   env.max_invalid_actions, float(search_cost))  # fmt: skip

    def __call__(self) -> SearchQAEnv:
        registry = ToolRegistry([self.search or search_tool(self.retriever, self.topk)])
        truncate = token_truncator(self.tokenizer, self.max_obs_tokens) if self.tokenizer is not None else None
        return SearchQAEnv(registry, self.max_turns, truncate, max_invalid_actions=self.max_invalid_actions,
                           search_cost=self.search_cost)  # fmt: skip


@register_env("search_qa")
def build_search_qa(ctx: EnvContext) -> EnvSpec:
    """Search-R1-style QA over a corpus: the recipe's env (corpus, tasks, taskgen),
    retriever and reward weights (em, f1, format, search_cost). A `search` tool from
    env.mcp_servers (taking `query`) replaces the search over the retriever."""
    from ponder.envs.data import load_search_qa
    from ponder.rewards.composite import SEARCH_QA_COMPONENTS
    from ponder.tools.retrieval import build_retriever

    recipe = ctx.recipe
    data = load_search_qa(recipe.env)
    cfg = recipe.retriever
    retriever = build_retriever(cfg.kind, data.corpus, cfg.url, cfg.timeout_s, cfg.retries)
    factory = SearchQAEnvFactory.from_recipe(recipe, retriever, ctx.tokenizer)
    factory.search = ctx.served_tool("search")
    if factory.search is not None and "query" not in factory.search.spec.parameters.get("properties", {}):
        raise ValueError("env.mcp_servers: the served 'search' takes no `query` argument, "
                         "which <search>…</search> fills")  # fmt: skip
    weights = {name: getattr(recipe.reward, name) for name in SEARCH_QA_COMPONENTS}
    return EnvSpec(factory, data.train, data.eval, {}, weights)
