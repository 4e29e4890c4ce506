"""``memstaged --once`` end to end on a temporary memory dir, through ``cli.main``."""

from __future__ import annotations

import json
import os
import shutil
import time
from hashlib import sha256
from pathlib import Path

import pytest
from support.commands import one_line_error, run
from support.decision_log import decision_events, decisions, read_events
from support.documents import (
    backlog,
    half_written_ahead,
    lesson,
    one_of_each,
    put,
    repairable,
    staging_doc,
    write,
)
from support.helpers import (
    DEMO,
    files_under,
)

from memstaged.cli.main import main
from memstaged.core.decide import Context, Decision, decide

pytestmark = pytest.mark.usefixtures("plain_output")


def _populate(project: Path, memory_dir: Path) -> dict[str, bytes]:
    staging = memory_dir / "staging"
    files = {
        "valid.json": write(staging / "valid.json", staging_doc(project, "valid")),
        "no-triggers.json": write(
            staging / "no-triggers.json",
            staging_doc(project, "no-triggers", candidates={"lessons": [lesson(triggers=[])]}),
        ),
        "bom.json": write(
            staging / "bom.json",
            b"\xef\xbb\xbf" + json.dumps(staging_doc(project, "bom")).encode(),
        ),
        "garbage.json": write(staging / "garbage.json", b"\x00\xffnot json at all"),
        "bad-version.json": write(
            staging / "bad-version.json", staging_doc(project, "bad", schemaVersion="1")
        ),
        "foreign.json": write(
            staging / "foreign.json", staging_doc("/somewhere/else", "foreign", schemaVersion=7)
        ),
        "notes.txt": write(staging / "notes.txt", b"not a staging file"),
        ".writer-tmp.json": write(staging / ".writer-tmp.json", b"{half"),
    }
    os.symlink("/etc/hostname", staging / "link.json")
    (staging / "dir.json").mkdir()
    old = 1_700_000_000
    for name in files:
        os.utime(staging / name, (old, old))
        os.chmod(staging / name, 0o644)
    return files


def test_once_decides_every_file_as_spec_says(
    project: Path, memory_dir: Path, log_file: Path
) -> None:
    """Valid/foreign/non-staging files stay byte for byte, repairs are rewritten valid, malformed
    files go to deadletter/ with byte-exact originals, and every decision is logged."""
    files = _populate(project, memory_dir)
    staging = memory_dir / "staging"

    assert main(["--once", "--memory-dir", str(memory_dir)]) == 0

    for name in ("valid.json", "foreign.json", "notes.txt", ".writer-tmp.json"):
        assert (staging / name).read_bytes() == files[name], name
    assert (staging / "link.json").is_symlink()
    assert not (staging / "garbage.json").exists()
    assert not (staging / "bad-version.json").exists()
    ctx = Context(project_root=str(project), file_name="x.json")
    for name in ("no-triggers.json", "bom.json"):
        rewritten = (staging / name).read_bytes()
        assert rewritten != files[name]
        assert decide(rewritten, ctx).decision is Decision.VALID, name
        # SPEC 6: a file memstaged creates is its owner's only, whatever the old file's mode.
        assert (staging / name).stat().st_mode & 0o777 == 0o600, name
    assert (staging / "valid.json").stat().st_mode & 0o777 == 0o644
    originals = {p.read_bytes() for p in (memory_dir / "deadletter" / "originals").iterdir()}
    assert originals == {files["garbage.json"], files["bad-version.json"]}
    records = [json.loads(p.read_bytes()) for p in (memory_dir / "deadletter").glob("*.json")]
    assert {r["session_id"] for r in records} == {"malformed-garbage", "bad"}
    assert all(r["last_gate_reason"] == "malformed staging file" for r in records)
    # bad-version.json had one lesson and one preference: one record each.
    assert sorted(r["category"] for r in records if r["session_id"] == "bad") == [
        "lessons",
        "preferences",
    ]
    assert decisions(log_file) == {
        "valid.json": "valid",
        "no-triggers.json": "repaired",
        "bom.json": "repaired",
        "garbage.json": "quarantined",
        "bad-version.json": "quarantined",
        "foreign.json": "foreign",
        "link.json": "skipped",
        "dir.json": "skipped",
    }


