"""`ponder personal list | update | rollback`: the per-user adapter store from the shell.

`register(commands)` adds the command to ponder's argument parser (ponder/cli.py calls
it). Bad input (no store in DIR, an unknown version, a bad user name, too little
feedback, an adapter of another base) is a ValueError: one line, exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

DESCRIPTION = """\
Per-user adapters trained from feedback. `ponder serve --users DIR` keeps them in DIR:
a chat on the base model with OpenAI's `user` field is answered with that user's
adapter and logged; feedback on it (thumbs up / down, a rewrite, a correction, a task
outcome) becomes preference pairs; an update trains the user's next adapter version
by DPO on them, anchored to the base (the DPO reference is the base with adapters
disabled). Versions are kept; a rollback makes an earlier one current. A running
server picks up what these commands change at the user's next request.
"""
UPDATE_DESCRIPTION = """\
Train USER's next adapter version on all of their preference pairs (DPO, continuing
the current version, or a fresh LoRA for a first update) and make it current. Only
that user's adapter trains; the base model must be the one the store's adapters
were trained on (checked by a hash of its weights).
"""


def _store(directory: str) -> Any:
    from ponder.personal.store import AdapterStore

    if not (Path(directory) / "store.sqlite").is_file():
        raise ValueError(f"--users {directory}: no adapter store there (ponder serve --users DIR creates one)")
    return AdapterStore(directory)


def cmd_list(args: argparse.Namespace) -> int:
    store = _store(args.users)
    header = f"{'user':<24} {'current':>7} {'versions':>8} {'chats':>6} {'up':>4} {'down':>4} {'rewrite':>7} " \
             f"{'correct':>7} {'outcome':>7}"  # fmt: skip
    print(header)
    for user in store.users():
        current, versions, counts = store.current(user), store.versions(user), store.counts(user)
        print(f"{user:<24} {current.version if current else '-':>7} {len(versions):>8} {counts['interactions']:>6} "
              f"{counts['up']:>4} {counts['down']:>4} {counts['rewrite']:>7} {counts['correction']:>7} "
              f"{counts['outcome']:>7}")  # fmt: skip
    return 0


def cmd_update(args: argparse.Namespace) -> int:
    from ponder.models.loading import load_policy
    from ponder.personal.config import PersonalConfig
    from ponder.personal.learn import update_user

    store = _store(args.users)
    names = ("steps", "lr", "beta", "rpo_alpha", "batch_size", "min_pairs")
    settings = {name: getattr(args, name) for name in names}
    cfg = PersonalConfig().with_overrides({k: v for k, v in settings.items() if v is not None})
    policy = load_policy(args.model, args.dtype, args.device)
    version, metrics = update_user(store, args.user, policy, cfg, say=lambda line: print(line, file=sys.stderr))
    print(f"user {args.user}: v{version} is current ({metrics['pairs']} pairs from {metrics['feedback']} feedback "
          f"rows, DPO margin {metrics['margin_first']:.3f} -> {metrics['margin_last']:.3f})")  # fmt: skip
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    store = _store(args.users)
    found = store.rollback(args.user, args.version)
    print(f"user {args.user}: v{found.version} is current")
    return 0


def register(commands: Any) -> None:
    """Add `personal` (list, update, rollback) to ponder's subcommands."""
    personal = commands.add_parser("personal", help="per-user adapters from feedback: list, update, rollback",
                                   description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = personal.add_subparsers(dest="personal_command", required=True, metavar="{list,update,rollback}")
    users_help = "the store `ponder serve --users DIR` keeps"

    listing = sub.add_parser("list", help="each user's current version, versions and feedback counts",
                             description="One line per user: current adapter version ('-': the base answers), "
                                         "versions kept, chats logged and feedback of each kind.")  # fmt: skip
    listing.add_argument("--users", required=True, metavar="DIR", help=users_help)
    listing.set_defaults(handler=cmd_list)

    update = sub.add_parser("update", help="train a user's next adapter version on their feedback now",
                            description=UPDATE_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    update.add_argument("--users", required=True, metavar="DIR", help=users_help)
    update.add_argument("--user", required=True, help="whose adapter to train")
    update.add_argument("--model", default="smollm2-135m",
                        help="the base model the server serves (smollm2-135m, tiny, a HF model dir …)")
    update.add_argument("--device", default="auto", help="auto, cpu or cuda")
    update.add_argument("--dtype", default="float32", help="float32 (default), bfloat16, float16 or auto; the "
                                                             "base hash includes it, so use the server's")  # fmt: skip
    update.add_argument("--steps", type=int, help="DPO optimizer steps (default 20)")
    update.add_argument("--lr", type=float, help="peak learning rate (default 5e-4)")
    update.add_argument("--beta", type=float, help="DPO beta: the KL anchor's strength (default 0.1)")
    update.add_argument("--rpo-alpha", type=float,
                        help="weight of the chosen reply's per-token NLL in DPO's loss (RPO; default 1)")
    update.add_argument("--batch-size", type=int, help="preference pairs per step (default 8)")
    update.add_argument("--min-pairs", type=int, help="refuse with fewer preference pairs (default 1)")
    update.set_defaults(handler=cmd_update)

    rollback = sub.add_parser("rollback", help="make an earlier adapter version a user's current one",
                              description="Point USER's current adapter at VERSION (kept versions are never "
                                          "deleted); a running server serves it from the user's next request.")
    rollback.add_argument("--users", required=True, metavar="DIR", help=users_help)
    rollback.add_argument("--user", required=True, help="whose adapter to roll back")
    rollback.add_argument("--version", required=True, type=int, help="the version to make current")
    rollback.set_defaults(handler=cmd_rollback)
