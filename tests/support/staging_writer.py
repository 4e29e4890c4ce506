"""A staging-file writer as a process of its own, for the kill harness (issue 19).

Run as ``python staging_writer.py MDIR JOURNAL SEED PREFIX``: it replaces files of a small pool
of names (``w-<slot>.json``) in ``MDIR/staging`` for ever, each time by writing ``.<name>.tmp``
and renaming it over the name (SPEC 5's writer), until it is killed. Each version holds fresh
candidates whose ids start with ``cid-<PREFIX>-<n>-``: valid files, files with one invalid
lesson (quarantined: their good preference and decision are for ``deadletter recover``), and
files that are not JSON at all (a whole-file record; kept by their bytes).

Each version is written complete to its temp, then appended to ``JOURNAL`` (one JSON line, one
``write``), then renamed into place. A SIGKILL can leave a journalled version that never reached
its name: its temp is then still there with exactly its bytes, which is how the harness tells.

Self-contained (standard library only): it is what a foreign writer would be.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time
from typing import Any, Final

SLOTS: Final = 6
CATEGORIES: Final = ("lessons", "preferences", "decisions", "domain")
EVIDENCE: Final = {"discussion_note_ids": [1, 2], "source": "kill-harness"}


def root_of(mdir: str) -> str:
    """``<project>`` of ``<project>/.pi/memory/project`` (SPEC 2.4's derived root)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(mdir))))


def version(root: str, prefix: str, n: int, kind: str) -> tuple[bytes, dict[str, list[str]]]:
    """The bytes of version ``n`` and its candidate ids by category, in file order."""
    cid = f"cid-{prefix}-{n}"
    triggers: Any = [{"type": "command", "pattern": "git push"}]
    if kind == "bad":
        triggers = [{"type": "bogus"}]
    lesson = {
        "summary": f"{cid}-l keep the build green",
        "detail": f"{cid}: run the tests before every push.",
        "scope_suggestion": "project",
        "triggers": triggers,
        "source_evidence": EVIDENCE,
    }
    pref = {"text": f"{cid}-p prefer small commits", "source_evidence": EVIDENCE}
    dec = {"summary": f"{cid}-d use msgspec", "detail": f"{cid}: fast", "source_evidence": EVIDENCE}
    candidates: dict[str, list[Any]] = {
        "lessons": [lesson],
        "preferences": [pref],
        "decisions": [dec] if kind == "bad" else [],
        "domain": [],
    }
    body = {
        "schemaVersion": 1,
        "session_id": f"{prefix}-{n}",
        "project_root": root,
        "produced_at": "2026-11-29T18:04:11.250Z",
        "candidates": candidates,
    }
    data = json.dumps(body).encode()
    ids = {c: [_id(item) for item in candidates[c]] for c in CATEGORIES}
    if kind == "notjson":
        data = data[: len(data) // 2]  # unparseable: quarantined whole once settled
        ids = {c: [] for c in CATEGORIES}
    return data, ids


def _id(candidate: dict[str, Any]) -> str:
    text = candidate.get("summary", candidate.get("text"))
    assert isinstance(text, str)
    return text.split(" ", 1)[0]


def main(argv: list[str]) -> int:
    mdir, journal, seed, prefix = argv[1], argv[2], int(argv[3]), argv[4]
    staging = os.path.join(mdir, "staging")
    root = root_of(mdir)
    rng = random.Random(seed)
    log_fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    n = 0
    while True:
        name = f"w-{rng.randrange(SLOTS)}.json"
        kind = rng.choice(("valid", "bad", "bad", "notjson"))
        data, ids = version(root, prefix, n, kind)
        entry = {
            "prefix": prefix,
            "n": n,
            "name": name,
            "kind": kind,
            "sha256": hashlib.sha256(data).hexdigest(),
            "ids": ids,
        }
        tmp = os.path.join(staging, f".{name}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.write(log_fd, (json.dumps(entry) + "\n").encode())
        os.rename(tmp, os.path.join(staging, name))
        n += 1
        time.sleep(rng.uniform(0.005, 0.04))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
