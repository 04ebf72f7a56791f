"""The BFCL suite of `ponder bench-agent`: conditions (all functions, or top-k retrieved)
× categories, each sample scored by BFCL's checker and turned into an AgentSample."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from ponder.bfcl.bridge import BfclBridge
from ponder.bfcl.data import find_data_dir, load_questions, load_tool_corpus
from ponder.eval.bench_agent import AgentSample
from ponder.eval.bfcl.adapter import BfclRunConfig, BfclSample, OraclePolicy, run_category


def to_agent_sample(sample: BfclSample) -> AgentSample:
    called = [name for call in sample.calls for name in call]
    return AgentSample(task_id=sample.id, group=sample.category, success=sample.valid, called=called,
                       needed=list(sample.needed), text=sample.text, reference=sample.reference,
                       seconds=sample.seconds)


def condition_name(topk: int, kind: str) -> str:
    return "BFCL functions" if topk == 0 else f"top-{topk} retrieved ({kind})"


def run_bfcl_suite(
    policy_spec: str, config: BfclRunConfig, topks: list[int], retriever_kind: str = "hybrid",
    encoder: str | None = None, venv: str = ".venv-bfcl", policy_options: dict[str, Any] | None = None,
    say: Callable[[str], None] = lambda _: None, checkpoint: Path | None = None,
) -> tuple[dict[str, list[BfclSample]], str]:
    """Samples per condition, and a one-line description of the run. With `checkpoint`,
    each category's samples are appended there as JSON lines as soon as they are scored."""
    from ponder.tools.retrieval.toolindex import Fusion, read_fusion

    # The hybrid uses the fusion `ponder tools train` chose on validation for this encoder.
    fusion = read_fusion(encoder) or Fusion()
    data_dir = find_data_dir(venv)
    policy = _policy(policy_spec, data_dir, config, policy_options or {})
    corpus = index = None
    if any(topks):
        from ponder.tools.retrieval.toolindex import ToolIndex

        corpus = load_tool_corpus(data_dir)
        index = ToolIndex(corpus.specs, kind=retriever_kind, encoder=encoder, fusion=fusion)
        say(f"tool index: {corpus.summary()}; {retriever_kind}, fusion {fusion}")
    results: dict[str, list[BfclSample]] = {}
    with BfclBridge(venv) as bridge:
        for topk in topks:
            name = condition_name(topk, retriever_kind)
            run = replace(config, retrieval_topk=topk)
            results[name] = []
            for category in config.categories:
                samples = run_category(policy, bridge, data_dir, category, run, corpus,
                                       index.rank_names if index is not None else None)
                results[name].extend(samples)
                if checkpoint is not None:
                    _append(checkpoint, name, samples)
                say(f"{name} / {category}: {sum(s.valid for s in samples)}/{len(samples)} valid")
    header = (f"policy {policy_spec}; categories {', '.join(config.categories)}; {config.per_category or 'all'} "
              f"questions per category (seed {config.seed}); {config.samples} sample(s) each; "
              f"max_new_tokens {config.max_new_tokens}; retriever {retriever_kind} encoder {encoder or 'base MiniLM'}"
              f"{f' fusion {fusion}' if retriever_kind == 'hybrid' else ''}")
    return results, header


def _append(path: Path, condition: str, samples: list[BfclSample]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        for sample in samples:
            handle.write(json.dumps({"condition": condition, **asdict(sample)}) + "\n")


def _policy(spec: str, data_dir: Path, config: BfclRunConfig, options: dict[str, Any]) -> Any:
    if spec == "oracle":
        questions = [q for category in config.categories for q in load_questions(data_dir, category)]
        return OraclePolicy(questions)
    from ponder.agent.policy import load_chat_policy

    return load_chat_policy(spec, **options)
