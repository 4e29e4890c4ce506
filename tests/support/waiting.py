"""Waiting for an event in a test: polled, with a generous limit, never a fixed sleep. The tests'
one waiter: a process that should bring the event about and exits first ends the wait at once."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

#: What a test waits at most for something that takes milliseconds on a quiet machine: long
#: enough for 2 busy cores, and a test that fails still ends.
LIMIT: Final = 60.0


def wait_until(
    predicate: Callable[[], object],
    what: str,
    *,
    timeout: float = LIMIT,
    interval: float = 0.02,
    alive: subprocess.Popen[Any] | None = None,
    said: Path | Callable[[], str] | None = None,
) -> None:
    """Poll ``predicate`` until it is true; raise TimeoutError naming ``what`` after ``timeout``.

    ``alive``: the process the event depends on; once it has exited (and the predicate is still
    false), AssertionError at once, with its exit status. ``said``: what the failure shows
    besides (a process's stderr file, or what a terminal shows).
    """
    deadline = time.monotonic() + timeout
    while not predicate():
        if alive is not None and alive.poll() is not None:
            raise AssertionError(
                f"the process exited ({alive.returncode}) before {what}{_shown(said)}"
            )
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}{_shown(said)}")
        time.sleep(interval)


def _shown(said: Path | Callable[[], str] | None) -> str:
    if said is None:
        return ""
    try:
        text = said.read_text(errors="replace")[-2000:] if isinstance(said, Path) else said()
    except OSError as err:
        text = f"({err})"
    return f"; it said:\n{text}"


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.05) -> bool:
    """:func:`wait_until`, as a truth value: whether ``predicate`` became true in time."""
    try:
        wait_until(predicate, "a condition", timeout=timeout, interval=interval)
    except TimeoutError:
        return False
    return True
