"""``systemctl --user``, the one way memstaged asks the user's service manager.

Its answer is bounded: the output kept is at most :data:`OUTPUT_LIMIT` bytes per stream (a
``systemctl`` that prints without end is killed), decoded with replacement (a byte that is not
UTF-8 is not a traceback), and a ``timeout`` ends the wait (the process is killed).
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Mapping
from typing import Final

from memstaged.errors import ConfigError

#: The most of each stream kept: the manager's answers to memstaged are a few lines.
OUTPUT_LIMIT: Final = 64 * 1024
#: How much is read at a time.
_CHUNK: Final = 16 * 1024


def systemctl(
    *args: str, timeout: float | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``systemctl --user --no-ask-password ARGS``: its exit status and its output. A missing
    systemctl is a :class:`ConfigError`; no end within ``timeout`` seconds is
    :class:`subprocess.TimeoutExpired`, the process killed. Output past
    :data:`OUTPUT_LIMIT` kills it too: the status then is that of the kill (``-9``)."""
    argv = ["systemctl", "--user", "--no-ask-password", *args]
    try:
        proc = subprocess.Popen(
            argv,
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except FileNotFoundError:
        raise ConfigError("systemctl is not installed: is this a systemd machine?") from None
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        out, err = _read_bounded(proc, deadline)
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        proc.wait(left)
    except subprocess.TimeoutExpired:
        raise subprocess.TimeoutExpired(argv, timeout or 0.0) from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    return subprocess.CompletedProcess(
        argv,
        proc.returncode,
        out.decode("utf-8", "replace"),
        err.decode("utf-8", "replace"),
    )


def _read_bounded(proc: subprocess.Popen[bytes], deadline: float | None) -> tuple[bytes, bytes]:
    """Both streams of ``proc`` to their end, each up to :data:`OUTPUT_LIMIT` bytes (past it the
    process is killed), by ``deadline``."""
    streams = [pipe.fileno() for pipe in (proc.stdout, proc.stderr) if pipe is not None]
    kept = {fd: bytearray() for fd in streams}
    with selectors.DefaultSelector() as selector:
        for fd in kept:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(proc.args, 0.0)
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, _CHUNK)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                kept[key.fd] += chunk
                if len(kept[key.fd]) > OUTPUT_LIMIT:
                    proc.kill()
                    del kept[key.fd][OUTPUT_LIMIT:]
    out, err = (bytes(kept[fd]) for fd in streams)
    return out, err
