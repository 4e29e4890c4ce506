"""``memstaged deadletter list|show|recover|purge`` against a store memstaged really wrote."""

from __future__ import annotations

import base64
import errno
import functools
import json
import os
import time
from pathlib import Path
from typing import Any, NoReturn

import pytest
from support.commands import (
    deadletter_command,
    json_lines,
    one_line_error,
    original_files,
    prepare,
    record_files,
    record_ids,
    run,
    staging_files,
    status_json,
)
from support.daemon_fakes import RecordingLogger
from support.decision_log import read_events
from support.documents import EVIDENCE, put, unparseable, write
from support.helpers import make_memory_dir, memory_dir_of

from memstaged import config
from memstaged.cli.commands import _common
from memstaged.cli.commands import deadletter_read as recorded
from memstaged.cli.main import main
from memstaged.core.decide import Context, Decision, decide
from memstaged.core.foreign import normalize
from memstaged.deadletter import recover as recover_module
from memstaged.deadletter import store as deadletter
from memstaged.files import atomic_write, fsio
from memstaged.files import recheck as holding
from memstaged.files.locks import InstanceLock
from memstaged.files.memdir import MemoryDir, Options
from memstaged.run.pipeline import Pipeline

pytestmark = pytest.mark.usefixtures("plain_output")


def _valid(data: bytes, project: Path) -> bool:
    ctx = Context(project_root=normalize(str(project)), file_name="x.json")
    return decide(data, ctx).decision is Decision.VALID


# -- list and show ------------------------------------------------------------------------------


def test_list_groups_records_by_source_file(
    capsys: pytest.CaptureFixture[str], store: Path
) -> None:
    """list --json gives every record with its category, summary or text, attempts, reason,
    session and source file, grouped (sorted) by the staging file it came from."""
    code, out, _ = deadletter_command(capsys, store, "list", "--json")
    assert code == 0
    rows = json_lines(out)
    names = sorted(record_files(store))
    assert [r["file"] for r in rows] == [n for n in names if n.startswith("broken")] + [
        n for n in names if n.startswith("mixed")
    ]
    assert [r["source_file"] for r in rows] == ["broken.json"] + ["mixed.json"] * 4
    broken, *mixed = rows
    assert broken["kind"] == "whole-file"
    assert broken["session_id"] == "malformed-broken"
    assert broken["text"].startswith("(not JSON)")
    assert {r["category"] for r in mixed} == {"lessons", "preferences", "decisions"}
    assert {r["text"] for r in mixed} >= {"Prefer small commits", "Use msgspec", "Pin the venv"}
    assert all(r["attempts"] == 0 and r["reason"] == "malformed staging file" for r in rows)
    assert all(r["session_id"] == "mixed" for r in mixed)
    # SPEC 4 v2: a record lists its own candidate's errors and the file's, no one else's.
    assert {r["category"] for r in mixed if r["errors"]} == {"lessons"}
    code, out, _ = deadletter_command(capsys, store, "list", "--json", "--session", "malformed-*")
    assert [r["id"] for r in json_lines(out)] == [broken["id"]]


def test_list_plain_output(capsys: pytest.CaptureFixture[str], store: Path) -> None:
    """Without --json: one line per record, its full ID first, so that it can be copied into
    ``show`` (issue 13: IDs were wrapped over six lines)."""
    code, out, _ = deadletter_command(capsys, store, "list")
    assert code == 0
    lines = out.splitlines()
    assert sorted(line.split("  ")[0] for line in lines) == sorted(record_ids(store, ""))
    # Issue 31: a whole-file record shows category ``file``, not the ``lessons`` SPEC 4.3 gives
    # it (--json keeps the record's own); a candidate's record shows its category.
    categories = {line.split("  ")[0]: line.split("  ")[3] for line in lines}
    [broken] = record_ids(store, "broken")
    assert categories.pop(broken) == "file"
    assert set(categories.values()) == {"lessons", "preferences", "decisions"}
    code, out, _ = deadletter_command(capsys, store, "show", broken)
    assert "category: file " in out


