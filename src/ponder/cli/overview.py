"""`ponder --help`'s grouped list of commands and each command's example line.

argparse lists sub-commands flat, in the order they were added; `group_commands`
hides that list and writes the commands into the description by group instead, each
with its own parser's one-line help. `EXAMPLES` gives every command the example its
`--help` ends with. tests/cli/test_cli_help.py checks that every registered command
stands in exactly one group and has an example.
"""

from __future__ import annotations

import argparse
import textwrap
from typing import Any

WIDTH = 80  # the grouped list never passes this column
NAME_COLUMN = 19  # "  bench-injection  " — the longest name and its margins

GROUPS: dict[str, tuple[str, ...]] = {
    "train": ("demo", "train", "train-adapters", "pipeline", "warmup", "improve", "export", "merge", "estimate"),
    "evaluate": ("eval", "report", "plot", "gain", "contamination", "bench-agent", "bench-injection",
                 "sandbagging"),
    "run and serve": ("chat", "run-agent", "serve", "gateway", "personal", "serve-retriever", "mcp-serve",
                      "a2a-serve", "tinker-serve"),
    "tools and data": ("tools", "gen-tasks", "export-data"),
    "experiments": ("needle", "refine"),
}

EXAMPLES: dict[str, tuple[str, ...]] = {
    "demo": (
        "ponder demo --quick",
        "ponder demo --recipe recipes/demo.yaml --out runs/demo",
        "ponder demo --recipe recipes/demo.yaml --out runs/demo --resume",
    ),
    "train": (
        "ponder train --recipe recipes/search_qa_grpo.yaml --out runs/grpo",
        "ponder train --resume runs/grpo train.steps=30",
    ),
    "train-adapters": ("ponder train-adapters examples/adapters/four.yaml --sft-from runs/demo",),
    "pipeline": ("ponder pipeline run recipes/pipeline_search_qa.yaml --out runs/pipeline",),
    "warmup": ("ponder warmup --recipe recipes/math.yaml --recipe recipes/code.yaml",),
    "improve": ("ponder improve --recipe recipes/math.yaml --rounds 2 --out runs/improve",),
    "export": ("ponder export runs/grpo --out runs/grpo-hf --merge",),
    "merge": ("ponder merge examples/merge/ties.yaml",),
    "estimate": (
        "ponder estimate recipes/demo.yaml",
        "ponder estimate recipes/demo.yaml --device h100 --devices 4 --json",
        "ponder estimate --versus runs/demo",
    ),
    "eval": (
        "ponder eval --recipe recipes/search_qa.yaml --model runs/grpo --out runs/eval",
        "ponder eval --recipe recipes/math.yaml --repeats 5 eval.temperature=1",
    ),
    "report": ("ponder report runs/grpo",),
    "plot": (
        "ponder plot runs/grpo",
        "ponder plot --compare runs/grpo runs/rloo --key reward/mean --out compare.png",
    ),
    "gain": ("ponder gain runs/demo runs/seed1 runs/seed2",),
    "contamination": (
        "ponder contamination recipes/math.yaml recipes/math.yaml",
        "ponder contamination sft.jsonl eval.jsonl --json --out report.json",
    ),
    "bench-agent": ("ponder bench-agent --model runs/fc --per-category 20 --retrieval-topk 0 5",),
    "bench-injection": ("ponder bench-injection --policy smollm2-135m --out runs/bench-injection",),
    "sandbagging": ("ponder sandbagging --recipe recipes/math.yaml --model runs/math",),
    "chat": ("ponder chat --model runs/grpo --tools calculator",),
    "run-agent": ('ponder run-agent --task "What is 17 * 23?" --tools calculator',),
    "serve": ("ponder serve --adapter grpo=runs/grpo --port 8000",),
    "gateway": ("ponder gateway --recipe recipes/gateway_math.yaml --out runs/online",),
    "personal": ("ponder personal list --users ~/.ponder-users",),
    "serve-retriever": ("ponder serve-retriever --recipe recipes/search_qa.yaml --port 8000",),
    "mcp-serve": ("ponder mcp-serve --transport http --tools calculator,python",),
    "a2a-serve": ("ponder a2a-serve --model runs/grpo --tools calculator --port 9000",),
    "tinker-serve": ("ponder tinker-serve --model smollm2-135m --port 8000",),
    "tools": ('ponder tools search "convert 100 dollars to euros" --index runs/tools/index',),
    "gen-tasks": ("ponder gen-tasks --out runs/tasks",),
    "export-data": (
        "ponder export-data runs/vqa --layout trl-messages --out sft.jsonl",
        "ponder export-data runs/vqa --layout verl-rl --out rl.parquet",
    ),
    "needle": ("ponder needle --rope yarn --factor 4 --lengths 1x,2x,4x --out needle.json",),
    "refine": ("ponder refine --recipe recipes/math.yaml --sft-from runs/math",),
}


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that a block of lines of which one is indented
    (the grouped list, example lines) is kept as written; other paragraphs are
    filled to the width as usual."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        blocks = []
        for block in text.strip("\n").split("\n\n"):
            lines = block.splitlines()
            if any(line.startswith(" ") for line in lines):
                blocks.append("\n".join(indent + line for line in lines))
            else:
                blocks.append(super()._fill_text(block, width, indent))
        return "\n\n".join(blocks)


def grouped_list(helps: dict[str, str]) -> str:
    """The commands by group, one line each: `  name   help`."""
    lines = []
    for group, names in GROUPS.items():
        lines.append(f"{group}:")
        for name in names:
            entry = f"  {name:<{NAME_COLUMN - 4}}  {helps[name]}"
            lines.extend(
                textwrap.wrap(entry, WIDTH, subsequent_indent=" " * NAME_COLUMN, break_on_hyphens=False)
            )  # never cut
        lines.append("")
    return "\n".join(lines).rstrip("\n")


def group_commands(parser: argparse.ArgumentParser, commands: Any, summary: str) -> None:
    """Hide argparse's flat list of `commands` (the sub-parsers action of `parser`),
    write the grouped one into the description after `summary`, and give every
    command its example."""
    helps = {action.dest: action.help or "" for action in commands._choices_actions}
    grouped = [name for names in GROUPS.values() for name in names]
    missing = sorted(set(commands.choices) - set(grouped))
    if missing:  # a new command must be placed, or it would vanish from --help
        raise AssertionError(
            f"ponder --help: put {', '.join(missing)} in a group of ponder.cli.overview.GROUPS"
        )
    commands.help = argparse.SUPPRESS
    parser.usage = "%(prog)s [-h] COMMAND ..."
    parser.formatter_class = HelpFormatter
    parser.description = f"{summary}\n\n{grouped_list(helps)}"
    for name, sub in commands.choices.items():
        examples = EXAMPLES.get(name, ())
        if not examples:
            continue
        lines = "\n".join(f"  {line}" for line in examples)
        heading = "example:" if len(examples) == 1 else "examples:"
        sub.epilog = f"{sub.epilog}\n\n{heading}\n{lines}" if sub.epilog else f"{heading}\n{lines}"
        if sub.formatter_class is argparse.HelpFormatter:
            sub.formatter_class = HelpFormatter
