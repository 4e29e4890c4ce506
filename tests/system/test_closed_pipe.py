"""memstaged into a pipe whose reader left (``memstaged ... | head``): a finished run keeps its
exit code, and a recovery is carried out to its end (issue 13). Real processes, a real shell
pipeline."""

from __future__ import annotations

import json
import os
import random
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.documents import (
    one_of_each,
    settled,
)
from support.helpers import (
    DEMO,
    KINDS,
    REPO,
    check_final,
    make_corpus,
    make_memory_dir,
    memstaged_cmd,
    memstaged_env,
    project_root_of,
    run_once,
    stopped,
    write_inputs,
)
from support.waiting import wait_for

pytestmark = pytest.mark.usefixtures("plain_output")


def test_once_summary_as_json_and_into_a_closed_pipe(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """Issue 13: ``--once --json`` prints one JSON summary per memory dir; ``--once | head``
    that stopped reading does not turn a finished run into exit 1 (every file was decided)."""
    one_of_each(project, memory_dir)
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
    files = one_of_each(project, memory_dir)
    env = memstaged_env(tmp_path)
    assert _into_closed_pipe(["check", str(files["quarantined"]), str(files["valid"])], env) == 4
    shutil.copytree(DEMO, memory_dir / "staging", dirs_exist_ok=True)
    for path in (memory_dir / "staging").iterdir():
        settled(path)
    once = run_once(memory_dir, env, "--project-root", str(project), timeout=60)
    assert once.returncode == 0, once.stderr
    assert _into_closed_pipe(["status", "--memory-dir", str(memory_dir)], env) == 1
    recover = ["deadletter", "recover", "--all", "--memory-dir", str(memory_dir)]
    assert _into_closed_pipe(recover, env) == 1  # a lesson without source_evidence stays
    assert (memory_dir / "staging" / "session-one-bad-lesson.recovered-1.json").exists()


def _run_lost(
    cmd: list[str], env: dict[str, str], cwd: Path, **stdout: Any
) -> subprocess.CompletedProcess[str]:
    """A command whose output cannot be written; its exit code and stderr."""
    return subprocess.run(
        cmd, env=env, stderr=subprocess.PIPE, text=True, timeout=120, check=False, cwd=cwd, **stdout
    )


def _lost_output_code(args: list[str]) -> int:
    """1, and 3 (UNKNOWN) for a monitoring plugin whose output is lost: not a WARNING."""
    return 3 if args == ["status", "--check"] else 1


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["--version"],
        ["status"],
        ["status", "--check"],
        ["stats"],
        ["config", "show"],
        ["--once", "--settle", "0"],
    ],
    ids=" ".join,
)
def test_output_that_cannot_be_written_is_one_line_and_not_success(
    tmp_path: Path, project: Path, memory_dir: Path, args: list[str]
) -> None:
    """stdout on a full device (``> /dev/full``) gave a traceback for status, stats, config
    show and --once, and a silent exit 0 for --help and --version (argparse drops the error).
    It is one line on stderr, and never exit 0: output was lost."""
    full = Path("/dev/full")
    if not full.exists():
        pytest.skip("no /dev/full here: stdout cannot be made to fail with ENOSPC")
    one_of_each(project, memory_dir)
    env = memstaged_env(tmp_path, MEMSTAGED_MEMORY_DIRS=str(memory_dir))
    with full.open("w") as stdout:
        result = _run_lost(memstaged_cmd(*args), env, project, stdout=stdout)
    lines = result.stderr.splitlines()
    assert result.returncode == _lost_output_code(args), result.stderr
    assert lines == ["memstaged: cannot write standard output: No space left on device"], lines


@pytest.mark.parametrize(
    "args", [["--help"], ["--version"], ["status"], ["status", "--check"]], ids=" ".join
)
def test_a_closed_stdout_is_one_line_and_not_success(
    tmp_path: Path, project: Path, memory_dir: Path, args: list[str]
) -> None:
    """stdout closed (``>&-``: Python's ``sys.stdout`` is None) gave an AttributeError
    traceback. It is one line, "it is closed", and never exit 0."""
    env = memstaged_env(tmp_path, MEMSTAGED_MEMORY_DIRS=str(memory_dir))
    command = " ".join(shlex.quote(word) for word in memstaged_cmd(*args))
    result = _run_lost(["bash", "-c", f"{command} >&-"], env, project)
    assert result.returncode == _lost_output_code(args), result.stderr
    assert result.stderr.splitlines() == ["memstaged: cannot write standard output: it is closed"]


def test_once_with_stderr_closed_decides_every_file(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """stderr closed (``2>&-``: Python's ``sys.stderr`` is None): the run raised an
    AttributeError as it set up its logging, decided nothing and exited 1, with nowhere to say
    so. It decides every file and exits 0; the decision log has every decision."""
    one_of_each(project, memory_dir)
    env = memstaged_env(tmp_path)
    command = " ".join(memstaged_cmd("--once", "--memory-dir", str(memory_dir)))
    result = _run_lost(["bash", "-c", f"{command} 2>&-"], env, project)
    assert result.returncode == 0, result.stdout
    log = Path(env["MEMSTAGED_LOG_FILE"]).read_text()
    decided = [json.loads(line) for line in log.splitlines()]
    assert {e["decision"] for e in decided if "decision" in e} >= {"valid", "repaired"}
    assert not (memory_dir / "staging" / "bad.json").exists()


def test_deciders_keep_no_file_of_a_run_started_without_stdin_and_stdout(tmp_path: Path) -> None:
    """stdin and stdout closed (``<&- >&-``): the decision log and the instance lock took
    descriptors 0 and 1, which the decider processes keep (as they keep 2), so a worker that
    outlived its run (stopped, its parent killed) held the instance lock, and the next run was
    refused as busy. They are opened above 2 (0-2 held on /dev/null): stopped as it writes its
    first temp, the run's workers hold neither file."""
    mdir = make_memory_dir(tmp_path)
    inputs = make_corpus(random.Random(7), 600, project_root_of(mdir), "fd-", kinds=KINDS[:8])
    write_inputs(mdir / "staging", inputs)
    env = memstaged_env(tmp_path, MEMSTAGED_WORKERS="2")
    command = " ".join(shlex.quote(w) for w in memstaged_cmd("--once", "--memory-dir", str(mdir)))
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {command} <&- >&-"],
        env={**env, "MEMSTAGED_CRASH_AT": "temp-created:1:STOP"},
        cwd=REPO,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_for(lambda: stopped(proc.pid) or proc.poll() is not None, 120)
        assert proc.poll() is None
        workers = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert workers, "no decider process started"
        held = {
            os.readlink(fd)
            for pid in workers
            for fd in Path(f"/proc/{pid}/fd").iterdir()
            if fd.is_symlink()
        }
        ours = [h for h in held if "decisions" in h or "instance" in h or h.endswith(".lock")]
        assert ours == [], ours
    finally:
        proc.kill()
        proc.wait()
    again = run_once(mdir, env, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert check_final(mdir, inputs) == []
