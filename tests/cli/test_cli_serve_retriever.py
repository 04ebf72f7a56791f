"""`ponder serve-retriever` as a real process; search-QA episodes retrieve through it."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx
import pytest

from ponder.config import RolloutConfig
from ponder.envs.search_qa import SearchQAEnvFactory
from ponder.envs.synthetic import TaskGenConfig, generate_world
from ponder.envs.taskfile import write_jsonl
from ponder.models import tiny_tokenizer
from ponder.rewards import exact_match
from ponder.rollout import RolloutEngine, ScriptedBackend
from ponder.tools.retrieval import build_retriever


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    world = generate_world(TaskGenConfig(n_people=30, n_train=4, n_eval=6))
    corpus = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    write_jsonl(corpus, world.corpus)
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "ponder.cli", "serve-retriever", "--corpus", str(corpus), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    else:
        process.kill()
        pytest.fail(f"retrieval server did not start: {process.stdout.read() if process.stdout else ''}")
    yield url, world
    process.terminate()
    process.wait(timeout=10)


def test_oracle_episodes_retrieve_over_http(server):
    url, world = server
    tokenizer = tiny_tokenizer()
    retriever = build_retriever("http", None, url=url, timeout_s=5.0, retries=1)
    factory = SearchQAEnvFactory(retriever, topk=2, max_turns=4, max_obs_tokens=400, tokenizer=tokenizer)
    tasks = world.eval
    backend = ScriptedBackend(tokenizer, {task.id: task.oracle_actions for task in tasks})
    config = RolloutConfig(batch_size=4)
    config.sampling.max_new_tokens_per_turn = 400
    config.sampling.max_total_tokens = 4000
    trajectories, _ = RolloutEngine(backend, factory, config).run(tasks)
    searched = [t for t in trajectories if t.metrics["searches"] > 0]
    assert searched, "the synthetic eval split should hold search tasks"
    for trajectory, task in zip(trajectories, tasks):
        assert exact_match(trajectory, task) == 1.0
        assert trajectory.metrics["tool_errors"] == 0
    for trajectory in searched:
        first_hop = trajectory.turns[0].observation or ""
        assert "<information>" in first_hop and "Doc 1" in first_hop


def test_raw_search_r1_request_shape(server):
    url, world = server
    name = world.corpus[0]["contents"].splitlines()[0]
    response = httpx.post(f"{url}/retrieve", json={"queries": [name], "topk": 1, "return_scores": True}, timeout=10)
    result = response.json()["result"]
    assert response.status_code == 200
    assert result[0][0]["document"]["id"] == world.corpus[0]["id"]
    assert isinstance(result[0][0]["score"], float)


def test_api_key_from_the_environment_and_request_limits(tmp_path):
    import os

    corpus = tmp_path / "corpus.jsonl"
    write_jsonl(corpus, [{"id": "a", "contents": "lighthouse keeper"}, {"id": "b", "contents": "glass works"}])
    port = _free_port()
    env = {**os.environ, "PONDER_RETRIEVER_API_KEY": "k3y"}
    command = [sys.executable, "-m", "ponder.cli", "serve-retriever", "--corpus", str(corpus), "--port", str(port),
               "--max-queries", "2", "--max-body-bytes", "2000"]  # fmt: skip
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        banner = process.stdout.readline()
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{url}/health", timeout=1.0)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        key = {"Authorization": "Bearer k3y"}
        assert httpx.post(f"{url}/retrieve", json={"queries": ["lighthouse"]}).status_code == 401
        answered = httpx.post(f"{url}/retrieve", json={"queries": ["lighthouse"]}, headers=key)
        assert answered.json()["result"] == [[{"id": "a", "contents": "lighthouse keeper"}]]
        assert httpx.post(f"{url}/retrieve", json={"queries": ["x"] * 3}, headers=key).status_code == 422
        assert httpx.post(f"{url}/retrieve", json={"queries": ["x" * 3000]}, headers=key).status_code == 413
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert banner.strip() == f"serving 2 documents (bm25) on http://127.0.0.1:{port}/retrieve; API key required"
