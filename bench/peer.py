"""The JavaScript peer of issue 14: run ``peer-loader.mjs`` and check that it did memstaged's work.

The peer (``bench/peer-loader.mjs``, a benchmark peer written for this project, not the agent's
code) and ``memstaged --once`` decide identical copies of one corpus, each in its own memory dir.
A speed ratio means something only if both did the same work, so :func:`outcome` reads back what
each left on disk and :func:`differences` says, in words, where they part:

- the same files untouched (byte for byte the pristine ones);
- the same files repaired, to the same JSON value (so the same derived triggers);
- the same files gone from ``staging/``, with the same original bytes in ``deadletter/originals/``;
- the same dead-letter records: SPEC 4's fields of each (``session_id``, ``produced_at``,
  ``attempts``, ``last_gate_reason``, ``category``, ``candidate``) as a multiset. Record names
  and memstaged's own additions (its ``memstaged`` key) are free, so they are not compared.

JSON values are compared as JavaScript sees them: ``1.0`` and ``1`` are the same number.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import corpus  # a sibling script: bench/ is on sys.path when these scripts run

PEER_SCRIPT: Final = Path(__file__).resolve().parent / "peer-loader.mjs"
#: SPEC 4's fields of a record: what the agent's tools read, and what both sides must agree on.
RECORD_FIELDS: Final = (
    "session_id",
    "produced_at",
    "attempts",
    "last_gate_reason",
    "category",
    "candidate",
)


def node_version(node: str) -> str | None:
    """``node --version`` (``v20.…``), or None when it cannot be run."""
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def copy_corpus(src: Path, dest: Path) -> None:
    """Make ``dest`` a second memory dir holding ``src``'s pristine corpus and manifest."""
    shutil.rmtree(dest, ignore_errors=True)
    (dest / "staging").mkdir(parents=True)
    shutil.copytree(src / corpus.PRISTINE_NAME, dest / corpus.PRISTINE_NAME)  # keeps mtimes
    shutil.copy2(src / corpus.MANIFEST_NAME, dest / corpus.MANIFEST_NAME)
    corpus.reset(dest)


def _js_value(value: Any) -> Any:
    """``value`` with every integral float made an int: JSON.parse reads ``1.0`` as ``1``."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, list):
        return [_js_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _js_value(v) for k, v in value.items()}
    return value


def _canonical(value: Any) -> str:
    return json.dumps(_js_value(value), sort_keys=True, ensure_ascii=False)


@dataclass(frozen=True)
class Outcome:
    """What one run left in a memory dir, in comparable form."""

    untouched: frozenset[str]
    repaired: dict[str, str]  # name -> canonical JSON of the rewritten file
    gone: frozenset[str]  # names no longer in staging/
    originals: Counter[str]  # sha256 of each file in deadletter/originals/
    records: Counter[str]  # canonical JSON of each record's SPEC 4 fields

    def summary(self) -> str:
        return (
            f"{len(self.untouched)} untouched, {len(self.repaired)} repaired, "
            f"{len(self.gone)} dead-lettered with {sum(self.records.values())} records"
        )


def outcome(memory_dir: Path) -> Outcome:
    """Read back ``staging/`` and ``deadletter/`` of a memory dir after a run."""
    pristine = memory_dir / corpus.PRISTINE_NAME
    staging = memory_dir / "staging"
    names = {p.name for p in pristine.iterdir()}
    untouched: set[str] = set()
    repaired: dict[str, str] = {}
    left: set[str] = set()
    for path in staging.iterdir():
        if path.name.startswith(".") or not path.name.endswith(".json"):
            continue
        left.add(path.name)
        data = path.read_bytes()
        if path.name in names and (pristine / path.name).read_bytes() == data:
            untouched.add(path.name)
        else:
            try:
                repaired[path.name] = _canonical(json.loads(data))
            except ValueError:
                repaired[path.name] = f"not JSON: {hashlib.sha256(data).hexdigest()}"
    deadletter = memory_dir / "deadletter"
    records: Counter[str] = Counter()
    originals: Counter[str] = Counter()
    if deadletter.is_dir():
        for path in deadletter.iterdir():
            if path.is_file() and path.name.endswith(".json") and not path.name.startswith("."):
                body = json.loads(path.read_bytes())
                records[_canonical({k: body.get(k) for k in RECORD_FIELDS})] += 1
        if (deadletter / "originals").is_dir():
            for path in (deadletter / "originals").iterdir():
                if path.is_file() and not path.name.startswith("."):
                    originals[hashlib.sha256(path.read_bytes()).hexdigest()] += 1
    return Outcome(frozenset(untouched), repaired, frozenset(names - left), originals, records)


def differences(ours: Outcome, theirs: Outcome, ours_name: str, theirs_name: str) -> list[str]:
    """Each way in which the two runs did not do the same work, as one line; [] if none."""
    out: list[str] = []

    def sets(what: str, a: frozenset[str] | set[str], b: frozenset[str] | set[str]) -> None:
        if a != b:
            out.append(
                f"{what}: {len(a - b)} only by {ours_name}, {len(b - a)} only by {theirs_name}"
                f" (e.g. {sorted(a ^ b)[0]})"
            )

    sets("untouched", ours.untouched, theirs.untouched)
    sets("repaired", set(ours.repaired), set(theirs.repaired))
    sets("dead-lettered", ours.gone, theirs.gone)
    unlike = sorted(
        n
        for n in ours.repaired.keys() & theirs.repaired.keys()
        if ours.repaired[n] != theirs.repaired[n]
    )
    if unlike:
        out.append(f"repaired differently (e.g. triggers): {len(unlike)} files, e.g. {unlike[0]}")
    if ours.originals != theirs.originals:
        out.append(
            f"originals: {sum(ours.originals.values())} by {ours_name}, "
            f"{sum(theirs.originals.values())} by {theirs_name}, "
            f"{sum((ours.originals - theirs.originals).values())} not alike"
        )
    if ours.records != theirs.records:
        out.append(
            f"records: {sum(ours.records.values())} by {ours_name}, "
            f"{sum(theirs.records.values())} by {theirs_name}, "
            f"{sum((ours.records - theirs.records).values())} of {ours_name}'s without a twin"
        )
    return out


def run_peer(node: str, memory_dir: Path, project_root: str, env: dict[str, str]) -> dict[str, int]:
    """Run the peer on ``memory_dir``; its counts (it prints one JSON object)."""
    proc = subprocess.run(
        [node, str(PEER_SCRIPT), str(memory_dir), "--project-root", project_root],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"peer-loader.mjs exited {proc.returncode}: {proc.stderr.decode(errors='replace')}"
        )
    counts: dict[str, int] = json.loads(proc.stdout)
    return counts


def node_env() -> dict[str, str]:
    """The environment of the peer: ours, without Node options that would change its speed."""
    return {k: v for k, v in os.environ.items() if not k.startswith("NODE_")}
