"""The engine under contract v2 (SPEC 2-4 as changed in version 2; issue 11 item 2, issue 10 items
9 and 15): R5, R6, blank context keys, Node's reading of bytes, any depth, bounded records, and the
whole engine's validity held to a JavaScript implementation of SPEC 2 run in Node.js.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from support.date_corpus import corpus
from support.documents import DELETE, lesson
from support.engine import (
    PROJECT,
    context,
    decide_doc,
    decoded,
    encode,
    patched,
    preference,
    records,
    staging,
)
from support.node_oracle import Node

from memstaged.core.decide import BOM, MAX_REASONS, Decision, decide, decide_too_large
from memstaged.core.js.ecma import parse_json
from memstaged.core.records import EMBED_LIMIT, original_name
from memstaged.core.repair import derive_topic

VALID, REPAIRED, QUARANTINED, FOREIGN = (
    Decision.VALID,
    Decision.REPAIRED,
    Decision.QUARANTINED,
    Decision.FOREIGN,
)


# -- R5 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("absent", [["domain"], ["decisions", "domain"], ["lessons"]])
def test_r5_adds_absent_categories(absent: list[str]) -> None:
    """R5 (issue 11 item 2): a file missing category arrays is not valid (the reconciler of
    2026-06-10 rejects it); each absent one is added as [], nothing else changes, and the
    rewrite is valid when decided again."""
    doc = patched(staging(), *((("candidates", c), DELETE) for c in absent))
    verdict = decide_doc(doc)
    assert verdict.decision is REPAIRED, verdict.reasons
    assert [(r.rule, r.where, r.wrote) for r in verdict.repairs] == [
        ("R5", f"candidates.{c}", []) for c in absent
    ]
    after = decoded(verdict.new_bytes)
    assert after == patched(doc, *((("candidates", c), []) for c in absent))
    assert decide(verdict.new_bytes or b"", context()).decision is VALID


def test_r5_does_not_repair_a_category_that_is_not_an_array() -> None:
    """R5: a present category that is not an array is not repaired."""
    verdict = decide_doc(patched(staging(), (("candidates", "domain"), None)))
    assert verdict.decision is QUARANTINED
    assert "candidates.domain: must be an array" in verdict.reasons


# -- R6 -----------------------------------------------------------------------------------------


def _wrapper(candidate: Any, **extra: Any) -> dict[str, Any]:
    return {"candidate": candidate, "original_staging_file": {"schemaVersion": 1}, **extra}


def test_r6_unwraps_requeued_wrappers_and_names_the_original() -> None:
    """R6 (issue 11 item 2): wrappers put back by the agent's /memory recover are replaced by
    their candidate, the wrapper's finite reconcile_attempts carried over; the verdict is
    ``repaired`` with no records and ``original`` set, so the original bytes are dead-lettered
    before the rewrite, and each R6 repair names where they go."""
    doc = staging()
    doc["candidates"]["preferences"] = [
        _wrapper(preference(), reconcile_attempts=2),
        _wrapper(preference(text="second", reconcile_attempts=7), reconcile_attempts="x"),
        preference(text="plain"),
    ]
    data = encode(doc)
    verdict = decide(data, context())
    assert verdict.decision is REPAIRED, verdict.reasons
    assert verdict.deadletter == ()
    sha = verdict.sha256
    assert verdict.original == original_name("sess-1.json", sha)
    r6 = [r for r in verdict.repairs if r.rule == "R6"]
    assert [r.where for r in r6] == ["candidates.preferences[0]", "candidates.preferences[1]"]
    assert all(r.wrote["original"] == f"deadletter/originals/{verdict.original}" for r in r6)
    after = decoded(verdict.new_bytes)
    assert after["candidates"]["preferences"] == [
        {**preference(), "reconcile_attempts": 2},
        preference(text="second", reconcile_attempts=7),
        preference(text="plain"),
    ]
    assert decide(verdict.new_bytes or b"", context()).decision is VALID


@pytest.mark.parametrize(
    "element",
    [
        pytest.param(_wrapper(preference(), extra=1), id="extra-key"),
        pytest.param({"candidate": preference()}, id="no-original"),
        pytest.param(_wrapper("text"), id="candidate-not-object"),
    ],
)
def test_r6_only_for_exact_wrappers(element: Any) -> None:
    """R6: only an object with exactly candidate, original_staging_file (and reconcile_attempts)
    whose candidate is an object is unwrapped; anything else stays and is quarantined."""
    doc = patched(staging(), (("candidates", "preferences"), [element]))
    verdict = decide_doc(doc)
    assert verdict.decision is QUARANTINED
    assert not [r for r in verdict.repairs if r.rule == "R6"]


def test_r6_undoes_the_agents_recover_of_memstageds_own_record() -> None:
    """R6 then R1: a lesson quarantined by memstaged, re-queued as the agent's /memory recover
    does it (spreading record.candidate), comes back as the lesson with derived triggers."""
    bad = patched(staging(session_id=""), (("candidates", "lessons", 0, "triggers"), DELETE))
    [record] = [r for r in records(decide_doc(bad)) if r["category"] == "lessons"]
    requeued = staging()
    requeued["candidates"]["lessons"] = [{**record["candidate"]}]
    verdict = decide_doc(requeued)
    assert verdict.decision is REPAIRED, verdict.reasons
    assert [r.rule for r in verdict.repairs] == ["R6", "R1"]
    [lesson_after] = decoded(verdict.new_bytes)["candidates"]["lessons"]
    assert lesson_after == {**bad["candidates"]["lessons"][0], "triggers": lesson_after["triggers"]}


# -- 3.1 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("context_keys", "expected"),
    [
        pytest.param({"topic": "  ", "project": "alpha"}, "alpha", id="blank-topic-passed-over"),
        pytest.param({"topic": 3, "name": "\u3000\n", "repo": " b  c "}, "b c", id="non-string"),
        pytest.param(
            {"project_root": "/home/ana/src/example-project/"}, "example-project", id="spec"
        ),
        pytest.param({"project_root": "/", "cwd": "/w/tool"}, "tool", id="root-has-no-basename"),
        pytest.param({"project_root": "/x/  ", "root": "/r/y//"}, "y", id="blank-basename"),
        pytest.param({"project_root": "///"}, "project", id="falls-to-scope"),
    ],
)
def test_topic_passes_over_blank_context_keys(context_keys: dict[str, Any], expected: str) -> None:
    """SPEC 3.1 v2 (issue 11 item 2): a context key whose value is blank is passed over and the
    next one tried (v1 stopped at the first string); basenames are Node's."""
    assert derive_topic(context_keys, lesson()) == expected


