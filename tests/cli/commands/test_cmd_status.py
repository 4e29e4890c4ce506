"""``memstaged status``: a read-only health check per memory dir (exit 0 fine, 1 needs care)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.commands import (
    BAD_TRIGGER,
    json_lines,
    one_line_error,
    prepare,
    run,
    set_old,
    staging_files,
    status_json,
)
from support.documents import lesson, staging_doc, write

from memstaged.cli.commands.status import SUMMARY_COLUMNS

pytestmark = pytest.mark.usefixtures("plain_output")


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else b"", p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if not p.is_symlink()
    }


def test_healthy_dir_exits_0(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """Only valid and foreign files, no dead letters, no stale lock: exit 0, nothing flagged."""
    write(memory_dir / "staging" / "a.json", staging_doc(project, "a"))
    write(memory_dir / "staging" / "far.json", staging_doc("/other/project", "far"))
    code, result = status_json(capsys, memory_dir)
    assert code == 0
    assert result["attention"] == []
    assert result["staging"]["valid"] == 1
    assert result["staging"]["foreign"] == 1
    assert result["staging"]["total"] == 2
    assert result["deadletter_records"] == 0
    assert result["canonical_lock"] is None
    assert result["memstaged_pid"] is None
    assert result["oldest_file"] in ("a.json", "far.json")
    code, out, _ = run(capsys, "status", "--memory-dir", str(memory_dir))
    assert code == 0
    assert "nothing needs attention" in out


def test_dead_letters_need_attention(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """After a quarantine the records and originals are counted and the exit code is 1."""
    prepare(project, memory_dir, log_file)
    code, result = status_json(capsys, memory_dir)
    assert code == 1
    records = list((memory_dir / "deadletter").glob("*.json"))
    assert result["deadletter_records"] == len(records) == 5  # 4 candidates of mixed + broken
    assert result["deadletter_originals"] == 2
    assert any("dead-letter record" in a for a in result["attention"])


def test_undecided_files_are_triaged_read_only(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """Files no memstaged has decided yet are counted as the engine would decide them, nothing
    on disk changes (not even a lock file), and they need attention only after --grace."""
    staging = memory_dir / "staging"
    fixme = staging_doc(project, "fix")
    del fixme["candidates"]["lessons"][0]["triggers"]
    write(staging / "fixme.json", fixme)
    write(
        staging / "bad.json",
        staging_doc(project, "bad", candidates={"lessons": [lesson(triggers=BAD_TRIGGER)]}),
    )
    write(staging / "half.json", b'{"schemaVersion": 1, "sess')
    before = _tree(memory_dir)
    code, fresh = status_json(capsys, memory_dir)
    assert code == 0, fresh["attention"]
    assert (fresh["staging"]["repaired"], fresh["staging"]["quarantined"]) == (1, 1)
    assert fresh["staging"]["deferred"] == 1  # still being written, for all we know
    for name in ("fixme.json", "bad.json", "half.json"):
        set_old(staging / name)
    code, old = status_json(capsys, memory_dir, "--files")
    assert code == 1
    assert old["staging"]["quarantined"] == 2  # half.json has settled: it would be quarantined
    assert any("not yet repaired or quarantined" in a for a in old["attention"])
    assert {f["name"]: f["decision"] for f in old["files"]} == {
        "bad.json": "quarantined",
        "fixme.json": "repaired",
        "half.json": "quarantined",
    }
    assert old["oldest_age_seconds"] >= 3600
    before = {k: v for k, v in before.items() if not k.startswith("staging/")}
    after = {k: v for k, v in _tree(memory_dir).items() if not k.startswith("staging/")}
    assert after == before
    assert not (memory_dir / ".memstaged.lock").exists()


def test_links_and_special_files_need_attention(
    capsys: pytest.CaptureFixture[str], memory_dir: Path, tmp_path: Path, log_file: Path
) -> None:
    """A symbolic link or FIFO in staging/ is never followed or opened, and is flagged."""
    target = tmp_path / "elsewhere.json"
    target.write_text("{}")
    (memory_dir / "staging" / "link.json").symlink_to(target)
    os.mkfifo(memory_dir / "staging" / "pipe.json")
    code, result = status_json(capsys, memory_dir)
    assert code == 1
    assert result["staging"]["skipped"] == 2
    assert any("cannot decide" in a for a in result["attention"])


def test_max_age_flags_an_old_staging_file(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """--max-age flags a memory dir whose oldest (valid) staging file waits too long."""
    write(memory_dir / "staging" / "a.json", staging_doc(project, "a"))
    set_old(memory_dir / "staging" / "a.json", 7200)
    assert status_json(capsys, memory_dir, "--max-age", "3h")[0] == 0
    code, result = status_json(capsys, memory_dir, "--max-age", "1h")
    assert code == 1
    assert any("--max-age" in a for a in result["attention"])


def test_missing_memory_dir_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, log_file: Path
) -> None:
    """A memory dir named on the command line that does not exist: exit 2, one line."""
    code, _, err = run(capsys, "status", "--memory-dir", str(tmp_path / "nope"))
    assert code == 2
    assert "does not exist" in one_line_error(err)


def test_memory_dir_before_the_command(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """``memstaged --memory-dir D status`` works like ``memstaged status --memory-dir D``."""
    write(memory_dir / "staging" / "a.json", staging_doc(project, "a"))
    code, out, _ = run(capsys, "--memory-dir", str(memory_dir), "status", "--json")
    assert code == 0
    assert json_lines(out)[0]["memory_dir"] == str(memory_dir)
    assert staging_files(memory_dir).keys() == {"a.json"}


def test_check_has_a_short_first_line_and_the_detail_after_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, log_file: Path
) -> None:
    """Issue 31 (polish): with several memory dirs `status --check` repeated one clause per
    memory dir on its one line (430 characters for three). Its first line is now short
    (`2 of 3 memory dirs need attention`, then the performance data), and each problem is a
    line after it, the Monitoring Plugins' long output; counts take their singular or plural
    (`1 dead-letter record`, `1 memory dir`). `--no-require-daemon`: the user manager is not
    asked."""
    dirs = []
    for name in ("a", "b", "c"):
        mdir = tmp_path / name / ".pi" / "memory" / "project"
        (mdir / "staging").mkdir(parents=True)
        dirs.append(mdir)
    for mdir in dirs[:2]:
        write(mdir / "staging" / "bad.json", b"not json")
        assert run(capsys, "--once", "--settle", "0", "--memory-dir", str(mdir))[0] == 0
    cfg = tmp_path / "three.toml"
    cfg.write_text("memory_dirs = [" + ", ".join(f'"{d}"' for d in dirs) + "]\n")

    code, out, err = run(capsys, "status", "--check", "--no-require-daemon", "--config", str(cfg))
    assert (code, err) == (1, "")
    first, *detail = out.splitlines()
    text, _, perf = first.partition(" | ")
    assert text == "MEMSTAGED WARNING - 2 of 3 memory dirs need attention"
    assert perf.startswith("memory_dirs=3;;;0 unseen=2;0;;0 ")
    assert detail == [
        f"{d}: 1 dead-letter record not yet seen: memstaged deadletter list, then memstaged "
        "deadletter ack"
        for d in dirs[:2]
    ]

    code, out, _ = run(
        capsys, "status", "--check", "--no-require-daemon", "--memory-dir", str(dirs[0])
    )
    assert (code, out.partition(" | ")[0]) == (
        1,
        "MEMSTAGED WARNING - 1 dead-letter record not yet seen (memstaged deadletter list, then "
        "deadletter ack)",
    )
    assert len(out.splitlines()) == 1  # one problem: named on the first line, no detail
    code, out, _ = run(
        capsys, "status", "--check", "--no-require-daemon", "--memory-dir", str(dirs[2])
    )
    assert (code, out.partition(" | ")[0]) == (
        0,
        "MEMSTAGED OK - 1 memory dir, nothing needs attention",
    )
    code, out, _ = run(capsys, "status", "--config", str(cfg))
    assert (code, out.splitlines()[-1]) == (
        1,
        "2 of 3 memory dirs need attention: memstaged status -v",
    )


def test_many_memory_dirs_are_one_line_each_and_the_detail_with_verbose(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, log_file: Path
) -> None:
    """Issue 21 item 6: `status` on many memory dirs prints one line per memory dir (1,000 must
    stay readable); -v, or a single memory dir, gives each one's detail."""
    dirs = []
    for i in range(30):
        mdir = tmp_path / f"p{i:02d}" / ".pi" / "memory" / "project"
        (mdir / "staging").mkdir(parents=True)
        dirs.append(mdir)
    write(dirs[3] / "staging" / "bad.json", b"not json")
    assert run(capsys, "--once", "--memory-dir", str(dirs[3]), "--settle", "0")[0] == 0
    pattern = str(tmp_path / "p*" / ".pi" / "memory" / "project")
    code, out, _ = run(capsys, "status", "--memory-dir", pattern)
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == "# 30 memory dirs"
    assert lines[1].split("\t") == list(SUMMARY_COLUMNS)
    rows = [line.split("\t") for line in lines[2:32]]
    assert [r[0] for r in rows] == [str(d) for d in dirs]
    assert rows[3][4:6] == ["1", "1"] and rows[3][-1] == "attention"
    assert all(r[-1] == "ok" for i, r in enumerate(rows) if i != 3)
    assert lines[32:] == ["1 of 30 memory dirs needs attention: memstaged status -v"]
    code, out, _ = run(capsys, "status", "-v", "--memory-dir", pattern)
    assert out.count("needs attention\t") == 30  # a table per memory dir


