"""JavaScript's own answers, from one long-running ``node`` process (SPEC 2, issue 11 item 3).

The differential tests ask Node.js what the reconciler's JavaScript does (``Date.parse``,
``fs.readFileSync(path, "utf-8")``, ``trim``, ``toLowerCase``, ``length``, ``path.posix.basename``,
``JSON.parse``, SPEC 2 validity written in JavaScript, SPEC 2.4's ``process.cwd()`` and
``path.resolve`` in a directory reached through links) and compare memstaged's answers with them.
Requests and answers are JSON lines (``tests/support/node/oracle.js``); inputs go in batches,
never one process per case.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ORACLE = Path(__file__).parent / "node" / "oracle.js"
_BATCH = 2000


class Node:
    """A ``node`` process answering batches of one operation at a time."""

    def __init__(self) -> None:
        node = shutil.which("node") or shutil.which("nodejs")
        if node is None:
            pytest.skip("node is not installed: the differential tests need Node.js 20")
        self.version = subprocess.run(
            [node, "--version"], capture_output=True, text=True, check=True
        ).stdout.strip()
        self._proc = subprocess.Popen(
            [node, str(ORACLE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            env={**os.environ, "TZ": os.environ.get("TZ", "UTC")},
        )

    def ask(self, op: str, inputs: Sequence[Any]) -> list[Any]:
        """JavaScript's answer for each input, in order."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        out: list[Any] = []
        for start in range(0, len(inputs), _BATCH):
            request = {"op": op, "inputs": list(inputs[start : start + _BATCH])}
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
            if not line:
                raise RuntimeError("node exited while answering")
            out.extend(json.loads(line)["out"])
        return out

    def ask_bytes(self, op: str, inputs: Sequence[bytes]) -> list[Any]:
        """:meth:`ask` with byte strings, sent as base64."""
        return self.ask(op, [base64.b64encode(b).decode("ascii") for b in inputs])

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait(timeout=10)
        if self._proc.stdout is not None:
            self._proc.stdout.close()


@contextmanager
def local_zone(node: Node, zone: str) -> Iterator[None]:
    """Both sides in time zone ``zone``: Node through ``process.env.TZ``, Python via ``tzset``."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = zone
    time.tzset()
    node.ask("tz", [zone])
    try:
        yield
    finally:
        if before is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = before
        time.tzset()
        node.ask("tz", [before or "UTC"])


def mismatches(
    inputs: Sequence[Any], ours: Sequence[Any], theirs: Sequence[Any], limit: int = 20
) -> list[str]:
    """One line per input on which the two disagree: the input and both answers."""
    out = []
    for given, mine, js in zip(inputs, ours, theirs, strict=True):
        if mine != js:
            out.append(f"input {given!r}: memstaged {mine!r}, node {js!r}")
    if len(out) > limit:
        out = [*out[:limit], f"... {len(out) - limit} more"]
    return out


def compare(
    node: Node, op: str, inputs: Sequence[Any], ours: Callable[[Any], Any], *, raw: bool = False
) -> list[str]:
    """Ask node ``op`` on every input and return the mismatches with :func:`ours`."""
    theirs = node.ask_bytes(op, inputs) if raw else node.ask(op, inputs)
    return mismatches(inputs, [ours(x) for x in inputs], theirs)
