"""`ponder bench-injection`: wiring only; the suite lives in ponder.eval.injection.suite."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

SCRIPTED = "scripted"


def _names(text: str | None) -> list[str] | None:
    return [name.strip() for name in text.split(",") if name.strip()] if text else None


def register(commands: Any) -> None:
    """Add `bench-injection` to the `ponder` sub-command parsers."""
    bench = commands.add_parser("bench-injection",
                                help="prompt injection: utility and attack success per defence")
    bench.add_argument("--policy", default=SCRIPTED,
                       help="scripted (the always-comply worst case), smollm2-135m, a model dir or an "
                            "OpenAI-compatible URL")  # fmt: skip
    bench.add_argument("--out", default="runs/bench-injection", help="writes episodes.jsonl, results.json, results.md")
    bench.add_argument("--defences", help="comma-separated (default: all): none,render,prompt,detector,allowlist,"
                                          "arguments,confirm,infoflow,monitor,all")
    bench.add_argument("--tasks", help="comma-separated user tasks (default: all)")
    bench.add_argument("--goals", help="comma-separated injection goals (default: all)")
    bench.add_argument("--templates", help="comma-separated attack templates (default: all)")
    bench.add_argument("--max-turns", type=int, default=6, help="model actions per episode")
    bench.add_argument("--max-new-tokens", type=int, default=128, help="tokens per model action")
    bench.add_argument("--opening", type=int, default=1,
                       help="with a model: its first N actions are the task's scripted reads, so it always "
                            "reads the poisoned output (0: the model acts from the start)")
    bench.set_defaults(handler=cmd_bench_injection)


def cmd_bench_injection(args: argparse.Namespace) -> int:
    from ponder.eval.injection.scripted import ScriptedOpening, ScriptedPlanPolicy
    from ponder.eval.injection.suite import SuiteSettings, markdown_table, run_suite, summarize, write_report

    settings = SuiteSettings(_names(args.tasks), _names(args.goals), _names(args.templates), _names(args.defences),
                             args.max_turns, args.max_new_tokens)  # fmt: skip
    if args.policy == SCRIPTED:
        def make_policy(task: Any) -> Any:
            return ScriptedPlanPolicy(task)
    else:
        from ponder.agent import load_chat_policy

        model = load_chat_policy(args.policy, temperature=0.0, stream_chunk_tokens=0)

        def make_policy(task: Any) -> Any:
            return ScriptedOpening(model, task, args.opening) if args.opening > 0 else model

    started = time.monotonic()

    def say(episode: Any) -> None:
        attack = f" {episode.goal}/{episode.template} attack={'yes' if episode.attack_success else 'no'}" \
            if episode.goal else ""  # fmt: skip
        print(f"[{episode.defence}] {episode.task}{attack} utility={'yes' if episode.utility else 'no'}",
              file=sys.stderr, flush=True)

    episodes = run_suite(make_policy, settings, on_episode=say)
    header = {"policy": args.policy, "opening": args.opening if args.policy != SCRIPTED else None,
              "command": " ".join(["ponder", *sys.argv[1:]]), "seconds": round(time.monotonic() - started, 1),
              "settings": vars(settings)}  # fmt: skip
    print(markdown_table(summarize(episodes)))
    for path in write_report(args.out, episodes, header):
        print(f"wrote {path}", file=sys.stderr)
    return 0