def test_show_a_record_by_unique_prefix(
    capsys: pytest.CaptureFixture[str], store: Path, project: Path
) -> None:
    """show takes a unique prefix of the ID and prints the record, its errors, whether recovery
    would take it, and the original's bytes (text here)."""
    [pref] = record_ids(store, "preferences")
    code, out, _ = deadletter_command(capsys, store, "show", pref[:-3], "--json")
    assert code == 0
    [shown] = json_lines(out)
    assert shown["id"] == pref
    assert shown["record"]["candidate"]["candidate"]["text"] == "Prefer small commits"
    # SPEC 4 v2: the preference's record holds its own errors (none), not the lesson's.
    assert not any("lessons[0]" in e for e in shown["errors"])
    assert shown["recovery"]["action"] == "recovered"
    original = (store / "staging").parent / "deadletter" / "originals" / shown["original"]["name"]
    assert shown["original"]["text"].encode() == original.read_bytes()
    assert shown["original"]["truncated"] is False
    code, out, _ = deadletter_command(capsys, store, "show", pref)
    assert "would be recovered into staging/mixed.recovered-1.json" in out
    assert "Prefer small commits" in out


def test_show_a_binary_original_as_hex(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """An original that is not text is shown as a hex dump (base64 in --json), byte for byte."""
    data = b"\xff\xfe\x00garbage\x01"
    write(memory_dir / "staging" / "bin.json", data)
    assert main(["--once", "--memory-dir", str(memory_dir), "--settle", "0"]) == 0
    code, out, _ = deadletter_command(capsys, memory_dir, "show", "bin", "--json")
    assert code == 0
    [shown] = json_lines(out)
    assert base64.b64decode(shown["original"]["base64"]) == data
    assert shown["recovery"]["action"] == "left"
    _, out, _ = deadletter_command(capsys, memory_dir, "show", "bin")
    assert "00000000  ff fe 00 67 61 72 62 61  67 65 01" in out
    assert "|...garbage.|" in out


@pytest.mark.parametrize(("record_id", "message"), [("m", "matches"), ("zzz", "no dead-letter")])
def test_show_needs_one_matching_id(
    capsys: pytest.CaptureFixture[str], store: Path, record_id: str, message: str
) -> None:
    """An ambiguous or unknown ID is a usage error: exit 2, one line."""
    code, _, err = deadletter_command(capsys, store, "show", record_id)
    assert code == 2
    assert message in one_line_error(err)


# -- recover ---------------------------------------------------------------------------------------


def test_recover_needs_a_choice(capsys: pytest.CaptureFixture[str], store: Path) -> None:
    """Nothing is recovered without --session, --id or --all (exit 2, nothing changes)."""
    before = record_files(store), staging_files(store)
    code, _, err = deadletter_command(capsys, store, "recover")
    assert code == 2
    assert "--session, --id or --all" in one_line_error(err)
    assert (record_files(store), staging_files(store)) == before


def test_dry_run_changes_nothing(capsys: pytest.CaptureFixture[str], store: Path) -> None:
    """--dry-run reports what would happen and leaves the store and staging/ as they were."""
    before = record_files(store), staging_files(store), original_files(store)
    code, out, _ = deadletter_command(capsys, store, "recover", "--all", "--dry-run", "--json")
    assert code == 1  # some records would stay
    outcomes = json_lines(out)
    assert {o["action"] for o in outcomes if o["category"] == "preferences"} == {"recovered"}
    assert {o["staging_file"] for o in outcomes if o["action"] == "recovered"} == {
        "mixed.recovered-1.json"
    }
    assert all(o["dry_run"] for o in outcomes)
    assert (record_files(store), staging_files(store), original_files(store)) == before


def test_recover_end_to_end(
    capsys: pytest.CaptureFixture[str], store: Path, project: Path, log_file: Path
) -> None:
    """The good candidates of mixed.json go back as one valid staging file (the lesson without
    triggers repaired by R1); the bad lesson and broken.json's record stay, unchanged, with the
    original they need; the new file is then decided valid by memstaged itself."""
    before = record_files(store)
    code, out, _ = deadletter_command(capsys, store, "recover", "--all", "--json")
    assert code == 1
    outcomes = json_lines(out)
    recovered = [o for o in outcomes if o["action"] == "recovered"]
    left = {o["id"]: o["reason"] for o in outcomes if o["action"] == "left"}
    assert len(recovered) == 3
    assert {o["staging_file"] for o in recovered} == {"mixed.recovered-1.json"}
    assert len(left) == 2
    assert any("cannot be made valid" in why for why in left.values())
    assert any("whole-file record" in why for why in left.values())

    data = (store / "staging" / "mixed.recovered-1.json").read_bytes()
    assert _valid(data, project)
    doc = json.loads(data)
    assert doc["session_id"] == "mixed"
    assert doc["produced_at"] == "2026-11-29T18:04:11.250Z"
    [repaired] = doc["candidates"]["lessons"]
    assert repaired["summary"] == "Pin the venv"
    assert repaired["triggers"] == [{"type": "topic", "value": "example-project"}]
    assert doc["candidates"]["preferences"][0]["text"] == "Prefer small commits"
    assert doc["candidates"]["decisions"][0]["summary"] == "Use msgspec"

    after = record_files(store)
    assert set(after) == {f"{record_id}.json" for record_id in left}
    assert all(after[name] == before[name] for name in after)  # the rest is untouched
    assert len(original_files(store)) == 2  # both still needed by a remaining record

    assert main(["--once", "--memory-dir", str(store), "--settle", "0"]) == 0
    last = {
        Path(e["path"]).name: e["decision"]
        for e in read_events(log_file)
        if e.get("event") == "decision"
    }
    assert last["mixed.recovered-1.json"] == "valid"
    events = [e["event"] for e in read_events(log_file)]
    assert "deadletter_recovered" in events
    assert "deadletter_recovery" in events


def test_recover_twice_duplicates_nothing(capsys: pytest.CaptureFixture[str], store: Path) -> None:
    """A second recovery finds nothing new to write; a record put back after its candidate was
    recovered (as after a crash between the write and the delete) is removed as a duplicate."""
    [pref] = record_ids(store, "preferences")
    saved = (store / "deadletter" / f"{pref}.json").read_bytes()
    assert deadletter_command(capsys, store, "recover", "--session", "mixed")[0] == 1
    staged = staging_files(store)
    assert deadletter_command(capsys, store, "recover", "--session", "mixed")[0] == 1
    assert staging_files(store) == staged

    (store / "deadletter" / f"{pref}.json").write_bytes(saved)
    code, out, _ = deadletter_command(capsys, store, "recover", "--id", pref, "--json")
    assert code == 0
    [outcome] = json_lines(out)
    assert outcome["action"] == "duplicate"
    assert outcome["staging_file"] == "mixed.recovered-1.json"
    assert not (store / "deadletter" / f"{pref}.json").exists()
    assert staging_files(store) == staged


def test_records_go_only_after_the_staging_file_is_durable(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    store: Path,
    project: Path,
    log_file: Path,
) -> None:
    """Issue 12 (one apply path) and SPEC 5: recovery goes through apply's transaction, in its
    order: the staging file is renamed into place, staging/ is fsynced, and only then are
    records deleted (each one: the file is there, complete and valid), then deadletter/ is
    fsynced; the removal is announced in the decision log before it happens."""
    steps: list[str] = []
    real_rename, real_fsync = fsio.rename_noreplace, fsio.fsync_dir
    real_unlink = holding.unlink_held

    def rename(src_dir: int, src: str, dst_dir: int, dst: str) -> None:
        real_rename(src_dir, src, dst_dir, dst)
        steps.append(f"rename {dst}")

    def fsync_dir(fd: int) -> None:
        real_fsync(fd)
        steps.append(f"fsync {Path(os.readlink(f'/proc/self/fd/{fd}')).name}")

    def unlink(dir_fd: int, held: Any) -> tuple[bool, str | None]:
        recovered = store / "staging" / "mixed.recovered-1.json"
        assert _valid(recovered.read_bytes(), project)
        assert "deadletter_recovering" in [e["event"] for e in read_events(log_file)]
        steps.append("delete record")
        return real_unlink(dir_fd, held)

    monkeypatch.setattr(fsio, "rename_noreplace", rename)
    monkeypatch.setattr(fsio, "fsync_dir", fsync_dir)
    monkeypatch.setattr(holding, "unlink_held", unlink)
    assert deadletter_command(capsys, store, "recover", "--session", "mixed")[0] == 1
    assert steps[:6] == [
        "rename mixed.recovered-1.json",
        "fsync staging",
        "delete record",
        "delete record",
        "delete record",
        "fsync deadletter",
    ]


def test_nothing_is_lost_when_the_staging_write_fails(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, store: Path
) -> None:
    """If the staging file cannot be written (disk full), every record and original stays
    byte for byte, no staging file or temp file appears, and the exit code is 1."""
    before = record_files(store), original_files(store), staging_files(store)

    def disk_full(*_args: Any, **_kwargs: Any) -> NoReturn:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic_write, "write_held_temp", disk_full)
    code, out, _ = deadletter_command(capsys, store, "recover", "--all", "--json")
    assert code == 1
    outcomes = json_lines(out)
    assert {o["action"] for o in outcomes} == {"left"}
    assert any("No space left on device" in (o["reason"] or "") for o in outcomes)
    assert (record_files(store), original_files(store), staging_files(store)) == before


