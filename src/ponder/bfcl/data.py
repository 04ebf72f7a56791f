"""The Berkeley Function Calling Leaderboard's data, read from the installed `bfcl-eval` package.

`bfcl-eval` lives in its own virtual environment (`make bfcl-venv` → .venv-bfcl); its
`data/` folder holds one JSON object per line: questions with the functions they may
call (`BFCL_v4_<category>.json`) and the possible answers (`possible_answer/…`). This
module reads those files directly; it imports nothing from bfcl-eval.

Training and tuning use only the non-live categories; the live categories
(user-contributed questions and tools) are the test of generalisation.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ponder.tools.retrieval.toolindex import normalise_parameters
from ponder.types import ToolSpec

DEFAULT_VENV = ".venv-bfcl"
NON_LIVE = ("simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple")
LIVE = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
# The single-turn categories the adapter runs (BFCL's "simple" is simple_python here).
ADAPTER_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")
VERSION_PREFIX = "BFCL_v4"


class BfclDataError(ValueError):
    """The BFCL data cannot be found or read; the message says what to do."""


def resolve_venv(venv: str | os.PathLike[str]) -> Path:
    """`venv` as given, or, when it is relative and not in the working directory, the one
    `make bfcl-venv` made in ponder's checkout: ponder runs from any directory."""
    path = Path(venv)
    if path.is_absolute() or path.exists():
        return path
    checkout = Path(__file__).resolve().parents[4] / path
    return checkout if checkout.exists() else path


