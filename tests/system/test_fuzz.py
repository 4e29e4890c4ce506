"""Fuzzing: no input makes memstaged raise, and every input gets exactly one decision.

Two generators: hypothesis builds staging-file-shaped JSON (every key optional, every value of
any type, SPEC's edge values over-represented), and byte-level mutations (flips, inserts,
deletes, truncations, splices, BOMs, NULs) of real staging files. The engine's verdicts are held
to SPEC's properties; whole ``--once`` runs over mutated memory dirs are held to the invariant.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.decision_log import read_events
from support.helpers import (
    Input,
    check_final,
    corpus_file,
    make_memory_dir,
    project_root_of,
    write_inputs,
)

from memstaged.cli.main import main
from memstaged.core.decide import Context, Decision, Verdict, decide
from memstaged.core.js.ecma import parse_json

ROOT = "/home/ana/src/example-project"
CTX = Context(project_root=ROOT, file_name="s.json", source_path=f"{ROOT}/x/s.json")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "memory-dir" / "staging"
SEED = int(os.environ.get("MEMSTAGED_TEST_SEED", random.randrange(1 << 30)))
REQUIRED_RECORD_KEYS = (
    "session_id",
    "produced_at",
    "attempts",
    "last_gate_reason",
    "category",
    "candidate",
)


def check_verdict(data: bytes, ctx: Context = CTX) -> Verdict:
    """Decide ``data`` and hold the verdict to SPEC's properties; returns it."""
    verdict = decide(data, ctx)
    assert verdict.decision in set(Decision)
    assert verdict == decide(data, ctx), "not deterministic"
    if verdict.decision is Decision.DEFERRED:
        assert not ctx.settled
    if verdict.decision is Decision.SKIPPED:
        raise AssertionError("the engine never skips bytes")
    if verdict.decision in (Decision.VALID, Decision.FOREIGN):
        assert verdict.new_bytes is None and not verdict.deadletter
    if verdict.decision is Decision.REPAIRED:
        assert verdict.new_bytes is not None and verdict.repairs
        again = decide(verdict.new_bytes, ctx)
        assert again.decision is Decision.VALID, ("a repair is not valid", again.reasons)
    if verdict.decision is Decision.QUARANTINED:
        assert verdict.deadletter and verdict.original
        assert not verdict.original.startswith(".") and "/" not in verdict.original
    names = [r.name for r in verdict.deadletter]
    assert len(names) == len(set(names)), "two records under one name"
    for record in verdict.deadletter:
        assert record.name.endswith(".json") and not record.name.startswith(".")
        assert "/" not in record.name and len(os.fsencode(record.name)) <= 255
        body = parse_json(record.body).value  # as the engine reads JSON (deep nesting, 1e400)
        assert all(key in body for key in REQUIRED_RECORD_KEYS), body.keys()
        assert body["last_gate_reason"] == "malformed staging file"
        assert body["category"] in ("lessons", "preferences", "decisions", "domain")
        assert isinstance(body["session_id"], str) and body["session_id"]
    return verdict


# -- hypothesis: staging-shaped JSON --------------------------------------------------------------

