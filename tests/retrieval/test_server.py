import contextlib
import socket
import threading
import time

import httpx
import pytest

from ponder.tools.retrieval import (
    BM25Retriever,
    Document,
    Hit,
    HttpRetriever,
    RetrievalError,
    build_retriever,
)
from ponder.tools.retrieval.server import ServerLimits, build_server

from ..uvicorn_thread import loopback_socket, serving

DOCS = [
    Document("quellin", "Zorvath Quellin\nZorvath Quellin keeps the lighthouse on the isle of Brimmerhold."),
    Document("fenwick", "Marisol Fenwick\nMarisol Fenwick painted the ceiling of the Ostravenne cathedral."),
    Document("tarrow", "Tarrow Vell\nTarrow Vell founded the glassworks of Lunmere in the river valley."),
    Document("ostravenne", "Ostravenne\nOstravenne is a harbour town famous for its cathedral and its fog."),
]


@contextlib.contextmanager
def running_server(retriever, topk=3, limits=None):
    """Serve `retriever` from a background thread on a free loopback port; yield its URL."""
    sock = loopback_socket()
    port = sock.getsockname()[1]
    server = build_server(retriever, host="127.0.0.1", port=port, topk=topk, log_level="warning", limits=limits)
    with serving(server, sock, timeout_s=10):
        yield f"http://127.0.0.1:{port}"


def closed_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def bm25():
    return BM25Retriever(DOCS)


def test_http_retriever_matches_the_local_retriever(bm25):
    queries = ["Who keeps the lighthouse on Brimmerhold?", "Ostravenne cathedral"]
    with running_server(bm25) as url, HttpRetriever(url) as client:
        remote = client.search(queries, topk=2)
        assert client.search([], topk=2) == []
    local = bm25.search(queries, topk=2)
    assert remote == local
    assert [[hit.doc_id for hit in hits] for hits in remote] == [["quellin"], ["ostravenne", "fenwick"]]
    assert remote[1][0] == Hit("ostravenne", DOCS[3].contents, pytest.approx(local[1][0].score))


def test_raw_http_both_response_shapes_health_and_default_topk(bm25):
    with running_server(bm25, topk=1) as url:
        health = httpx.get(f"{url}/health")
        scored = httpx.post(
            f"{url}/retrieve", json={"queries": ["Ostravenne cathedral"], "return_scores": True}
        )
        plain = httpx.post(f"{url}/retrieve", json={"queries": ["Ostravenne cathedral", "fog"], "topk": 2})
    assert health.json() == {"status": "ok", "retriever": "BM25Retriever", "topk": 1}
    (expected,) = bm25.search(["Ostravenne cathedral"], topk=1)
    assert scored.status_code == 200
    ostravenne = {"id": "ostravenne", "contents": DOCS[3].contents}
    fenwick = {"id": "fenwick", "contents": DOCS[1].contents}
    assert scored.json() == {"result": [[{"document": ostravenne, "score": expected[0].score}]]}
    assert plain.json() == {"result": [[ostravenne, fenwick], [ostravenne]]}


@pytest.mark.parametrize(
    "body",
    [
        {"topk": 2},
        {"queries": "not a list"},
        {"queries": ["q"], "topk": 0},
        {"queries": ["q"], "topk": "many"},
    ],
)
def test_bad_requests_get_422(bm25, body):
    with running_server(bm25) as url:
        response = httpx.post(f"{url}/retrieve", json=body)
    assert response.status_code == 422
    assert "detail" in response.json()


def test_client_does_not_retry_a_rejected_request(bm25):
    with running_server(bm25) as url, HttpRetriever(url, retries=2) as client:
        with pytest.raises(RetrievalError, match=r"rejected the request with HTTP 422 .* after 1 attempt$"):
            client.search(["q"], topk=0)


