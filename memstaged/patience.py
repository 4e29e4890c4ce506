"""Waiting with a deadline: the one way memstaged waits for what another process holds.

A lock held by another process (``flock`` has no timeout), a daemon that closed a connection
unanswered, the reconciler's lock: each is tried again after a pause, until it is had or the
time allowed is spent. Pauses double from ``first`` to ``most`` (a short hold costs a
millisecond, a long one few wake-ups) and never reach past the deadline. The clock and the
sleep are parameters, so that a test moves time instead of sleeping through it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll(
    attempt: Callable[[], T | None],
    within: float,
    *,
    first: float,
    most: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T | None:
    """What ``attempt()`` gives first that is not ``None``, trying it now and again after each
    pause while ``within`` seconds have not passed; ``None`` when they have.

    ``attempt`` is called at least once, and once more at the end of the last pause.
    """
    deadline = clock() + within
    pause = first
    while True:
        got = attempt()
        if got is not None:
            return got
        left = deadline - clock()
        if left <= 0:
            return None
        sleep(min(pause, left))
        pause = min(pause * 2, most)