# -- reading bytes as Node does -----------------------------------------------------------------


def test_invalid_utf8_valid_file_is_left_untouched() -> None:
    """SPEC 2 v2 (issue 11 item 2): a stray non-UTF-8 byte inside a string reads as U+FFFD;
    the file is valid, decided on the decoded text, and not touched."""
    data = encode(staging()).replace(b"Prefer small", b"Prefer \xff small")
    verdict = decide(data, context())
    assert verdict.decision is VALID, verdict.reasons
    assert verdict.new_bytes is None and verdict.deadletter == ()


def test_invalid_utf8_foreign_file_is_foreign() -> None:
    """Issue 11: memstaged moved another project's file with a stray byte out of staging/;
    read as Node reads it, it is foreign, whatever else is wrong with it."""
    doc = staging(project_root="/elsewhere", session_id="")
    data = encode(doc).replace(b"Prefer small", b"Prefer \xc0 small")
    assert decide(data, context()).decision is FOREIGN


def test_bom_and_invalid_utf8_rewrites_utf8() -> None:
    """R2 on a file with invalid bytes: the rewrite is the decoded text as UTF-8 (U+FFFD in
    place), which Node reads as the same value, and is then valid."""
    data = encode(staging()).replace(b"Prefer small", b"Prefer \xe2\x82 small")
    verdict = decide(BOM + data, context())
    assert verdict.decision is REPAIRED
    assert verdict.new_bytes == data.decode("utf-8", "replace").encode("utf-8")
    assert decide(verdict.new_bytes, context()).decision is VALID


# -- depth (issue 10 item 15) -------------------------------------------------------------------


def test_million_levels_valid_file_is_valid() -> None:
    """Issue 10 item 15: a valid file holding an unknown key nested 1,000,000 levels deep
    (2 MB, within the 8 MiB limit) is valid, as Node finds it; no RecursionError."""
    data = encode(staging()).replace(
        b'"extractor"', b'"deep":' + b"[" * 10**6 + b"]" * 10**6 + b',"extractor"', 1
    )
    verdict = decide(data, context())
    assert verdict.decision is VALID, verdict.reasons


def test_million_levels_repaired_file_keeps_its_depth() -> None:
    """Issue 10 item 15: the same depth in a file that needs R1 is repaired; the rewrite is
    encoded without recursion and holds the same deep value."""
    doc = patched(staging(), (("candidates", "lessons", 0, "triggers"), DELETE))
    data = encode(doc).replace(
        b'"extractor"', b'"deep":' + b"[" * 10**6 + b"]" * 10**6 + b',"extractor"', 1
    )
    verdict = decide(data, context())
    assert verdict.decision is REPAIRED, verdict.reasons
    assert verdict.new_bytes is not None
    assert b"[" * 10**6 + b"]" * 10**6 in verdict.new_bytes
    assert decide(verdict.new_bytes, context()).decision is VALID