#: Recovery's own planning step, for the tests that put it back after :func:`_after_the_plan`
#: (not with ``monkeypatch.undo()``, which also undid the ``log_file`` fixture's variables).
_GATHER = recover_module._gather


def _after_the_plan(monkeypatch: pytest.MonkeyPatch, meanwhile: Any) -> None:
    """Run ``meanwhile()`` between recovery's plan (made without a lock) and its transactions."""
    real = recover_module._gather

    def gather(*args: Any, **kwargs: Any) -> Any:
        found = real(*args, **kwargs)
        meanwhile()
        return found

    monkeypatch.setattr(recover_module, "_gather", gather)


def test_a_candidate_staged_after_the_plan_is_not_written_again(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    store: Path,
    project: Path,
) -> None:
    """Issue 12 item 2: a staging file holding one of a group's candidates that appears after
    the plan (a recovery killed after its rename, a writer) is seen under the lock: the group
    is not written, its records stay; the next recovery removes that record as a duplicate and
    writes the rest. The candidate ends in exactly one staging file."""
    [pref] = record_ids(store, "preferences")
    record = json.loads((store / "deadletter" / f"{pref}.json").read_bytes())
    envelope = {k: v for k, v in record["candidate"]["original_staging_file"].items()}
    envelope["candidates"] = {
        "lessons": [],
        "preferences": [record["candidate"]["candidate"]],
        "decisions": [],
        "domain": [],
    }
    killed = store / "staging" / "mixed.recovered-1.json"
    _after_the_plan(monkeypatch, lambda: write(killed, envelope))
    before = record_files(store)
    code, out, _ = deadletter_command(capsys, store, "recover", "--session", "mixed", "--json")
    assert code == 1
    outcomes = json_lines(out)
    assert not [o for o in outcomes if o["action"] == "recovered"]
    assert any(
        "got a candidate of its group while this ran" in (o["reason"] or "") for o in outcomes
    )
    assert record_files(store) == before
    assert sorted(staging_files(store)) == [
        "fixme.json",
        "good.json",
        "mixed.recovered-1.json",
        "other.json",
    ]

    monkeypatch.setattr(recover_module, "_gather", _GATHER)  # the log stays the test's
    code, out, _ = deadletter_command(capsys, store, "recover", "--session", "mixed", "--json")
    actions = {o["id"]: o["action"] for o in json_lines(out)}
    assert actions[pref] == "duplicate"
    assert sum(a == "recovered" for a in actions.values()) == 2
    texts = [
        p["text"]
        for data in staging_files(store).values()
        for p in json.loads(data).get("candidates", {}).get("preferences", [])
    ]
    assert texts.count("Prefer small commits") == 1


