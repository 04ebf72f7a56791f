"""User plug-ins named in recipes by import path (`package.module:attribute`).

A leaf module (standard library only): environments, rewards and tools all resolve
their import paths here.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any


def import_object(path: str, what: str) -> Any:
    """`package.module:attribute` → the attribute; one-line ValueError when it is missing.

    Modules are found on sys.path and, after it, in the working directory (as with
    `python -m`: the `ponder` console script alone would not look there), so a
    user's `my_env.py` next to their recipe, or `examples/guess/env.py` as
    `examples.guess.env`, imports without installing anything."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{what} '{path}': expected a registered name or an import path 'module:attribute'")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{what} '{path}': cannot import {module_name} ({err})") from None
    if not hasattr(module, attribute):
        raise ValueError(f"{what} '{path}': {module_name} has no attribute '{attribute}'")
    return getattr(module, attribute)
