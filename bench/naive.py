"""The usual alternative: the backlog decided with ``json`` and ``jsonschema`` (Draft 2020-12).

This is what a user would write instead of installing memstaged: a JSON Schema transcribing SPEC
section 2, a small Python repair of R1/R2/R3, and the same file operations as memstaged (nothing
for valid files; temp file, fsync, rename, directory fsync for repairs; original plus one record
per candidate, fsyncs, then unlink for quarantines). memstaged has to beat it by 3x on the backlog
and by 5x on validation alone (``validate_only``). It is a fair baseline, not a straw man: it is
correct on the benchmark corpus, and where JSON Schema cannot say a rule, a few lines of Python do.
It has none of memstaged's safety (locks, settle interval, concurrent writers, symlinks).
"""

from __future__ import annotations

import argparse
import calendar
import contextlib
import hashlib
import json
import posixpath
import re
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import corpus  # a sibling script: bench/ is on sys.path when these scripts run
from jsonschema import Draft202012Validator, FormatChecker

# ECMAScript trim's code points (SPEC 2). JSON Schema *can* say "non-empty after trim": a string
# holding at least one code point outside this set. Python's str.strip() would be wrong (U+FEFF).
_TRIM = "\t-\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
_WS = re.compile(f"[{_TRIM}]+")
_EDGES = re.compile(f"^[{_TRIM}]+|[{_TRIM}]+\\Z")
_MAX = 1.7976931348623157e308
_STR = {"type": "string", "pattern": f"[^{_TRIM}]"}
# JSON Schema has no "finite"; bounds exclude the Infinity that 1e400 parses to.
_FINITE = {"type": "number", "minimum": -_MAX, "maximum": _MAX}
_EVIDENCE = {
    "type": "object",
    "properties": {
        "discussion_note_ids": {"type": "array", "items": _FINITE},
        "lesson_candidate_marker_ids": {"type": "array", "items": _STR},
    },
    "anyOf": [
        {"required": [k], "properties": {k: {"minItems": 1}}}
        for k in ("discussion_note_ids", "lesson_candidate_marker_ids")
    ],
}
_TRIGGER = {
    "type": "object",
    "required": ["type"],
    "anyOf": [
        {
            "properties": {"type": {"enum": ["path", "filename", "topic"]}, "value": _STR},
            "required": ["value"],
        },
        {
            "properties": {"type": {"const": "tool"}, "value": _STR, "pattern": {"type": "string"}},
            "required": ["value"],
        },
        {"properties": {"type": {"const": "command"}, "pattern": _STR}, "required": ["pattern"]},
    ],
}


def _candidate(*keys: str, **extra: Any) -> dict[str, Any]:
    # reconcile_attempts never invalidates a candidate, so the schema does not mention it.
    props = {k: _STR for k in keys} | {"source_evidence": _EVIDENCE} | extra
    return {"type": "object", "required": list(props), "properties": props}


SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["schemaVersion", "session_id", "project_root", "produced_at", "candidates"],
    "properties": {
        "schemaVersion": {"type": "number", "const": 1},  # jsonschema: const 1 rejects true
        "session_id": _STR,
        "project_root": _STR,  # "names this project" needs path normalization: see decide()
        "produced_at": _STR | {"format": "staging-timestamp"},
        "candidates": {
            "type": "object",
            "properties": {
                "lessons": {
                    "type": "array",
                    "items": _candidate(
                        "summary",
                        "detail",
                        "scope_suggestion",
                        triggers={"type": "array", "minItems": 1, "items": _TRIGGER},
                    ),
                },
                "preferences": {"type": "array", "items": _candidate("text")},
                "decisions": {"type": "array", "items": _candidate("summary", "detail")},
                "domain": {"type": "array", "items": _candidate("summary", "detail")},
            },
        },
    },
}
# What JSON Schema cannot express, and where it is done instead:
# - JSON syntax (UTF-8 only, no BOM, no NaN/Infinity; duplicate keys: the last wins): loads();
# - a timestamp's calendar validity (a day that exists in its month): the custom format below;
# - ECMAScript trim has no keyword: _STR's pattern asks for one code point outside _TRIM;
# - "finite": number bounds at the largest double, which the Infinity of 1e400 exceeds;
# - a foreign project_root (path normalization against the project root): decide().

