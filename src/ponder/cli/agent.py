"""`ponder chat` (interactive, streaming) and `ponder run-agent` (one task, JSON out).

`register(commands)` adds both to the `ponder` argument parser; `ponder.cli` calls it.
Bad input (unknown tool, missing file, invalid config or schema file) raises
ValueError / OSError, which `ponder.cli.core` prints as one line with exit code 2.

Both run their tools behind a guard (ponder.tools.safety): tool output that reads as an
injection is marked, and a tool named in `--sensitive` (or sensitive in `--safety`'s
policy) runs only when the user approves it: `chat` asks y/N at the prompt; `run-agent`,
with no one to ask, refuses it. Tools an injected instruction could abuse (RISKY_TOOLS:
code execution; every remote A2A agent, which receives whatever text the model sends)
are sensitive by default; `--allow-risky` opts out."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

from ponder.agent.console import (
    ChatPrinter,
    argument_text,
    chat_loop,
    confirm_at_prompt,
    enable_line_editing,
    history_path,
    stream_reader,
)


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that describe an agent (model, tools, safety, config), shared by `chat`,
    `run-agent` and `a2a-serve`."""
    parser.add_argument("--model", default="smollm2-135m",
                        help="smollm2-135m (embedded), tiny, a local HF model dir, or an OpenAI-compatible base URL")
    parser.add_argument("--api-model", help="model name sent to an HTTP endpoint")
    parser.add_argument("--tools", default="calculator,echo",
                        help="comma-separated built-in tools: calculator,echo,python,read_file,search,rag")
    parser.add_argument("--files-root", help="folder the read_file tool may read")
    parser.add_argument("--corpus", help="JSONL corpus for the search tool")
    parser.add_argument("--docs", action="append", help="document file or folder for the rag tool (repeatable)")
    parser.add_argument("--a2a", action="append", default=[], metavar="NAME=URL",
                        help="a remote A2A agent as tool NAME (its card read at start; repeatable), e.g. "
                             "calc=http://127.0.0.1:9100 (see docs/guide/agents.md)")
    parser.add_argument("--sensitive", default="",
                        help="comma-separated tools that need the user's approval for every call (chat asks y/N)")
    parser.add_argument("--allow-risky", action="store_true",
                        help="run the tools an injection could abuse (python, --a2a agents) without asking; "
                             "by default each call needs approval (chat asks y/N, run-agent and a2a-serve refuse)")
    parser.add_argument("--safety", help="YAML/JSON safety policy: allow, sensitive, trusted, argument rules, "
                                         "forbid (intents refused across the conversation; see "
                                         "ponder.tools.safety.policy)")  # fmt: skip
    parser.add_argument("--config", help="YAML file of AgentConfig fields (see ponder.agent.config)")
    parser.add_argument("--schema", help="JSON Schema file the final answer must match")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="AgentConfig overrides, e.g. max_turns=4")


def register(commands: Any) -> None:
    """Add `chat` and `run-agent` to the `ponder` sub-command parsers."""
    chat = commands.add_parser("chat", help="interactive chat with an agent and its tools (streams tokens)")
    add_agent_arguments(chat)
    chat.set_defaults(handler=cmd_chat)

    run = commands.add_parser("run-agent", help="run an agent on one task and print the result as JSON")
    task = run.add_mutually_exclusive_group(required=True)
    task.add_argument("--task", help="the task text")
    task.add_argument("--resume", metavar="STATE_JSON", help="continue a saved agent state")
    add_agent_arguments(run)
    run.add_argument("--max-steps", type=int, help="stop after this many steps (the state can be resumed)")
    run.add_argument("--save-state", metavar="FILE", help="write the final agent state as JSON")
    run.add_argument("--out", help="write the JSON result here as well as to stdout")
    run.add_argument("--no-transcript", action="store_true", help="leave the transcript out of the JSON")
    run.set_defaults(handler=cmd_run_agent)


