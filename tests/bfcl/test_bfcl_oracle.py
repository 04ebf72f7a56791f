"""The BFCL adapter end to end: BFCL's prompt and BFCL's own AST checker (bfcl-eval in its
own venv, `make bfcl-venv`), fed by a scripted oracle replaying possible answers, must
score 100% on a seeded sample of every covered category."""

from pathlib import Path

import pytest

from ponder.eval.bench_agent import grouped_metrics
from ponder.bfcl.answers import oracle_reply
from ponder.eval.bfcl.adapter import BfclRunConfig, OraclePolicy, run_category
from ponder.bfcl.bridge import BfclBridge
from ponder.bfcl.data import ADAPTER_CATEGORIES, DEFAULT_VENV, find_data_dir, load_questions, load_tool_corpus
from ponder.eval.bfcl.suite import to_agent_sample

VENV = Path(__file__).resolve().parents[2] / DEFAULT_VENV
pytestmark = pytest.mark.skipif(
    not (VENV / "bin" / "python").exists(), reason=f"no bfcl-eval venv at {VENV}; `make bfcl-venv` creates it"
)
PER_CATEGORY = 8


@pytest.fixture(scope="module")
def bridge():
    with BfclBridge(VENV) as running:
        yield running


def test_oracle_scores_100_percent_on_every_category(bridge):
    data_dir = find_data_dir(VENV)
    config = BfclRunConfig(per_category=PER_CATEGORY, seed=0)
    samples = []
    for category in ADAPTER_CATEGORIES:
        questions = load_questions(data_dir, category)
        scored = run_category(OraclePolicy(questions), bridge, data_dir, category, config)
        assert len(scored) == PER_CATEGORY
        assert all(s.valid for s in scored), [(s.id, s.error_type, s.text) for s in scored if not s.valid]
        samples.extend(to_agent_sample(s) for s in scored)
    metrics = grouped_metrics(samples)["all"]
    assert metrics["success"]["value"] == metrics["tool_selection"]["value"] == 1.0
    assert metrics["pass@1"]["pass@k"] == 1.0


def test_checker_rejects_wrong_answers(bridge):
    data_dir = find_data_dir(VENV)
    question = load_questions(data_dir, "simple_python")[0]
    wrong_value = oracle_reply(question).replace("base=10", "base=11")
    items = [{"id": question.id, "text": text, "function": question.functions, "ground_truth": question.ground_truth}
             for text in (wrong_value, "I cannot help.", "[no_such_function(x=1)]")]
    assert [v["valid"] for v in bridge.check("simple_python", items)] == [False, False, False]
    irrelevant = load_questions(data_dir, "irrelevance")[0]
    call = [{"id": irrelevant.id, "text": "[determine_body_mass_index(weight=1.0, height=2.0)]", "function": [],
             "ground_truth": []}]
    assert bridge.check("irrelevance", call)[0]["valid"] is False


def test_tool_corpus_reads_every_definition_and_names_are_unique():
    corpus = load_tool_corpus(find_data_dir(VENV))
    names = [spec.name for spec in corpus.specs]
    assert len(names) == len(set(names)) > 1800
    assert corpus.read > corpus.variants >= len(names)