def test_million_levels_is_never_a_depth_quarantine() -> None:
    """Issue 10 item 15: a million nested arrays is JSON; it is quarantined only because it is
    not an object, never for its depth."""
    verdict = decide(b"[" * 10**6 + b"]" * 10**6, context())
    assert verdict.decision is QUARANTINED
    assert verdict.reasons == ("the file is not a JSON object",)


# -- records (SPEC 4 v2, issue 10 item 9) -------------------------------------------------------


def test_record_errors_are_its_own_and_the_files() -> None:
    """SPEC 4 v2: a record's errors are its own candidate's and the file-level ones only."""
    doc = staging(session_id="")
    doc["candidates"]["preferences"] = [preference(text=""), preference()]
    by_index = {
        r["memstaged"]["source_file"] + str(i): r for i, r in enumerate(records(decide_doc(doc)))
    }
    errors = [r["memstaged"]["errors"] for r in by_index.values()]
    assert ["session_id: must be a non-empty string"] in errors  # a valid candidate's record
    assert [
        "session_id: must be a non-empty string",
        "candidates.preferences[0].text: must be a non-empty string",
    ] in errors


def test_records_reference_the_original_when_embedding_would_be_too_large() -> None:
    """SPEC 4 v2: when every record embedding the whole file would pass max(16 x size, 64 MiB),
    ``original_staging_file`` names the original and its hash instead; below it, the file is
    embedded as parsed."""
    small = staging(session_id="")
    [first, *_] = records(decide_doc(small))
    assert first["candidate"]["original_staging_file"] == small
    big = staging(session_id="", padding="x" * (200 * 1024))
    big["candidates"]["preferences"] = [{}] * 400  # 400 records x 200 KB > 64 MiB
    verdict = decide_doc(big)
    assert len(encode(big)) * 403 > EMBED_LIMIT
    body = parse_json(verdict.deadletter[5].body).value
    assert body["candidate"]["original_staging_file"] == {
        "memstaged_original": verdict.original,
        "sha256": verdict.sha256,
    }
    assert body["candidate"]["candidate"] == {}


def test_records_are_rendered_on_demand() -> None:
    """Issue 10 item 9: a record keeps no bytes; each read of ``body`` renders the same bytes."""
    verdict = decide_doc(staging(session_id=""))
    record = verdict.deadletter[0]
    assert not hasattr(record, "__dict__") and "body" not in type(record).__slots__
    assert record.body == record.body


def test_reasons_are_bounded() -> None:
    """The log's reasons list at most MAX_REASONS errors and says how many more."""
    doc = staging(session_id="")
    doc["candidates"]["preferences"] = [{}] * 500
    verdict = decide_doc(doc)
    assert len(verdict.reasons) == MAX_REASONS + 1
    assert verdict.reasons[-1].startswith("... and ")


