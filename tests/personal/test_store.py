"""The per-user adapter store: round trip, versions and rollback, refusal of an adapter
trained on another base, a writer SIGKILLed between any two steps of a write, untrusted
user names, feedback validation, gc of orphans."""

from __future__ import annotations

import math
import os
import select
import signal
import subprocess
import sys
import time

import pytest
import torch

from ponder.models import tiny_policy
from ponder.models.base_hash import base_model_hash
from ponder.personal.store import PAUSE_ENV, AdapterStore, NotFound, check_user

from .conftest import lora_state

STAGES = ["staging", "copied adapter_config.json", "copied adapter_model.safetensors", "renamed", "inserted"]
WRITER = ("import sys; from ponder.personal.store import AdapterStore; "
          "print(AdapterStore(sys.argv[1]).save_version('alice', sys.argv[2], sys.argv[3], steps=5))")  # fmt: skip


def same_files(a, b) -> bool:
    return all((a / name).read_bytes() == (b / name).read_bytes()
               for name in ("adapter_config.json", "adapter_model.safetensors"))  # fmt: skip


def test_a_saved_version_round_trips_with_its_metadata(tmp_path, adapter_dirs, tiny_hash):
    store = AdapterStore(tmp_path / "users")
    assert store.current("alice") is None and store.users() == []
    version = store.save_version("alice", adapter_dirs["one"], tiny_hash, steps=7, feedback=3, pairs=2)
    assert version == 1
    current = store.current("alice")
    assert (current.user, current.version, current.base_hash, current.steps, current.feedback, current.pairs,
            current.parent_version) == ("alice", 1, tiny_hash, 7, 3, 2, None)  # fmt: skip
    assert current.path.parent == tmp_path / "users" / "adapters" / "alice" and current.path.name.startswith("v1-")
    assert same_files(current.path, adapter_dirs["one"])
    assert store.users() == ["alice"] and store.current("bob") is None
    # a second store object (another process) sees the same thing
    assert AdapterStore(tmp_path / "users").adapter_path("alice", base_hash=tiny_hash) == current.path


def test_versions_are_kept_and_rolled_back(tmp_path, adapter_dirs, tiny_hash):
    store = AdapterStore(tmp_path)
    assert store.save_version("alice", adapter_dirs["one"], tiny_hash) == 1
    assert store.save_version("alice", adapter_dirs["two"], tiny_hash, parent_version=1) == 2
    assert store.save_version("bob", adapter_dirs["two"], tiny_hash) == 1  # numbered per user
    assert [(v.version, v.parent_version) for v in store.versions("alice")] == [(1, None), (2, 1)]
    assert store.current("alice").version == 2
    assert same_files(store.adapter_path("alice"), adapter_dirs["two"])
    store.rollback("alice", 1)
    assert store.current("alice").version == 1 and same_files(store.adapter_path("alice"), adapter_dirs["one"])
    assert same_files(store.adapter_path("alice", 2), adapter_dirs["two"])  # still there
    assert store.save_version("alice", adapter_dirs["two"], tiny_hash) == 3  # the next number, not 2 again
    assert store.current("alice").version == 3 and store.current("bob").version == 1
    with pytest.raises(NotFound, match=r"user alice has no adapter version 9 \(versions: 1, 2, 3\)"):
        store.rollback("alice", 9)
    with pytest.raises(NotFound, match="user carol has no adapter yet"):
        store.adapter_path("carol")


def test_an_adapter_is_refused_on_another_base(tmp_path, adapter_dirs, tiny_hash):
    other = base_model_hash(tiny_policy(seed=1).model)
    assert other != tiny_hash and base_model_hash(tiny_policy(seed=0).model) == tiny_hash
    store = AdapterStore(tmp_path)
    store.save_version("alice", adapter_dirs["one"], tiny_hash)
    with pytest.raises(ValueError) as err:
        store.adapter_path("alice", base_hash=other)
    assert str(err.value) == f"user alice v1 was trained on base {tiny_hash[:12]}…, this model is {other[:12]}…"
    assert store.adapter_path("alice", base_hash=tiny_hash).is_dir()


def test_the_base_hash_ignores_adapters_and_sees_every_weight(trained_lora):
    policy = tiny_policy()
    bare = base_model_hash(policy.model)
    wrapped = trained_lora(tiny_policy())  # PEFT-wrapped, non-zero LoRA weights
    assert base_model_hash(wrapped.model) == bare
    with torch.no_grad():
        policy.model.model.norm.weight[0] += 1e-3
    assert base_model_hash(policy.model) != bare
    assert base_model_hash(tiny_policy().model.to(torch.bfloat16)) != bare  # dtype counts


