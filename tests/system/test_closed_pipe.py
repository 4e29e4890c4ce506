"""memstaged into a pipe whose reader left (``memstaged ... | head``): a finished run keeps its
exit code, and a recovery is carried out to its end (issue 13). Real processes, a real shell
pipeline."""

from __future__ import annotations

import json
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
    REPO,
    memstaged_cmd,
    memstaged_env,
    run_once,
)

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