_RSS_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from memstaged.core.decide import Context, decide
    count = int(sys.argv[1])
    def status(field):  # in KiB, of this process's own memory (ru_maxrss counts the forker's)
        with open("/proc/self/status") as lines:
            return next(int(l.split()[1]) for l in lines if l.startswith(field))
    base = status("VmRSS:")
    doc = {"schemaVersion": 1, "session_id": "s", "project_root": "/p",
           "produced_at": "2026-01-01T00:00:00Z",
           "candidates": {c: [{}] * count
                          for c in ("lessons", "preferences", "decisions", "domain")}}
    data = json.dumps(doc, separators=(",", ":")).encode()
    verdict = decide(data, Context(project_root="/p", file_name="s.json"))
    total = sum(len(r.body) for r in verdict.deadletter)  # as the apply path writes them
    peak = status("VmHWM:")
    print(json.dumps({"size": len(data), "records": len(verdict.deadletter),
                      "total": total, "base_kib": base, "peak_kib": peak}))
    """
)


def test_many_empty_candidates_decide_in_bounded_memory() -> None:
    """Issue 10 item 9: a 30 KB file of 10,000 empty candidates (v1: killed by the OOM killer at
    24 GB) is quarantined with one record each, their bytes bounded by SPEC 4, in a process whose
    peak RSS grows by less than 100 MiB (the v1 engine hit MemoryError at a 3 GiB limit)."""
    done = subprocess.run(
        [sys.executable, "-c", _RSS_SCRIPT, "2500"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found = json.loads(done.stdout)
    print(found)
    assert 29_000 < found["size"] < 32_000
    assert found["records"] == 10_000
    assert found["total"] < max(16 * found["size"], EMBED_LIMIT) + found["records"] * 2048
    assert found["peak_kib"] - found["base_kib"] < 100 * 1024


def test_too_large_record_is_as_spec_says() -> None:
    """SPEC 6: a file over the size limit gets one record, candidate null, session
    malformed-<name>, reason ``file too large``."""
    verdict = decide_too_large(context(), "ab" * 32, 9 << 20, 8 << 20)
    [record] = records(verdict)
    assert record["candidate"] is None
    assert record["session_id"] == "malformed-sess-1"
    assert record["memstaged"]["errors"] == ["file too large"]


# -- the whole engine against SPEC 2 in JavaScript ----------------------------------------------


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    """One Node.js for the whole module."""
    js = Node()
    yield js
    js.close()


SPEC_FILES = [
    staging(),
    staging(schemaVersion=1.0),
    staging(schemaVersion="1"),
    staging(schemaVersion=True),
    staging(session_id="\u3000\ufeff"),
    staging(session_id="\x1c"),
    staging(produced_at="2026-02-30"),
    staging(produced_at="1"),
    staging(produced_at="foo 2026"),
    staging(produced_at="Wed, 10 Jun 26 10:00:00 GMT"),
    staging(produced_at="2026-06-10T10:00:00+0200"),
    staging(produced_at="20260110T100000Z"),
    staging(produced_at="2026-01-10T10:00:00,5Z"),
    staging(produced_at="2026-W01-1"),
    staging(produced_at="hello"),
]


def _files(seed: int, count: int) -> list[bytes]:
    """Staging files of every kind: SPEC's, mutated, with odd timestamps and odd bytes."""
    rng = random.Random(seed)
    stamps = corpus(seed, count)
    out = [encode(d) for d in SPEC_FILES]
    out.append(encode(staging()).replace(b"1.0", b"1e0"))
    keys = [
        ("schemaVersion",), ("session_id",), ("project_root",), ("candidates",),
        ("candidates", "lessons", 0, "triggers"), ("candidates", "preferences", 0, "text"),
        ("candidates", "decisions", 0, "source_evidence"), ("candidates", "domain"),
        ("candidates", "lessons", 0, "source_evidence", "discussion_note_ids"),
    ]  # fmt: skip
    values = [DELETE, "", " ", "\u00a0x", None, [], {}, 1, 1.0, True, "1", [{}], [1e400], ["m"]]
    for i in range(count):
        doc = staging(produced_at=stamps[i] if i % 2 else "2026-01-01T00:00:00Z")
        for _ in range(rng.randint(0, 2)):
            try:
                doc = patched(doc, (rng.choice(keys), rng.choice(values)))
            except (KeyError, IndexError, TypeError):
                pass  # the path is gone after an earlier change

        data = encode(doc)
        roll = rng.random()
        if roll < 0.05:
            data = BOM + data
        elif roll < 0.1:
            data = data.replace(b"Prefer", b"Pr\xffefer")
        out.append(data)
    return out


@pytest.mark.parametrize("zone", ["UTC", "America/New_York"])
def test_engine_validity_agrees_with_javascript(node: Node, zone: str) -> None:
    """Issue 11 "done when": on SPEC's examples and 3,000 generated files (timestamps from the
    Date.parse corpus, mutated fields, BOMs, invalid bytes) a file memstaged calls valid is one
    SPEC 2 in JavaScript accepts and vice versa, and every rewrite it makes is accepted."""
    from support.node_oracle import local_zone

    files = _files(11, 3000)
    with local_zone(node, zone):
        verdicts = [decide(data, context()) for data in files]
        accepts = node.ask_bytes("valid", files)
        rewrites = [v.new_bytes for v in verdicts if v.decision is REPAIRED]
        accepts_rewrite = node.ask_bytes("valid", [b for b in rewrites if b is not None])
    wrong = [
        f"input {data!r}: memstaged {v.decision.value} {v.reasons[:2]}, node valid={js}"
        for data, v, js in zip(files, verdicts, accepts, strict=True)
        if (v.decision is VALID) != js and v.decision is not FOREIGN
    ]
    assert wrong == [], "\n".join(wrong[:20])
    assert all(accepts_rewrite), "a rewrite that JavaScript rejects"
    counts = {d: sum(v.decision is d for v in verdicts) for d in Decision}
    print(zone, counts)
    assert counts[VALID] > 150 and counts[REPAIRED] > 100 and counts[QUARANTINED] > 300
    assert PROJECT  # files name this project
