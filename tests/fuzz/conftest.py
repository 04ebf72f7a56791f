"""Property-based fuzzing (issue 21, item 8): readers of model output and of files never
fail with anything but their own one-line error, and never hang.

Each target runs twice: a modest budget in the normal suite (the whole directory in well
under 60 s on the 2-core CI machine) and a deeper `slow` run (`make test-slow`, or
`pytest -m slow tests/fuzz`). No example database is written (database=None): runs are
reproducible from hypothesis's seed printed on failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FAST_EXAMPLES = 150
DEEP_EXAMPLES = 3000
# A single example taking longer than this counts as a hang (every reader is linear).
HANG_S = 5.0

_SETTINGS = dict(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
                           HealthCheck.function_scoped_fixture],  # fmt: skip
)


def fuzz_pair(strategy: st.SearchStrategy, check: Callable[[Any], None], fast: int = FAST_EXAMPLES,
              deep: int = DEEP_EXAMPLES) -> tuple[Callable[[], None], Callable[[], None]]:  # fmt: skip
    """(fast test, slow-marked deep test) running `check` on examples of `strategy`."""

    def timed() -> Callable[[Any], None]:
        def run(example: Any) -> None:
            started = time.monotonic()
            check(example)
            assert time.monotonic() - started < HANG_S, f"took {time.monotonic() - started:.1f} s"

        return run

    fast_test = settings(max_examples=fast, **_SETTINGS)(given(strategy)(timed()))
    deep_test = pytest.mark.slow(settings(max_examples=deep, **_SETTINGS)(given(strategy)(timed())))
    return fast_test, deep_test


# Every code point, lone surrogates included (hypothesis leaves category Cs out by default).
ANY_CHARACTER = st.characters(codec=None, categories=None)
# What breaks encoders, tokenizers and line splitting; a uniform draw of code points rarely
# hits them, so they are mixed in as pieces of their own.
SPICE = st.sampled_from(["\ud800", "\udcff", "\udfff", "\x00", "\u2028", "\x1c", "\r", "\n", "\ufffd", "\u202e"])
ANY_TEXT = st.lists(st.one_of(st.text(ANY_CHARACTER, max_size=40), SPICE), max_size=12).map("".join)


def deep_nesting(opening: str, closing: str = "") -> st.SearchStrategy[str]:
    """`opening` repeated up to 6000 times (then `closing` as often): past any recursion limit."""
    return st.integers(0, 6000).map(lambda n: opening * n + closing * n)


def one_line_error(message: str, *must_contain: str) -> None:
    assert message and "\n" not in message, repr(message)
    for part in must_contain:
        assert part in message, (part, message)