@pytest.mark.parametrize("kind", ["FIFO", "symbolic link", "directory"])
def test_an_instance_lock_no_memstaged_can_take_is_critical(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    memory_dir: Path,
    log_file: Path,
    kind: str,
) -> None:
    """A FIFO, a link or a directory at a memory dir's instance lock made `status --check`
    say OK, while no daemon and no `--once` can work on the dir (each refuses to open it).
    The check says CRITICAL and names the lock; `--once` indeed refuses (exit 2)."""
    from memstaged.files.locks import instance_lock_path

    st = memory_dir.stat()
    lock = instance_lock_path(tmp_path / "state" / "memstaged", (st.st_dev, st.st_ino))
    lock.parent.mkdir(parents=True, mode=0o700)
    os.chmod(lock.parent.parent, 0o700)
    if kind == "FIFO":
        os.mkfifo(lock, 0o600)
    elif kind == "symbolic link":
        (tmp_path / "elsewhere").write_text("")
        lock.symlink_to(tmp_path / "elsewhere")
    else:
        lock.mkdir(mode=0o700)
    code, out, _ = run(
        capsys, "status", "--check", "--no-require-daemon", "--memory-dir", str(memory_dir)
    )
    assert code == 2, out
    assert out.startswith("MEMSTAGED CRITICAL"), out
    assert f"its instance lock {lock} is a {kind}, not a regular file" in out
    code, _, err = run(capsys, "--once", "--memory-dir", str(memory_dir))
    assert code == 2, err


def test_an_instances_dir_no_memstaged_can_use_is_critical(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, memory_dir: Path, log_file: Path
) -> None:
    """A link at the state dir's ``instances/`` stops every daemon and `--once` ("bad ownership
    or modes for directory instances"), and `status --check` said OK. It is CRITICAL."""
    state = tmp_path / "state" / "memstaged"
    state.mkdir(parents=True, mode=0o700)
    os.chmod(state, 0o700)
    (tmp_path / "alt").mkdir(mode=0o700)
    (state / "instances").symlink_to(tmp_path / "alt")
    code, out, _ = run(
        capsys, "status", "--check", "--no-require-daemon", "--memory-dir", str(memory_dir)
    )
    assert code == 2, out
    assert "no memstaged can work on it: state dir: bad ownership or modes for directory" in out
    code, _, err = run(capsys, "--once", "--memory-dir", str(memory_dir))
    assert code == 2, err
