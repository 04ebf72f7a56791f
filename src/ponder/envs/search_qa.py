"""Search-R1-style question answering: the model thinks, may `<search>` (results come
back in `<information>`), and ends with `<answer>`.

The environment knows no generation backend: it turns an action's text into an
observation through the shared tool step (parse → validate → call → observe).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ponder.config import Recipe, from_dict
from ponder.envs.base import EnvContext, EnvSpec, Opening, register_env
from ponder.envs.synthetic import TaskGenConfig
from ponder.rewards.format import format_compliance
from ponder.rewards.qa import exact_match, token_f1
from ponder.rewards.search import search_calls
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
# The reward components and their default weights (reward.terms changes any of them):
# exact match, token F1, the tag protocol kept with an answer given, and a cost per search.
REWARD_COMPONENTS = {"em": exact_match, "f1": token_f1, "format": format_compliance, "search_cost": search_calls}
REWARD_WEIGHTS = {"em": 1.0, "f1": 0.0, "format": 0.1, "search_cost": -0.05}


@dataclass
class RetrieverConfig:
    """env.options.retriever: retrieval behind the `search` tool.

    kind: `bm25`, `dense` (all-MiniLM-L6-v2 + faiss), `hybrid` (reciprocal-rank
        fusion of both) or `http` (a Search-R1 `/retrieve` server at `url`).
    topk: passages returned per search.
    url: base URL of the retrieval server, for kind `http`.
    timeout_s: per-request timeout, for kind `http`.
    retries: extra attempts after a failed request (exponential backoff).
    """

    kind: str = "bm25"
    topk: int = 3
    url: str | None = None
    timeout_s: float = 5.0
    retries: int = 2

    def __post_init__(self) -> None:
        if self.topk < 1:
            raise ValueError(f"topk must be >= 1, got {self.topk}")


@dataclass
class SearchQAOptions:
    """env.options of search_qa (see build_search_qa), typed: a misspelt key or a wrong
    type fails when the environment is built, naming the key.

    corpus: JSONL file of {"id", "contents"}; empty = the synthetic corpus.
    tasks: JSONL file of tasks ({"id", "question", "answers", ...}), all of them the
        eval split; empty = synthetic tasks from `taskgen`.
    taskgen: the synthetic world and its tasks (ponder.envs.synthetic.TaskGenConfig).
    retriever: retrieval behind the `search` tool (RetrieverConfig).
    max_obs_tokens: retrieved text longer than this is truncated and marked.
    max_invalid_actions: end an episode (stop reason `invalid`) after this many
        actions that break the tag protocol; 0 = never, the model is told the error
        and goes on until env.max_turns.
    """

    corpus: str = ""
    tasks: str = ""
    taskgen: TaskGenConfig = field(default_factory=TaskGenConfig)
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    max_obs_tokens: int = 256
    max_invalid_actions: int = 0

    def __post_init__(self) -> None:
        for name, least in (("max_obs_tokens", 1), ("max_invalid_actions", 0)):
            if getattr(self, name) < least:
                raise ValueError(f"{name} must be >= {least}, got {getattr(self, name)}")

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> SearchQAOptions:
        """env.options as SearchQAOptions (ConfigError naming the key when one is wrong)."""
        return from_dict(cls, dict(options), "env.kind search_qa", "env.options.")

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> SearchQAOptions:
        return cls.from_options(recipe.env.options)


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
    def from_options(cls, options: SearchQAOptions, retriever: Retriever, tokenizer: Any, max_turns: int = 4,
                     terms: dict[str, float] | None = None) -> SearchQAEnvFactory:  # fmt: skip
        """Episodes of `options`, with the search_cost weight (`terms`, the recipe's
        reward.terms, else the default) as each search's per-turn reward."""
        search_cost = dict(terms or {}).get("search_cost", REWARD_WEIGHTS["search_cost"])
        return cls(retriever, options.retriever.topk, max_turns, options.max_obs_tokens, tokenizer,
                   options.max_invalid_actions, float(search_cost))  # fmt: skip

    @classmethod
    def from_recipe(cls, recipe: Recipe, retriever: Retriever, tokenizer: Any) -> SearchQAEnvFactory:
        """The recipe's episodes: its env.options, env.max_turns and reward.terms."""
        options = SearchQAOptions.from_recipe(recipe)
        return cls.from_options(options, retriever, tokenizer, recipe.env.max_turns, recipe.reward.terms)

    def __call__(self) -> SearchQAEnv:
        registry = ToolRegistry([self.search or search_tool(self.retriever, self.topk)])
        truncate = token_truncator(self.tokenizer, self.max_obs_tokens) if self.tokenizer is not None else None
        return SearchQAEnv(registry, self.max_turns, truncate, max_invalid_actions=self.max_invalid_actions,
                           search_cost=self.search_cost)  # fmt: skip


@register_env("search_qa")
def build_search_qa(ctx: EnvContext) -> EnvSpec:
    """Search-R1-style QA over a corpus (the synthetic world's by default).

    env.options (all optional; SearchQAOptions):
      corpus / tasks: a corpus file ({"id", "contents"} per line) and a task file
        (all its tasks the eval split) in place of the synthetic ones ("").
      taskgen: the synthetic world: seed (0), n_people (120), n_train / n_eval
        (256 / 64), single_hop / multi_hop / in_prompt (the kind mix, 0.5 / 0.25 /
        0.25), plan (false: the oracle's first thought opens with its lookup count).
      retriever: kind (`bm25`, `dense`, `hybrid` or `http`), topk (3), url, timeout_s
        (5), retries (2).
      max_obs_tokens: retrieved text is cut to this many tokens and marked (256).
      max_invalid_actions: end an episode after this many malformed actions (0 = never).
    The episode takes env.max_turns actions at most. A `search` tool from
    env.mcp_servers (taking `query`) replaces the search over the retriever.
    Reward components: em and f1 (the answer against the gold list), format (every
    action keeps the tag protocol and an answer is given) and search_cost (search
    calls; also each searching turn's reward, at its weight); default weights 1.0,
    0.0, 0.1 and -0.05, changed with reward.terms. A task's `metadata["needs_search"]`
    (true unless it says false) and `hops` tell the rewards how many searches it needs."""
    from ponder.envs.data import load_search_qa
    from ponder.tools.retrieval import build_retriever

    options = SearchQAOptions.from_options(ctx.options)
    data = load_search_qa(options)
    cfg = options.retriever
    retriever = build_retriever(cfg.kind, data.corpus, cfg.url, cfg.timeout_s, cfg.retries)
    recipe = ctx.recipe if ctx.recipe is not None else Recipe()
    factory = SearchQAEnvFactory.from_options(options, retriever, ctx.tokenizer, recipe.env.max_turns,
                                              recipe.reward.terms)  # fmt: skip
    factory.search = ctx.served_tool("search")
    if factory.search is not None and "query" not in factory.search.spec.parameters.get("properties", {}):
        raise ValueError("env.mcp_servers: the served 'search' takes no `query` argument, "
                         "which <search>…</search> fills")  # fmt: skip
    return EnvSpec(factory, data.train, data.eval, dict(REWARD_COMPONENTS), dict(REWARD_WEIGHTS))
