"""A real terminal for tests: a tmux session of 80x24 whose screen a test reads.

tmux runs the program on a pseudo-terminal as a person's terminal would; ``send`` types keys
(``Tab`` and ``Enter`` as tmux names them) and ``wait_for`` reads the screen
(``capture-pane``) until a pattern shows up, with a generous bound only as a failure guard: what
the test waits for is the text, never a time.

:func:`pty_run` is the plain way: a command on a pseudo-terminal of 80x24, and what it showed.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import termios
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Final

import pytest

from support.waiting import wait_until

COLUMNS: Final = 80
ROWS: Final = 24
#: The failure guard of :meth:`Terminal.wait_for`: far above what any screen here needs.
GUARD_SECONDS: Final = 60.0


class Terminal:
    """One tmux server (its own socket) with one window running ``argv``."""

    def __init__(self, socket: str) -> None:
        self.socket = socket

    def tmux(self, *args: str) -> str:
        result = subprocess.run(
            ["tmux", "-L", self.socket, *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return result.stdout

    def send(self, *keys: str, literal: bool = False) -> None:
        """Type ``keys``: with ``literal`` as text, else as tmux key names (``Tab``, ``Enter``)."""
        self.tmux("send-keys", "-t", "t", *(["-l"] if literal else []), *keys)

    def type(self, text: str) -> None:
        self.send(text, literal=True)

    def screen(self) -> str:
        """What the terminal shows now, a line wrapped at the edge joined again (``-J``)."""
        return self.tmux("capture-pane", "-p", "-J", "-t", "t")

    def wait_for(self, pattern: str, flags: int = re.MULTILINE) -> re.Match[str]:
        """The first match of ``pattern`` on the screen, as soon as it shows (the screen is
        polled: a look, not a wait for the outcome)."""
        found: list[re.Match[str]] = []

        def shows() -> bool:
            match = re.search(pattern, self.screen(), flags)
            found[:] = [match] if match is not None else []
            return bool(found)

        what = f"{pattern!r} on the screen"
        wait_until(shows, what, timeout=GUARD_SECONDS, interval=0.05, said=self.screen)
        return found[0]

    def run(self, command: str, marker: str) -> str:
        """Type ``command`` and Enter, then wait until ``marker`` (a pattern the command's
        output shows once it is done) is on the screen; the screen then."""
        self.type(command)
        self.send("Enter")
        self.wait_for(marker)
        return self.screen()


@contextmanager
def terminal(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> Iterator[Terminal]:
    """``argv`` in a fresh 80x24 tmux session with exactly ``env``; killed afterwards."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (make sysdeps installs it)")
    term = Terminal(f"memstaged-test-{os.getpid()}-{time.monotonic_ns()}")
    command = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]
    term.tmux(
        "-f",
        "/dev/null",
        "new-session",
        "-d",
        "-s",
        "t",
        "-x",
        str(COLUMNS),
        "-y",
        str(ROWS),
        "-c",
        cwd,
        *command,
    )
    try:
        yield term
    finally:
        subprocess.run(
            ["tmux", "-L", term.socket, "kill-server"], capture_output=True, timeout=30, check=False
        )


def pty_run(argv: list[str], env: dict[str, str], timeout: float = 60) -> tuple[int, bytes]:
    """``argv`` with stdout and stderr on a pseudo-terminal: its exit code and what it showed."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal, env=env
    )
    os.close(terminal)
    shown = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([controller], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(controller, 65536)
            except OSError:
                break
            if not chunk:
                break
            shown += chunk
        elif proc.poll() is not None:
            break
    os.close(controller)
    return proc.wait(timeout=10), shown