_CHECKER = FormatChecker()
_TS = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})(?:[Tt]([0-9]{2}):([0-9]{2})"
    r"(?::([0-9]{2})(?:\.[0-9]+)?)?(?:[Zz]|[+-][0-9]{2}:[0-9]{2}))?"
)
_LOOSE = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})(?:[Tt ]([0-9]{2}):([0-9]{2})"
    r"(?::([0-9]{2})(?:\.([0-9]+))?)?([Zz]|[+-][0-9]{2}:[0-9]{2})?)?"
)


def trim(s: str) -> str:
    """ECMAScript ``String.prototype.trim``."""
    return _EDGES.sub("", s)


def is_timestamp(value: object) -> bool:
    """SPEC 2.3: one of the ISO forms, with calendar values that exist."""
    if not isinstance(value, str):
        return True  # formats only judge strings; "type" judges the rest
    m = _TS.fullmatch(trim(value))
    if not m:
        return False
    y, mo, d, h, mi, s = (int(g) if g else 0 for g in m.groups())
    return (
        1 <= mo <= 12
        and 1 <= d <= calendar.monthrange(y, mo)[1]
        and h <= 23
        and mi <= 59
        and s <= 59
    )


_CHECKER.checks("staging-timestamp")(is_timestamp)  # no decorator: untyped for mypy
VALIDATOR = Draft202012Validator(SCHEMA, format_checker=_CHECKER)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def loads(data: bytes) -> Any:
    """RFC 8259 from UTF-8 only: no BOM (json rejects it), no NaN/Infinity, no UTF-16 guessing."""
    return json.loads(data.decode("utf-8"), parse_constant=_reject_constant)


def errors(doc: Any) -> list[str]:
    """Every schema violation, as ``path: keyword`` (messages would repr whole candidates)."""
    return [f"{e.json_path}: {e.validator}" for e in VALIDATOR.iter_errors(doc)]


def validate_only(paths: Iterable[Path]) -> None:
    """Read, decode and validate each file, discarding the result: validation speed alone."""
    for path in paths:
        with contextlib.suppress(ValueError, RecursionError):  # unparseable is a result too
            errors(loads(path.read_bytes()))


# ---------------------------------------------------------------------------- repairs
def canonical_time(value: str) -> str | None:
    """R3 (and SPEC 4): the instant ``value`` names, as ``YYYY-MM-DDTHH:MM:SS.sssZ``, or None.

    ISO forms may use a space for ``T``; a date-time without offset is local time and a bare date
    is UTC midnight, as JavaScript's Date reads them; anything else is tried as RFC 2822.
    """
    v = trim(value)
    try:
        if m := _LOOSE.fullmatch(v):
            y, mo, d, h, mi, s = (int(g) if g else 0 for g in m.groups()[:6])
            frac, off = m.group(7) or "0", m.group(8) or ("Z" if m.group(4) is None else None)
            tz = None
            if off:
                sign = -1 if off[0] == "-" else 1
                hours, minutes = (int(off[1:3]), int(off[4:6])) if len(off) > 1 else (0, 0)
                tz = timezone(sign * timedelta(hours=hours, minutes=minutes))
            dt = datetime(y, mo, d, h, mi, s, int((frac + "00")[:3]) * 1000, tzinfo=tz)
        else:
            dt = parsedate_to_datetime(v)
    except (ValueError, TypeError, IndexError):
        return None
    dt = dt.astimezone(UTC)  # a naive datetime is read as local time, as the reconciler does
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


