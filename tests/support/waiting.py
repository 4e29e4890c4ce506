"""Waiting for an event in a test: polled, with a generous limit, never a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

#: What a test waits at most for something that takes milliseconds on a quiet machine: long
#: enough for 2 busy cores, and a test that fails still ends.
LIMIT: Final = 60.0


def wait_until(
    predicate: Callable[[], object],
    what: str,
    *,
    timeout: float = LIMIT,
    interval: float = 0.02,
) -> None:
    """Poll ``predicate`` until it is true; raise TimeoutError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.05) -> bool:
    """:func:`wait_until`, as a truth value: whether ``predicate`` became true in time."""
    try:
        wait_until(predicate, "a condition", timeout=timeout, interval=interval)
    except TimeoutError:
        return False
    return True
