"""memstaged for the person who runs it (issue 13): what a memory dir is, no traceback for any
argument, ``check`` as ``--once``, dry runs marked, and output that fits a terminal."""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.commands import one_line_error, run
from support.documents import lesson, read_log, staging_doc, write
from support.helpers import (
    REPO,
    daemon,
    memstaged_cmd,
    memstaged_env,
    read_events,
    without_dac_override,
)
from support.terminal import pty_run
from support.waiting import wait_for

from memstaged.cli.main import main

pytestmark = pytest.mark.usefixtures("plain_output")

OLD = 1_700_000_000


def _old(*paths: Path) -> None:
    for path in paths:
        os.utime(path, (OLD, OLD))


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _populated(project: Path, memory_dir: Path) -> dict[str, Path]:
    staging = memory_dir / "staging"
    bad = staging_doc(project, "bad", candidates={"lessons": [lesson(triggers=[{"type": "x"}])]})
    files = {
        "valid": staging / "valid.json",
        "repaired": staging / "fix.json",
        "quarantined": staging / "bad.json",
        "foreign": staging / "far.json",
    }
    no_triggers = staging_doc(project, "fix")
    del no_triggers["candidates"]["lessons"][0]["triggers"]
    write(files["valid"], staging_doc(project, "ok"))
    write(files["repaired"], no_triggers)
    write(files["quarantined"], bad)
    write(files["foreign"], staging_doc("/elsewhere", "far"))
    _old(*files.values())
    return files


# -- item 2: what a memory dir is --------------------------------------------------------------

_REFUSED: dict[str, Callable[[Path], str]] = {
    "project-root": str,
    "empty": lambda project: "",
    "root": lambda project: "/",
}
_COMMANDS = {
    "once": ["--once"],
    "once-dry-run": ["--once", "--dry-run"],
    "status": ["status"],
    "deadletter-list": ["deadletter", "list"],
    "recover": ["deadletter", "recover", "--all"],
    "purge": ["deadletter", "purge", "--older-than", "1d", "--yes"],
}


@pytest.mark.parametrize("command", list(_COMMANDS))
@pytest.mark.parametrize("where", list(_REFUSED))
def test_a_path_that_is_not_a_memory_dir_is_refused_and_left_alone(
    capsys: pytest.CaptureFixture[str],
    project: Path,
    memory_dir: Path,
    log_file: Path,
    where: str,
    command: str,
) -> None:
    """Issue 13 item 2 (SPEC 5): ``--memory-dir`` naming the project root, ``''`` or ``/`` is
    refused with one line and exit 2 by ``--once`` (dry run too) and every command that takes
    it, and nothing is created there (it was a silent ``total=0`` that left a lock file)."""
    target = _REFUSED[where](project)
    before = _tree(project)
    code, _, err = run(capsys, *_COMMANDS[command], "--memory-dir", target)
    assert code == 2
    line = one_line_error(err)
    assert "not a memory dir" in line or "empty" in line
    assert not line.startswith("memstaged: memstaged")
    assert _tree(project) == before
    assert not Path("/.memstaged.lock").exists()