def _wait_for(process, line: str, timeout_s: float = 60.0) -> None:
    """Read the writer's stderr until `line` (a stage it announces) appears."""
    deadline, seen = time.monotonic() + timeout_s, []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stderr], [], [], 0.5)
        if ready:
            text = process.stderr.readline()
            seen.append(text)
            if text.strip() == f"store: paused at {line}":
                return
            if not text and process.poll() is not None:
                break
    raise AssertionError(f"the writer never reached {line!r}; it wrote {''.join(seen)!r}")


def test_a_writer_killed_at_any_step_leaves_the_previous_version_current(tmp_path, adapter_dirs, tiny_hash):
    store = AdapterStore(tmp_path)
    store.save_version("alice", adapter_dirs["one"], tiny_hash)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-c", WRITER, str(tmp_path), str(adapter_dirs["two"]), tiny_hash]
    for stage in STAGES:
        writer = subprocess.Popen(args, env={**env, PAUSE_ENV: stage}, stderr=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)  # fmt: skip
        try:
            _wait_for(writer, stage)
        finally:
            writer.send_signal(signal.SIGKILL)
            writer.communicate(timeout=30)
        assert writer.returncode == -signal.SIGKILL
        current = store.current("alice")
        assert (stage, current.version, len(store.versions("alice"))) == (stage, 1, 1)
        assert same_files(store.adapter_path("alice", base_hash=tiny_hash), adapter_dirs["one"])
    orphans = [p for p in (tmp_path / "adapters" / "alice").iterdir() if p != current.path]
    leftovers = list((tmp_path / "tmp").iterdir())
    assert len(orphans) == 2 and len(leftovers) == 3  # renamed (2 kills after the rename) / staged only
    assert sorted(store.gc(min_age_s=0)) == sorted(orphans + leftovers)
    assert list((tmp_path / "tmp").iterdir()) == [] and store.adapter_path("alice") == current.path
    # the previous version still loads into PEFT with its own weights
    from peft import PeftModel

    model = PeftModel.from_pretrained(tiny_policy().model, str(store.adapter_path("alice")))
    state = {k.replace(".default", ""): v for k, v in model.state_dict().items() if "lora_" in k}
    assert all(torch.equal(state[name], tensor) for name, tensor in lora_state(adapter_dirs["one"]).items())
    # a write that runs to the end after the kills: version 2, current
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "2" and store.current("alice").version == 2
    assert same_files(store.adapter_path("alice"), adapter_dirs["two"]) and store.current("alice").steps == 5


@pytest.mark.parametrize("name", ["", "../evil", "a/b", ".", "..", "al ice", "x" * 65, "ünï", None, "a\x00b"])
def test_unsafe_user_names_are_refused_before_any_path_is_built(tmp_path, adapter_dirs, tiny_hash, name):
    store = AdapterStore(tmp_path / "users")
    with pytest.raises(ValueError, match="use 1-64 letters, digits"):
        store.save_version(name, adapter_dirs["one"], tiny_hash)
    with pytest.raises(ValueError, match="use 1-64 letters, digits"):
        store.log_interaction(name, [], "x")
    assert list((tmp_path / "users" / "adapters").iterdir()) == [] and sorted(os.listdir(tmp_path)) == ["users"]


def test_good_user_names_pass():
    assert check_user("alice.B-1_2") == "alice.B-1_2" and check_user("x" * 64) == "x" * 64


def test_feedback_is_validated_and_counted(tmp_path):
    store = AdapterStore(tmp_path)
    first = store.log_interaction("alice", [{"role": "user", "content": "hi"}], "hello", interaction_id="chat-1")
    assert first == "chat-1" and store.interaction("chat-1").messages == [{"role": "user", "content": "hi"}]
    assert store.add_feedback("chat-1", "up") == 1
    assert store.add_feedback("chat-1", "rewrite", text="Hello!") == 2
    assert store.add_feedback("chat-1", "outcome", value=0.25) == 3
    with pytest.raises(NotFound, match="no interaction 'chat-9'"):
        store.add_feedback("chat-9", "up")
    bad = [("meh", {}, "feedback kind 'meh': use one of up, down, rewrite, correction, outcome"),
           ("rewrite", {"text": "  "}, "rewrite feedback needs the text"),
           ("correction", {}, "correction feedback needs the text"),
           ("outcome", {"value": math.nan}, "outcome feedback needs a finite number"),
           ("outcome", {"value": True}, "outcome feedback needs a finite number")]  # fmt: skip
    for kind, extra, message in bad:
        with pytest.raises(ValueError, match=message):
            store.add_feedback("chat-1", kind, **extra)
    interactions, rows = store.feedback_for("alice")
    assert [i.id for i in interactions] == ["chat-1"]
    assert [(r.kind, r.value, r.text) for r in rows] == [("up", 1.0, None), ("rewrite", None, "Hello!"),
                                                         ("outcome", 0.25, None)]  # fmt: skip
    assert store.counts("alice") == {"interactions": 1, "up": 1, "down": 0, "rewrite": 1, "correction": 0,
                                     "outcome": 1}  # fmt: skip
    assert store.feedback_for("bob") == ([], [])
