"""``systemctl --user``, the one way memstaged asks the user's service manager.

Its answer is bounded: the output kept is at most :data:`OUTPUT_LIMIT` bytes per stream (a
``systemctl`` that prints without end is killed, with all it started), decoded with replacement
(a byte that is not UTF-8 is not a traceback), and a ``timeout`` ends the wait.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping
from typing import Final

from memstaged.errors import ConfigError

#: The most of each stream kept: the manager's answers to memstaged are a few lines.
OUTPUT_LIMIT: Final = 64 * 1024
#: How much is read at a time.
_CHUNK: Final = 16 * 1024
#: How long a ``systemctl`` is waited for at most, unless told otherwise: longer than any job
#: systemd runs for it (a start waits for ``READY=1``), short enough that a stuck one ends.
LONGEST: Final = 600.0
#: How long what systemctl started may hold its output once systemctl has ended.
DRAIN: Final = 1.0
#: How often the reader looks whether systemctl has ended.
_POLL: Final = 0.1


def systemctl(
    *args: str, timeout: float = LONGEST, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``systemctl --user --no-ask-password ARGS``: its exit status and its output. A missing
    systemctl, and no end within ``timeout`` seconds, are a :class:`ConfigError`. It runs in a
    process group of its own, killed whole when it is given up on: past ``timeout``, past
    :data:`OUTPUT_LIMIT` (the status then is that of the kill, ``-9``), or when memstaged is
    stopped. Once systemctl has ended, what it started is given :data:`DRAIN` seconds to let
    go of its output."""
    argv = ["systemctl", "--user", "--no-ask-password", *args]
    try:
        proc = subprocess.Popen(
            argv,
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except FileNotFoundError:
        raise ConfigError("systemctl is not installed: is this a systemd machine?") from None
    deadline = time.monotonic() + timeout
    try:
        out, err = _read_bounded(proc, deadline)
        proc.wait(max(deadline - time.monotonic(), 0.0))
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"systemctl --user {' '.join(args)}: no answer within {timeout:g}s"
        ) from None
    finally:
        _kill_group(proc)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    return subprocess.CompletedProcess(
        argv,
        proc.returncode,
        out.decode("utf-8", "replace"),
        err.decode("utf-8", "replace"),
    )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill what is left of systemctl's process group (it, and whatever it started), and reap
    systemctl."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _read_bounded(proc: subprocess.Popen[bytes], deadline: float) -> tuple[bytes, bytes]:
    """Both streams of ``proc``, each up to :data:`OUTPUT_LIMIT` bytes, until both end, the
    limit is passed (the group is killed), :data:`DRAIN` seconds after ``proc`` ended, or
    ``deadline`` (:class:`subprocess.TimeoutExpired`)."""
    streams = [pipe.fileno() for pipe in (proc.stdout, proc.stderr) if pipe is not None]
    kept = {fd: bytearray() for fd in streams}
    drained_by: float | None = None
    with selectors.DefaultSelector() as selector:
        for fd in kept:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            now = time.monotonic()
            if drained_by is None and proc.poll() is not None:
                drained_by = now + DRAIN
            if drained_by is not None and now >= drained_by:
                break  # systemctl ended; a process it left behind holds the pipe
            if now >= deadline:
                raise subprocess.TimeoutExpired(proc.args, 0.0)
            until = min(deadline, drained_by if drained_by is not None else now + _POLL)
            for key, _ in selector.select(until - now):
                chunk = os.read(key.fd, _CHUNK)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                kept[key.fd] += chunk
                if len(kept[key.fd]) > OUTPUT_LIMIT:
                    _kill_group(proc)
                    del kept[key.fd][OUTPUT_LIMIT:]
                    return _cut(kept, streams)
    return _cut(kept, streams)


def _cut(kept: dict[int, bytearray], streams: list[int]) -> tuple[bytes, bytes]:
    out, err = (bytes(kept[fd]) for fd in streams)
    return out, err