def test_the_project_root_mistake_says_where_the_memory_dir_is(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """Issue 13 item 2: the likely mistake, a project root, gets the memory dir it meant."""
    _, _, err = run(capsys, "--once", "--memory-dir", str(project))
    assert f"did you mean {memory_dir}?" in one_line_error(err)


def test_the_daemon_refuses_it_too(tmp_path: Path, project: Path) -> None:
    """Issue 13 item 2: the daemon (a real process) exits 2 with one line for a project root,
    instead of running on it."""
    result = subprocess.run(
        memstaged_cmd("--memory-dir", str(project)),
        env=memstaged_env(tmp_path),
        capture_output=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 2
    assert len(result.stderr.decode().strip().splitlines()) == 1
    assert b"is not a memory dir" in result.stderr


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
    _populated(project, memory_dir)
    before = {p: p.read_bytes() for p in memory_dir.rglob("*") if p.is_file()}
    assert run(capsys, "--once", "--dry-run", "--memory-dir", str(memory_dir))[0] == 0
    after = {p: p.read_bytes() for p in memory_dir.rglob("*") if p.is_file()}
    assert {p: b for p, b in after.items() if p.name != ".memstaged.lock"} == before
    assert not (log_file.parent / "memstaged" / "seen").exists()
    assert not (log_file.parent / "seen").exists()


# -- item 4: no traceback, whatever the arguments ------------------------------------------------

_CONFIG_COMMANDS = [
    ["--once"],
    [],  # the daemon
    ["status"],
    ["log"],
    ["stats"],
    ["deadletter", "list"],
    ["deadletter", "show", "x"],
    ["deadletter", "recover", "--all"],
    ["deadletter", "purge", "--older-than", "1d"],
    ["check", "FILE"],
]


@pytest.mark.parametrize("argv", _CONFIG_COMMANDS, ids=lambda a: "-".join(a) or "daemon")
def test_a_config_file_that_is_not_utf8_is_one_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    project: Path,
    memory_dir: Path,
    log_file: Path,
    argv: list[str],
) -> None:
    """Issue 13 item 4: a config file with a byte that is not UTF-8 is exit 2 and one line
    naming the file, in every command (it was a UnicodeDecodeError traceback)."""
    config = tmp_path / "config.toml"
    config.write_bytes(b"settle = 1 # caf\xe9\n")
    write(memory_dir / "staging" / "a.json", staging_doc(project))
    file = str(memory_dir / "staging" / "a.json")
    argv = [file if a == "FILE" else a for a in argv]
    code, _, err = run(capsys, *argv, "--config", str(config), "--memory-dir", str(memory_dir))
    if argv and argv[0] == "check":
        code, _, err = run(capsys, *argv, "--config", str(config))
    assert code == 2
    assert f"{config}: not UTF-8" in one_line_error(err)


@pytest.mark.parametrize("argv", _CONFIG_COMMANDS, ids=lambda a: "-".join(a) or "daemon")
def test_a_config_path_with_a_nul_byte_is_one_line(
    capsys: pytest.CaptureFixture[str], memory_dir: Path, log_file: Path, argv: list[str]
) -> None:
    """Issue 13 item 4 (found by the argv fuzz test): ``--config 'a<NUL>b'`` is exit 2 and one
    line in every command (``os.open``'s ValueError was a traceback)."""
    argv = [str(memory_dir / "staging" / "a.json") if a == "FILE" else a for a in argv]
    code, _, err = run(capsys, *argv, "--config", "a\x00b", "--memory-dir", str(memory_dir))
    if argv and argv[0] == "check":
        code, _, err = run(capsys, *argv, "--config", "a\x00b")
    assert code == 2
    assert "NUL byte" in one_line_error(err)


@pytest.mark.parametrize("value", ["inf", "1e308", "99999999999", "nan", "-1", "-inf"])
def test_settle_out_of_range_is_one_line(
    capsys: pytest.CaptureFixture[str], memory_dir: Path, log_file: Path, value: str
) -> None:
    """Issue 13 item 4: ``--settle inf/1e308/99999999999`` (OverflowError) and ``nan`` (was
    accepted) are refused with one line and exit 2."""
    code, _, err = run(capsys, "--once", "--settle", value, "--memory-dir", str(memory_dir))
    assert code == 2
    assert "--settle" in one_line_error(err)


@pytest.mark.parametrize("source", ["env", "file"])
def test_settle_out_of_range_from_the_environment_or_the_file(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    memory_dir: Path,
    log_file: Path,
    source: str,
) -> None:
    """Issue 13 item 4: the same bound holds for ``MEMSTAGED_SETTLE`` and the file's
    ``settle`` (TOML has ``inf`` and ``nan``)."""
    argv = ["--once", "--memory-dir", str(memory_dir)]
    if source == "env":
        monkeypatch.setenv("MEMSTAGED_SETTLE", "inf")
    else:
        config = tmp_path / "c.toml"
        config.write_text("settle = nan\n")
        argv += ["--config", str(config)]
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert "settle" in one_line_error(err).lower()


def test_huge_durations(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """Issue 13 item 4: ``log --since 3000000d`` shows everything (a time before the first
    date), ``purge --older-than 99999999999d`` is one line and exit 2; both were a
    ValueError traceback."""
    _populated(project, memory_dir)
    assert run(capsys, "--once", "--memory-dir", str(memory_dir))[0] == 0
    code, out, err = run(capsys, "log", "--since", "3000000d", "--json")
    assert code == 0, err
    assert len(out.splitlines()) == 5  # four decisions and the look at fix.json's rewrite
    code, _, err = run(capsys, "deadletter", "purge", "--older-than", "99999999999d")
    assert code == 2
    assert "--older-than" in one_line_error(err)


# -- item 5: check decides as --once -------------------------------------------------------------


def test_check_decides_exactly_as_once(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    project: Path,
    memory_dir: Path,
    log_file: Path,
) -> None:
    """Issue 13 item 5: on the same files and settings (a config with a small size limit),
    ``check`` gives each file the decision ``--once --dry-run`` logs for it: a file over the
    limit is quarantined for its size (check called a 9 MB file valid), a FIFO and a link are
    skipped (check hung on the FIFO), a fresh unparseable file is deferred."""
    files = _populated(project, memory_dir)
    staging = memory_dir / "staging"
    big = staging / "big.json"
    write(big, staging_doc(project, "big", padding="x" * 5000))
    os.mkfifo(staging / "fifo.json")
    os.symlink(files["valid"], staging / "link.json")
    write(staging / "fresh.json", b'{"half')
    _old(big)
    config = tmp_path / "c.toml"
    config.write_text("max_file_size = 4096\nsettle = 600\n")
    names = sorted(p.name for p in staging.iterdir())
    code, out, _ = run(
        capsys, "check", "--json", "--config", str(config), *(str(staging / n) for n in names)
    )
    checked = {Path(e["path"]).name: e["decision"] for e in map(json.loads, out.splitlines())}
    assert checked["big.json"] == "quarantined"
    assert checked["fifo.json"] == checked["link.json"] == "skipped"
    assert checked["fresh.json"] == "deferred"
    once_argv = ["--once", "--dry-run", "--settle", "0", "--memory-dir", str(memory_dir)]
    # --once waits for the fresh file to settle: compare it with a zero settle on both sides
    code_once, _, _ = run(capsys, *once_argv, "--config", str(config))
    assert code_once == 0
    logged = {
        Path(e["path"]).name: e["decision"] for e in read_log(log_file) if e["event"] == "decision"
    }
    _, out, _ = run(
        capsys,
        "check",
        "--json",
        "--settle",
        "0",
        "--config",
        str(config),
        *(str(staging / n) for n in names),
    )
    checked = {Path(e["path"]).name: e["decision"] for e in map(json.loads, out.splitlines())}
    assert checked == logged
    assert code == 6  # the worst: skipped


def test_check_never_blocks_on_a_fifo(tmp_path: Path, memory_dir: Path) -> None:
    """Issue 13 item 5: a FIFO is opened with O_NONBLOCK|O_NOFOLLOW (never read): a real
    ``check`` process ends at once with exit 6 (skipped)."""
    fifo = memory_dir / "staging" / "pipe.json"
    os.mkfifo(fifo)
    result = subprocess.run(
        memstaged_cmd("check", str(fifo)),
        env=memstaged_env(tmp_path),
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 6
    assert b"skipped" in result.stdout


def test_check_hints_at_project_root_when_every_file_is_foreign(
    capsys: pytest.CaptureFixture[str], log_file: Path
) -> None:
    """Issue 13 item 5: on the shipped examples (whose project is not where the clone is) every
    file is foreign, and check says to pass --project-root; with it, the files are decided."""
    examples = sorted((REPO / "examples" / "memory-dir" / "staging").iterdir())
    code, _, err = run(capsys, "check", *map(str, examples))
    assert code == 4  # foreign, and one that is not even JSON
    assert "--project-root" in one_line_error(err)
    code, out, err = run(
        capsys, "check", "--project-root", "/x/example-project", *map(str, examples)
    )
    assert err == ""
    assert code == 4 and ": valid" in out and ": repaired" in out


def test_check_help_says_it_decides_as_once_and_gives_the_exit_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 13 item 5: ``check --help`` says it decides as --once would, with the codes."""
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    text = capsys.readouterr().out
    assert "decides exactly as --once" in text
    for line in ("0  valid", "3  repairable", "4  would be quarantined", "5  foreign"):
        assert line in text


# -- item 6: dry runs marked -----------------------------------------------------------------


def test_dry_run_decisions_are_marked_and_never_counted(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """Issue 13 item 6 (SPEC 7): after ``--once --dry-run``, ``log`` shows every decision
    marked ``(dry run)`` and ``stats`` counts none of them as decisions (it counts them apart);
    after a real run, they count."""
    _populated(project, memory_dir)
    assert run(capsys, "--once", "--dry-run", "--memory-dir", str(memory_dir))[0] == 0
    _, out, _ = run(capsys, "log", "--decision", "quarantined")
    assert "quarantined (dry run)" in out
    _, out, _ = run(capsys, "stats", "--json")
    stats = json.loads(out)
    assert stats["total"] == 0 and stats["decisions"]["quarantined"] == 0
    assert stats["dry_run"] == 4
    assert run(capsys, "--once", "--memory-dir", str(memory_dir))[0] == 0
    stats = json.loads(run(capsys, "stats", "--json")[1])
    assert stats["decisions"]["quarantined"] == 1 and stats["total"] == 4


# -- inspection output -----------------------------------------------------------------------


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
    _populated(project, memory_dir)
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


def _events(log_file: Path, stamps: list[float]) -> None:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("w") as fh:
        for i, stamp in enumerate(stamps):
            when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stamp)) + ".000001Z"
            event = {
                "timestamp": when,
                "level": "info",
                "event": "decision",
                "decision": "valid",
                "path": f"/m/staging/f{i}.json",
                "memory_dir": "/m",
            }
            fh.write(json.dumps(event) + "\n")


def test_lines_reverse_and_journalctl_words_for_days(
    capsys: pytest.CaptureFixture[str], log_file: Path
) -> None:
    """Issue 13: one line per event; ``-n``, ``--reverse`` and ``--since today/yesterday``
    (local midnight, as journalctl takes them), ``--until today``."""
    now = time.time()
    lt = time.localtime(now)
    midnight = time.mktime((lt.tm_year, lt.tm_mon, lt.tm_mday, 0, 0, 0, 0, 0, -1))
    _events(log_file, [midnight - 40 * 3600, midnight - 12 * 3600, now])

    def names(out: str) -> list[str]:  # time, decision, project label, file name (issue 22)
        return [line.split()[4] for line in out.splitlines()]

    assert names(run(capsys, "log")[1]) == ["f0.json", "f1.json", "f2.json"]
    assert names(run(capsys, "log", "--reverse")[1]) == ["f2.json", "f1.json", "f0.json"]
    assert names(run(capsys, "log", "-n", "2")[1]) == ["f1.json", "f2.json"]
    assert names(run(capsys, "log", "-n", "2", "--reverse")[1]) == ["f2.json", "f1.json"]
    assert names(run(capsys, "log", "--since", "today")[1]) == ["f2.json"]
    assert names(run(capsys, "log", "--since", "yesterday")[1]) == ["f1.json", "f2.json"]
    assert names(run(capsys, "log", "--until", "today")[1]) == ["f0.json", "f1.json"]
    code, _, err = run(capsys, "log", "--follow", "--reverse")
    assert code == 2 and "exclude" in one_line_error(err)


def test_argparse_errors_are_one_line_and_not_doubled(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 13: argparse errors said ``memstaged: memstaged: ...``; now once, and one line."""
    code, _, err = run(capsys, "log", "--lines", "many")
    assert code == 2
    line = one_line_error(err)
    assert line.startswith("memstaged log: argument -n/--lines")
    assert "memstaged: memstaged" not in line


def test_on_a_terminal_log_goes_through_the_pager_and_a_quitting_pager_is_fine(
    tmp_path: Path,
) -> None:
    """Issue 13: on a TTY ``log`` writes to ``$PAGER`` (here one that keeps the first 300
    bytes and quits, as a reader pressing q after the first screen): exit 0, no traceback,
    and the pager got the first lines; ``--no-pager`` writes to the terminal itself."""
    log_file = tmp_path / "decisions.jsonl"
    _events(log_file, [time.time() - 60] * 20_000)
    kept = tmp_path / "pager-saw"
    env = memstaged_env(tmp_path, MEMSTAGED_LOG_FILE=str(log_file))
    env["PAGER"] = f"sh -c 'head -c 300 > {kept}'"
    env.pop("MEMSTAGED_PAGER", None)
    code, shown = pty_run(memstaged_cmd("log"), env)
    assert code == 0, shown[-2000:]
    assert b"Traceback" not in shown
    assert kept.read_bytes().startswith(b"20")  # the first event's line: the date
    assert b"f0.json" in kept.read_bytes()
    code, shown = pty_run(memstaged_cmd("log", "-n", "1", "--no-pager"), env)
    assert code == 0
    assert b"f19999.json" in shown


def test_on_an_80_column_terminal_each_event_and_record_is_one_line(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """Issue 13: on a terminal, ``log`` drew a box table (5,000 events became 20,671 lines at
    80 columns) and ``deadletter list`` wrapped each ID over six lines. On an 80x24 pty, each
    event and each record is exactly one line (the terminal may fold it, the output does not),
    a record's line starts with its full ID, and the ID given to ``show`` finds it."""
    _populated(project, memory_dir)
    env = memstaged_env(tmp_path)
    code, _ = pty_run(memstaged_cmd("--once", "--memory-dir", str(memory_dir)), env)
    assert code == 0
    events = read_events(Path(env["MEMSTAGED_LOG_FILE"]))
    code, shown = pty_run(memstaged_cmd("log", "--no-pager", "--color", "never"), env)
    assert code == 0
    lines = [ln for ln in shown.decode().split("\r\n") if ln.strip()]
    assert len(lines) == len(events), lines
    assert all(ln.startswith("20") and len(ln) > 80 for ln in lines if "staging/" in ln)
    records = sorted(p.stem for p in (memory_dir / "deadletter").glob("*.json"))
    assert records
    argv = ["deadletter", "list", "--no-pager", "--color", "never", "--memory-dir"]
    code, shown = pty_run(memstaged_cmd(*argv, str(memory_dir)), env)
    assert code == 0
    lines = [ln for ln in shown.decode().split("\r\n") if ln.strip()]
    assert sorted(ln.split("  ")[0] for ln in lines) == records, lines
    show = ["deadletter", "show", records[0], "--no-pager", "--memory-dir", str(memory_dir)]
    code, shown = pty_run(memstaged_cmd(*show), env)
    assert code == 0 and f"record {records[0]}".encode() in shown


def test_repaired_lines_on_a_terminal_say_which_repair(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """Issue 13: the daemon's and --once's console line on a TTY names the repair."""
    _populated(project, memory_dir)
    env = memstaged_env(tmp_path)
    code, shown = pty_run(memstaged_cmd("--once", "--memory-dir", str(memory_dir)), env)
    assert code == 0
    assert b"repaired by R1 at candidates.lessons[0].triggers" in shown


def test_a_repair_behind_added_categories_is_still_named_on_a_terminal(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """Issue 13 ("repaired lines on a TTY don't say which repair"): the demo's
    session-no-triggers.json lacks three categories and a lesson's triggers; its line on a
    terminal, from ``--once`` and from ``memstaged log``, names R1 and where, instead of three
    R5s and "(+1 more)"."""
    doc = staging_doc(project, "no-triggers", candidates={"lessons": [lesson(triggers=[])]})
    for category in ("preferences", "decisions", "domain"):
        del doc["candidates"][category]
    write(memory_dir / "staging" / "no-triggers.json", doc)
    _old(memory_dir / "staging" / "no-triggers.json")
    env = memstaged_env(tmp_path)
    named = b"repaired by R1 at candidates.lessons[0].triggers; R5 at candidates.preferences"
    code, shown = pty_run(memstaged_cmd("--once", "--memory-dir", str(memory_dir)), env)
    assert code == 0 and named in shown, shown
    code, shown = pty_run(memstaged_cmd("log", "--no-pager"), env)
    assert code == 0 and named in shown, shown


def test_once_summary_as_json_and_into_a_closed_pipe(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """Issue 13: ``--once --json`` prints one JSON summary per memory dir; ``--once | head``
    that stopped reading does not turn a finished run into exit 1 (every file was decided)."""
    _populated(project, memory_dir)
    env = memstaged_env(tmp_path)
    cmd = " ".join(memstaged_cmd("--once", "--json", "--memory-dir", str(memory_dir)))
    result = subprocess.run(
        ["bash", "-c", f'{cmd} | head -0; echo "status=${{PIPESTATUS[0]}}"'],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert b"status=0" in result.stdout, result.stderr
    assert b"Traceback" not in result.stderr
    result = subprocess.run(
        memstaged_cmd("--once", "--json", "--memory-dir", str(memory_dir)),
        env=env,
        capture_output=True,
        timeout=60,
        check=True,
        cwd=REPO,
    )
    [summary] = [json.loads(line) for line in result.stdout.splitlines()]
    assert summary["memory_dir"] == str(memory_dir)
    # fix.json's rewrite was looked at by the first run: nothing is read again (issue 21 item 3)
    assert summary["total"] == 3 and summary["unchanged"] == 3 and summary["dry_run"] is False


def _into_closed_pipe(argv: list[str], env: dict[str, str]) -> int:
    """``memstaged ARGV | head -0``: the exit code of memstaged, whose reader left at once."""
    cmd = " ".join(shlex.quote(a) for a in memstaged_cmd(*argv))
    result = subprocess.run(
        ["bash", "-c", f'{cmd} | head -0; echo "status=${{PIPESTATUS[0]}}"'],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert b"Traceback" not in result.stderr, result.stderr
    return int(result.stdout.decode().rpartition("status=")[2])


def test_a_verdict_survives_a_reader_that_left(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """Issue 13 (``--once | head -1`` exited 1 though every file was decided), the same for
    the commands whose exit code is a verdict or whose work changes things: ``check F | head``
    exits 4 for a file that would be quarantined (it said 0), ``status | head`` 1 when
    something needs care, and ``deadletter recover --all | head`` carries the recovery out to
    the end and exits as it would have."""
    files = _populated(project, memory_dir)
    env = memstaged_env(tmp_path)
    assert _into_closed_pipe(["check", str(files["quarantined"]), str(files["valid"])], env) == 4
    shutil.copytree(
        REPO / "examples" / "memory-dir" / "staging", memory_dir / "staging", dirs_exist_ok=True
    )
    for path in (memory_dir / "staging").iterdir():
        _old(path)
    run_once = subprocess.run(
        memstaged_cmd("--once", "--project-root", str(project), "--memory-dir", str(memory_dir)),
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert run_once.returncode == 0, run_once.stderr
    assert _into_closed_pipe(["status", "--memory-dir", str(memory_dir)], env) == 1
    recover = ["deadletter", "recover", "--all", "--memory-dir", str(memory_dir)]
    assert _into_closed_pipe(recover, env) == 1  # a lesson without source_evidence stays
    assert (memory_dir / "staging" / "session-one-bad-lesson.recovered-1.json").exists()


def _half_written_ahead(memory_dir: Path) -> None:
    """A half-written file dated a day ahead: it settles counting from when memstaged first sees
    it (SPEC 5), not from its write, which a busy machine may have made seconds before."""
    path = memory_dir / "staging" / "half.json"
    write(path, b'{"schemaVersion": 1, "sess')
    ahead = time.time() + 86_400
    os.utime(path, (ahead, ahead))


def test_a_long_settle_wait_says_what_it_waits_for(
    capsys: pytest.CaptureFixture[str], memory_dir: Path, log_file: Path
) -> None:
    """Issue 13: ``--once`` waiting for a file still being written says so on stderr, naming
    the file and the settle interval, instead of a silent pause. The file is dated ahead, so
    that it settles from when ``--once`` first sees it: a run that starts late on a busy machine
    still has the whole interval to wait (issue 19 item 8)."""
    _half_written_ahead(memory_dir)
    code, _, err = run(capsys, "--once", "--settle", "3", "--memory-dir", str(memory_dir))
    assert code == 0
    waiting = [line for line in err.splitlines() if "waiting up to" in line]
    assert len(waiting) == 1
    assert "half.json" in waiting[0] and "settle interval (3s)" in waiting[0]


def test_the_settle_wait_is_one_line_on_a_terminal_too(tmp_path: Path, memory_dir: Path) -> None:
    """Issue 13: on an 80-column terminal, where ``--once`` shows a progress bar, the line that
    says what it waits for is one line, not hard-wrapped at 80 columns by the bar's console
    (a path cut in two cannot be copied)."""
    _half_written_ahead(memory_dir)
    env = memstaged_env(tmp_path)
    argv = memstaged_cmd("--once", "--settle", "3", "--memory-dir", str(memory_dir))
    code, shown = pty_run(argv, env)
    assert code == 0, shown
    [line] = [ln for ln in shown.split(b"\n") if b"waiting up to" in ln]
    assert len(line) > 80
    assert str(memory_dir).encode() in line and b"settle interval (3s): half.json" in line


def test_the_busy_error_is_one_unwrapped_line(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """Issue 13: ``--once`` on a memory dir a daemon works on says so on one line, whatever the
    width (rich wrapped it at 80 columns into a pipe), and exits 1."""
    env = memstaged_env(tmp_path, COLUMNS="30")
    log = Path(env["MEMSTAGED_LOG_FILE"])
    with daemon([memory_dir], env):
        assert wait_for(lambda: any(e.get("event") == "ready" for e in read_events(log)), 30)
        result = subprocess.run(
            memstaged_cmd("--once", "--memory-dir", str(memory_dir)),
            env=env,
            capture_output=True,
            timeout=60,
            check=False,
            cwd=REPO,
        )
    assert result.returncode == 1
    lines = [ln for ln in result.stderr.decode().splitlines() if "already decides" in ln]
    assert len(lines) == 1 and str(memory_dir) in lines[0]


def test_the_daemon_says_when_staging_cannot_be_read(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """Issue 13 item 3, the daemon's side: with ``staging/`` unreadable (``chmod 000``, a normal
    user), the daemon does not just log ``ready``: an error event ``staging_unreadable``
    naming the directory and the cause comes first. As root, the run drops the capabilities
    that let root read anything (``setpriv``)."""
    prefix = without_dac_override()
    env = memstaged_env(tmp_path)
    log = Path(env["MEMSTAGED_LOG_FILE"])
    (memory_dir / "staging").chmod(0)
    proc = subprocess.Popen(
        [*prefix, *memstaged_cmd("--memory-dir", str(memory_dir))],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    try:
        assert wait_for(lambda: any(e.get("event") == "ready" for e in read_events(log)), 30)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        (memory_dir / "staging").chmod(0o700)
    assert code == 0
    events = [e.get("event") for e in read_events(log)]
    [unreadable] = [e for e in read_events(log) if e.get("event") == "staging_unreadable"]
    assert events.index("staging_unreadable") < events.index("ready")
    assert unreadable["level"] == "error"
    assert unreadable["path"] == str(memory_dir / "staging")
    assert "ermission denied" in unreadable["error"]


# -- issue 10 item 17: private directories -----------------------------------------------------


def test_every_directory_memstaged_creates_is_0700(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """Issue 10 item 17 (SPEC 6): with ``$XDG_STATE_HOME`` not there yet, each directory
    memstaged creates for its state (the parents too) is 0700, whatever the umask."""
    _populated(project, memory_dir)
    state = tmp_path / "new" / "state"
    env = memstaged_env(tmp_path, XDG_STATE_HOME=str(state))
    env.pop("MEMSTAGED_LOG_FILE")
    result = subprocess.run(
        [
            "sh",
            "-c",
            'umask 022; exec "$@"',
            "sh",
            *memstaged_cmd("--once", "--memory-dir", str(memory_dir)),
        ],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    created = [tmp_path / "new", state, state / "memstaged", state / "memstaged" / "seen"]
    modes = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.stat().st_mode) for p in created}
    assert modes == {k: 0o700 for k in modes}
