"""`ponder bench-injection`: wiring only; the suites live in ponder.eval.injection.

--suite injection (default): AgentDojo-style injections in tool output (suite.py);
poisoning: poisoned MCP servers (poisoning.py); escalation: Crescendo and best-of-N
against the chat runtime (escalation.py); cascade: a hostile team member (cascade.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

SCRIPTED = "scripted"
SUITES = ("injection", "poisoning", "escalation", "cascade")
# Each suite's defences (--defences); tests/eval/test_cascade.py checks them against the suites.
SUITES_HELP = """suites and their defences (--defences; none: undefended, all: every layer):
  injection   instructions in tool output (files, e-mail, search, web pages):
              none,render,prompt,detector,allowlist,arguments,confirm,infoflow,
              monitor,all
  poisoning   poisoned MCP servers: instructions in tool descriptions, schemas,
              names and results: none,screen,strip,results,guard,all
  escalation  Crescendo (many innocuous turns) and best-of-N (perturbed
              retries) against the chat agent: none,last_turn_raw,last_turn,
              conversation_raw,all
  cascade     a hostile team member (coordinator, A2A peer, peer chat):
              none,guards,data,taint,all
the scripted policies obey every instruction they read, so the defences alone
decide; --policy runs a model instead (injection and poisoning suites)"""


def _names(text: str | None) -> list[str] | None:
    return [name.strip() for name in text.split(",") if name.strip()] if text else None


def register(commands: Any) -> None:
    """Add `bench-injection` to the `ponder` sub-command parsers."""
    bench = commands.add_parser("bench-injection", help="prompt injection: utility and attack success per defence",
                                epilog=SUITES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_argument("--suite", choices=SUITES, default="injection",
                       help="injection (tool output), poisoning (MCP tool definitions and results), escalation "
                            "(Crescendo, best-of-N), cascade (a hostile team member)")  # fmt: skip
    bench.add_argument("--policy", default=SCRIPTED,
                       help="scripted (the always-comply worst case), smollm2-135m, a model dir or an "
                            "OpenAI-compatible URL (injection and poisoning suites)")  # fmt: skip
    bench.add_argument("--out", default=None, help="writes episodes.jsonl, results.json, results.md "
                                                   "(default runs/bench-injection[-SUITE])")
    bench.add_argument("--defences", help="comma-separated (default: every one of the suite's, listed below)")
    bench.add_argument("--tasks", help="comma-separated user tasks (default: all)")
    bench.add_argument("--goals", help="comma-separated injection goals (injection suite; default: all)")
    bench.add_argument("--templates", help="comma-separated attack templates (injection suite; default: all)")
    bench.add_argument("--attacks", help="comma-separated poisoned servers' attacks (poisoning suite; default: all)")
    bench.add_argument("--teams", help="comma-separated coordinator,a2a,chat (cascade suite; default: all)")
    bench.add_argument("--n", type=int, default=20, help="best-of-N attempts per request (escalation suite)")
    bench.add_argument("--seed", type=int, default=0, help="best-of-N perturbation seed (escalation suite)")
    bench.add_argument("--max-turns", type=int, default=6, help="model actions per episode")
    bench.add_argument("--max-new-tokens", type=int, default=128, help="tokens per model action")
    bench.add_argument("--opening", type=int, default=1,
                       help="with a model: its first N actions are the task's scripted reads, so it always "
                            "reads the poisoned output (0: the model acts from the start)")
    bench.set_defaults(handler=cmd_bench_injection)


def _make_policy(args: argparse.Namespace, scripted: Any) -> Any:
    if args.policy == SCRIPTED:
        return scripted
    from ponder.agent import load_chat_policy
    from ponder.eval.injection.scripted import ScriptedOpening

    model = load_chat_policy(args.policy, temperature=0.0, stream_chunk_tokens=0)

    def make_policy(task: Any) -> Any:
        return ScriptedOpening(model, task, args.opening) if args.opening > 0 else model

    return make_policy


def _say(episode: Any) -> None:
    fields = episode if isinstance(episode, dict) else episode.to_dict()
    shown = " ".join(f"{k}={v}" for k, v in fields.items() if k in ("defence", "task", "team", "kind", "conversation",
                                                                     "goal", "template", "attack", "utility",
                                                                     "attack_success", "success"))  # fmt: skip
    print(shown, file=sys.stderr, flush=True)


def cmd_bench_injection(args: argparse.Namespace) -> int:
    started = time.monotonic()
    if args.policy != SCRIPTED and args.suite in ("escalation", "cascade"):
        raise ValueError(f"--policy applies to the injection and poisoning suites; the {args.suite} suite runs "
                         "scripted agents only")  # fmt: skip
    runner = {"injection": _injection, "poisoning": _poisoning, "escalation": _escalation, "cascade": _cascade}
    records, rows, table, settings = runner[args.suite](args)
    header = {"suite": args.suite, "policy": args.policy, "command": " ".join(["ponder", *sys.argv[1:]]),
              "seconds": round(time.monotonic() - started, 1), "settings": settings}  # fmt: skip
    from ponder.eval.injection.suite import write_records

    out = args.out or ("runs/bench-injection" if args.suite == "injection" else f"runs/bench-injection-{args.suite}")
    print(table)
    for path in write_records(out, records, header, rows, table):
        print(f"wrote {path}", file=sys.stderr)
    return 0


def _injection(args: argparse.Namespace) -> tuple[list[Any], list[Any], str, Any]:
    from ponder.eval.injection.scripted import ScriptedPlanPolicy
    from ponder.eval.injection.suite import SuiteSettings, markdown_table, run_suite, summarize

    settings = SuiteSettings(_names(args.tasks), _names(args.goals), _names(args.templates), _names(args.defences),
                             args.max_turns, args.max_new_tokens)  # fmt: skip
    episodes = run_suite(_make_policy(args, lambda task: ScriptedPlanPolicy(task)), settings, on_episode=_say)
    rows = summarize(episodes)
    return [e.to_dict() for e in episodes], rows, markdown_table(rows), vars(settings)


def _poisoning(args: argparse.Namespace) -> tuple[list[Any], list[Any], str, Any]:
    from ponder.eval.injection.comply import CompliantPolicy
    from ponder.eval.injection.poisoning import PoisonSettings, attack_table, poison_table, run_poisoning
    from ponder.eval.injection.suite import summarize

    settings = PoisonSettings(_names(args.tasks), _names(args.attacks), _names(args.defences), args.max_turns,
                              args.max_new_tokens)  # fmt: skip
    episodes = run_poisoning(_make_policy(args, lambda task: CompliantPolicy(task)), settings, on_episode=_say)
    rows = summarize(episodes)
    table = poison_table(rows) + "\n\n" + attack_table(episodes)
    return [e.to_dict() for e in episodes], rows, table, vars(settings)


def _escalation(args: argparse.Namespace) -> tuple[list[Any], list[Any], str, Any]:
    from ponder.eval.injection.escalation import EscalationSettings, escalation_table, run_escalation
    from ponder.eval.injection.escalation import summarize_escalation

    settings = EscalationSettings(n=args.n, seed=args.seed, defences=_names(args.defences))
    talks = run_escalation(settings, on_talk=_say)
    rows = summarize_escalation(talks)
    return [t.to_dict() for t in talks], rows, escalation_table(rows), vars(settings)


def _cascade(args: argparse.Namespace) -> tuple[list[Any], list[Any], str, Any]:
    from ponder.eval.injection.cascade import CascadeSettings, cascade_table, run_cascade, summarize_cascade

    settings = CascadeSettings(_names(args.defences), _names(args.teams))
    episodes = run_cascade(settings, on_episode=_say)
    rows = summarize_cascade(episodes)
    return [e.to_dict() for e in episodes], rows, cascade_table(rows), vars(settings)
