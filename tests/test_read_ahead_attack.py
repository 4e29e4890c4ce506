"""``memstaged --once``'s read-ahead across transactions (issue 23), attacked from outside.

Real processes only: ``python -m memstaged --once`` as a subprocess on corpora of 1,000-3,000
mixed files, with its descriptor limit lowered, its workers killed, and a "reconciler" process
that takes ``canonical-writer.lock`` between two transactions. What is checked is what a user
sees: the exit code, stderr, the decision log (one decision per file) and the bytes on disk.
Nothing is timed: a test waits for an event (a log line, a child process) and acts on it.
"""

from __future__ import annotations

import collections
import json
import os
import random
import resource
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    KINDS,
    REPO,
    Input,
    check_final,
    make_corpus,
    make_memory_dir,
    memstaged_cmd,
    memstaged_env,
    project_root_of,
    read_events,
    write_inputs,
)

#: The corpus of these tests: every kind of file but the 2,000-deep one (whose records the
#: checks read back with ``json``).
_KINDS = tuple(k for k in KINDS if k != "deep")


def _corpus(mdir: Path, count: int, seed: int, prefix: str) -> list[Input]:
    inputs = make_corpus(
        random.Random(seed), count, project_root_of(mdir), prefix, big_every=7, kinds=_KINDS
    )
    write_inputs(mdir / "staging", inputs)
    return inputs


def _decided(events: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    """Staging file name -> the decisions logged for it, a look at memstaged's own rewrite and
    a wait (``deferred``) left out: SPEC 7's one decision per version."""
    out: dict[str, list[str]] = collections.defaultdict(list)
    for event in events:
        if event.get("event") != "decision" or event.get("own_rewrite"):
            continue
        if event.get("decision") == "deferred":
            continue
        out[os.path.basename(event["path"])].append(event["decision"])
    return out


def _limit_descriptors(limit: int) -> Callable[[], None]:
    """In the child, before exec: a soft and hard limit of ``limit`` descriptors (so that
    ``raise_fd_limit`` cannot raise it), as a container or a unit's ``LimitNOFILE=`` sets."""

    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return preexec


@pytest.mark.parametrize(
    ("limit", "workers"),
    [
        (500, "2"),  # a hard limit below what 512 files read ahead and 256 held need
        (1024, "32"),  # the default limit, on a 32-core machine: 2 chunks per worker ahead
    ],
)
def test_once_under_a_low_descriptor_limit_decides_every_file_without_an_error(
    tmp_path: Path, limit: int, workers: str
) -> None:
    """SPEC 6 (descriptors stay bounded) and issue 23: under a hard limit of 500 descriptors,
    or of 1,024 with 32 workers, a 3,000-file backlog is decided in one run: exit 0, every file
    exactly one decision, none deferred for an I/O error ("Too many open files"), no traceback,
    and the disk as SPEC says. Files read ahead each hold a descriptor: they must leave room
    for the transaction's own (before the fix, 500 crashed with EMFILE importing ``ctypes`` at
    the first commit, exit 1 with a traceback; 1,024 with 32 workers deferred ~1,000 files with
    ``Too many open files`` and retried them one by one)."""
    mdir = make_memory_dir(tmp_path)
    inputs = _corpus(mdir, 3000, 31, "fd-")
    env = memstaged_env(tmp_path, MEMSTAGED_WORKERS=workers)
    proc = subprocess.run(
        memstaged_cmd("--once", "--memory-dir", str(mdir)),
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
        cwd=REPO,
        preexec_fn=_limit_descriptors(limit),
    )
    stderr = proc.stderr.decode(errors="replace")
    assert "Traceback" not in stderr
    assert proc.returncode == 0, stderr[-2000:]
    events = read_events(tmp_path / "decisions.jsonl")
    errors = [e for e in events if "Too many open files" in json.dumps(e)]
    assert errors == [], errors[:3]
    decided = _decided(events)
    assert {i.name for i in inputs} == set(decided)
    assert [n for n, d in decided.items() if len(d) != 1] == []
    assert check_final(mdir, inputs) == []
