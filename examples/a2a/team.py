"""A ponder coordinator delegating one task to remote A2A agents and printing the transcript.

The planner here is scripted (one round: the task to every peer), so what is shown is
the delegation itself: each remote call, its reply marked as untrusted data, or its
failure as one line. Swap in any `Agent` as the planner for a real one.

    ponder a2a-serve --model tiny --tools calculator --port 9000 &
    python examples/a2a/calculator_agent.py --port 9100 &
    python examples/a2a/team.py --peer ponder=http://127.0.0.1:9000 --peer calc=http://127.0.0.1:9100 \\
        --task "What is 17 * 23?"
"""

from __future__ import annotations

import argparse
import json

from ponder.agent import Agent, AgentConfig, BackendPolicy
from ponder.agent.a2a_peer import RemoteAgent, parse_peer
from ponder.agent.multi import Coordinator, TeamConfig
from ponder.models import tiny_tokenizer
from ponder.rollout.scripted import ScriptedBackend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", action="append", required=True, metavar="NAME=URL", help="a remote A2A agent")
    parser.add_argument("--task", required=True)
    parser.add_argument("--timeout-s", type=float, default=60.0, help="limit of each remote call")
    args = parser.parse_args()
    roles = {spec.name: RemoteAgent(spec) for spec in (parse_peer(p, timeout_s=args.timeout_s) for p in args.peer)}
    plan = json.dumps({"subtasks": [{"role": name, "task": args.task} for name in roles]})
    planner = Agent(BackendPolicy(ScriptedBackend(tiny_tokenizer(), {"planner": [plan]})), [], AgentConfig())
    result = Coordinator(planner, roles, config=TeamConfig(max_rounds=1, max_subtasks=len(roles))).run(args.task)
    for message in result.transcript:
        print(f"{message.sender} -> {message.to}: {message.content}")
    for run in result.runs[1:]:
        call = run["tool_attempts"][0]
        print(f"[{run['agent']}] {run['status']} ({run['stop_reason']}) in {call['elapsed_s']:.2f} s via {call['tool']}"
              + (f": {run['error']}" if run["error"] else ""))


if __name__ == "__main__":
    main()