def test_once_twice_changes_nothing_the_second_time(
    project: Path, memory_dir: Path, log_file: Path
) -> None:
    """The second run finds every file valid or foreign and writes nothing."""
    _populate(project, memory_dir)
    assert main(["--once", "--memory-dir", str(memory_dir)]) == 0
    before = files_under(memory_dir)
    log_file.unlink()
    assert main(["--once", "--memory-dir", str(memory_dir)]) == 0
    assert files_under(memory_dir) == before
    assert set(decisions(log_file).values()) <= {"valid", "foreign", "skipped"}


def test_dry_run_writes_nothing_but_logs_decisions(
    project: Path, memory_dir: Path, log_file: Path
) -> None:
    """--dry-run decides and logs every file and leaves the memory dir byte for byte as it was."""
    _populate(project, memory_dir)
    before = files_under(memory_dir)
    assert main(["--once", "--dry-run", "--memory-dir", str(memory_dir)]) == 0
    assert files_under(memory_dir) == before
    assert not (memory_dir / "deadletter").exists()
    logged = decisions(log_file)
    assert logged["garbage.json"] == "quarantined"
    assert logged["no-triggers.json"] == "repaired"
    assert all(e.get("dry_run") for e in read_events(log_file) if e["event"] == "decision")


def test_settle_defers_a_fresh_unparseable_file_then_decides_it(
    project: Path, memory_dir: Path, log_file: Path
) -> None:
    """A just-written file that does not parse is deferred first, then quarantined once settled;
    the run still exits 0 because it got its decision within the run. The file is dated ahead,
    so it settles from when the run first sees it: written 0.3 s before a run that starts late
    on a busy machine, it would already be settled (issue 19 item 8)."""
    path = memory_dir / "staging" / "fresh.json"
    write(path, b'{"schemaVersion": 1, "sess')
    ahead = time.time() + 86_400
    os.utime(path, (ahead, ahead))
    assert main(["--once", "--settle", "0.3", "--memory-dir", str(memory_dir)]) == 0
    kinds = [e["decision"] for e in read_events(log_file) if e["event"] == "decision"]
    assert kinds == ["deferred", "quarantined"]
    assert not (memory_dir / "staging" / "fresh.json").exists()


