"""A small A2A agent written with the a2a-sdk alone (nothing of ponder): it finds the
arithmetic in a message ("What is 17 * 23?") and answers "17 * 23 = 391".

It is the second, independently written agent that ponder's A2A client is tested with
(tests/agent/test_a2a_team.py), and a template for wrapping any program as an A2A agent.
It answers with a direct Message (no task), where `ponder a2a-serve` answers with tasks,
so a caller has to handle both shapes the protocol allows.

    python examples/a2a/calculator_agent.py --port 9100
    # card: http://127.0.0.1:9100/.well-known/agent-card.json ; JSON-RPC at http://127.0.0.1:9100/
"""

from __future__ import annotations

import argparse
import re
import socket
import sys
from pathlib import Path

import uvicorn
from a2a.helpers import get_message_text, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill
from a2a.utils.errors import UnsupportedOperationError
from starlette.applications import Starlette

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agents"))
from mathtools import calculate  # noqa: E402 - the math example programs' calculator (plain Python)

EXPRESSION = re.compile(r"[-+(]*\d[\d.\s+\-*/()]*")


def answer(text: str) -> str:
    """The reply to one message: the longest arithmetic expression in it, evaluated."""
    found = sorted((m.group(0).strip() for m in EXPRESSION.finditer(text[:2000])), key=len, reverse=True)
    for expression in found:
        if not any(symbol in expression for symbol in "+-*/"):
            continue
        result = calculate(expression)
        if result.startswith("error: "):
            return f"cannot compute {expression}: {result.removeprefix('error: ')}"
        return f"{expression} = {result}"
    return "no arithmetic found; send something like: What is 17 * 23?"


class CalculatorExecutor(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        reply = answer(get_message_text(context.message) if context.message else "")
        await event_queue.enqueue_event(new_text_message(reply, context_id=context.context_id))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise UnsupportedOperationError(message="the calculator answers at once; nothing to cancel")


def card(url: str) -> AgentCard:
    skill = AgentSkill(id="arithmetic", name="arithmetic", description="Evaluates + - * / and parentheses.",
                       tags=["math"], examples=["What is 17 * 23?"])  # fmt: skip
    return AgentCard(
        name="calculator", description="Answers arithmetic questions exactly.", version="1.0.0",
        supported_interfaces=[AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=True), skills=[skill],
        default_input_modes=["text/plain"], default_output_modes=["text/plain"],
    )  # fmt: skip


def app(url: str) -> Starlette:
    agent_card = card(url)
    handler = DefaultRequestHandler(CalculatorExecutor(), InMemoryTaskStore(), agent_card)
    routes = create_agent_card_routes(agent_card) + create_jsonrpc_routes(handler, "/", enable_v0_3_compat=True)
    return Starlette(routes=routes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100, help="0 picks a free port")
    args = parser.parse_args()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((args.host, args.port))  # bound before the card is written, so --port 0 names the real port
    url = f"http://{args.host}:{sock.getsockname()[1]}/"
    print(f"calculator A2A agent on {url}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app(url), log_level="warning"))
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
