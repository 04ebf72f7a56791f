"""Search-QA with its `search` served over MCP: `ponder mcp-serve --tools search` over the
same corpus shows the policy exactly what the built-in search shows."""

from __future__ import annotations

from ponder.config import load_recipe
from ponder.envs.search_qa import SearchQAOptions
from ponder.envs.synthetic import generate_world
from ponder.envs.taskfile import write_jsonl
from ponder.wiring import build_env


def test_search_over_mcp_matches_the_built_in_search(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    write_jsonl(corpus, generate_world(SearchQAOptions.from_recipe(load_recipe(None)).taskgen).corpus)
    server = f"[{{name: docs, command: [python, -m, ponder.cli, mcp-serve, --tools, search, --corpus, {corpus}]}}]"
    local = build_env(load_recipe(None, [f"env.options.corpus={corpus}"]))
    served = build_env(load_recipe(None, [f"env.options.corpus={corpus}", f"env.mcp_servers={server}"]))
    task = local.eval[0]
    observations = []
    for spec in (local, served):
        env = spec.factory()
        env.reset(task)
        observation, done, info = env.step(f"<search>{task.question}</search>")
        assert not done and not info["turn"].tool_results[0].is_error
        observations.append(observation)
    assert served.factory.search is not None and local.factory.search is None
    assert observations[0] == observations[1] and "<information>" in observations[0]
