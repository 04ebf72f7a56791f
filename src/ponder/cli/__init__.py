"""`ponder …`: the one command line. argparse and dispatch only; the flows it runs
live in ponder.jobs, and nothing imports this package (`python -m ponder.cli` and
the `ponder` entry point both call `main`)."""

from ponder.cli.core import build_parser, main, parse_args

__all__ = ["build_parser", "main", "parse_args"]
