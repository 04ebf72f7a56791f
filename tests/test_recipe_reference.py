"""The recipe reference (docs/guide/recipe-reference.md) is generated from the config
dataclasses' docstrings: every field of every section is listed and described, and
the committed file is exactly the generator's output."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from ponder.config import PipelineRecipe, Recipe
from ponder.config.reference import COMMAND, descriptions, parse_docstring, reference_markdown, sections

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "guide" / "recipe-reference.md"
ALL = sections(PipelineRecipe)


def test_every_section_of_both_recipes_is_walked():
    keys = [s.key for s in ALL]
    top = [f.name for f in dataclasses.fields(PipelineRecipe)]
    assert [k for k in keys if "." not in k] == top
    nested = {"model.rope_scaling", "rollout.sampling", "reward.shaping", "reward.judge"}
    assert nested <= set(keys)
    assert [s.key for s in sections(Recipe)] == keys[: len(sections(Recipe))]


@pytest.mark.parametrize("section", ALL, ids=lambda s: s.key)
def test_every_field_has_a_description(section):
    found = descriptions(section.cls)
    missing = [f.name for f in dataclasses.fields(section.cls) if not found.get(f.name, "").strip()]
    assert not missing, (
        f"{section.cls.__name__} ({section.key}): document {missing} in its docstring as "
        f"'name: description', then run `{COMMAND}`"
    )
    assert section.summary


@pytest.mark.parametrize("section", ALL, ids=lambda s: s.key)
def test_docstring_names_no_field_the_class_lacks(section):
    names = {f.name for f in dataclasses.fields(section.cls)}
    assert set(descriptions(section.cls)) <= names


def test_the_text_lists_every_field_with_its_description():
    text = reference_markdown()
    for section in ALL:
        assert f"### `{section.key}`\n" in text
        for f in dataclasses.fields(section.cls):
            assert f"`{section.key}.{f.name}` · " in text, f"{section.key}.{f.name} not listed"
        for text_of_field in descriptions(section.cls).values():
            assert " ".join(text_of_field.split()[:4]) in " ".join(text.split())


def test_type_and_default_are_shown():
    text = reference_markdown()
    assert '`model.name` · str · default `"smollm2-135m"`' in text
    assert "`rollout.sampling.temperature` · float · default `1.0`" in text
    assert "`rollout.vllm_url` · str | None · default `null`" in text
    assert '`tracking.trackers` · list · default `["auto"]`' in text
    assert "`rollout.sampling` · section, below" in text


def test_lines_fit_80_columns():
    long = [line for line in reference_markdown().splitlines() if len(line) > 80]
    assert not long


def test_shared_and_inline_entries_are_split():
    _, _, entries = parse_docstring(type(Recipe().optim))
    assert (["lr"], "peak learning rate.") in entries
    assert (["weight_decay"], "AdamW decay.") in entries
    found = descriptions(type(Recipe().lora))
    assert found["r"] == found["alpha"] == found["dropout"]
    judge = descriptions(type(Recipe().reward.judge))
    assert judge["url"].endswith("http://127.0.0.1:8000/v1.")  # a URL's colon is no key


def test_undocumented_field_is_caught():
    @dataclasses.dataclass
    class Probe:
        """A probe.

        kept: documented.
            on two lines.
        A note that names no field.
        """

        kept: int = 1
        forgotten: int = 2

    found = descriptions(Probe)
    assert found == {"kept": "documented. on two lines."}
    assert parse_docstring(Probe)[1] == ["A note that names no field."]


def test_committed_reference_is_the_generators_output():
    assert DOCS.is_file(), f"missing {DOCS}: run `{COMMAND}`"
    assert DOCS.read_text(encoding="utf-8") == reference_markdown(), f"{DOCS} is stale: run `{COMMAND}`"


def test_the_command_writes_the_file(tmp_path):
    out = tmp_path / "guide" / "ref.md"
    subprocess.run([sys.executable, "-m", "ponder.config.reference", str(out)], check=True, cwd=ROOT)
    assert out.read_text(encoding="utf-8") == reference_markdown()