def test_a_duplicate_stays_when_its_staging_file_changes_after_the_plan(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, store: Path
) -> None:
    """Issue 12 item 2, SPEC 5: a record whose candidate staging/ held at the plan is deleted
    only if that staging file is still the very file recovery looked at (it is then fsynced
    before the record goes). Here a writer rewrites it without the candidate between the plan
    and apply's transaction: the record stays, so the candidate is not lost; the next run
    brings it back."""
    [pref] = record_ids(store, "preferences")
    saved = (store / "deadletter" / f"{pref}.json").read_bytes()
    assert deadletter_command(capsys, store, "recover", "--session", "mixed")[0] == 1
    (store / "deadletter" / f"{pref}.json").write_bytes(saved)  # as after a crash
    holder = store / "staging" / "mixed.recovered-1.json"
    doc = json.loads(holder.read_bytes())
    doc["candidates"]["preferences"] = []
    _after_the_plan(monkeypatch, lambda: write(holder, doc))
    code, out, _ = deadletter_command(capsys, store, "recover", "--id", pref, "--json")
    assert code == 1
    [outcome] = json_lines(out)
    assert outcome["action"] == "left"
    why = "staging/mixed.recovered-1.json changed meanwhile; run recover again"
    assert outcome["reason"] == why
    assert (store / "deadletter" / f"{pref}.json").read_bytes() == saved

    monkeypatch.setattr(recover_module, "_gather", _GATHER)  # the log stays the test's
    code, out, _ = deadletter_command(capsys, store, "recover", "--id", pref, "--json")
    assert code == 0
    [outcome] = json_lines(out)
    assert outcome["action"] == "recovered"
    assert not (store / "deadletter" / f"{pref}.json").exists()