class _Slow:
    """Answers only after `release` is set (or 30 s), far beyond the client's timeout."""

    def __init__(self):
        self.release = threading.Event()

    def search(self, queries, topk):
        self.release.wait(timeout=30)
        return [[] for _ in queries]


def test_timeout_is_retried_then_raises_within_bounded_time():
    slow = _Slow()
    timeout_s, retries, backoff_s = 0.3, 2, 0.05
    with running_server(slow) as url, HttpRetriever(url, timeout_s, retries, backoff_s) as client:
        start = time.monotonic()
        with pytest.raises(RetrievalError) as info:
            client.search(["anything"], topk=3)
        elapsed = time.monotonic() - start
        slow.release.set()
    assert str(info.value) == f"retrieval server {url} timed out after 3 attempts"
    # Each of the 3 attempts waits the full timeout; backoff adds 0.05 + 0.1 s.
    assert elapsed >= (retries + 1) * timeout_s
    assert elapsed < (retries + 1) * timeout_s + 0.15 + 3.0


class _Flaky:
    """Fails its first `failures` calls (the server answers 500), then answers."""

    def __init__(self, failures):
        self.failures = failures
        self.calls = 0

    def search(self, queries, topk):
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("index shard unavailable")
        return [[Hit("d", "passage", 1.25)] for _ in queries]


def test_5xx_is_retried_and_recovers_or_raises():
    flaky = _Flaky(failures=2)
    with running_server(flaky) as url, HttpRetriever(url, retries=2, backoff_s=0.01) as client:
        assert client.search(["q"], topk=1) == [[Hit("d", "passage", 1.25)]]
    assert flaky.calls == 3
    broken = _Flaky(failures=100)
    with running_server(broken) as url, HttpRetriever(url, retries=1, backoff_s=0.01) as client:
        with pytest.raises(RetrievalError) as info:
            client.search(["q"], topk=1)
    assert str(info.value) == (
        f'retrieval server {url} answered HTTP 500 ({{"detail":"RuntimeError: index shard unavailable"}}) '
        "after 2 attempts"
    )
    assert broken.calls == 2


def test_connection_refused_raises_after_retries():
    url = f"http://127.0.0.1:{closed_port()}"
    with build_retriever("http", None, url=url, timeout_s=1.0, retries=2) as client:
        assert isinstance(client, HttpRetriever) and client.backoff_s == 0.2
        start = time.monotonic()
        with pytest.raises(RetrievalError) as info:
            client.search(["q"], topk=3)
        elapsed = time.monotonic() - start
    message = str(info.value)
    assert message.startswith(f"retrieval server {url} could not be reached (ConnectError: ")
    assert message.endswith(") after 3 attempts")
    assert "\n" not in message
    # A refused connection fails fast, so the time is the backoff: 0.2 + 0.4 s.
    assert 0.6 <= elapsed < 0.6 + 3.0


# --- limits, API key, concurrency (issue 21, item 7) -------------------------------------


def test_a_body_over_the_cap_gets_413_from_its_length_or_while_it_is_read(bm25):
    limits = ServerLimits(max_body_bytes=10_000)
    big = b'{"queries": ["' + b"x" * 50_000 + b'"]}'

    def chunks():  # no Content-Length: the server must count while reading
        for start in range(0, len(big), 4096):
            yield big[start : start + 4096]

    with running_server(bm25, limits=limits) as url:
        declared = httpx.post(f"{url}/retrieve", content=big, headers={"content-type": "application/json"})
        streamed = httpx.post(f"{url}/retrieve", content=chunks(), headers={"content-type": "application/json"})
        fine = httpx.post(f"{url}/retrieve", json={"queries": ["fog"], "topk": 1})
    assert declared.status_code == 413 and streamed.status_code == 413
    assert fine.status_code == 200 and fine.json()["result"][0][0]["id"] == "ostravenne"