def find_data_dir(venv: str | os.PathLike[str] = DEFAULT_VENV) -> Path:
    """bfcl_eval/data inside `venv` (or $PONDER_BFCL_DATA when set)."""
    override = os.environ.get("PONDER_BFCL_DATA")
    if override:
        if not Path(override, f"{VERSION_PREFIX}_simple_python.json").is_file():
            raise BfclDataError(f"PONDER_BFCL_DATA={override} holds no {VERSION_PREFIX}_simple_python.json")
        return Path(override)
    found = sorted(resolve_venv(venv).glob("lib/python*/site-packages/bfcl_eval/data"))
    if not found:
        raise BfclDataError(f"bfcl-eval is not installed in {venv}; create it with `make bfcl-venv`")
    return found[-1]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise BfclDataError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    records = []
    for lineno, line in enumerate(lines, start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise BfclDataError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
    return records


@dataclass
class BfclQuestion:
    """One single-turn BFCL entry: the chat, the functions offered, the possible answers."""

    id: str
    category: str
    messages: list[dict[str, Any]]
    functions: list[dict[str, Any]]
    ground_truth: list[dict[str, Any]] = field(default_factory=list)

    @property
    def query(self) -> str:
        """The user's words (all user messages of the first turn), what retrieval searches with."""
        return "\n".join(str(m.get("content") or "") for m in self.messages if m.get("role") == "user").strip()

    @property
    def answer_names(self) -> set[str]:
        return {name for call in self.ground_truth for name in call}

    def answer_names_list(self) -> list[str]:
        """The names of the expected calls, repeated as often as they are called."""
        return [name for call in self.ground_truth for name in call]


def load_questions(data_dir: Path, category: str) -> list[BfclQuestion]:
    """The questions of a single-turn category with their possible answers (none for irrelevance)."""
    entries = read_jsonl(data_dir / f"{VERSION_PREFIX}_{category}.json")
    answers_path = data_dir / "possible_answer" / f"{VERSION_PREFIX}_{category}.json"
    answers = {r["id"]: r["ground_truth"] for r in read_jsonl(answers_path)} if answers_path.is_file() else {}
    questions = []
    for entry in entries:
        turns = entry.get("question") or [[]]
        questions.append(BfclQuestion(entry["id"], category, list(turns[0]), list(entry.get("function") or []),
                                      list(answers.get(entry["id"], []))))
    return questions


@dataclass
class ToolCorpus:
    """The unique tools of the BFCL data and what happened while reading them.

    read: definitions read; variants: unique (name, schema) pairs; skipped: definitions
    whose schema could not be normalised, by reason; specs: one tool per name.
    """

    specs: list[ToolSpec]
    read: int
    variants: int
    skipped: Counter = field(default_factory=Counter)
    definitions: dict[str, dict[str, Any]] = field(default_factory=dict)  # name → BFCL's own definition

    def summary(self) -> str:
        skipped = sum(self.skipped.values())
        return (f"{self.read} function definitions read, {self.variants} unique by name and schema, "
                f"{len(self.specs)} tools (one per name), {skipped} skipped for invalid schemas")


def _definition_files(data_dir: Path) -> list[Path]:
    """Non-live first, then live, then the multi-turn API docs: the first variant of a name wins."""
    ordered = [data_dir / f"{VERSION_PREFIX}_{c}.json" for c in NON_LIVE + ("irrelevance",)]
    rest = sorted(p for p in data_dir.glob(f"{VERSION_PREFIX}_*.json") if p not in ordered)
    return [p for p in ordered if p.is_file()] + rest + sorted((data_dir / "multi_turn_func_doc").glob("*.json"))


def _definitions(path: Path) -> list[Any]:
    try:
        records = read_jsonl(path)
    except BfclDataError:
        return []  # e.g. format_sensitivity.json is one JSON document of ids, not entries
    found: list[Any] = []
    for record in records:
        if isinstance(record, dict) and isinstance(record.get("function"), list):
            found.extend(record["function"])
        elif isinstance(record, dict) and "name" in record and "parameters" in record:
            found.append(record)  # multi_turn_func_doc: one definition per line
    return found


def load_tool_corpus(data_dir: Path) -> ToolCorpus:
    """Every function definition in the data files, deduplicated: one tool per name.

    Definitions with equal (name, schema) are one variant; a name defined with several
    schemas keeps its first variant in file order (non-live categories first), so that
    names, which is how BFCL's answers identify functions, stay unique in the index.
    """
    read, variants, skipped = 0, set(), Counter()
    specs: dict[str, ToolSpec] = {}
    definitions: dict[str, dict[str, Any]] = {}
    for path in _definition_files(data_dir):
        for definition in _definitions(path):
            read += 1
            spec, reason = definition_to_spec(definition)
            if spec is None:
                skipped[reason] += 1
                continue
            variants.add((spec.name, json.dumps(definition.get("parameters"), sort_keys=True)))
            specs.setdefault(spec.name, spec)
            definitions.setdefault(spec.name, definition)
    return ToolCorpus(list(specs.values()), read, len(variants), skipped, definitions)


def definition_to_spec(definition: Any) -> tuple[ToolSpec | None, str]:
    """A ToolSpec from a BFCL function definition, or None and the reason it was skipped."""
    if not isinstance(definition, dict) or not isinstance(definition.get("name"), str) or not definition["name"]:
        return None, "no function name"
    schema, reason = normalise_parameters(definition.get("parameters"))
    if schema is None:
        return None, reason.split(":")[0]
    return ToolSpec(definition["name"], str(definition.get("description") or ""), schema), ""


@dataclass
class LabelledQuery:
    """A query and the names of the tools that answer it."""

    id: str
    category: str
    query: str
    relevant: set[str]


def labelled_queries(data_dir: Path, categories: tuple[str, ...]) -> list[LabelledQuery]:
    """(query, tools) from the possible answers of `categories`; questions without answers are left out."""
    queries = []
    for category in categories:
        for question in load_questions(data_dir, category):
            if question.answer_names and question.query:
                queries.append(LabelledQuery(question.id, category, question.query, question.answer_names))
    return queries


def function_coin(name: str, seed: int, salt: str = "") -> float:
    """A fixed, seeded uniform number in [0, 1) per function name; a different `salt`
    gives an independent one."""
    digest = hashlib.sha256(f"{salt}{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def is_test_function(name: str, test_fraction: float, seed: int, salt: str = "") -> bool:
    """A fixed, seeded coin per function name: the held-out split is by function. A
    different `salt` gives an independent coin (the validation split uses one)."""
    return function_coin(name, seed, salt) < test_fraction


def split_by_function(
    queries: list[LabelledQuery], test_fraction: float = 0.2, seed: int = 0, salt: str = ""
) -> tuple[list[LabelledQuery], list[LabelledQuery]]:
    """(train, test): a query is test when all its tools are test functions, train when
    none is; queries mixing both are dropped, so no test tool is ever seen in training."""
    return split_queries(queries, lambda name: is_test_function(name, test_fraction, seed, salt))


def split_queries(
    queries: list[LabelledQuery], held_out: Callable[[str], bool]
) -> tuple[list[LabelledQuery], list[LabelledQuery]]:
    """(kept, held): held when `held_out` says so of all the query's tools, kept when of
    none; queries mixing both are dropped."""
    kept, held = [], []
    for query in queries:
        marks = [held_out(name) for name in query.relevant]
        if all(marks):
            held.append(query)
        elif not any(marks):
            kept.append(query)
    return kept, held