def build_agent(args: argparse.Namespace, on_event: Callable[[str, Any], None] | None = None,
                confirm: Callable[[Any], bool] | None = None) -> Any:
    """The Agent the arguments describe; every input is checked before the model loads.
    `confirm(call) -> bool` approves sensitive calls (None: they are refused)."""
    from ponder.agent import Agent, AgentConfig, load_chat_policy
    from ponder.agent.toolbox import ToolboxOptions, build_tools
    from ponder.config import load_recipe

    config = load_recipe(args.config, args.overrides, cls=AgentConfig)
    if args.schema:
        config.answer_schema = _read_json(args.schema)
    names = [name.strip() for name in args.tools.split(",") if name.strip()]
    tools = build_tools(names, ToolboxOptions(files_root=args.files_root, corpus=args.corpus, docs=args.docs))
    if getattr(args, "a2a", None):
        from ponder.agent.a2a_peer import a2a_tool, parse_peer

        tools += [a2a_tool(parse_peer(entry)) for entry in args.a2a]
    guard = _guard(args, [getattr(t, "name", "") for t in tools], confirm)
    policy = load_chat_policy(args.model, temperature=args.temperature, seed=args.seed, api_model=args.api_model)
    return Agent(policy, tools, config, on_event=on_event, guard=guard)


RISKY_TOOLS = ("python",)  # built-ins whose call an injected instruction could turn into harm


def _guard(args: argparse.Namespace, tool_names: list[str], confirm: Callable[[Any], bool] | None) -> Any:
    """The CLI's guard: the --safety policy plus --sensitive tools (and, unless
    --allow-risky, RISKY_TOOLS and the --a2a agents); flagged output is marked, not cut
    (a person reads along); the monitor and the information-flow rule on."""
    from ponder.tools.safety import (
        ConversationGuard,
        Guard,
        GuardOptions,
        InjectionDetector,
        SafetyPolicy,
        ToolRule,
        TrajectoryMonitor,
    )

    policy = SafetyPolicy.load(args.safety) if getattr(args, "safety", None) else SafetyPolicy()
    sensitive = [n.strip() for n in (getattr(args, "sensitive", "") or "").split(",") if n.strip()]
    if not getattr(args, "allow_risky", False):
        sensitive += [name for name in RISKY_TOOLS if name in tool_names]
        sensitive += [entry.partition("=")[0].strip() for entry in getattr(args, "a2a", None) or []]
    for name in sensitive:
        policy.tools.setdefault(name, ToolRule()).sensitive = True
    detector = InjectionDetector(tool_names=tool_names)
    monitor = TrajectoryMonitor(policy.is_sensitive, detector)
    conversation = ConversationGuard(policy.forbid) if policy.forbid else None  # the policy's `forbid` intents
    return Guard(policy, detector, confirm, monitor, GuardOptions(detector_action="flag"), conversation=conversation)


def _read_json(path: str) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from err


def cmd_run_agent(args: argparse.Namespace) -> int:
    from ponder.agent import AgentState
    from ponder.agent.rag import provenance
    from ponder.fileio import write_text_atomic

    agent = build_agent(args)
    task: Any = AgentState.load(args.resume) if args.resume else argument_text(args.task)
    state = agent.run(task, max_steps=args.max_steps)
    if args.save_state:
        state.save(args.save_state)
    result = state.result()
    record = state.memory.get("guard") or {}
    if record.get("refused") or record.get("confirmations"):
        result["safety"] = {key: record.get(key, []) for key in ("tainted_by", "refused", "confirmations")}
    cited = provenance(state)
    if cited:  # the passages the answer could be built on, with source and page/row
        result["provenance"] = cited
    if args.no_transcript:
        result.pop("transcript")
    text = json.dumps(result, ensure_ascii=False, indent=2, default=str)
    if args.out:
        write_text_atomic(args.out, text + "\n")
    print(text)
    return 0 if state.status == "answered" else 1


def cmd_chat(args: argparse.Namespace) -> int:
    printer = ChatPrinter(sys.stdout)
    read_line = input if sys.stdin.isatty() else stream_reader(sys.stdin)
    agent = build_agent(args, on_event=printer, confirm=confirm_at_prompt(read_line, sys.stdout))
    if sys.stdin.isatty():
        save_history = enable_line_editing(history_path())
        try:
            return chat_loop(agent, read_line, sys.stdout)
        finally:
            save_history()
    return chat_loop(agent, read_line, sys.stdout)
