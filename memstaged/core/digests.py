"""SHA-256 for every digest memstaged makes, without OpenSSL unless a backlog is worth it.

The digests are in file names (quarantine names, temp names, seen caches, ack marks) and in the
decision log (``sha256``, ``rewrite_sha256``), so whichever implementation makes one, the bytes
are the same: SHA-256 is SHA-256.

Why not ``hashlib`` everywhere: ``import hashlib`` loads its ``_hashlib`` extension, which links
OpenSSL's libcrypto: 3.4 MB of an idle daemon's resident memory (the target is 25 MB on 50
memory dirs; docs/performance.md) and 2.5 ms of every command's start-up. CPython's own
SHA-256 (``_sha256`` on 3.11, ``_sha2`` from 3.12) needs nothing but libc. It is 5 times slower
per byte (360 against 1,830 MB/s on the bench's machine, whose CPU has SHA extensions): nothing
for the daemon, which hashes a file as it decides it (16 µs more for a 7 KB file, of the 2.2 ms
a file costs its start-up scan), but a ``--once`` run on measure 9's corpus hashes 28 MB (each
file, each rewrite, each original it copies): 64 ms more CPU, 2-3 % of the run. So the
built-in is the default, and ``--once`` calls :func:`for_backlog` once it has files to decide:
a run that finds only files already decided, and every short command, stay without OpenSSL.
A decider worker makes the same choice when it starts (it decides backlogs only), whether it was
forked or came from a fork server (as when a progress bar's thread runs).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Protocol

__all__ = ["Hash", "for_backlog", "sha256"]


class Hash(Protocol):
    """What memstaged uses of a hash object (``hashlib``'s and the built-in's alike)."""

    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...


def _builtin() -> Callable[[bytes], Hash]:
    """CPython's own SHA-256 (imported by name: the module changed name in 3.12, and typeshed
    describes neither); ``hashlib``'s on a Python built without it."""
    for name in ("_sha2", "_sha256"):
        try:
            made: Callable[[bytes], Hash] = importlib.import_module(name).sha256
        except ImportError:
            continue
        return made
    import hashlib  # a Python configured --without-builtin-hashlib-hashes

    return hashlib.sha256


_make: Callable[[bytes], Hash] = _builtin()


def sha256(data: bytes = b"") -> Hash:
    """A SHA-256 hash object, fed ``data`` (as ``hashlib.sha256``)."""
    return _make(data)


def for_backlog() -> None:
    """From now on, OpenSSL's SHA-256, 5 times faster per byte, for a run that hashes every
    byte of a backlog; the process maps libcrypto from here on (see the module's docstring)."""
    global _make  # noqa: PLW0603 - one choice per process, made by the command that runs in it
    import hashlib

    _make = hashlib.sha256
