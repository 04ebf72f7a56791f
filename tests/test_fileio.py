"""fileio: strict JSON (no NaN / Infinity tokens) and durable atomic writes."""

import json
import os

import numpy as np
import pytest
import torch

from ponder.fileio import atomic_path, dumps_strict, write_json_atomic


def _strict_loads(text):
    """json.loads that refuses NaN, Infinity and -Infinity, as JSON.parse and jq do."""

    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def test_write_json_atomic_turns_every_non_finite_float_into_null(tmp_path):
    value = {
        "nan": float("nan"), "inf": float("inf"), "ninf": -float("inf"), "ok": 0.25,
        "nested": [{"x": (1.5, float("nan"))}, np.float32("nan"), np.float64("inf"), np.float32(0.5)],
        "array": np.array([1.0, np.nan]), "tensor": torch.tensor([float("inf"), 2.0]),
        "count": np.int64(3), "flag": True, "none": None, "text": "NaN",
    }  # fmt: skip
    path = tmp_path / "out" / "results.json"
    write_json_atomic(path, value)
    text = path.read_text()
    assert text.endswith("}\n") and "NaN," not in text and "Infinity" not in text
    assert _strict_loads(text) == {
        "nan": None, "inf": None, "ninf": None, "ok": 0.25,
        "nested": [{"x": [1.5, None]}, None, None, 0.5],
        "array": [1.0, None], "tensor": [None, 2.0], "count": 3, "flag": True, "none": None, "text": "NaN",
    }  # fmt: skip
    assert sorted(os.listdir(path.parent)) == ["results.json"]


def test_dumps_strict_cleans_what_default_returns_and_keeps_json_options():
    class Seconds:
        def __init__(self, value):
            self.value = value

    text = dumps_strict(
        {"b": Seconds(float("nan")), "a": Seconds(2.0)}, default=lambda s: s.value, sort_keys=True
    )
    assert text == '{"a": 2.0, "b": null}'
    with pytest.raises(TypeError):  # without `default` an unknown object is still an error
        dumps_strict({"a": Seconds(1.0)})


def test_atomic_path_fsyncs_the_file_before_the_rename_and_the_directory_after(tmp_path, monkeypatch):
    # A spy around the real os.fsync records what each call synced and whether the
    # target existed yet: the data must be on disk before the new name points at it.
    synced = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        name = os.readlink(f"/proc/self/fd/{fd}")
        synced.append((name, (tmp_path / "data.json").exists()))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    with atomic_path(tmp_path / "data.json") as tmp, open(tmp, "w") as handle:
        handle.write("{}")
    assert len(synced) == 2
    (temp_name, existed_then), (directory, _) = synced
    assert os.path.basename(temp_name).startswith(".data.json.") and not existed_then
    assert directory == str(tmp_path)
    assert (tmp_path / "data.json").read_text() == "{}"


def test_atomic_dir_appears_whole_or_not_at_all(tmp_path):
    from ponder.fileio import atomic_dir

    out = tmp_path / "model"
    with pytest.raises(RuntimeError):
        with atomic_dir(out) as staging:
            (staging / "half").write_text("x")
            raise RuntimeError("failed midway")
    assert not out.exists() and list(tmp_path.iterdir()) == []  # nothing left behind
    with atomic_dir(out) as staging:
        (staging / "whole").write_text("x")
    assert [p.name for p in out.iterdir()] == ["whole"]
    with pytest.raises(ValueError, match="exists and is not empty"):
        with atomic_dir(out):
            pass
