"""`ponder serve`, `ponder gateway` and `ponder a2a-serve`: parse the flags and run the server.

`register(commands)` adds the command to the `ponder` argument parser; `ponder.cli`
calls it. Bad flags (a malformed --adapter, a path that holds no adapter, an adapter
that does not fit the model) raise ValueError before anything listens, which
`ponder.cli.core` prints as one line with exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

DESCRIPTION = """\
Serve a policy over OpenAI's HTTP API: POST /v1/chat/completions (tools,
tool_choice, response_format, stream), POST /v1/completions, GET /v1/models.
Each --adapter is served under its own model name on the one base model;
requests that arrive together are generated in one batch. See docs/guide/serving.md.

Backends (--backend): `hf` is ponder's own (transformers, the lean CPU decoder;
a batch runs to its end). `vllm` generates on a vLLM server (its own venv, `make
vllm-venv`, started here for the base model with every adapter loaded, or
--vllm-url), which batches concurrent requests continuously. `auto` (default)
picks vllm when --vllm-url is given, or when --vllm-python exists and vLLM can
load --model (not `tiny`, not a run dir with merged adapters); else hf. Prompts,
tools, response_format and stop strings are handled by ponder for both.

Per-user adapters (--users DIR, hf backend): a chat on the base model with OpenAI's
`user` field is answered with that user's adapter and logged; POST /v1/feedback
rates it (rating 1 | -1, rewrite, correction, outcome), POST /v1/users/{user}/update
trains the user's next adapter version by DPO on a background thread and serves it
without a restart, GET /v1/users/{user} shows versions and the update's status,
POST /v1/users/{user}/rollback {version} goes back. See docs/guide/serving.md.
"""


def register(commands: Any) -> None:
    serve = commands.add_parser("serve", help="serve a policy and adapters over an OpenAI-compatible API",
                                description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("--model", default="smollm2-135m",
                       help="base model: smollm2-135m (embedded), tiny, a local HF model dir, or a ponder run "
                            "dir (its adapters merged); served under this name")
    serve.add_argument("--adapter", action="append", default=[], metavar="NAME=PATH",
                       help="serve a LoRA adapter as model NAME; PATH is a PEFT adapter dir (ponder export) or "
                            "a ponder run / checkpoint dir (repeatable)")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", help="require Authorization: Bearer KEY; default $PONDER_API_KEY, which keeps "
                                         "it out of the process list")
    serve.add_argument("--max-tokens-limit", type=int, default=1024, help="larger max_tokens get 400")
    serve.add_argument("--max-body-bytes", type=int, default=1_000_000, help="larger request bodies get 413")
    serve.add_argument("--max-batch-size", type=int, default=32, help="most requests generated in one batch")
    serve.add_argument("--batch-window-ms", type=float, default=5.0,
                       help="how long a batch waits for more requests to join it")
    serve.add_argument("--backend", default="auto", choices=["auto", "hf", "vllm"],
                       help="who generates (see above); default auto")
    serve.add_argument("--vllm-url", help="a running vLLM server to generate on (started with --enable-lora and "
                                          "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True when serving adapters)")
    serve.add_argument("--vllm-python", default=".venv-vllm/bin/python",
                       help="python of vLLM's venv, for the server started here (default: %(default)s)")
    serve.add_argument("--vllm-start-timeout", type=float, default=600.0,
                       help="seconds the vLLM server may take to come up (default: %(default)s)")
    serve.add_argument("--vllm-timeout", type=float, default=300.0,
                       help="seconds without a token from vLLM before a request gets 503 (default: %(default)s)")
    serve.add_argument("--users", metavar="DIR",
                       help="keep per-user adapters in DIR (created when missing): chats with a `user` field "
                            "on the base model use that user's adapter, are logged and learn from feedback "
                            "(hf backend only)")
    serve.add_argument("--device", default="auto", help="auto, cpu or cuda (hf backend)")
    serve.add_argument("--seed", type=int, default=0, help="sampling seed")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.set_defaults(handler=cmd_serve)
    _register_gateway(commands)
    _register_a2a(commands)


GATEWAY = """\
Online training through the gateway: serve sessions to outside drivers (another
process, another language) and train on them. A driver opens a session with the
admin key ($PONDER_GATEWAY_KEY), POST /v1/sessions {"task_id": ...}, runs its agent
against the returned base_url and api_key with any OpenAI client (model "policy"),
posts the reward (POST /v1/sessions/ID/reward {"reward": x}) and ends it (POST
/v1/sessions/ID/end). Each of train.steps steps trains on the next
train.tasks_per_step x rollout.group_size ended sessions; sessions with the same
task_id form one GRPO group. The recipe is a gateway recipe (env.kind gateway).
See docs/guide/gateway.md.
"""


def _register_gateway(commands: Any) -> None:
    gateway = commands.add_parser("gateway", help="train online on sessions that outside agent programs drive",
                                  description=GATEWAY, formatter_class=argparse.RawDescriptionHelpFormatter)
    gateway.add_argument("--recipe", required=True, help="a gateway recipe (env.kind gateway)")
    gateway.add_argument("--out", required=True, help="the run directory (weights, metrics.jsonl)")
    gateway.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    gateway.add_argument("--port", type=int, default=8100)
    gateway.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides")
    gateway.set_defaults(handler=cmd_gateway)


def cmd_gateway(args: argparse.Namespace) -> int:
    import os

    from ponder.config import load_recipe
    from ponder.jobs.online import ADMIN_KEY_ENV, run_online

    admin_key = os.environ.get(ADMIN_KEY_ENV)
    if not admin_key:
        raise ValueError(f"set ${ADMIN_KEY_ENV} to the admin key drivers will open sessions with")
    recipe = load_recipe(args.recipe, ["train.eval_every=0", *args.overrides])
    run_online(recipe, args.out, admin_key, args.host, args.port, lambda line: print(line, file=sys.stderr, flush=True))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from ponder.serve import ServeConfig, api_key_from_env, serve
    from ponder.serve.adapters import parse_adapter_flags

    config = ServeConfig(
        model=args.model, adapters=parse_adapter_flags(args.adapter), host=args.host, port=args.port,
        api_key=args.api_key or api_key_from_env(), max_tokens_limit=args.max_tokens_limit,
        max_body_bytes=args.max_body_bytes, max_batch_size=args.max_batch_size,
        batch_window_ms=args.batch_window_ms, device=args.device, seed=args.seed,
        backend=args.backend, vllm_url=args.vllm_url, vllm_python=args.vllm_python,
        vllm_start_timeout_s=args.vllm_start_timeout, vllm_timeout_s=args.vllm_timeout, users=args.users,
    )  # fmt: skip
    serve(config, log_level=args.log_level, say=lambda line: print(line, file=sys.stderr, flush=True))
    return 0


A2A = """\
Serve a ponder agent (the run-agent runtime: its model, tools, config and guard)
over the Agent2Agent protocol, with the a2a-sdk: the agent card at
/.well-known/agent-card.json (skills from the tools, streaming on), JSON-RPC at /
(message/send, message/stream, tasks/get, tasks/cancel, and their A2A 1.0 names).
Each message is one task: model actions and tool results stream as `working`
updates; an answer ends it `completed` (artifact `answer`), a run without one
`failed` with the reason. --model takes a trained run directory too. Loopback by
default; --port 0 picks a free port (the first line on stderr names the URL).
See docs/guide/agents.md.
"""


def _register_a2a(commands: Any) -> None:
    from ponder.cli.agent import add_agent_arguments

    a2a = commands.add_parser("a2a-serve", help="serve an agent over the Agent2Agent (A2A) protocol",
                              description=A2A, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_agent_arguments(a2a)
    a2a.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    a2a.add_argument("--port", type=int, default=9000, help="port (default 9000; 0 picks a free one)")
    a2a.add_argument("--name", default="ponder-agent", help="the agent card's name")
    a2a.add_argument("--description", default="", help="the agent card's description (default: written from the "
                                                        "model and tools)")
    a2a.add_argument("--max-message-chars", type=int, default=20_000, help="longer message texts are refused")
    a2a.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    a2a.set_defaults(handler=cmd_a2a_serve)


def cmd_a2a_serve(args: argparse.Namespace) -> int:
    from ponder.extras import require

    require("a2a", "a2a", "ponder a2a-serve")  # before the model loads: one line, at once
    from ponder.agent.a2a_server import A2AServeOptions, serve_a2a
    from ponder.cli.agent import build_agent

    if args.max_message_chars < 1:
        raise ValueError("--max-message-chars must be >= 1")
    options = A2AServeOptions(name=args.name, description=args.description, max_message_chars=args.max_message_chars)
    agent = build_agent(args)
    serve_a2a(agent, args.host, args.port, options, say=lambda line: print(line, file=sys.stderr, flush=True),
              log_level=args.log_level)
    return 0
