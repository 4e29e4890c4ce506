"""Deterministic staging-file corpora for the memstaged benchmarks.

A benchmark is only comparable across machines and commits if every run decides the same bytes,
so everything here derives from one ``random.Random(seed)``: the same seed gives the same files,
byte for byte. The files follow SPEC section 2 (valid), need exactly one repair of section 3
(repairable) or fail beyond repair (malformed), and the manifest records which is which so that the
I/O floor can do the work of a decision without deciding anything.

Layout: ``generate`` writes the corpus once to ``<memory dir>/bench-pristine/`` and the manifest to
``<memory dir>/bench-manifest.json``; ``reset`` then restores ``staging/`` from that pristine copy
before each measured run, because every measured run (memstaged, naive, floor) consumes the
backlog it is given. ``write_file`` and ``fsync_dir`` are the file operations the baselines
(floor, naive) share.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path, PurePosixPath
from typing import Any, Final, Literal

Kind = Literal["valid", "repairable", "malformed"]

#: The decision memstaged must reach for each kind: a runner checks correctness, not just time.
EXPECTED_DECISION: dict[str, str] = {
    "valid": "valid",
    "repairable": "repaired",
    "malformed": "quarantined",
}
MANIFEST_NAME = "bench-manifest.json"
PRISTINE_NAME = "bench-pristine"
#: Files are dated well in the past: memstaged defers unparseable files younger than its settle
#: interval (SPEC 5), which would turn a benchmark of decisions into a benchmark of waiting.
PRISTINE_MTIME = 1_577_836_800  # 2020-01-01T00:00:00Z

REPAIR_DEFECTS = ("R1", "R2", "R3")
#: ``records`` is the number of dead-letter records SPEC 4 calls for: one per candidate when
#: ``candidates`` is an object, a single record when no candidate can be found.
MALFORMED_DEFECTS = (
    "truncated",
    "non-utf8",
    "nan-literal",
    "candidates-array",
    "bad-trigger",
    "schema-string",
    "trim-empty",
)
_NO_CANDIDATES_FOUND = {"truncated", "non-utf8", "nan-literal", "candidates-array"}

#: The corpus of issue 14's comparison with the agent's loader (3,000 files, ~22 MB: 70 % valid,
#: 20 % lessons without triggers, 10 % malformed with ~4,400 candidates), as ``generate``'s
#: keyword arguments. Only R1 and defects that SPEC version 1 and version 2 decide alike, and all
#: four categories present, so that a JavaScript peer following version 2 and a memstaged still
#: on version 1 must do exactly the same work (``non-utf8`` is valid under version 2; an absent
#: category is repaired by version 2's R5).
PEER_CORPUS: Final[dict[str, Any]] = {
    "repairs": ("R1",),
    "malformed": ("bad-trigger", "schema-string", "trim-empty", "truncated"),
    "all_categories": True,
    "malformed_sizes": (8000, 24000),
}


#: The backlog corpus (``run.py``'s measures 1-7) as contract version 2 decides it: the same mix
#: and sizes as the earlier runs, but all four categories in every file (version 2 repairs an
#: absent one by R5), no R3 defect (its forms are all timestamps to V8's ``Date.parse`` now:
#: valid as they are) and no ``non-utf8`` file (valid under version 2). On the corpus of the
#: earlier runs memstaged decided 4,298 / 4,833 / 869 where the manifest said 7,000 / 2,000 /
#: 1,000, and the "valid" pool of the latency and burst measures was half repairs.
V2_CORPUS: Final[dict[str, Any]] = {
    "repairs": ("R1", "R2"),
    "malformed": tuple(d for d in MALFORMED_DEFECTS if d != "non-utf8"),
    "all_categories": True,
}


@dataclass(frozen=True)
class Entry:
    """One staging file: what it is, and how much work deciding it takes."""

    name: str
    kind: Kind
    defect: str  # "" for valid files, else an R* repair or a MALFORMED_DEFECTS name
    candidates: int
    records: int  # dead-letter records a quarantine writes (0 unless malformed)
    size: int


@dataclass(frozen=True)
class Manifest:
    """What ``generate`` wrote; saved as JSON next to the corpus so that runners need no seed."""

    seed: int
    project_root: str
    files: tuple[Entry, ...]

    def save(self, memory_dir: Path) -> None:
        """Write ``<memory dir>/bench-manifest.json``."""
        body = {
            "seed": self.seed,
            "project_root": self.project_root,
            "files": [asdict(e) for e in self.files],
        }
        (memory_dir / MANIFEST_NAME).write_text(json.dumps(body, indent=1) + "\n")

    @classmethod
    def load(cls, memory_dir: Path) -> Manifest:
        """Read the manifest ``generate`` saved in ``memory_dir``."""
        body = json.loads((memory_dir / MANIFEST_NAME).read_text())
        files = tuple(Entry(**e) for e in body["files"])
        return cls(seed=body["seed"], project_root=body["project_root"], files=files)


def project_root_of(memory_dir: Path) -> str:
    """Return the default project root of SPEC 2.4: three levels up, normalized lexically."""
    return os.path.normpath(Path(memory_dir).absolute() / ".." / ".." / "..")


# ---------------------------------------------------------------------------- text
def _split(text: str) -> list[str]:
    """Vocabulary lists, written as one ``|``-separated string so they stay short on the page."""
    return text.split("|")


_SUBJECTS = _split(
    "The reconciler|The test suite|The staging writer|Our CI job|The daemon|"
    "The migration script|The bridge|This repository|The build|The linter|"
    "The release checklist|A flaky test|The cache layer|The café's API client"
)
_VERBS = _split(
    "must run|should never touch|fails when it sees|rewrites|keeps|depends on|"
    "silently drops|needs a lock around|retries|logs|must fsync|is slow on|validates|"
    "cannot parse"
)
_OBJECTS = _split(
    "the lock file|symbolic links in staging|files larger than 8 MiB|"
    "timestamps without an offset|`make test` before every push|the schema version|"
    "trailing commas in JSON|the dead-letter directory|UTF-8 byte-order marks|"
    "the journald fields|pyproject.toml|src/memstaged/service.py|naïve datetimes|"
    "the “quarantined” decisions|a 10,000-file backlog|the settle interval"
)
_TAILS = _split(
    "| after a crash| on ext4| under systemd| — see the incident notes| in CI only|"
    " when two writers race| (twice, last week)| since v0.4"
)
_WORDS = _split(
    "state|reconcile|staging|memory|lesson|pattern|writer|durable|rename|fsync|backlog|"
    "trigger|project|session|schema|journal"
)

_PATHS = ["src/**/*.py", "tests/", "docs/*.md", "packaging/memstaged.service", ".ci/run"]
_FILES = ["pyproject.toml", "Makefile", "CHANGELOG.md", "config.example.toml", "conftest.py"]
_TOPICS = ["fsync ordering", "lock files", "timestamps", "release process", "json schema"]
_TOOLS = ["bash", "edit", "write", "read", "grep"]
_COMMANDS = ["make test", "git push --force*", "rm -rf *", "pytest -x", "mypy --strict ."]
_SCOPES = ["project", "global", "path:src/memstaged", "repo", "team"]


class _Text:
    """A pool of sentences drawn once per corpus, so that filling 100 MB of text stays fast."""

    def __init__(self, rng: random.Random, size: int = 2000) -> None:
        self.rng = rng
        self.pool = [
            f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}"
            f"{rng.choice(_TAILS)}."
            for _ in range(size)
        ]
        self.cost = [len(json.dumps(s, ensure_ascii=False).encode()) - 2 for s in self.pool]

    def sentence(self) -> str:
        """One sentence, for summaries and short fields."""
        return self.rng.choice(self.pool)

    def fill(self, budget: int) -> str:
        """Whole sentences adding at most ``budget`` bytes of JSON (one separating space each)."""
        out: list[str] = []
        while True:
            i = self.rng.randrange(len(self.pool))
            if self.cost[i] + 1 > budget:
                return " ".join(out)
            budget -= self.cost[i] + 1
            out.append(self.pool[i])

    def pad(self, n: int) -> str:
        """Exactly ``n`` ASCII bytes of word salad: closes the last gap to the target size."""
        s = ""
        while len(s) < n:
            s += " " + self.rng.choice(_WORDS)
        return s[:n]


# ---------------------------------------------------------------------------- candidates
def _trigger(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["path", "filename", "topic", "tool", "tool", "command"])
    if kind == "command":
        return {"type": "command", "pattern": rng.choice(_COMMANDS)}
    values = {"path": _PATHS, "filename": _FILES, "topic": _TOPICS, "tool": _TOOLS}[kind]
    trig: dict[str, Any] = {"type": kind, "value": rng.choice(values)}
    if kind == "tool" and rng.random() < 0.6:
        trig["pattern"] = rng.choice([*_COMMANDS, ""])  # any string is allowed, even empty
    return trig


def _evidence(rng: random.Random) -> dict[str, Any]:
    ev: dict[str, Any] = {"source": rng.choice(["session-extractor", "bridge", "manual"])}
    shape = rng.random()
    if shape < 0.8:
        ev["discussion_note_ids"] = [rng.randrange(1, 90_000) for _ in range(rng.randint(1, 4))]
    if shape > 0.5:
        ev["lesson_candidate_marker_ids"] = [
            f"m-{rng.getrandbits(32):08x}" for _ in range(rng.randint(1, 3))
        ]
    if shape > 0.9:
        ev["discussion_note_ids"] = []  # one empty array is fine when the other is not
    if rng.random() < 0.3:
        ev["request_id"] = f"req_{rng.getrandbits(48):012x}"
    return ev


def _candidate(rng: random.Random, text: _Text, category: str) -> dict[str, Any]:
    c: dict[str, Any]
    if category == "preferences":
        c = {"text": text.sentence()}
    else:
        c = {"summary": text.sentence(), "detail": text.sentence()}
    if category == "lessons":
        c["scope_suggestion"] = rng.choice(_SCOPES)
        c["triggers"] = [_trigger(rng) for _ in range(rng.randint(1, 3))]
    c["source_evidence"] = _evidence(rng)
    if rng.random() < 0.2:
        c["reconcile_attempts"] = rng.choice([1, 2, 3, "2", None])  # non-numbers count as 0
    if rng.random() < 0.3:
        c["confidence"] = round(rng.random(), 2)  # an unknown key: must be kept as it is
    return c


# ---------------------------------------------------------------------------- files
def _timestamp(rng: random.Random, when: datetime, repairable: bool) -> str:
    if repairable:  # R3: names an instant, but not as SPEC 2.3 writes it
        return rng.choice(
            [
                when.strftime("%Y-%m-%d %H:%M:%S"),
                when.strftime("%Y-%m-%dT%H:%M:%S"),
                format_datetime(when, usegmt=True),
                when.strftime("%Y-%m-%d %H:%M:%S.250+02:00"),
            ]
        )
    return rng.choice(
        [
            when.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
            when.strftime("%Y-%m-%dT%H:%M:%S+02:00"),
            when.strftime("%Y-%m-%d"),
            when.strftime("%Y-%m-%dt%H:%Mz"),
            when.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        ]
    )


def _document(
    rng: random.Random,
    text: _Text,
    *,
    root: str,
    sid: str,
    n: int,
    defect: str,
    target: int,
    pretty: bool,
    all_categories: bool = False,
) -> dict[str, Any]:
    weights = [0.5, 0.15, 0.2, 0.15]
    cats = ("lessons", "preferences", "decisions", "domain")
    picks = rng.choices(cats, weights, k=n)
    if defect in ("R1", "bad-trigger") and "lessons" not in picks:
        picks[0] = "lessons"
    if defect == "trim-empty" and "preferences" not in picks:
        picks[0] = "preferences"
    candidates: dict[str, Any] = {
        c: [] for c in cats if all_categories or c in picks or rng.random() < 0.3
    }
    for c in picks:
        candidates[c].append(_candidate(rng, text, c))
    when = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randrange(90 * 86400))
    doc: dict[str, Any] = {
        "schemaVersion": rng.choice([1, 1, 1, 1.0]),
        "session_id": sid,
        "project_root": root,
        "produced_at": _timestamp(rng, when, defect == "R3"),
        "candidates": candidates,
    }
    if rng.random() < 0.5:
        doc["extractor"] = {"name": "session-extractor", "version": "0.4.2"}
    if rng.random() < 0.3:
        doc["project"] = PurePosixPath(root).name or "example-project"  # an R1 topic source
    # Too many candidates for a small target: drop some (keeping one per category, which the
    # defects rely on), then grow the long fields until the file reaches its target size.
    while len(_dump(doc, pretty)) > target and sum(map(len, candidates.values())) > 3:
        longest = max(candidates.values(), key=len)
        if len(longest) == 1:
            break
        longest.pop()
    items = [x for lst in candidates.values() for x in lst]
    budget = (target - len(_dump(doc, pretty))) // len(items)
    for c in items:
        extra = text.fill(budget)
        if extra:
            key = "text" if "text" in c else "detail"
            c[key] += " " + extra
    gap = target - len(_dump(doc, pretty))
    if gap > 0:
        key = "text" if "text" in items[0] else "detail"
        items[0][key] += text.pad(gap)
    _break(rng, doc, defect)
    return doc


def _break(rng: random.Random, doc: dict[str, Any], defect: str) -> None:
    """Apply a defect that lives in the parsed value; byte-level defects are done in ``_bytes``."""
    lessons = doc["candidates"].get("lessons", [])
    if defect == "R1":
        for lesson in lessons[: rng.randint(1, len(lessons))]:
            if rng.random() < 0.5:
                del lesson["triggers"]
            else:
                lesson["triggers"] = []
    elif defect == "bad-trigger":
        bad = rng.choice(
            [
                {"type": "regex", "value": "x"},
                {"type": "command"},
                {"type": "path", "value": " \u00a0"},
                {"type": "tool", "value": 3},
            ]
        )
        rng.choice(lessons)["triggers"].append(bad)
    elif defect == "schema-string":
        doc["schemaVersion"] = "1"
    elif defect == "trim-empty":  # empty only under ECMAScript trim (U+FEFF); str.strip keeps it
        rng.choice(doc["candidates"]["preferences"])["text"] = "\u3000\ufeff"
    elif defect == "candidates-array":
        doc["candidates"] = [x for lst in doc["candidates"].values() for x in lst]


def _dump(doc: dict[str, Any], pretty: bool) -> bytes:
    return json.dumps(doc, ensure_ascii=False, indent=2 if pretty else None).encode()


def _bytes(rng: random.Random, doc: dict[str, Any], defect: str, pretty: bool) -> bytes:
    data = _dump(doc, pretty)
    if defect == "R2":
        return b"\xef\xbb\xbf" + data
    if defect == "truncated":
        return data[: rng.randrange(len(data) // 2, len(data) - 2)]
    if defect == "non-utf8":
        at = data.index(b'"detail"') + 11 if b'"detail"' in data else len(data) // 2
        return data[:at] + b"\xff\xfe latin-1 caf\xe9 " + data[at:]
    if defect == "nan-literal":
        nan = b'"reconcile_attempts": NaN, "schemaVersion": '
        return data.replace(b'"schemaVersion": ', nan, 1)
    return data


# ---------------------------------------------------------------------------- API
def generate(
    dest_memory_dir: Path,
    n: int,
    seed: int,
    mix: tuple[float, float, float] = (0.7, 0.2, 0.1),
    *,
    repairs: Sequence[str] = REPAIR_DEFECTS,
    malformed: Sequence[str] = MALFORMED_DEFECTS,
    all_categories: bool = False,
    sizes: tuple[int, int] = (1300, 20000),
    malformed_sizes: tuple[int, int] | None = None,
) -> Manifest:
    """Write ``n`` staging files for ``dest_memory_dir`` and restore ``staging/`` from them.

    ``mix`` is the share of (valid, repairable, malformed) files; counts are rounded so that they
    add up to ``n``, and the kinds are shuffled so that no run processes them in sorted blocks.
    ``repairs`` and ``malformed`` are the defects drawn from, and ``all_categories`` writes all
    four category arrays in every file; file sizes are log-uniform in ``sizes`` (in
    ``malformed_sizes`` for malformed files, if given). The peer corpus of issue 14
    (:data:`PEER_CORPUS`) uses them to stay inside what SPEC versions 1 and 2 decide alike. The
    defaults give the corpus of the earlier runs, byte for byte.
    """
    rng = random.Random(seed)
    text = _Text(rng)
    root = project_root_of(dest_memory_dir)
    n_valid, n_rep = round(n * mix[0]), round(n * mix[1])
    counts: dict[Kind, int] = {
        "valid": n_valid,
        "repairable": n_rep,
        "malformed": n - n_valid - n_rep,
    }
    kinds = [k for k, c in counts.items() for _ in range(c)]
    rng.shuffle(kinds)
    pristine = dest_memory_dir / PRISTINE_NAME
    shutil.rmtree(pristine, ignore_errors=True)
    pristine.mkdir(parents=True)
    entries = []
    for kind in kinds:
        defect = {
            "valid": "",
            "repairable": rng.choice(repairs),
            "malformed": rng.choice(malformed),
        }[kind]
        low, high = malformed_sizes if malformed_sizes and kind == "malformed" else sizes
        target = int(math.exp(rng.uniform(math.log(low), math.log(high))))
        n_cand = max(3, min(rng.randint(3, 40), target // 480))  # trimmed to fit
        sid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        pretty = rng.random() < 0.8  # most writers indent; some write compact JSON
        doc = _document(
            rng,
            text,
            root=root,
            sid=sid,
            n=n_cand,
            defect=defect,
            target=target,
            pretty=pretty,
            all_categories=all_categories,
        )
        data = _bytes(rng, doc, defect, pretty)
        cands = doc["candidates"]
        n_cand = len(cands) if isinstance(cands, list) else sum(map(len, cands.values()))
        name = f"{sid}.json"
        path = pristine / name
        path.write_bytes(data)
        os.utime(path, (PRISTINE_MTIME, PRISTINE_MTIME))
        records = 0 if kind != "malformed" else 1 if defect in _NO_CANDIDATES_FOUND else n_cand
        entries.append(Entry(name, kind, defect, n_cand, records, len(data)))
    manifest = Manifest(seed=seed, project_root=root, files=tuple(entries))
    manifest.save(dest_memory_dir)
    reset(dest_memory_dir)
    return manifest


def reset(memory_dir: Path) -> None:
    """Put the pristine backlog back in ``staging/``, drop all outputs, and flush to disk.

    The final ``os.sync()`` matters: a measured run must not pay for writing back the copy.
    """
    for sub in ("staging", "deadletter", "bench-raw"):
        shutil.rmtree(memory_dir / sub, ignore_errors=True)
    shutil.copytree(memory_dir / PRISTINE_NAME, memory_dir / "staging")  # copy2 keeps the mtimes
    os.sync()


def measure(memory_dir: Path, action: Callable[[], object], repeat: int) -> list[float]:
    """Wall-clock seconds of ``action`` over ``repeat`` runs, each on a freshly reset backlog."""
    times = []
    for _ in range(repeat):
        reset(memory_dir)
        t0 = time.perf_counter()
        action()
        times.append(time.perf_counter() - t0)
    return times


def write_file(path: Path, data: bytes, *, durable: bool) -> None:
    """Write ``data`` to ``path`` (mode 0600), fsynced if ``durable``: the baselines' writes."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """fsync a directory, so that the names created, renamed or unlinked in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: generate a corpus and print its make-up."""
    p = argparse.ArgumentParser(description="Generate a deterministic memstaged staging backlog.")
    p.add_argument("dest", type=Path, help="memory dir, ideally <project>/.pi/memory/project")
    p.add_argument("--n", type=int, default=10_000, help="number of staging files")
    p.add_argument("--seed", type=int, default=1, help="random seed (same seed, same bytes)")
    p.add_argument(
        "--mix",
        type=float,
        nargs=3,
        default=(0.7, 0.2, 0.1),
        metavar=("VALID", "REPAIRABLE", "MALFORMED"),
        help="shares of each kind",
    )
    args = p.parse_args(argv)
    m = generate(args.dest, args.n, args.seed, tuple(args.mix))
    total = sum(e.size for e in m.files)
    by_kind = {k: sum(e.kind == k for e in m.files) for k in EXPECTED_DECISION}
    print(f"{len(m.files)} files, {total / 1e6:.1f} MB, {by_kind}, project_root={m.project_root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