def test_records_taken_after_the_plan_are_not_recovered_twice(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, store: Path
) -> None:
    """Issue 12 item 2: a record that another recovery (or a purge) took between the plan and
    the transaction is reported `gone`, and nothing is written for its group, whose other
    records stay for the next run; no staging file appears."""
    [pref] = record_ids(store, "preferences")
    _after_the_plan(monkeypatch, (store / "deadletter" / f"{pref}.json").unlink)
    staged = staging_files(store)
    code, out, _ = deadletter_command(capsys, store, "recover", "--session", "mixed", "--json")
    assert code == 1
    actions = {o["id"]: o["action"] for o in json_lines(out)}
    assert actions[pref] == "gone"
    assert "recovered" not in actions.values()
    assert staging_files(store) == staged
    assert len(record_ids(store, "mixed")) == 3


def test_recovered_names_never_overwrite(capsys: pytest.CaptureFixture[str], store: Path) -> None:
    """A staging file already named <session>.recovered-1.json (some writer's) is kept; the
    recovered file takes the next free number."""
    taken = store / "staging" / "mixed.recovered-1.json"
    taken.write_bytes(b"a writer's file")
    assert deadletter_command(capsys, store, "recover", "--session", "mixed")[0] == 1
    assert taken.read_bytes() == b"a writer's file"
    assert (store / "staging" / "mixed.recovered-2.json").exists()


def test_hand_fixed_record_recovers_and_frees_its_original(
    capsys: pytest.CaptureFixture[str], store: Path, project: Path
) -> None:
    """After an operator fixes the bad lesson in its record, recovering the session takes every
    candidate, deletes every record of mixed.json, and then its original, which nothing needs."""
    [bad] = record_ids(store, "lessons-0")
    path = store / "deadletter" / f"{bad}.json"
    record = json.loads(path.read_bytes())
    record["candidate"]["candidate"]["triggers"] = [{"type": "topic", "value": "tests"}]
    path.write_text(json.dumps(record))
    code, out, _ = deadletter_command(capsys, store, "recover", "--session", "mixed", "--json")
    assert code == 0
    lines = json_lines(out)
    assert [o["action"] for o in lines if "action" in o and o["action"] != "original_deleted"] == [
        "recovered"
    ] * 4
    assert [o for o in lines if o.get("action") == "original_deleted"]
    assert record_ids(store, "mixed") == []
    assert [n for n in original_files(store) if n.startswith("mixed")] == []
    assert (
        len(
            json.loads((store / "staging" / "mixed.recovered-1.json").read_bytes())["candidates"][
                "lessons"
            ]
        )
        == 2
    )