_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**20), max_value=10**20)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
)
_any = st.recursive(
    _leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_strings = st.sampled_from(
    ["", " ", "\u3000", "\ufeff", "\u0085", "\x1c", "x", " y ", "ü"]
) | st.text(max_size=10)
_trigger = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["path", "filename", "topic", "tool", "command", "regex"]) | _any,
        "value": _strings | _any,
        "pattern": _strings | _any,
    },
)
_evidence = st.fixed_dictionaries(
    {},
    optional={
        "discussion_note_ids": st.lists(
            st.integers() | st.floats(allow_nan=False) | st.booleans() | _strings, max_size=3
        )
        | _any,
        "lesson_candidate_marker_ids": st.lists(_strings | _any, max_size=3) | _any,
        "source": _strings,
    },
)
_common = {"source_evidence": _evidence | _any, "reconcile_attempts": _any, "extra": _any}
_lesson = st.fixed_dictionaries(
    {},
    optional={
        "summary": _strings,
        "detail": _strings,
        "scope_suggestion": _strings,
        "triggers": st.lists(_trigger, max_size=3) | _any,
        **_common,
    },
)
_preference = st.fixed_dictionaries({}, optional={"text": _strings, **_common})
_decision = st.fixed_dictionaries({}, optional={"summary": _strings, "detail": _strings, **_common})
_candidates = st.fixed_dictionaries(
    {},
    optional={
        "lessons": st.lists(_lesson | _any, max_size=3) | _any,
        "preferences": st.lists(_preference | _any, max_size=2) | _any,
        "decisions": st.lists(_decision | _any, max_size=2) | _any,
        "domain": st.lists(_decision | _any, max_size=2) | _any,
        "other": _any,
    },
)
_timestamps = st.sampled_from(
    [
        "2026-11-29T18:04:11.250Z",
        "2026-11-29",
        "2026-11-29 18:04:11",
        "2026-11-29T18:04:11",
        "2026-11-29t18:04z",
        "Tue, 01 Dec 2026 00:00:00 GMT",
        "2026-02-30T00:00:00Z",
        "2026-11-29T24:00:00Z",
        "0000-01-01T00:00:00+00:00",
        " 2026-11-29T18:04:11+02:00 ",
    ]
)
_doc = st.fixed_dictionaries(
    {},
    optional={
        "schemaVersion": st.sampled_from([1, 1.0, "1", True, 2, 0]) | _any,
        "session_id": _strings | _any,
        "project_root": st.sampled_from([ROOT, ROOT + "/", ROOT + "/./", "/elsewhere", "", "."])
        | _any,
        "produced_at": _timestamps | _strings | _any,
        "candidates": _candidates | _any,
        "topic": _strings,
        "cwd": _strings,
    },
)


@st.composite
def _encoded(draw: Any) -> bytes:
    value = draw(_doc | _any)
    data = json.dumps(value, ensure_ascii=draw(st.booleans())).encode()
    if draw(st.integers(0, 9)) == 0:
        data = b"\xef\xbb\xbf" + data
    return data


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_encoded())
def test_the_engine_holds_spec_properties_on_staging_shaped_json(data: bytes) -> None:
    """For any staging-shaped JSON (every key optional, any type, SPEC's edge values): the engine
    returns one of the six decisions without raising, deterministically; a repair is valid on
    its own (never rewritten twice); a quarantine has an original and well-formed records under
    safe, distinct names."""
    check_verdict(data)


@settings(max_examples=800, deadline=None)
@given(data=st.binary(max_size=300), settled=st.booleans())
def test_the_engine_decides_any_bytes(data: bytes, settled: bool) -> None:
    """Arbitrary bytes get a decision too (deferred only while not settled)."""
    ctx = Context(project_root=ROOT, file_name="s.json", settled=settled)
    check_verdict(data, ctx)


# -- byte-level mutations of real staging files ---------------------------------------------------


def _seeds(rng: random.Random) -> list[bytes]:
    seeds = [p.read_bytes() for p in sorted(EXAMPLES.glob("*.json"))]
    seeds += [corpus_file(rng, f"seed{i}", ROOT).data for i in range(40)]
    return [s for s in seeds if s]


_INTERESTING = [
    b"\x00",
    b"\xff",
    b'"',
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b"\\",
    b"\\u0000",
    b"\\ud800",
    b"\xef\xbb\xbf",
    b"1e400",
    b"NaN",
    b"-",
    b" ",
    b"\n",
    b"null",
    b"\xc3",
]


def mutate(rng: random.Random, data: bytes, other: bytes) -> bytes:
    """One to four random byte-level mutations of ``data`` (``other`` is spliced in)."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(8)
        pos = rng.randrange(len(out) + 1)
        if op == 0 and out:
            i = rng.randrange(len(out))
            out[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            out[pos:pos] = rng.choice(_INTERESTING)
        elif op == 2 and out:
            del out[pos : pos + rng.randint(1, 16)]
        elif op == 3:
            del out[pos:]
        elif op == 4:
            start = rng.randrange(len(other) + 1)
            out[pos:] = other[start:]
        elif op == 5 and out:
            i = rng.randrange(len(out))
            out[pos:pos] = out[i : i + rng.randint(1, 64)]
        elif op == 6 and out:
            out[rng.randrange(len(out))] = rng.randrange(256)
        else:
            out[pos:pos] = rng.choice(_INTERESTING) * rng.randint(1, 50)
    return bytes(out)


def mutations(count: int, seed: int) -> Iterator[bytes]:
    rng = random.Random(seed)
    seeds = _seeds(rng)
    for _ in range(count):
        yield mutate(rng, rng.choice(seeds), rng.choice(seeds))


def _fuzz_bytes(count: int) -> dict[str, int]:
    tally: dict[str, int] = {}
    for data in mutations(count, SEED):
        verdict = check_verdict(data)
        tally[verdict.decision.value] = tally.get(verdict.decision.value, 0) + 1
    print(f"\nmutation fuzz (seed {SEED}): {count} inputs: {tally}")
    return tally


def test_the_engine_on_mutated_staging_files() -> None:
    """3,000 byte-level mutations of real staging files: every one gets a decision that holds
    SPEC's properties, and no exception escapes."""
    tally = _fuzz_bytes(3000)
    assert tally.get("quarantined") and tally.get("valid")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_engine_on_100k_mutated_staging_files() -> None:
    """The same with 100,000 mutations."""
    _fuzz_bytes(100_000)


