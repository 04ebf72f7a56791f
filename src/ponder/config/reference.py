"""The recipe reference (docs/guide/recipe-reference.md), generated from the config
dataclasses' docstrings so that it cannot drift from them.

A section's docstring is its summary (first paragraph), then one entry per field:
a line `name: description` at the docstring's margin, continued on indented lines;
fields that share a description are written `a / b: ...` or `a, b: ...`; a short
entry may follow another on the same line after a full stop (`lr: peak LR.
weight_decay: AdamW decay.`). Other lines at the margin are notes on the section.

    python -m ponder.config.reference docs/guide/recipe-reference.md

Plain data: imports nothing of ponder outside this package.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import sys
import textwrap
import typing
from pathlib import Path
from typing import Any

from ponder.config.pipeline import PipelineRecipe
from ponder.config.sections import Recipe

WIDTH = 80
_NAMES = r"[a-z_][a-z0-9_]*(?:(?: / |, )[a-z_][a-z0-9_]*)*"
_ENTRY = re.compile(rf"^({_NAMES}): (.*)$")
_INLINE = re.compile(rf"(?<=\. )({_NAMES}): ")

COMMAND = "python -m ponder.config.reference docs/guide/recipe-reference.md"


@dataclasses.dataclass
class Section:
    """One recipe section: its dotted key, summary, notes and per-field descriptions."""

    key: str
    cls: type
    summary: str
    notes: list[str]
    entries: list[tuple[list[str], str]]  # (field names sharing it, description)


def _names(text: str, fields: set[str]) -> list[str] | None:
    names = re.split(r" / |, ", text)
    return names if all(name in fields for name in names) else None


def _split_inline(names: list[str], text: str, fields: set[str]) -> list[tuple[list[str], str]]:
    """`a: x. b: y.` as [(a, 'x.'), (b, 'y.')], splitting only before known field names."""
    entries = [(names, "")]
    position = 0
    for match in _INLINE.finditer(text):
        found = _names(match.group(1), fields)
        if found is None:
            continue
        entries[-1] = (entries[-1][0], text[position : match.start()].strip())
        entries.append((found, ""))
        position = match.end()
    entries[-1] = (entries[-1][0], text[position:].strip())
    return entries


def parse_docstring(cls: type) -> tuple[str, list[str], list[tuple[list[str], str]]]:
    """(summary, notes, entries) of a config dataclass's docstring (see the module's)."""
    doc = inspect.cleandoc(cls.__doc__ or "")
    summary, _, body = doc.partition("\n\n")
    fields = {f.name for f in dataclasses.fields(cls)}
    notes: list[str] = []
    raw: list[tuple[list[str], list[str]]] = []
    current: list[str] | None = None
    for line in body.splitlines():
        match = _ENTRY.match(line)
        names = _names(match.group(1), fields) if match else None
        if names is not None and match is not None:
            current = [match.group(2)]
            raw.append((names, current))
        elif line[:1].isspace() and current is not None:
            current.append(line.strip())
        elif line.strip():
            current = None
            notes.append(line.strip())
        else:
            current = None
    entries = [e for names, lines in raw for e in _split_inline(names, " ".join(lines), fields)]
    return " ".join(summary.split()), _join_notes(notes), entries


def _join_notes(lines: list[str]) -> list[str]:
    """Note lines as sentences: a line that does not end one runs on into the next."""
    notes: list[str] = []
    for line in lines:
        if notes and not notes[-1].endswith((".", ")", ":")):
            notes[-1] += " " + line
        else:
            notes.append(line)
    return notes


def descriptions(cls: type) -> dict[str, str]:
    """Field name → its description; a section field with none gets its class's summary."""
    _, _, entries = parse_docstring(cls)
    found = {name: text for names, text in entries for name in names}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not found.get(f.name) and dataclasses.is_dataclass(hints[f.name]):
            found[f.name] = parse_docstring(hints[f.name])[0]
    return found


