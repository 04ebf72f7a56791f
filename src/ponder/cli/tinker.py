"""`ponder tinker-serve`: parse the flags into a TinkerConfig and run the server.

`register(commands)` adds the command to the `ponder` argument parser; `ponder.cli`
calls it. A missing `tinker` extra or a model that does not load is one line, exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

API_KEY_ENV = "PONDER_TINKER_API_KEY"

DESCRIPTION = """\
Serve ponder's models to the published `tinker` client (the `tinker` extra):
the Tinker training API on the embedded model (or tiny, or a local HF model
directory), on ponder's own trainer parts, CPU first.

Point the client at it and name the served model as the base model:

  export TINKER_API_KEY=tml-local    # any tml-... key, unless --api-key is set
  service = tinker.ServiceClient(base_url="http://127.0.0.1:8000")
  training = service.create_lora_training_client(base_model="smollm2-135m")

What works: create_lora_training_client (LoRA on attention and MLP layers),
forward_backward / forward with cross_entropy, importance_sampling or ppo (and
forward_backward_custom, which the client runs through cross_entropy),
optim_step (AdamParams: AdamW), save_weights_for_sampler,
save_weights_and_get_sampling_client, create_sampling_client (the base model or
a tinker:// path), sample (tokens and their log-probs), compute_logprobs,
save_state, load_state, create_training_client_from_state(_with_optimizer),
get_info, get_tokenizer (a copy saved in --state-dir).

Refused with a status and a one-line reason: an unknown loss function, model id
or base model, a datum whose loss_fn_inputs do not match its tokens, a stale
sampler (its tinker:// path was saved again, or it is an old snapshot), an
unknown checkpoint path, a wrong API key. Checkpoints are PEFT adapters under
--state-dir/runs/MODEL_ID/, which `ponder serve --adapter NAME=DIR` serves.
See docs/guide/tinker.md.
"""


def register(commands: Any) -> None:
    serve = commands.add_parser("tinker-serve", help="serve the Tinker training API to the `tinker` client",
                                description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("--model", default="smollm2-135m",
                       help="the base model clients train: smollm2-135m (embedded), tiny, or a local HF model "
                            "directory; clients name it as base_model")  # fmt: skip
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", help=f"require this X-API-Key (the client's $TINKER_API_KEY, so it starts "
                                         f"tml-); default ${API_KEY_ENV}, which keeps it out of the process list")
    serve.add_argument("--state-dir", default="tinker-state",
                       help="checkpoints and the tokenizer copy live here (default: %(default)s)")
    serve.add_argument("--device", default="auto", help="auto, cpu or cuda")
    serve.add_argument("--dtype", default="float32", help="the model's precision: float32, bfloat16 or auto")
    serve.add_argument("--seed", type=int, default=0, help="sampling seed (per-request seeds override it)")
    serve.add_argument("--max-tokens", type=int, default=256,
                       help="a sample request's max_tokens when it gives none (default: %(default)s)")
    serve.add_argument("--token-budget", type=int, default=2048,
                       help="tokens per forward_backward micro-batch (rows x longest row; default: %(default)s)")
    serve.add_argument("--max-live-samplers", type=int, default=2,
                       help="sampling copies of the weights kept in memory (default: %(default)s)")
    serve.add_argument("--max-kept-snapshots", type=int, default=4,
                       help="snapshots (save_weights_and_get_sampling_client) a training client keeps "
                            "samplable; older ones are stale (default: %(default)s)")  # fmt: skip
    serve.add_argument("--max-body-bytes", type=int, default=64_000_000, help="larger request bodies get 413")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.set_defaults(handler=cmd_tinker_serve)


def cmd_tinker_serve(args: argparse.Namespace) -> int:
    from ponder.extras import require

    for module in ("tinker", "fastapi", "uvicorn"):  # before ponder.serve, which names its own extra
        require(module, "tinker", "ponder tinker-serve")
    from ponder.serve.tinker import TinkerConfig
    from ponder.serve.tinker.server import serve_tinker

    config = TinkerConfig(
        model=args.model, host=args.host, port=args.port, api_key=args.api_key or os.environ.get(API_KEY_ENV),
        state_dir=args.state_dir, device=args.device, dtype=args.dtype, seed=args.seed, max_tokens=args.max_tokens,
        max_body_bytes=args.max_body_bytes, token_budget=args.token_budget,
        max_live_samplers=args.max_live_samplers, max_kept_snapshots=args.max_kept_snapshots,
    )  # fmt: skip
    serve_tinker(config, log_level=args.log_level, say=lambda line: print(line, file=sys.stderr, flush=True))
    return 0