def test_records_of_the_agents_own_tools(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """A record the agent's reconciler wrote (a bare candidate, no memstaged key) is recovered
    as the agent recovers it: its attempts become reconcile_attempts, the project root is the
    memory dir's, and a session id that is a path is sanitized in the file name."""
    dl = memory_dir / "deadletter"
    dl.mkdir()
    record = {
        "session_id": "../../evil session",
        "produced_at": "2026-11-01T00:00:00.000Z",
        "attempts": 3,
        "last_gate_reason": "coverage mismatch",
        "category": "domain",
        "candidate": {
            "summary": "Staging is JSON",
            "detail": "Always.",
            "source_evidence": EVIDENCE,
        },
    }
    write(dl / "agent-1.json", record)
    code, out, _ = deadletter_command(capsys, memory_dir, "recover", "--id", "agent", "--json")
    assert code == 0
    [outcome] = json_lines(out)
    name = outcome["staging_file"]
    assert "/" not in name
    assert not name.startswith(".")
    assert name.endswith(".recovered-1.json")
    doc = json.loads((memory_dir / "staging" / name).read_bytes())
    assert doc["project_root"] == normalize(str(project))
    assert doc["session_id"] == "../../evil session"
    assert doc["candidates"]["domain"][0]["reconcile_attempts"] == 3
    assert _valid((memory_dir / "staging" / name).read_bytes(), project)
    assert not (dl / "agent-1.json").exists()


def test_recover_waits_for_nobody_by_default(
    capsys: pytest.CaptureFixture[str], store: Path
) -> None:
    """Issue 12 item 1: with the reconciler holding canonical-writer.lock, recovery exits 1 with
    one line naming the holder, changes nothing, and its summary does not claim "0 left" as if
    it had looked; with a memstaged holding only the instance lock (the daemon's), it works."""
    before = record_files(store), staging_files(store)
    lock = store / "canonical-writer.lock"
    lock.write_text(json.dumps({"pid": os.getpid(), "owner": "reconciler"}))
    code, out, err = deadletter_command(capsys, store, "recover", "--all")
    assert code == 1
    line = one_line_error(err)
    assert f"canonical-writer.lock is held by pid {os.getpid()} (owner 'reconciler')" in line
    assert "--wait" in line
    assert "0 left" not in out
    assert "2 left in the dead-letter store; 3 not tried because 1 memory dir was busy" in out
    assert (record_files(store), staging_files(store)) == before
    assert lock.exists()
    lock.unlink()

    held = InstanceLock(str(store), state_dir=config.default_state_dir(os.environ))
    held.acquire(wait=False)
    try:
        code, out, err = deadletter_command(capsys, store, "recover", "--all")
    finally:
        held.release()
    assert (code, err) == (1, "")  # two records cannot be recovered; no busy memory dir
    assert "3 recovered" in out
    assert (store / "staging" / "mixed.recovered-1.json").exists()


def test_wait_rejects_a_bad_limit(capsys: pytest.CaptureFixture[str], store: Path) -> None:
    """`--wait=soon` is a usage error (exit 2, one line), not a wait for ever."""
    code, _, err = deadletter_command(capsys, store, "recover", "--all", "--wait=soon")
    assert code == 2
    assert "--wait" in one_line_error(err)


# -- purge -----------------------------------------------------------------------------------------


def test_purge_lists_without_yes_and_deletes_with_it(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    store: Path,
    log_file: Path,
) -> None:
    """purge --older-than is required; young records are kept; without --yes old ones are only
    listed; with --yes they go, with their originals, and the purge is logged."""
    code, _, err = deadletter_command(capsys, store, "purge")
    assert code == 2
    assert "--older-than" in one_line_error(err)
    before = record_files(store), original_files(store)
    code, out, _ = deadletter_command(capsys, store, "purge", "--older-than", "30d", "--json")
    assert (code, out) == (0, "")

    later = _common.now() + 31 * 86_400
    monkeypatch.setattr(_common, "now", lambda: later)
    code, out, _ = deadletter_command(capsys, store, "purge", "--older-than", "30d", "--json")
    assert code == 0
    listed = json_lines(out)
    assert {r["action"] for r in listed} == {"would delete"}
    assert sum(r["kind"] == "record" for r in listed) == 5
    assert sum(r["kind"] == "original" for r in listed) == 2
    assert (record_files(store), original_files(store)) == before

    code, out, _ = deadletter_command(capsys, store, "purge", "--older-than", "30d", "--yes")
    assert code == 0
    assert "deleted 5 records and 2 originals" in out
    assert record_files(store) == {}
    assert original_files(store) == {}
    assert "deadletter_purged" in [e["event"] for e in read_events(log_file)]


def test_action_is_required(capsys: pytest.CaptureFixture[str], store: Path) -> None:
    """``memstaged deadletter`` alone is a usage error, never the daemon."""
    code, _, err = run(capsys, "deadletter")
    assert code == 2
    assert "ACTION" in one_line_error(err)


def test_memory_dir_may_come_before_the_action(
    capsys: pytest.CaptureFixture[str], store: Path
) -> None:
    """``deadletter --memory-dir D list`` reads D."""
    code, out, _ = run(capsys, "deadletter", "--memory-dir", str(store), "list", "--json")
    assert code == 0
    assert len(json_lines(out)) == 5


_ODD_RECORDS: list[bytes] = [
    b'{"session_id": "s", "category": "lessons", "candidate": {"candidate": {"summary": "x"},'
    b' "original_staging_file": {"deep": [1, 2, {"a": 1e400}]}, "extra": 1}, "attempts": 2}',
    b'{"session_id": "\\ud800", "candidate": {"candidate": null, "original_staging_file": 1}}',
    b'{"candidate": "not JSON at all", "memstaged": {"errors": ["e"], "source_file": "f.json"}}',
    b'{"candidate": [1, 2], "session_id": 7}',
    b'{"candidate": {"candidate": {"text": "t"}}, "category": "preferences"}',
    b'["not", "an", "object"]',
    b'{"a": 1, "a": 2, "candidate": {"candidate": {"summary": "last"},'
    b' "original_staging_file": {}}, "candidate": {"candidate": {"summary": "wins"},'
    b' "original_staging_file": {}}}',
    b'{"summary": "\xff not utf-8"}',
]


def test_list_reads_records_lightly_yet_shows_what_a_full_read_shows(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 13 (``deadletter list`` at 20,000 records/s): ``list`` leaves each wrapper's
    embedded original unparsed; for real records and odd ones (an original with 1e400, lone
    surrogates, a string or array candidate, a half wrapper, a non-object, duplicate keys,
    invalid UTF-8) every field ``list --json`` prints is what a full read gives."""
    for i, body in enumerate(_ODD_RECORDS):
        (store / "deadletter" / f"odd-{i}.json").write_bytes(body)
    mdir = MemoryDir(str(store), project_root=str(store.parent.parent.parent))
    full = [recorded.record_summary(r) for r in deadletter.list_records(mdir)]
    light = [recorded.record_summary(r) for r in deadletter.list_records(mdir, light=True)]
    assert len(full) == len(record_files(store)) >= len(_ODD_RECORDS) + 2
    assert light == full


# -- ack -------------------------------------------------------------------------------------------


def test_ack_needs_ids_or_all_and_a_wrong_id_is_one_line(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """Issue 21 item 6: `deadletter ack` with neither IDs nor --all (or both), or with an ID
    no record has, is a usage error (exit 2, one line) and marks nothing."""
    prepare(project, memory_dir, log_file)
    for argv in ([], ["--all", "x"], ["no-such-record"]):
        code, out, err = run(capsys, "deadletter", "ack", *argv, "--memory-dir", str(memory_dir))
        assert (code, out) == (2, "")
        one_line_error(err)
    assert status_json(capsys, memory_dir)[1]["deadletter_unseen"] == 5


def test_a_requarantine_refreshes_the_age_that_purge_counts(
    tmp_path: Path, log_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 10 item 4: the same bytes quarantined again an hour later are not purged by
    ``purge --older-than 5s`` run right after: their only copy survives."""
    mdir = make_memory_dir(tmp_path)
    root = str(mdir.parents[2])
    data = unparseable(root, "same bytes")
    staging = mdir / "staging" / "bad.json"
    now = time.time()
    for clock in (now - 3600, now):
        put(staging, data)
        Pipeline(
            Options(settle=0), RecordingLogger(), clock=functools.partial(float, clock)
        ).process(memory_dir_of(mdir), "bad.json")
        assert not staging.exists()
    records = sorted((mdir / "deadletter").glob("*.json"))
    assert len(records) == 1  # not a second set
    code = main(["deadletter", "purge", "--older-than", "5s", "--yes", "--memory-dir", str(mdir)])
    assert code == 0
    assert sorted((mdir / "deadletter").glob("*.json")) == records
    assert data in _every_byte_string_in(mdir / "deadletter")


def _every_byte_string_in(mdir: Path) -> set[bytes]:
    return {p.read_bytes() for p in mdir.rglob("*") if p.is_file() and not p.is_symlink()}