# -- whole --once runs ----------------------------------------------------------------------------


def _fuzz_once(tmp_path: Path, log_file: Path, files: int, seed: int) -> int:
    rng = random.Random(seed)
    mdir = make_memory_dir(tmp_path / f"run-{seed}")
    root = project_root_of(mdir)
    seeds = [corpus_file(rng, f"o{i}", root).data for i in range(30)]
    seeds += [p.read_bytes() for p in sorted(EXAMPLES.glob("*.json"))]
    seeds = [s.replace(b"../example-project", root.encode()) for s in seeds if s]
    inputs = []
    for i in range(files):
        data = mutate(rng, rng.choice(seeds), rng.choice(seeds)) if i % 4 else rng.choice(seeds)
        inputs.append(Input(f"f{i}.json", data, "mutated"))
    write_inputs(mdir / "staging", inputs)
    before = len(read_events(log_file, strict=False))
    assert main(["--once", "--settle", "0", "--memory-dir", str(mdir)]) == 0
    events = [
        e
        for e in read_events(log_file, strict=False)[before:]
        if e.get("event") == "decision" and not e.get("own_rewrite")  # a look is no decision
    ]
    per_file: dict[str, int] = {}
    for event in events:
        name = Path(event["path"]).name
        per_file[name] = per_file.get(name, 0) + 1
        assert not any("internal error" in r for r in event.get("reasons", [])), event
    assert per_file == {item.name: 1 for item in inputs}, "not exactly one decision per file"
    problems = check_final(mdir, inputs)
    assert not problems, problems[:20]
    return len(inputs)


def test_once_over_a_memory_dir_of_mutated_files(tmp_path: Path, log_file: Path) -> None:
    """``memstaged --once`` over 600 mutated staging files: exit 0, exactly one decision per
    file, no internal error, and the final state is the one SPEC gives each file."""
    _fuzz_once(tmp_path, log_file, 600, SEED)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(files=st.lists(_encoded() | st.binary(max_size=200), min_size=1, max_size=8))
def test_once_over_hypothesis_memory_dirs(log_file: Path, files: list[bytes]) -> None:
    """Whole ``--once`` runs over memory dirs that hypothesis fills with staging-shaped JSON and
    arbitrary bytes (naming this project's root, so that few are foreign): exit 0, exactly one
    decision per file, and the final state SPEC gives each file."""
    base = Path(tempfile.mkdtemp(prefix="memstaged-fuzz-"))
    try:
        mdir = make_memory_dir(base)
        root = project_root_of(mdir).encode()
        inputs = [
            Input(f"h{i}.json", data.replace(ROOT.encode(), root), "hypothesis")
            for i, data in enumerate(files)
        ]
        write_inputs(mdir / "staging", inputs)
        before = len(read_events(log_file, strict=False))
        assert main(["--once", "--settle", "0", "--memory-dir", str(mdir)]) == 0
        events = [
            e for e in read_events(log_file, strict=False)[before:] if e.get("event") == "decision"
        ]
        assert sorted(Path(e["path"]).name for e in events) == sorted(i.name for i in inputs)
        problems = check_final(mdir, inputs)
        assert not problems, problems
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_once_over_many_memory_dirs_of_mutated_files(tmp_path: Path, log_file: Path) -> None:
    """The same over 10 memory dirs of 1,000 files each."""
    total = sum(_fuzz_once(tmp_path, log_file, 1000, SEED + k) for k in range(10))
    print(f"\n--once fuzz: {total} files")