_PUNCT = re.compile(r"[`*_#>\[\](){}:;,.!?/\\|<=+~$%^&\-0-9]+")
_STOP_WORDS = (  # SPEC 3.1's list, verbatim
    "the and for with from that this when then into should must have has are was were use using"
)
_STOP = set(_STOP_WORDS.split())


def topic(doc: dict[str, Any], lesson: dict[str, Any]) -> str:
    """SPEC 3.1: the first non-empty of context key, root basename, scope, keywords, text."""

    def first(keys: str) -> Any:
        return next((doc[k] for k in keys.split() if isinstance(doc.get(k), str)), None)

    name, root = (
        first("topic project projectName name title repository repo scope"),
        first("project_root projectRoot root cwd"),
    )
    text = f"{lesson.get('summary', '')}\n{lesson.get('detail', '')}"
    words = _WS.split(_PUNCT.sub(" ", text.lower()))
    words = [w for w in words if len(w) >= 3 and w not in _STOP]
    options = [
        name,
        posixpath.basename(root.rstrip("/")) if root else None,
        lesson.get("scope_suggestion"),
        " ".join(words[:4]),
        text,
    ]
    for o in options:
        if isinstance(o, str) and (t := trim(_WS.sub(" ", o))):
            return t
    return "lesson"


def repair(data: bytes) -> bytes | None:
    """R2, R3 and R1 applied as needed; the new bytes if the result is valid, else None."""
    try:
        doc = loads(data.removeprefix(b"\xef\xbb\xbf"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    ts = doc.get("produced_at")
    if isinstance(ts, str) and not is_timestamp(ts) and (fixed := canonical_time(ts)):
        doc["produced_at"] = fixed
    cands = doc.get("candidates")
    lessons = cands.get("lessons") if isinstance(cands, dict) else None
    for lesson in lessons if isinstance(lessons, list) else []:
        if isinstance(lesson, dict) and not (
            isinstance(lesson.get("triggers"), list) and lesson["triggers"]
        ):
            lesson["triggers"] = [{"type": "topic", "value": topic(doc, lesson)}]
    return None if errors(doc) else json.dumps(doc, ensure_ascii=False).encode()


# ---------------------------------------------------------------------------- disk
def _records(path: Path, data: bytes, sha: str, reasons: list[str]) -> list[dict[str, Any]]:
    """SPEC 4: one record per candidate found, else one record holding what could be read."""
    doc: Any
    try:
        doc = loads(data)
    except (ValueError, RecursionError):
        try:
            doc = data.decode("utf-8")
        except UnicodeDecodeError:
            doc = None  # the original in deadletter/originals/ holds the bytes
    d = doc if isinstance(doc, dict) else {}
    sid = d.get("session_id")
    sid = trim(sid) if isinstance(sid, str) and trim(sid) else f"malformed-{path.stem}"
    ts = d.get("produced_at")
    when = (canonical_time(ts) if isinstance(ts, str) else None) or "1970-01-01T00:00:00.000Z"
    base = {
        "session_id": sid,
        "produced_at": when,
        "last_gate_reason": "malformed staging file",
        "source_path": str(path),
        "sha256": sha,
        "errors": reasons,
        "decided_at": datetime.now(UTC).isoformat(),
    }
    cands = d.get("candidates")
    found = [
        (cat, c)
        for cat in ("lessons", "preferences", "decisions", "domain")
        if isinstance(cands, dict) and isinstance(cands.get(cat), list)
        for c in cands[cat]
    ]
    if not found:
        return [base | {"category": "lessons", "attempts": 0, "candidate": doc}]
    out = []
    for cat, c in found:
        n = c.get("reconcile_attempts") if isinstance(c, dict) else None
        ok = isinstance(n, int | float) and not isinstance(n, bool) and abs(n) <= _MAX
        out.append(
            base
            | {
                "category": cat,
                "attempts": n if ok else 0,
                "candidate": {"candidate": c, "original_staging_file": doc},
            }
        )
    return out


def quarantine(path: Path, data: bytes, memory_dir: Path, reasons: list[str]) -> None:
    """Original and records, each fsynced, their directories fsynced, then the unlink."""
    dl = memory_dir / "deadletter"
    originals = dl / "originals"
    originals.mkdir(parents=True, exist_ok=True)
    sha = hashlib.sha256(data).hexdigest()
    stem = re.sub(r"[^A-Za-z0-9_-]", "_", path.stem)[:80] or "x"  # never from raw content
    corpus.write_file(originals / f"{stem}-{sha[:16]}.json", data, durable=True)
    for i, rec in enumerate(_records(path, data, sha, reasons)):
        record = json.dumps(rec).encode()
        corpus.write_file(dl / f"{stem}-{sha[:16]}-{i}.json", record, durable=True)
    corpus.fsync_dir(originals)
    corpus.fsync_dir(dl)
    path.unlink()
    corpus.fsync_dir(path.parent)


def decide(path: Path, memory_dir: Path, project_root: str) -> str:
    """Decide one staging file and apply the decision; returns its name."""
    data = path.read_bytes()
    try:
        doc = loads(data)
        reasons = errors(doc)
    except (ValueError, RecursionError) as e:
        doc, reasons = None, [f"$: {type(e).__name__}"]
    root = doc.get("project_root") if isinstance(doc, dict) else None
    if (
        isinstance(root, str)
        and trim(root)
        and posixpath.normpath(posixpath.join(project_root, trim(root))) != project_root
    ):
        return "foreign"
    if not reasons:
        return "valid"
    fixed = repair(data)
    if fixed is None:
        quarantine(path, data, memory_dir, reasons)
        return "quarantined"
    tmp = path.with_name(f".naive-{path.name}.tmp")
    corpus.write_file(tmp, fixed, durable=True)
    tmp.replace(path)  # rename(2)
    corpus.fsync_dir(path.parent)
    return "repaired"


def run(memory_dir: Path, project_root: str | None = None) -> Counter[str]:
    """``--once`` for the naive baseline: decide every staging file; count the decisions."""
    root = project_root or corpus.project_root_of(memory_dir)
    staging = memory_dir / "staging"
    paths = sorted(
        p for p in staging.iterdir() if p.name.endswith(".json") and not p.name.startswith(".")
    )
    return Counter(decide(p, memory_dir, root) for p in paths)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: time the naive baseline on a corpus made by corpus.py, and check its decisions."""
    p = argparse.ArgumentParser(description="Time the json+jsonschema baseline on a corpus.")
    p.add_argument("memory_dir", type=Path, help="a memory dir made by corpus.py")
    p.add_argument("--repeat", type=int, default=3, help="runs (each on a reset backlog)")
    p.add_argument("--validate-only", action="store_true", help="time validation alone")
    args = p.parse_args(argv)
    manifest = corpus.Manifest.load(args.memory_dir)
    n = len(manifest.files)
    if args.validate_only:
        corpus.reset(args.memory_dir)
        paths = [args.memory_dir / "staging" / e.name for e in manifest.files]
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            validate_only(paths)
            times.append(time.perf_counter() - t0)
    else:
        counts: Counter[str] = Counter()
        times = corpus.measure(
            args.memory_dir, lambda: counts.update(run(args.memory_dir)), args.repeat
        )
        want = Counter(corpus.EXPECTED_DECISION[e.kind] for e in manifest.files)
        got = Counter({k: v // args.repeat for k, v in counts.items()})
        if got != want:
            print(
                f"decisions differ from the manifest: got {dict(got)}, want {dict(want)}",
                file=sys.stderr,
            )
            return 1
    median = sorted(times)[len(times) // 2]
    print(
        f"naive{' validate-only' if args.validate_only else ''}: {n} files, median "
        f"{median:.3f} s, {n / median:,.0f} files/s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
