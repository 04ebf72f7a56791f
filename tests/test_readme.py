"""The README's own commands run as written (on the tiny model) and do what it says.

Every `ponder …` line of the README's bash blocks must be listed in COMMANDS: run
(with tiny-model settings appended, which override the recipe) or skipped with the
reason and the test that covers it instead. A README command missing here fails
the test, so the README cannot drift from what ponder accepts.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ponder.cli import main

ROOT = Path(__file__).resolve().parents[1]
SMALL_WORLD = ["env.taskgen.n_people=20", "env.taskgen.n_train=8", "env.taskgen.n_eval=2"]
TINY = [
    "model.name=tiny", "sft.steps=2", "sft.batch_size=2", "sft.examples=4", "train.steps=2",
    "train.tasks_per_step=2", "rollout.group_size=2", "rollout.sampling.max_new_tokens_per_turn=8",
    "train.save_every=1", "lora.r=4", "eval.episodes=2", *SMALL_WORLD,
]  # fmt: skip
PIPELINE = ["model.name=tiny", "sft.steps=1", "sft.examples=4", "sft_trainer.steps=1", "dpo.steps=1",
            "pipeline.stages=[sft,eval]", "rollout.sampling.max_new_tokens_per_turn=8", "eval.episodes=2",
            *SMALL_WORLD]  # fmt: skip  (the tiny model ties every DPO pair: tests/train/test_pipeline.py covers DPO)
SKIP = "skip"
# README command → what the test appends to it (or SKIP and why).
COMMANDS: dict[str, list[str] | tuple[str, str]] = {
    "ponder --help": [],
    "ponder demo --quick": TINY,
    "ponder demo --recipe recipes/search_qa_rloo.yaml --sft-from runs/demo --out runs/rloo": TINY,
    "ponder gain runs/demo runs/rloo --each": [],
    "ponder train --recipe recipes/search_qa_grpo.yaml --out runs/grpo": TINY,
    "ponder train --recipe recipes/search_qa_ppo.yaml --out runs/ppo algo.epochs=4": TINY,
    "ponder train --resume runs/grpo train.steps=30": ["train.steps=3"],
    "ponder train --recipe recipes/search_qa_rloo.yaml --sft-from runs/grpo --out runs/grpo-rloo": TINY,
    "ponder plot runs/grpo": [],
    "ponder plot --compare runs/demo runs/rloo --key reward/mean --key episode/searches --out cmp.png": [],
    "ponder report runs/demo --compare runs/rloo": [],
    "ponder train --recipe recipes/search_qa_grpo.yaml --out runs/grpo-wb 'tracking.trackers=[tensorboard, wandb]'": TINY,
    "ponder eval --recipe recipes/search_qa.yaml --model runs/grpo --episodes 32 --out runs/eval": SMALL_WORLD,
    "ponder chat --model runs/grpo --tools calculator": [],
    "ponder export runs/grpo --out runs/grpo-hf --merge": [],
    "ponder serve --adapter grpo=runs/grpo --port 8000": (
        SKIP, "serves until stopped: tests/serve/test_cli.py runs it (with an adapter) on a free port"),
    "ponder serve --users runs/users --port 8000": (
        SKIP, "serves until stopped: tests/personal/test_serve_users.py serves two users over HTTP on 127.0.0.1"),
    "ponder personal list --users runs/users": (
        SKIP, "needs a store with users: tests/personal/test_cli.py lists, updates and rolls back one"),
    "ponder improve --recipe recipes/math.yaml --sft-from runs/math --rounds 3 --out runs/rft": (
        SKIP, "needs a math warm-up: tests/train/test_improve.py runs whole rounds on the tiny model"),
    "ponder merge examples/merge/ties.yaml": (
        SKIP, "merges trained runs: tests/models/test_merge.py merges tiny-model adapters and full weights"),
    "ponder warmup --recipe recipes/math.yaml --recipe recipes/demo.yaml --out runs/shared": (
        SKIP, "SFT on two recipes' full demonstrations: tests/train/test_shared_warmup.py runs it "
              "on tiny recipes"),
    "ponder mcp-serve --tools calculator,python": (
        SKIP, "serves until stopped: tests/tools/mcp/test_mcp.py runs it over stdio and HTTP"),
    "ponder train --recipe recipes/search_qa_grpo.yaml --out runs/grpo-ray --ray": (
        SKIP, "starts a Ray cluster: tests/train/test_distributed.py runs it on a local one"),
    "ponder train --recipe recipes/search_qa_grpo.yaml --out runs/grpo-vllm rollout.backend=vllm": (
        SKIP, "needs `make vllm-venv`: tests/rollout/test_vllm_backend.py (slow) runs a real vLLM-CPU server"),
    "ponder gen-tasks --out data/": SMALL_WORLD,
    "ponder serve-retriever --corpus data/corpus.jsonl --port 8000": (
        SKIP, "serves until stopped: tests/retrieval/test_server.py runs it on a free port"),
    "ponder eval --recipe recipes/search_qa.yaml --out runs/eval-http retriever.kind=http "
    "retriever.url=http://127.0.0.1:8000": (SKIP, "needs the server above: tests/retrieval/test_server.py"),
    "ponder chat --model smollm2-135m --tools calculator,python": ["--model", "tiny"],
    'ponder run-agent --task "What is 17 * 23?" --tools calculator': ["--model", "tiny"],
    'ponder run-agent --task "…" --tools rag --docs ./docs': ["--model", "tiny", "max_turns=1"],
    "ponder tools train": (SKIP, "fine-tunes the encoder for minutes: tests/eval/test_tool_retrieval.py"),
    "ponder tools eval": (SKIP, "needs `tools train`: tests/eval/test_tool_retrieval.py"),
    "ponder tools index": (SKIP, "needs `tools train`: tests/eval/test_tool_retrieval.py"),
    'ponder tools search "convert 100 USD to EUR"': (SKIP, "needs `tools index`"),
    "ponder bench-agent --model smollm2-135m --retrieval-topk 0 5": (
        SKIP, "BFCL's checker in .venv-bfcl, minutes: tests/eval/test_bench_agent_samples.py"),
    "ponder demo --recipe recipes/math.yaml --out runs/math": [*TINY, "env.options.n_train=16", "train.val_tasks=2",
                                                               "train.eval_every=1"],
    "ponder demo --recipe recipes/code.yaml --out runs/code": [*TINY, "env.options.n_train=16"],
    "ponder demo --recipe recipes/function_calling.yaml --out runs/fc": TINY,
    "ponder demo --recipe examples/guess_number/recipe.yaml --out runs/guess": TINY,
    "ponder pipeline run recipes/pipeline_search_qa.yaml": PIPELINE,
    "ponder pipeline run recipes/pipeline_search_qa.yaml --resume": PIPELINE,
}


def readme_commands() -> list[str]:
    """`ponder …` commands of the README's bash blocks, comments dropped, `&&` split."""
    text = (ROOT / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            commands += [part.strip() for part in line.split("&&") if part.strip().startswith("ponder")]
    return commands


def test_every_readme_command_is_listed():
    assert [c for c in readme_commands() if c not in COMMANDS] == []


def _run(command: str, extra: list[str], monkeypatch, capsys) -> str:
    argv = shlex.split(command)[1:] + extra
    if argv[0] == "chat":  # piped: one question, then the end of input
        monkeypatch.setattr(sys, "stdin", io.StringIO("What is 2 + 2?\n/help\n"))
    if argv == ["--help"]:
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 0
    else:  # run-agent exits 1 when the agent stopped without an answer (the tiny model never answers)
        assert main(argv) in ((0, 1) if argv[0] == "run-agent" else (0,)), f"{command}: {capsys.readouterr().err[-800:]}"
    return capsys.readouterr().out


# What a command must have done (run in its chain's directory): directory, its output -> bool.
CHECKS: dict[str, Callable[[Path, str], bool]] = {
    "ponder --help": lambda d, out: "export" in out and "PONDER_DEBUG=1" in out,
    "ponder demo --recipe recipes/search_qa_rloo.yaml --sft-from runs/demo --out runs/rloo":
        lambda d, out: json.loads((d / "runs/rloo/results.json").read_text())["sft_from"] == "runs/demo",
    "ponder train --resume runs/grpo train.steps=30":
        lambda d, out: [json.loads(line)["step"] for line in open(d / "runs/grpo/metrics.jsonl")]
        == [1, 2, 3],
    "ponder train --recipe recipes/search_qa_rloo.yaml --sft-from runs/grpo --out runs/grpo-rloo":
        lambda d, out: (d / "runs/grpo-rloo/sft/adapter_model.safetensors").read_bytes()
        == (d / "runs/grpo/sft/adapter_model.safetensors").read_bytes(),
    "ponder plot runs/grpo": lambda d, out: (d / "runs/grpo/plots/reward.png").is_file(),
    "ponder plot --compare runs/demo runs/rloo --key reward/mean --key episode/searches --out cmp.png":
        lambda d, out: (d / "cmp.png").read_bytes()[:4] == b"\x89PNG",
    "ponder eval --recipe recipes/search_qa.yaml --model runs/grpo --episodes 32 --out runs/eval":
        lambda d, out: json.loads((d / "runs/eval/metrics.json").read_text())["model"] == "runs/grpo",
    "ponder export runs/grpo --out runs/grpo-hf --merge":
        lambda d, out: (d / "runs/grpo-hf/config.json").is_file(),
    "ponder gen-tasks --out data/":
        lambda d, out: {"corpus.jsonl", "train.jsonl", "eval.jsonl"}
        <= {p.name for p in (d / "data").iterdir()},
    "ponder chat --model smollm2-135m --tools calculator,python": lambda d, out: "/tools" in out,
    'ponder run-agent --task "What is 17 * 23?" --tools calculator':
        lambda d, out: json.loads(out)["status"] in ("answered", "stopped")
        and json.loads(out)["stop_reason"],
    "ponder pipeline run recipes/pipeline_search_qa.yaml --resume":
        lambda d, out: (d / "runs/pipeline/results.json").is_file(),
}  # fmt: skip
# Commands that read another's output run after it in one directory (README order);
# every other command runs alone, so the chains and the rest spread over test workers.
CHAINS = {"runs/demo": "demo", "runs/rloo": "demo", "runs/grpo": "grpo", "pipeline run": "pipeline"}


def chains() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for command in readme_commands():
        if not isinstance(COMMANDS[command], tuple):
            name = next((chain for marker, chain in CHAINS.items() if marker in command), command)
            found.setdefault(name, []).append(command)
    return found


def test_every_check_is_a_readme_command():
    assert set(CHECKS) - set(readme_commands()) == set()


@pytest.mark.parametrize("chain", list(chains()))
def test_readme_commands_run_as_written(chain, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # recipes resolve from any directory
    (tmp_path / "docs").mkdir()  # the RAG command's ./docs: two of ponder's documents and an image
    for name in ("guide/agents.md", "guide/tools.md", "results/img/demo-reward.png"):
        (tmp_path / "docs" / Path(name).name).symlink_to(ROOT / "docs" / name)
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # its README line runs from the repository root
    if chain == "demo":  # `make demo` first: the chain's later commands reuse its warm-up
        _run("ponder demo --recipe recipes/demo.yaml --out runs/demo", TINY, monkeypatch, capsys)
    for command in chains()[chain]:
        output = _run(command, list(COMMANDS[command]), monkeypatch, capsys)
        check = CHECKS.get(command, lambda d, out: True)
        assert check(tmp_path, output), f"{command}: not done as the README says"