def test_project_root_option_makes_a_file_foreign(memory_dir: Path, log_file: Path) -> None:
    """--project-root overrides the default root: a file naming the default root is foreign."""
    default_root = memory_dir.parent.parent.parent
    data = write(memory_dir / "staging" / "a.json", staging_doc(default_root, schemaVersion=2))
    code = main(
        ["--once", "--memory-dir", str(memory_dir), "--project-root", str(memory_dir.parent)]
    )
    assert code == 0
    assert (memory_dir / "staging" / "a.json").read_bytes() == data
    assert decisions(log_file) == {"a.json": "foreign"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--once", "--memory-dir", "/nonexistent/mem"],
            "memory dir /nonexistent/mem does not exist",
        ),
        (["--once", "--settle", "soon"], "--settle: 'soon': expected a number of seconds"),
        (["--once", "--bogus"], "unrecognized arguments: --bogus"),
        (
            ["--once", "--memory-dir", "a", "--memory-dir", "b", "--project-root", "/x"],
            "--project-root needs exactly one memory dir",
        ),
    ],
    ids=["missing-dir", "bad-settle", "unknown-option", "root-needs-one-dir"],
)
def test_usage_errors_exit_2_with_one_line(
    argv: list[str], message: str, log_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad options give exit 2 and one line on stderr naming the option, never a traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_unknown_config_key_is_named(
    tmp_path: Path, memory_dir: Path, log_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo in the config file is an error naming the file and the key, not a silent default."""
    config = tmp_path / "config.toml"
    config.write_text("setle = 5\n")
    code = main(["--once", "--config", str(config), "--memory-dir", str(memory_dir)])
    assert code == 2
    assert f"{config}: unknown key 'setle'" in capsys.readouterr().err


def test_wrong_config_type_is_named(
    tmp_path: Path, memory_dir: Path, log_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A value of the wrong type names the key."""
    config = tmp_path / "config.toml"
    config.write_text('settle = "two"\n')
    assert main(["--once", "--config", str(config), "--memory-dir", str(memory_dir)]) == 2
    assert "key 'settle'" in capsys.readouterr().err


def test_memory_dirs_from_config_file_and_globs(tmp_path: Path, log_file: Path) -> None:
    """memory_dirs in the config file, with a glob, are all decided."""
    for name in ("a", "b"):
        staging = tmp_path / "src" / name / ".pi" / "memory" / "project" / "staging"
        staging.mkdir(parents=True)
        write(staging / "x.json", b"garbage")
        os.utime(staging / "x.json", (1, 1))
    config = tmp_path / "config.toml"
    config.write_text(f'memory_dirs = ["{tmp_path}/src/*/.pi/memory/project"]\n')
    assert main(["--once", "--config", str(config)]) == 0
    for name in ("a", "b"):
        assert not (tmp_path / "src" / name / ".pi/memory/project/staging/x.json").exists()


def test_default_memory_dir_is_the_current_project(
    project: Path, memory_dir: Path, log_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no --memory-dir and no config, ./.pi/memory/project is used when it exists."""
    write(memory_dir / "staging" / "v.json", staging_doc(project))
    monkeypatch.chdir(project)
    assert main(["--once"]) == 0
    assert decisions(log_file) == {"v.json": "valid"}


def test_no_memory_dir_at_all_is_a_usage_error(
    tmp_path: Path,
    log_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Nothing to work on is said plainly (exit 2)."""
    monkeypatch.chdir(tmp_path)
    assert main(["--once"]) == 2
    assert "no memory dir" in capsys.readouterr().err


def test_second_run_does_not_reread_unchanged_files(
    project: Path, memory_dir: Path, log_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Files decided valid or foreign and not changed since are not decided (read) again; a
    file changed in place, even to the same size, is."""
    staging = memory_dir / "staging"
    write(staging / "a.json", staging_doc(project, "a"))
    write(staging / "b.json", staging_doc(project, "b"))
    write(staging / "f.json", staging_doc("/else", "f"))
    assert main(["--once", "--memory-dir", str(memory_dir)]) == 0
    assert decisions(log_file) == {"a.json": "valid", "b.json": "valid", "f.json": "foreign"}
    capsys.readouterr()
    log_file.unlink()
    # Same size, new content: "b" -> "c" in the session id.
    write(staging / "b.json", staging_doc(project, "c"))
    assert main(["--once", "--memory-dir", str(memory_dir)]) == 0
    assert decisions(log_file) == {"b.json": "valid"}
    summary = capsys.readouterr().out
    assert "valid=2 " in summary
    assert "foreign=1 " in summary
    assert "unchanged=2" in summary


def test_seen_cache_outlives_a_change_of_split_but_not_a_lower_size_limit(
    project: Path, memory_dir: Path, log_file: Path, tmp_path: Path
) -> None:
    """Issue 21 item 3: split_invalid_candidates changes only what becomes of invalid files,
    which are never cached, so a run after a change of it decides nothing again; a size limit
    lowered below a cached file's size has that file decided again (now too large)."""
    write(memory_dir / "staging" / "a.json", staging_doc(project, "a"))
    assert main(["--once", "--memory-dir", str(memory_dir)]) == 0
    log_file.unlink()
    config = tmp_path / "config.toml"
    config.write_text("split_invalid_candidates = true\n")
    assert main(["--once", "--config", str(config), "--memory-dir", str(memory_dir)]) == 0
    assert decisions(log_file) == {}
    config.write_text("split_invalid_candidates = true\nmax_file_size = 100\nsettle = 0\n")
    assert main(["--once", "--config", str(config), "--memory-dir", str(memory_dir)]) == 0
    assert decisions(log_file) == {"a.json": "quarantined"}


@pytest.mark.parametrize("limit", ["count", "bytes"])
def test_a_backlog_of_many_batches_is_decided_as_one_by_one(
    project: Path,
    memory_dir: Path,
    log_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    limit: str,
) -> None:
    """A backlog cut into batches (by count, or by the bytes they hold): every file gets the
    decision it gets alone, each exactly once in the log, and a too-large file met inside a
    batch is copied and quarantined, not deferred for the lock the batch takes."""
    from memstaged.run import pipeline

    if limit == "count":
        monkeypatch.setattr(pipeline, "BATCH", 5)
    else:
        monkeypatch.setattr(pipeline, "BATCH_BYTES", 1)  # every pending file closes a batch
    expected = backlog(project, memory_dir, 40)
    staging = memory_dir / "staging"
    big = write(staging / "f0033-big.json", b"[" + b" " * 5000 + b"]")
    os.utime(staging / "f0033-big.json", (1_700_000_000, 1_700_000_000))
    expected["f0033-big.json"] = "quarantined"
    config = tmp_path / "config.toml"
    config.write_text("max_file_size = 4096\nsettle = 0\n")

    assert main(["--once", "--config", str(config), "--memory-dir", str(memory_dir)]) == 0

    events = [e for e in read_events(log_file) if e.get("event") == "decision"]
    decided = [e for e in events if not e.get("own_rewrite")]
    assert sorted(Path(e["path"]).name for e in decided) == sorted(expected)
    looks = [Path(e["path"]).name for e in events if e.get("own_rewrite")]
    assert sorted(looks) == sorted(n for n, d in expected.items() if d == "repaired")
    assert decisions(log_file) == expected
    left = sorted(p.name for p in staging.iterdir())
    assert left == sorted(n for n, d in expected.items() if d != "quarantined")
    ctx = Context(project_root=str(project), file_name="x.json")
    for name in left:
        assert decide((staging / name).read_bytes(), ctx).decision is Decision.VALID, name
    assert big in {p.read_bytes() for p in (memory_dir / "deadletter" / "originals").iterdir()}
    assert not (memory_dir / "canonical-writer.lock").exists()


def test_the_project_root_mistake_says_where_the_memory_dir_is(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """Issue 13 item 2: the likely mistake, a project root, gets the memory dir it meant."""
    _, _, err = run(capsys, "--once", "--memory-dir", str(project))
    assert f"did you mean {memory_dir}?" in one_line_error(err)


def test_a_glob_match_that_is_not_a_memory_dir_is_just_not_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, log_file: Path
) -> None:
    """Issue 13 item 2: of ``*/.pi/memory/project``, a match without ``staging/`` is skipped
    without an error and left untouched; the real memory dirs are decided."""
    real = tmp_path / "a" / ".pi" / "memory" / "project"
    (real / "staging").mkdir(parents=True)
    write(real / "staging" / "x.json", staging_doc(tmp_path / "a"))
    fake = tmp_path / "b" / ".pi" / "memory" / "project"
    fake.mkdir(parents=True)
    code, out, _ = run(capsys, "--once", "--memory-dir", f"{tmp_path}/*/.pi/memory/project")
    assert code == 0
    assert str(real) in out and str(fake) not in out
    assert list(fake.iterdir()) == []


def test_dry_run_writes_no_seen_cache(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """Issue 13 item 2: ``--dry-run`` writes nothing anywhere: not in the memory dir and no seen
    cache in the state dir (only the decision log, where its decisions are marked)."""
    one_of_each(project, memory_dir)
    before = {p: p.read_bytes() for p in memory_dir.rglob("*") if p.is_file()}
    assert run(capsys, "--once", "--dry-run", "--memory-dir", str(memory_dir))[0] == 0
    after = {p: p.read_bytes() for p in memory_dir.rglob("*") if p.is_file()}
    assert {p: b for p, b in after.items() if p.name != ".memstaged.lock"} == before
    assert not (log_file.parent / "memstaged" / "seen").exists()
    assert not (log_file.parent / "seen").exists()


def test_a_long_settle_wait_says_what_it_waits_for(
    capsys: pytest.CaptureFixture[str], memory_dir: Path, log_file: Path
) -> None:
    """Issue 13: ``--once`` waiting for a file still being written says so on stderr, naming
    the file and the settle interval, instead of a silent pause. The file is dated ahead, so
    that it settles from when ``--once`` first sees it: a run that starts late on a busy machine
    still has the whole interval to wait (issue 19 item 8)."""
    half_written_ahead(memory_dir)
    code, _, err = run(capsys, "--once", "--settle", "3", "--memory-dir", str(memory_dir))
    assert code == 0
    waiting = [line for line in err.splitlines() if "waiting up to" in line]
    assert len(waiting) == 1
    assert "half.json" in waiting[0] and "settle interval (3s)" in waiting[0]


def test_a_second_once_on_the_demo_decides_nothing_again(
    capsys: pytest.CaptureFixture[str], memory_dir: Path, log_file: Path
) -> None:
    """Issue 21 item 3, the demo: ``--once`` repairs three files and looks at each rewrite
    (logged ``own_rewrite``, not counted); a second run reads none of them again (it said
    ``unchanged=2`` and logged three ``valid`` decisions)."""
    for path in DEMO.iterdir():
        shutil.copy(path, memory_dir / "staging")
    code, out, _ = run(capsys, "--once", "--memory-dir", str(memory_dir), "--settle", "0")
    assert code == 0
    assert "valid=1 repaired=3 quarantined=3 foreign=1 deferred=0 skipped=0 total=8" in out
    first = decision_events(read_events(log_file))
    assert sum(1 for e in first if e.get("own_rewrite")) == 3
    code, out, _ = run(capsys, "--once", "--memory-dir", str(memory_dir), "--settle", "0")
    assert code == 0
    assert "total=5 unchanged=5" in out
    assert decision_events(read_events(log_file)) == first
    code, out, _ = run(capsys, "log", "--decision", "valid")
    assert len(out.splitlines()) == 1  # session-valid.json: the looks are no decisions
    code, out, _ = run(capsys, "log", "--path", "session-bom.json")
    assert "memstaged's own rewrite, looked at again: valid (not a new decision)" in out


@pytest.mark.parametrize("when", ["replaced", "rewrite-seen"])
def test_a_writer_editing_the_rewrite_in_place_right_after_the_exchange_is_decided(
    project: Path, memory_dir: Path, log_file: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """SPEC 1 and 5: the look at memstaged's own rewrite reads it. A writer that writes into
    the rewrite just after the exchange, keeping its size and putting its mtime back (``cp
    -p``), leaves another version at the name: it gets a decision of its own in the same run,
    not a look, and the next run has nothing left to decide. Forced at the step after the
    exchange, and after the ``lstat`` that takes the rewrite's identity for the look in place
    (its bytes, read next through the temp's descriptor, are then the writer's)."""
    staging = memory_dir / "staging"
    put(staging / "r.json", repairable(project))
    from memstaged.files import fsio

    real = fsio.crash_point
    edited: list[bytes] = []

    def writer_in_place(step: str) -> None:
        real(step)
        if step == when and not edited:
            path = staging / "r.json"
            st = path.stat()
            bad = path.read_bytes().replace(b'"schemaVersion":1', b'"schemaVersion":7')
            with path.open("r+b") as fh:
                fh.write(bad)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
            edited.append(bad)

    monkeypatch.setattr(fsio, "crash_point", writer_in_place)
    assert main(["--once", "--memory-dir", str(memory_dir)]) == 0
    monkeypatch.undo()
    assert edited, "the rewrite was never put in place"
    assert not (staging / "r.json").exists()  # the writer's version, quarantined
    events = decision_events(read_events(log_file))
    decided = [(e["decision"], e.get("own_rewrite", False), e["sha256"]) for e in events]
    assert decided[0][:2] == ("repaired", False)
    assert ("quarantined", False, sha256(edited[0]).hexdigest()) in decided
    assert not [d for d in decided if d[1]], "the writer's version was taken for the look"
    log_file.unlink()
    assert main(["--once", "--memory-dir", str(memory_dir)]) == 0
    assert decision_events(read_events(log_file)) == []


def test_a_rewrite_replaced_before_it_is_looked_at_is_read_and_decided(
    project: Path, memory_dir: Path, log_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer renames its version over the rewrite just after the exchange: what stands there
    is not memstaged's, so no look is logged for it; it is read and gets a decision of its own
    in the same run. Forced at the step after the exchange."""
    staging = memory_dir / "staging"
    put(staging / "r.json", repairable(project))
    theirs = json.dumps(staging_doc(project, "writer")).encode()
    from memstaged.files import fsio

    real = fsio.crash_point

    def writer_after_the_exchange(step: str) -> None:
        if step == "replaced":
            (staging / ".writer.tmp").write_bytes(theirs)
            os.rename(staging / ".writer.tmp", staging / "r.json")
        real(step)

    monkeypatch.setattr(fsio, "crash_point", writer_after_the_exchange)
    assert main(["--once", "--memory-dir", str(memory_dir)]) == 0
    monkeypatch.undo()
    assert (staging / "r.json").read_bytes() == theirs
    events = decision_events(read_events(log_file))
    assert [(e["decision"], e.get("own_rewrite", False)) for e in events] == [
        ("repaired", False),
        ("valid", False),
    ]
    assert events[1]["sha256"] == sha256(theirs).hexdigest()
