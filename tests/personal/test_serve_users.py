"""`ponder serve --users` end to end on 127.0.0.1 with the tiny model: two users chat
(logged, ids = completion ids), give feedback, get their adapters updated in the
background and swapped in without a restart; a user's answers change after their
update while the other user's and the base's do not; rollback; every bad request is an
OpenAI-style 4xx body."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from ponder.personal.config import PersonalConfig
from ponder.personal.store import AdapterStore
from ponder.serve import ServeConfig

from .conftest import running_server

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
SETTINGS = PersonalConfig(steps=10, batch_size=2, micro_batch_size=2, lr=2e-2, beta=0.5, lora_r=4, lora_alpha=8)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("users")
    config = ServeConfig(model="tiny", users=str(root), max_tokens_limit=32, batch_window_ms=5, personal=SETTINGS)
    with running_server(config) as (url, model_server):
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
        with httpx.Client(base_url=url, timeout=60) as http:
            yield client, http, model_server, root


def ask(client, user=None):
    extra = {"user": user} if user else {}
    reply = client.chat.completions.create(model="tiny", messages=QUESTION, temperature=0, max_tokens=12, **extra)
    return reply.id, reply.choices[0].message.content


def wait_for_update(http, user, timeout_s=120.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = http.get(f"/users/{user}").json()
        if info["update"]["status"] in ("done", "failed"):
            return info
        time.sleep(0.1)
    raise AssertionError(f"the update of {user} did not finish: {info}")


def update(http, user, **settings):
    response = http.post(f"/users/{user}/update", json=settings or None)
    assert response.status_code == 202, response.text
    assert response.json()["status"] in ("queued", "running") and response.json()["user"] == user
    info = wait_for_update(http, user)
    assert info["update"]["status"] == "done", info["update"]["error"]
    return info


def test_feedback_trains_the_users_adapter_and_swaps_it_in_without_restart(served):
    client, http, model_server, root = served
    worker = model_server.generator._thread
    _, base = ask(client)
    alice_id, alice_before = ask(client, "alice")
    bob_id, bob_before = ask(client, "bob")
    assert alice_before == base and bob_before == base  # no adapter yet: the base answers
    store = AdapterStore(root)
    logged = store.interaction(alice_id)
    assert (logged.user, logged.messages, logged.response, logged.adapter_version) == ("alice", QUESTION, base, None)

    assert http.post("/feedback", json={"id": bob_id, "rewrite": "Bonjour, Paris."}).json()["kind"] == "rewrite"
    bob = update(http, "bob")
    assert (bob["current"], bob["served"], bob["update"]["version"]) == (1, 1, 1)
    _, bob_trained = ask(client, "bob")
    assert bob_trained != base

    assert http.post("/feedback", json={"id": alice_id, "rating": -1}).json() == {
        "object": "feedback", "id": 2, "interaction": alice_id, "user": "alice", "kind": "down"}
    http.post("/feedback", json={"id": alice_id, "correction": "Paris is the capital of France."})
    alice = update(http, "alice")
    metrics = alice["update"]["metrics"]
    assert metrics["pairs"] == 1 and metrics["margin_last"] > metrics["margin_first"] + 0.5
    assert alice["counts"] == {"interactions": 1, "up": 0, "down": 1, "rewrite": 0, "correction": 1, "outcome": 0}
    after_id, alice_after = ask(client, "alice")
    assert alice_after != alice_before  # the user's answer changed ...
    assert ask(client, "bob")[1] == bob_trained and ask(client)[1] == base  # ... nobody else's did
    assert store.interaction(after_id).adapter_version == 1
    assert model_server.generator._thread is worker and worker.is_alive()  # same server, same worker
    assert model_server.generator.backend.aliases == {"@bob": "user:bob@v1", "@alice": "user:alice@v1"}

    # a second version, then back to the first
    http.post("/feedback", json={"id": after_id, "rewrite": "Paris."})
    assert update(http, "alice", steps=4)["current"] == 2
    assert [v["parent_version"] for v in http.get("/users/alice").json()["versions"]] == [None, 1]
    rolled = http.post("/users/alice/rollback", json={"version": 1}).json()
    assert (rolled["current"], rolled["served"]) == (1, 1) and ask(client, "alice")[1] == alice_after
    assert set(model_server.generator.backend.policy.model.peft_config) == {"user:bob@v1", "user:alice@v1"}


def test_a_streamed_chat_is_logged_too(served):
    client, _, _, root = served
    stream = client.chat.completions.create(model="tiny", messages=QUESTION, temperature=0, max_tokens=6,
                                            user="carol", stream=True)  # fmt: skip
    chunks = list(stream)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert AdapterStore(root).interaction(chunks[0].id).response == text


def _error(response, status, code):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"] and "\n" not in error["message"]
    return error["message"]


def test_bad_requests_get_openai_style_errors(served):
    client, http, _, _ = served
    chat_id, _ = ask(client, "dave")
    _error(http.post("/feedback", json={"id": "chatcmpl-nope", "rating": 1}), 404, "interaction_not_found")
    assert "exactly one of" in _error(http.post("/feedback", json={"id": chat_id, "rating": 1, "rewrite": "x"}),
                                      400, "invalid_request")  # fmt: skip
    _error(http.post("/feedback", json={"id": chat_id, "rating": 5}), 400, "invalid_request")
    _error(http.post("/feedback", json={"id": chat_id, "rewrite": "   "}), 400, "invalid_request")
    _error(http.post("/feedback", json={"id": chat_id, "outcome": "good"}), 400, "invalid_request")
    assert "0 preference pair(s)" in _error(http.post("/users/dave/update"), 400, "not_enough_feedback")
    _error(http.post("/users/dave/update", json={"stepz": 1}), 400, "invalid_request")
    _error(http.post("/users/dave/rollback", json={"version": 3}), 404, "version_not_found")
    _error(http.post("/users/dave/rollback", json={}), 400, "invalid_request")
    _error(http.get("/users/bad%20name"), 400, "invalid_user")
    with pytest.raises(openai.BadRequestError, match="use 1-64 letters"):
        ask(client, "bad/name")
    http.post("/feedback", json={"id": chat_id, "rewrite": "Paris."})
    first = http.post("/users/dave/update")
    assert first.status_code == 202
    _error(http.post("/users/dave/update"), 409, "update_in_progress")  # the first is still queued or running
    assert wait_for_update(http, "dave")["update"]["status"] == "done"


def test_users_need_the_hf_backend():
    with pytest.raises(ValueError, match="--users needs --backend hf"):
        ServeConfig(model="tiny", users="/tmp/x", backend="vllm")
    with pytest.raises(ValueError, match="--users needs --backend hf"):
        ServeConfig(model="tiny", users="/tmp/x", vllm_url="http://127.0.0.1:1")


def test_the_user_endpoints_need_the_key_and_say_when_users_are_off():
    from types import SimpleNamespace

    from fastapi.testclient import TestClient

    from ponder.serve.app import create_app

    app = create_app(SimpleNamespace(config=ServeConfig(model="tiny", api_key="k"), users=None))
    with TestClient(app) as http:
        for method, path in (("post", "/v1/feedback"), ("get", "/v1/users/alice"),
                             ("post", "/v1/users/alice/update"), ("post", "/v1/users/alice/rollback")):  # fmt: skip
            _error(getattr(http, method)(path), 401, "invalid_api_key")
            off = getattr(http, method)(path, headers={"Authorization": "Bearer k"})
            assert "start ponder serve with --users DIR" in _error(off, 404, "users_disabled")