def sections(root: type, prefix: str = "", skip: tuple[str, ...] = ()) -> list[Section]:
    """Every section under `root` (a Recipe class), depth first, in field order."""
    out: list[Section] = []
    hints = typing.get_type_hints(root)
    for f in dataclasses.fields(root):
        cls = hints[f.name]
        if f.name in skip or not dataclasses.is_dataclass(cls):
            continue
        key = f"{prefix}{f.name}"
        summary, notes, entries = parse_docstring(cls)
        if summary.startswith(f"{key}: "):  # `model.rope_scaling: a longer context …`
            summary = summary[len(key) + 2 :][:1].upper() + summary[len(key) + 3 :]
        out.append(Section(key, cls, summary, notes, entries))
        out.extend(sections(cls, key + "."))
    return out


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value: Any = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    return f"`{json.dumps(value)}`"


def _wrap(text: str, indent: str = "", first: str | None = None) -> list[str]:
    return textwrap.wrap(
        text, WIDTH, initial_indent=indent if first is None else first, subsequent_indent=indent,
        break_long_words=False, break_on_hyphens=False,
    )  # fmt: skip


def _term(section: Section, f: dataclasses.Field, hints: dict[str, Any]) -> list[str]:
    """A field's term line(s): `key` · type · default, the default below when too wide."""
    key = f"`{section.key}.{f.name}`"
    if dataclasses.is_dataclass(hints[f.name]):
        return [f"{key} · section, below"]
    kind = str(f.type).replace("typing.", "")
    line = f"{key} · {kind} · default {_default(f)}"
    return [line] if len(line) <= WIDTH else [f"{key} · {kind}", f"default {_default(f)}"]


def _section_markdown(section: Section) -> list[str]:
    hints = typing.get_type_hints(section.cls)
    fields = {f.name: f for f in dataclasses.fields(section.cls)}
    described = descriptions(section.cls)
    lines = [f"### `{section.key}`", "", *_wrap(section.summary), ""]
    for note in section.notes:
        lines += [*_wrap(note), ""]
    done: set[str] = set()
    entries = {name: names for names, _ in section.entries for name in names}
    for name, f in fields.items():
        if name in done:
            continue
        group = [n for n in entries.get(name, [name]) if n in fields and n not in done] or [name]
        done.update(group)
        for member in group:
            lines += _term(section, fields[member], hints)
        lines += [*_wrap(described.get(name) or "(undocumented)", "    ", ":   "), ""]
    return lines


def reference_markdown() -> str:
    """The whole recipe reference as markdown (the committed docs file is exactly this)."""
    intro = (
        "Every key a recipe can set, section by section: its type, its default and what "
        "it does. A recipe is a YAML file of these sections; any key can also be set "
        "on the command line as a dotted override (`rollout.sampling.temperature=0.7`). "
        "An unknown key, a duplicate key or a value of the wrong type is refused "
        "before anything loads, naming the file and the key."
    )
    lines = ["# Recipe reference", "", *_wrap(intro), ""]
    lines += [*_wrap("Generated from the config dataclasses' docstrings "
                     "(src/ponder/config/sections.py and pipeline.py): edit those, "
                     "not this file, then regenerate it:"), ""]  # fmt: skip
    lines += ["```", COMMAND, "```", ""]
    recipe_keys = tuple(f.name for f in dataclasses.fields(Recipe))
    common, pipeline = sections(Recipe), sections(PipelineRecipe, skip=recipe_keys)
    lines += ["## Sections of every recipe", ""]
    lines += [*_wrap(", ".join(f"`{s.key}`" for s in common) + "."), ""]
    for section in common:
        lines += _section_markdown(section)
    lines += ["## Pipeline sections", ""]
    lines += [*_wrap("Read by `ponder pipeline run` only, on top of the sections above "
                     "(a PipelineRecipe is a Recipe plus these): "
                     + ", ".join(f"`{s.key}`" for s in pipeline) + "."), ""]  # fmt: skip
    for section in pipeline:
        lines += _section_markdown(section)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the reference to the path given (stdout when none)."""
    args = sys.argv[1:] if argv is None else argv
    text = reference_markdown()
    if not args:
        sys.stdout.write(text)
        return 0
    path = Path(args[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
