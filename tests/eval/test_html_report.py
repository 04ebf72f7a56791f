"""`ponder report` in a real headless Chromium (Playwright, Debian's chromium): the
tables hold results.json's numbers, choosing an episode shows its turns, masked
tokens carry the observation class, and hostile model text stays text.

The run directory is built from real records: episodes through the real rollout
engine, search-QA environment and BM25 (a scripted backend speaks for the model),
scored by ponder's rewards, summarised by ponder's evaluation and saved with its
own writers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ponder.config import RolloutConfig, SamplingConfig
from ponder.envs.data import load_search_qa
from ponder.envs.search_qa import SearchQAEnvFactory, SearchQAOptions
from ponder.envs.synthetic import TaskGenConfig
from ponder.eval.metrics import summarise
from ponder.eval.report_html import load_run, write_report
from ponder.eval.report_html.page import embed_json
from ponder.fileio import write_json_atomic
from ponder.models import tiny_tokenizer
from ponder.rewards import CompositeReward, score_trajectories
from ponder.rollout import RolloutEngine, ScriptedBackend
from ponder.tools.retrieval import build_retriever
from ponder.runlog.metrics_log import MetricsLog
from ponder.train.rl_metrics import episode_metrics
from ponder.types import save_trajectories

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
HOSTILE = "<script>alert(1)</script></script><img src=x onerror=alert(2)>&amp;"
WEIGHTS = {"em": 1.0, "format": 0.1, "search_cost": -0.1}


def _episodes(scripts_for, data, tokenizer):
    """Scored trajectories of the first task of each kind, each action from `scripts_for`."""
    first = {}
    for task in data.train:
        first.setdefault(task.kind, task)
    tasks = [first["multi_hop"], first["single_hop"], first["in_prompt"]]
    env_factory = SearchQAEnvFactory(build_retriever("bm25", data.corpus), topk=1, max_turns=3, max_obs_tokens=64,
                                     tokenizer=tokenizer)  # fmt: skip
    sampling = SamplingConfig(temperature=0.0, max_new_tokens_per_turn=256, max_total_tokens=2048)
    config = RolloutConfig(batch_size=3, group_size=1, sampling=sampling)
    engine = RolloutEngine(ScriptedBackend(tokenizer, scripts_for(tasks)), env_factory, config)
    trajectories, _ = engine.run(tasks)
    by_id = {task.id: task for task in tasks}
    score_trajectories(trajectories, by_id, CompositeReward(WEIGHTS))
    return trajectories, by_id


def build_run(run_dir: Path, hostile: str = HOSTILE) -> dict:
    """A demo-shaped run: base (hostile search and answer) and rl (oracle) stages."""
    tokenizer = tiny_tokenizer()
    data = load_search_qa(SearchQAOptions(taskgen=TaskGenConfig(seed=0, n_people=30, n_train=24, n_eval=4)))
    base = lambda tasks: {t.id: [f"<think>{hostile}</think>\n<search>{hostile}</search>",  # noqa: E731
                                 f"<answer>{hostile}</answer>"] for t in tasks}  # fmt: skip
    oracle = lambda tasks: {t.id: t.oracle_actions for t in tasks}  # noqa: E731
    stages = {}
    run_dir.mkdir(parents=True, exist_ok=True)
    for name, scripts in (("base", base), ("rl", oracle)):
        trajectories, by_id = _episodes(scripts, data, tokenizer)
        save_trajectories(trajectories, run_dir / f"eval-{name}.parquet")
        stages[name] = summarise(trajectories, by_id)
        if name == "rl":
            with MetricsLog(run_dir / "rl", tensorboard=False) as log:
                for step in (1, 2, 3):
                    log.log(step, {**episode_metrics(trajectories), "policy/entropy": 1.0 / step})
    results = {"stages": stages, "eval_temperature": 0.0}
    write_json_atomic(run_dir / "results.json", results)
    (run_dir / "recipe.yaml").write_text(yaml.safe_dump({"model": {"name": "tiny"}}))
    return results


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("run")
    build_run(path)
    return path


@pytest.fixture(scope="module")
def page(run_dir, tmp_path_factory):
    if not Path(CHROMIUM).is_file():
        pytest.skip("Debian's chromium is not installed: run `make sysdeps` (apt-get install chromium)")
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is a test extra: pip install -e '.[test]'")
    report = write_report(run_dir, tmp_path_factory.mktemp("out") / "report.html")
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        tab = browser.new_page()
        dialogs, errors = [], []
        tab.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        tab.on("pageerror", lambda error: errors.append(str(error)))
        tab.on("request", lambda request: errors.append(f"request {request.url}")
               if not request.url.startswith(("file:", "data:")) else None)  # fmt: skip
        tab.goto(report.as_uri())
        yield tab, dialogs, errors
        browser.close()


def test_tables_hold_the_numbers_of_results_json(run_dir, page):
    tab, _, _ = page
    stages = json.loads((run_dir / "results.json").read_text())["stages"]
    for stage in ("base", "rl"):
        for metric, value in (("reward", stages[stage]["reward"]),
                              ("components/em", stages[stage]["components"]["em"]),
                              ("tool_calls_per_episode", stages[stage]["tool_calls_per_episode"])):  # fmt: skip
            cell = tab.locator(f'#stages td[data-stage="{stage}"][data-metric="{metric}"]')
            digits = 3 if metric != "tool_calls_per_episode" else 2
            assert cell.inner_text() == f"{value:.{digits}f}", (stage, metric)
    assert stages["rl"]["reward"] > stages["base"]["reward"]  # the oracle answers; the hostile script does not
    assert tab.locator("#stages thead th").all_inner_texts() == ["", "before SFT", "after RL"]
    assert tab.locator(".figures[data-source=rl] img").count() >= 2


def test_choosing_an_episode_shows_its_turns_tokens_and_breakdown(run_dir, page):
    tab, _, errors = page
    tab.select_option("#stage-select", "rl")
    episodes = load_run(run_dir).episodes["rl"]
    multi_hop = next(i for i, e in enumerate(episodes) if len(e["turns"]) == 3)  # search, search, answer
    tab.select_option("#episode-select", str(multi_hop))
    episode = episodes[multi_hop]
    assert tab.locator("#episode h3").inner_text() == episode["task_id"]
    assert tab.locator("#episode .turn").count() == 3
    trained, observed = tab.locator("#episode .tok.trained"), tab.locator("#episode .tok.observation")
    assert trained.count() == episode["trained_tokens"] and observed.count() == episode["masked_tokens"] > 0
    first_turn = tab.locator("#episode .turn").first
    observation = "".join(first_turn.locator(".tok.observation").all_inner_texts())
    assert "<information>" in observation and "</information>" in observation  # the env's text, masked
    assert "<search>" in "".join(first_turn.locator(".tok.trained").all_inner_texts())
    breakdown = dict(zip(tab.locator("#breakdown th").all_inner_texts(), tab.locator("#breakdown td").all_inner_texts()))
    assert breakdown == {name: f"{value:.3f}" for name, value in episode["breakdown"].items()}
    assert breakdown["em"] == "1.000"
    assert errors == []


def test_hostile_text_is_shown_as_text_and_never_runs(run_dir, page):
    tab, dialogs, errors = page
    tab.select_option("#stage-select", "base")
    tab.select_option("#episode-select", "0")
    text = tab.locator("#episode").inner_text()
    assert text.count("<script>alert(1)</script>") >= 3  # think, search and answer
    assert "onerror=alert(2)>&amp;" in text
    assert tab.locator("#episode script, #episode img, body > img").count() == 0
    assert tab.locator("script").count() == 2  # the data block and the page's own script
    assert dialogs == [] and errors == []


def test_compare_puts_two_runs_side_by_side(run_dir, tmp_path, page):
    tab, _, _ = page
    other = tmp_path / "other"
    build_run(other, hostile="plain")
    out = write_report(run_dir, tmp_path / "both.html", compare=other)
    tab.goto(out.as_uri())
    first = json.loads((run_dir / "results.json").read_text())["stages"]["base"]["reward"]
    second = json.loads((other / "results.json").read_text())["stages"]["base"]["reward"]
    cells = tab.locator('#compare td[data-stage="base"][data-metric="reward"]').all_inner_texts()
    assert cells == [f"{first:.3f}", f"{second:.3f}"]
    assert tab.locator("#run-select option").count() == 2
    tab.select_option("#run-select", "1")
    tab.select_option("#stage-select", "base")
    assert "plain" in tab.locator("#episode").inner_text()


def test_embedded_json_cannot_end_its_script_block():
    text = embed_json({"a": "</script><!-- & \u2028"})
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == {"a": "</script><!-- & \u2028"}


def test_cli_writes_the_report_and_refuses_a_folder_without_a_run(run_dir, tmp_path):
    ponder = [sys.executable, "-m", "ponder.cli"]
    out = tmp_path / "r.html"
    done = subprocess.run([*ponder, "report", str(run_dir), "--out", str(out), "--text"], capture_output=True,
                          text=True, env={**os.environ, "PONDER_DEBUG": ""})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out) and out.stat().st_size > 10_000
    assert "https://" not in out.read_text() and "http://" not in out.read_text()  # nothing to fetch
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = subprocess.run([*ponder, "report", str(empty)], capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        f"ponder report: error: {empty}: no results.json, metrics.json, metrics.jsonl or trajectories "
        "(not a ponder run directory?)"]