def test_too_many_queries_or_too_large_a_topk_get_422(bm25):
    limits = ServerLimits(max_queries=3, max_topk=5)
    with running_server(bm25, limits=limits) as url:
        many = httpx.post(f"{url}/retrieve", json={"queries": ["q"] * 4})
        deep = httpx.post(f"{url}/retrieve", json={"queries": ["q"], "topk": 6})
        fine = httpx.post(f"{url}/retrieve", json={"queries": ["q"] * 3, "topk": 5})
    assert (many.status_code, many.json()) == (422, {"detail": "4 queries in one request; at most 3"})
    assert (deep.status_code, deep.json()) == (422, {"detail": "topk 6 is larger than 5"})
    assert fine.status_code == 200


def test_an_api_key_is_required_when_set(bm25, monkeypatch):
    monkeypatch.delenv("PONDER_RETRIEVER_API_KEY", raising=False)
    body = {"queries": ["fog"], "topk": 1}
    with running_server(bm25, limits=ServerLimits(api_key="s3cret")) as url:
        missing = httpx.post(f"{url}/retrieve", json=body)
        wrong = httpx.post(f"{url}/retrieve", json=body, headers={"Authorization": "Bearer guess"})
        bearer = httpx.post(f"{url}/retrieve", json=body, headers={"Authorization": "Bearer s3cret"})
        header = httpx.post(f"{url}/retrieve", json=body, headers={"X-API-Key": "s3cret"})
        health = httpx.get(f"{url}/health")
        with HttpRetriever(url, api_key="s3cret") as client:
            assert [hit.doc_id for hit in client.search(["fog"], 1)[0]] == ["ostravenne"]
        monkeypatch.setenv("PONDER_RETRIEVER_API_KEY", "s3cret")
        with HttpRetriever(url) as client:  # the key from the environment
            assert len(client.search(["fog"], 1)[0]) == 1
        monkeypatch.delenv("PONDER_RETRIEVER_API_KEY")
        with HttpRetriever(url, retries=2) as client:
            with pytest.raises(RetrievalError, match=r"HTTP 401 .* after 1 attempt$"):
                client.search(["fog"], 1)
    assert (missing.status_code, wrong.status_code) == (401, 401)
    assert missing.headers["www-authenticate"] == "Bearer"
    assert bearer.status_code == header.status_code == health.status_code == 200


def test_server_limits_reject_nonsense():
    with pytest.raises(ValueError, match="max_queries must be >= 1"):
        ServerLimits(max_queries=0)
    with pytest.raises(ValueError, match="api_key must not be empty"):
        ServerLimits(api_key=" ")


class _Sleepy:
    """Takes 50 ms per query; `thread_safe` as given."""

    def __init__(self, thread_safe):
        self.thread_safe = thread_safe

    def search(self, queries, topk):
        time.sleep(0.05 * len(queries))
        return [[Hit(q, q, 1.0)] for q in queries]


@pytest.mark.parametrize("thread_safe", [True, False])
def test_a_large_request_does_not_hold_other_clients_behind_it(thread_safe):
    limits = ServerLimits(max_queries=1000, chunk_queries=4)
    with running_server(_Sleepy(thread_safe), limits=limits) as url:
        finished = []

        def large():
            httpx.post(f"{url}/retrieve", json={"queries": [f"q{i}" for i in range(60)]}, timeout=30)
            finished.append(time.monotonic())

        worker = threading.Thread(target=large)
        worker.start()
        time.sleep(0.3)  # the large request (3 s of searching) is in flight
        started = time.monotonic()
        small = httpx.post(f"{url}/retrieve", json={"queries": ["mine"]}, timeout=30)
        latency = time.monotonic() - started
        worker.join()
    assert small.json()["result"] == [[{"id": "mine", "contents": "mine"}]]
    # Without a lock it runs at once; under the lock it waits for one chunk (0.2 s), not 3 s.
    assert latency < (0.5 if thread_safe else 1.0)
    assert finished[0] > started + latency
