"""Issue 22 items 1-5 (the terminal): what ``log``, ``deadletter`` and ``--once`` show a person.

These tests read the output of the commands run as a user runs them, on stores and logs a real
``--once`` wrote. The same commands on a real pseudo-terminal of 80 columns (a tmux pane, read
with ``tmux capture-pane``) are in ``tests/system/test_terminal_panes.py``.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from support.commands import json_lines, one_line_error, original_files, prepare, record_files, run
from support.decision_log import read_events
from support.documents import one_of_each, staging_doc, write

from memstaged.cli.main import main
from memstaged.log.format import journal_fields

pytestmark = pytest.mark.usefixtures("plain_output")


# -- item 1: log ------------------------------------------------------------------------------


def test_lifecycle_lines_name_their_memory_dir_and_full_gives_paths(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """Issue 22 item 1: a lifecycle line (a recovery's) names its memory dir by the same project
    label as decisions do (none did), and ``--full`` gives every path in full instead."""
    prepare(project, memory_dir, log_file)
    code, _, _ = run(capsys, "deadletter", "recover", "--all", "--memory-dir", str(memory_dir))
    assert code in (0, 1)
    lifecycle = [e for e in read_events(log_file) if e["event"].startswith("deadletter_")]
    assert lifecycle
    code, out, _ = run(capsys, "log")
    assert code == 0
    lines = [line for line in out.splitlines() if "  deadletter_" in line]
    assert len(lines) == len(lifecycle)
    assert all(re.search(r"  deadletter_\w+  example-project  ", line) for line in lines), lines
    assert str(memory_dir) not in out

    code, out, _ = run(capsys, "log", "--full")
    assert code == 0
    full = [line for line in out.splitlines() if "  deadletter_" in line]
    assert all(f"  {memory_dir}  " in line for line in full), full
    assert f"  {memory_dir / 'staging' / 'mixed.json'}  " in out


def test_labels_tell_apart_projects_of_the_same_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, log_file: Path
) -> None:
    """Issue 22 item 1: two projects both called gamma are labelled by as many of their last
    path components as it takes to tell them apart."""
    dirs = []
    for parent in ("src", "old"):
        root = tmp_path / parent / "gamma"
        mdir = root / ".pi" / "memory" / "project"
        (mdir / "staging").mkdir(parents=True)
        write(mdir / "staging" / f"{parent}.json", staging_doc(root, parent))
        assert main(["--once", "--memory-dir", str(mdir), "--settle", "0"]) == 0
        dirs += ["--memory-dir", str(mdir)]
    code, out, _ = run(capsys, "log", *dirs)
    assert code == 0
    assert len([ln for ln in out.splitlines() if "  src/gamma  src.json" in ln]) == 1, out
    assert len([ln for ln in out.splitlines() if "  old/gamma  old.json" in ln]) == 1, out


# -- item 2: deadletter list ---------------------------------------------------------------------


def test_deadletter_list_has_project_since_and_newest_last(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """Issue 22 item 2: ``deadletter list`` shows each record's project, takes ``--since``,
    and is in time order, newest last (it was sorted by source file: alpha before zeta)."""
    for name in ("zeta.json", "alpha.json"):  # zeta is dead-lettered first
        write(memory_dir / "staging" / name, b'{"session_id": "' + name.encode())
        assert main(["--once", "--memory-dir", str(memory_dir), "--settle", "0"]) == 0
    decided = {
        json.loads(data)["memstaged"]["source_file"]: json.loads(data)["memstaged"]["decided_at"]
        for data in record_files(memory_dir).values()
    }
    assert decided["zeta.json"] < decided["alpha.json"]
    code, out, _ = run(capsys, "deadletter", "list", "--memory-dir", str(memory_dir))
    assert code == 0
    lines = out.splitlines()
    assert [re.search(r"from=(\S+)", line)[1] for line in lines] == [  # type: ignore[index]
        "zeta.json",
        "alpha.json",
    ]
    assert all(re.search(r"^\S+  \S+ \S+  example-project  file  ", ln) for ln in lines), lines
    code, out, _ = run(
        capsys, "deadletter", "list", "--memory-dir", str(memory_dir), "--since",
        decided["alpha.json"],
    )  # fmt: skip
    assert code == 0
    assert [re.search(r"from=(\S+)", ln)[1] for ln in out.splitlines()] == [  # type: ignore[index]
        "alpha.json"
    ]


# -- item 3: deadletter show ---------------------------------------------------------------------


def test_show_prints_the_original_once(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """Issue 22 item 3: ``show`` printed the whole original twice, embedded in the record's
    JSON and then as text; now once, the record saying where it is."""
    prepare(project, memory_dir, log_file)
    [pref] = [n[: -len(".json")] for n in record_files(memory_dir) if "preferences" in n]
    code, out, _ = run(capsys, "deadletter", "show", pref, "--memory-dir", str(memory_dir))
    assert code == 0
    assert out.count("Pin the venv") == 1  # another candidate of the file: only in the original
    assert '"original_staging_file": "(the original file: shown below)"' in out
    code, out, _ = run(
        capsys, "deadletter", "show", pref, "--json", "--memory-dir", str(memory_dir)
    )
    [shown] = json_lines(out)
    assert "Pin the venv" in json.dumps(shown["record"])  # --json keeps the record whole


def test_whole_file_summary_is_marked_and_escaped(
    capsys: pytest.CaptureFixture[str], memory_dir: Path, log_file: Path
) -> None:
    """Issue 22 item 3: a whole-file record of bytes that are not UTF-8 is marked as one and
    its bytes shown escaped (``list`` showed raw U+FFFD marks for them, ``~\ufffdQ\ufffdv1``)."""
    data = b"~\x9fQ\xe2v1\x00\xffw"
    write(memory_dir / "staging" / "bin.json", data)
    assert main(["--once", "--memory-dir", str(memory_dir), "--settle", "0"]) == 0
    code, out, _ = run(capsys, "deadletter", "list", "--memory-dir", str(memory_dir))
    assert code == 0
    assert r"  (whole file) ~\x9fQ\xe2v1\x00\xffw  [malformed staging file" in out
    assert "\ufffd" not in out
    code, out, _ = run(capsys, "deadletter", "show", "bin", "--memory-dir", str(memory_dir))
    assert code == 0
    assert "summary: (whole file) ~\\x9fQ\\xe2v1\\x00\\xffw\n" in out
    assert "\ufffd" not in out


# -- item 4: deadletter purge --id / --session ---------------------------------------------------


def test_purge_by_id_and_session_lists_first(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """Issue 22 item 4: ``purge`` takes ``--id`` and ``--session`` (with ``--older-than`` too,
    a record must match each); without ``--yes`` it only lists, with it only the chosen records
    and their own originals go, and the purge is logged with what chose them."""
    prepare(project, memory_dir, log_file)

    def purge(*argv: str) -> tuple[int, str, str]:
        return run(capsys, "deadletter", "purge", "--memory-dir", str(memory_dir), *argv)

    code, _, err = purge()
    assert code == 2
    assert "--older-than, --id or --session" in one_line_error(err)
    before = record_files(memory_dir), original_files(memory_dir)

    code, out, _ = purge("--older-than", "1m", "--session", "mixed", "--json")
    assert (code, out) == (0, "")  # young records: none is older than a minute
    code, out, _ = purge("--session", "mixed", "--json")
    assert code == 0
    listed = json_lines(out)
    assert {r["action"] for r in listed} == {"would delete"}
    assert {r["session_id"] for r in listed if r["kind"] == "record"} == {"mixed"}
    assert sum(r["kind"] == "record" for r in listed) == 4
    [orig] = [r["name"] for r in listed if r["kind"] == "original"]
    assert orig.startswith("originals/mixed.json.")
    assert (record_files(memory_dir), original_files(memory_dir)) == before

    [broken] = [n[: -len(".json")] for n in record_files(memory_dir) if n.startswith("broken")]
    code, out, _ = purge("--id", broken[:-4], "--yes")
    assert code == 0
    assert "deleted 1 record and 1 original" in out
    assert sorted(record_files(memory_dir)) == sorted(n for n in before[0] if "mixed" in n)
    assert [n for n in original_files(memory_dir)] == [orig[len("originals/") :]]
    [event] = [e for e in read_events(log_file) if e["event"] == "deadletter_purged"]
    assert event["ids"] == [broken[:-4]]
    assert event["records"] == [broken + ".json"]

    code, out, _ = purge("--session", "mixed", "--yes")
    assert code == 0
    assert "deleted 4 records and 1 original" in out
    assert record_files(memory_dir) == {}
    assert original_files(memory_dir) == {}
    code, _, err = purge("--id", "zzz", "--yes")
    assert code == 2
    assert "zzz" in one_line_error(err)
    code, out, err = purge("--session", "nobody", "--yes")
    assert code == 0
    assert "no dead-letter record of session 'nobody'" in err
    assert "deleted 0 records and 0 originals" in out


# -- item 5: small slips -------------------------------------------------------------------------


def test_the_journal_message_names_no_none() -> None:
    """Issue 22 item 5: the journal's MESSAGE of the daemon's stop event said ``abandoned=None``
    when no work was abandoned, and ``log`` said ``abandoned=null``. The event is built here as
    the daemon logs it (``daemon/loop.py``'s stop): a real stop needs a daemon run for nothing
    else."""
    event: dict[str, Any] = {
        "event": "stop",
        "decided": 3,
        "pending": 0,
        "abandoned": None,
        "level": "info",
        "timestamp": "2026-12-01T22:00:00.000000Z",
    }
    assert journal_fields(dict(event))["MESSAGE"] == "stop: decided=3, pending=0"


def test_log_shows_no_null_field(capsys: pytest.CaptureFixture[str], log_file: Path) -> None:
    """Issue 22 item 5: ``log`` leaves out a lifecycle event's fields that are null."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    event = {"timestamp": "2026-12-01T22:00:00.000000Z", "level": "info", "event": "stop"}
    log_file.write_text(json.dumps({**event, "decided": 3, "abandoned": None}) + "\n")
    code, out, _ = run(capsys, "log")
    assert code == 0
    assert out.rstrip().endswith("  stop         decided=3")


def test_status_json_is_compact_for_every_memory_dir(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, log_file: Path
) -> None:
    """Issue 22 item 5: ``status --json`` wrote a memory dir holding a name that is not UTF-8
    with spaces after its separators, the others compact; every line is compact now."""
    dirs = []
    for name in ("one", "two"):
        mdir = tmp_path / name / ".pi" / "memory" / "project"
        (mdir / "staging").mkdir(parents=True)
        dirs += ["--memory-dir", str(mdir)]
    (tmp_path / "two" / ".pi" / "memory" / "project" / "staging").joinpath(
        os.fsdecode(b"caf\xe9.json")
    ).write_bytes(b"{")
    code, out, _ = run(capsys, "status", "--json", "--files", *dirs)
    assert code in (0, 1)
    lines = out.splitlines()
    assert len(lines) == 2
    for line in lines:
        assert '": ' not in line and '", "' not in line, line
        json.loads(line)


class _Terminal(io.StringIO):
    """stdout as a terminal (for colour decisions), captured."""

    def isatty(self) -> bool:
        return True


def _on_terminal(monkeypatch: pytest.MonkeyPatch) -> _Terminal:
    """Called in the test's body: pytest's capture puts its own stdout back between phases."""
    fake = _Terminal()
    monkeypatch.setattr(sys, "stdout", fake)
    monkeypatch.setenv("MEMSTAGED_PAGER", "")  # no pager: the output is read here
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    return fake


def test_no_color_means_no_escape_sequences_at_all(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    project: Path,
    memory_dir: Path,
    log_file: Path,
) -> None:
    """Issue 13: on a terminal, decisions are coloured; with NO_COLOR (or --color=never) no
    escape sequence at all, bold and italic included (rich still gave them); --color=always
    colours a pipe."""
    terminal = _on_terminal(monkeypatch)
    one_of_each(project, memory_dir)
    assert main(["--once", "--memory-dir", str(memory_dir)]) == 0
    mdir = ["--memory-dir", str(memory_dir)]
    for argv in (["log"], ["status", *mdir], ["stats"], ["deadletter", "list", *mdir]):
        terminal.seek(0)
        terminal.truncate()
        main(argv)
        assert "\x1b[" in terminal.getvalue(), argv
        monkeypatch.setenv("NO_COLOR", "1")
        terminal.seek(0)
        terminal.truncate()
        main(argv)
        assert "\x1b" not in terminal.getvalue(), argv
        monkeypatch.delenv("NO_COLOR")
        terminal.seek(0)
        terminal.truncate()
        main([*argv, "--color=never"])
        assert "\x1b" not in terminal.getvalue(), argv
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stdout", pipe)
    main(["log", "--color=always"])
    assert "\x1b[" in pipe.getvalue()


#: JSON keeps these raw in a string; a terminal may act on them (U+009B is a one-character CSI).
_TERMINAL_ACTS_ON = "\x7f\u009b\u0085\u202e\u2028\u2066"


def test_json_output_holds_no_character_a_terminal_acts_on(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """SPEC 6 (control characters never passed raw to a terminal), issue 13: ``--json`` output
    goes to terminals too. A name and contents with DEL, C1 controls (CSI), bidi overrides and
    U+2028 come out of ``log --json``, ``check --json`` and ``deadletter list --json`` as
    ``\\uXXXX`` escapes: none of them raw, and each line reads back to the very same values."""
    mdir = memory_dir
    name = f"x{_TERMINAL_ACTS_ON}.json"
    doc = staging_doc(project, f"s{_TERMINAL_ACTS_ON}")
    doc["candidates"]["lessons"][0]["triggers"] = [{"type": "x" + _TERMINAL_ACTS_ON}]
    path = mdir / "staging" / name
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    os.utime(path, (1_700_000_000, 1_700_000_000))
    outputs = {}
    for argv in (
        ["check", "--json", str(path)],
        ["--once", "--memory-dir", str(mdir)],
        ["log", "--json"],
        ["deadletter", "list", "--json", "--memory-dir", str(mdir)],
    ):
        code, out, err = run(capsys, *argv)
        assert code in (0, 4), (argv, err)
        outputs[argv[0]] = out
    for command in ("check", "log", "deadletter"):
        out = outputs[command]
        assert out.strip(), command
        assert not set(out) & set(_TERMINAL_ACTS_ON), (command, out)
        values = [json.loads(line) for line in out.splitlines()]
        shown = json.dumps(values, ensure_ascii=False)
        assert f"s{_TERMINAL_ACTS_ON}" in shown, command  # the session id, exactly
    [decision] = [v for v in map(json.loads, outputs["log"].splitlines()) if v.get("decision")]
    assert decision["path"] == str(path) and decision["decision"] == "quarantined"
