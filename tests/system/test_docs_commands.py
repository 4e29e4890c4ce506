"""The shell commands of the README, docs/install.md and docs/inspection.md, run as written on
the demo's data.

Issue 13 ("The README, as written, must work"): a new user runs the README's blocks in order.
This test does the same: ``make demo`` in a temporary copy of the repository (with this venv, so
nothing is installed), then every command of every ```` ```sh ```` block of the two documents,
in order, in one shell (so the README's ``export`` holds for the commands after it), with HOME
and the XDG directories in the temporary directory. A command that does not work fails the test:
a usage or configuration error (exit 2), any exit code a document does not give memstaged
(0, 1 and 3-6 are outcomes: attention needed, repairable, ...), a traceback, or a time-out.

Only commands that need what a test machine cannot give are skipped, each with its reason
printed (:data:`SKIPPED`): nothing in the documents is special-cased by text.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Final

import pytest

REPO: Final = Path(__file__).resolve().parents[2]
DOCS: Final = ("README.md", "docs/install.md", "docs/inspection.md")
#: First word of a command -> why it is not run here.
SKIPPED: Final = {
    "make": "runs the build or test suite itself (make demo is what made the data)",
    "sudo": "installs Debian packages on the machine",
    "pipx": "builds and installs a second copy of memstaged from the registry",
    "systemctl": "needs a running systemd --user manager",
    "journalctl": "needs journald holding memstaged's entries",
    "$EDITOR": "interactive",
    "git": "updates the clone from its remote (the upgrade steps)",
}
#: memstaged subcommands that need a user manager, likewise.
SKIPPED_MEMSTAGED: Final = {"service": "needs a running systemd --user manager"}
#: The exit codes memstaged's documentation gives as outcomes (not failures) of a command.
OUTCOMES: Final = {0, 1, 3, 4, 5, 6}
_BLOCK: Final = re.compile(r"^```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)


def commands(text: str) -> list[str]:
    """The commands of a document's ```sh blocks, comments removed, in order."""
    found = []
    for block in _BLOCK.findall(text):
        for line in block.splitlines():
            if shlex.split(line, comments=True):
                found.append(line.strip())  # bash itself drops the comment
    return found


def skip_reason(command: str) -> str | None:
    words = shlex.split(command, comments=True)
    if words[0] in SKIPPED:
        return SKIPPED[words[0]]
    if words[0] == "jq" and shutil.which("jq") is None:
        return "jq is not installed on this machine"
    if words[0] == "memstaged" and len(words) > 1 and words[1] in SKIPPED_MEMSTAGED:
        return SKIPPED_MEMSTAGED[words[1]]
    return None


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the repository's demo inputs with ``make demo`` run in it on this venv."""
    work = tmp_path_factory.mktemp("readme")
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy2(REPO / name, work / name)
    shutil.copytree(REPO / "examples", work / "examples")
    (work / ".venv").symlink_to(REPO / ".venv")
    env = _env(work)
    # -o: the venv is this one; make must not rebuild it (nor install Debian packages).
    result = subprocess.run(
        ["make", "-o", ".venv/.installed-runtime", "-o", "sysdeps", "demo"],
        cwd=work,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    return work


def _env(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMSTAGED_", "XDG_"))}
    for name in ("JOURNAL_STREAM", "INVOCATION_ID", "NOTIFY_SOCKET", "PAGER", "NO_COLOR"):
        env.pop(name, None)
    home = work / "home"
    home.mkdir(exist_ok=True)
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_STATE_HOME=str(home / ".local" / "state"),
        EDITOR="true",
    )
    return env


def test_every_documented_command_works_on_the_demo(demo: Path) -> None:
    """Issue 13: each command of the documents' shell blocks (:data:`DOCS`) runs on the
    demo's data and exits with one of its documented outcomes, without a traceback; the README's
    recover example really recovers a candidate."""
    script = ["set -u", "cd " + shlex.quote(str(demo)), "exec </dev/null"]
    planned: list[tuple[str, str]] = []
    for doc in DOCS:
        for index, command in enumerate(commands((REPO / doc).read_text())):
            key = f"{doc}:{index}"
            reason = skip_reason(command)
            if reason is not None:
                print(f"skipped {key}: {command!r}: {reason}")
                continue
            planned.append((key, command))
            script += [
                f"echo '@@@ {key}' >&2",
                f"timeout 60 {command}" if not command.startswith("export ") else command,
                f'echo "@@@ {key} exit $?" >&2',
            ]
    assert planned, "the documents have no shell commands"
    result = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        env=_env(demo),
        capture_output=True,
        timeout=600,
        check=False,
    )
    stderr = result.stderr.decode(errors="replace")
    codes = dict(re.findall(r"^@@@ (\S+) exit (\d+)$", stderr, re.MULTILINE))
    problems = []
    for key, command in planned:
        code = codes.get(key)
        if code is None:
            problems.append(f"{key}: {command!r} never finished")
        elif int(code) not in OUTCOMES:
            section = stderr.split(f"@@@ {key}\n", 1)[-1].split("@@@", 1)[0]
            problems.append(f"{key}: {command!r} exited {code}: {section.strip()[-500:]}")
    assert "Traceback" not in stderr, stderr[-3000:]
    assert not problems, "\n".join(problems)
    recovered = demo / "demo/example-project/.pi/memory/project/staging"
    assert (recovered / "session-one-bad-lesson.recovered-1.json").exists()


def test_the_demo_logs_where_memstaged_log_finds_it(demo: Path) -> None:
    """Issue 13: after ``make demo`` and the README's ``export``, ``memstaged log`` shows the
    demo's decisions (the demo used to log to a file the next command never read)."""
    env = _env(demo)
    env["MEMSTAGED_CONFIG"] = str(demo / "demo" / "config.toml")
    out = subprocess.run(
        [str(REPO / ".venv/bin/memstaged"), "log", "--decision", "quarantined"],
        cwd=demo,
        env=env,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.decode()
    assert "session-truncated.json" in out
    assert "session-bad-trigger.json" in out


def test_the_demo_installs_no_dev_or_bench_extras() -> None:
    """Issue 13: ``make demo`` needs memstaged alone; the dev and bench extras are for ``make
    test`` and ``make bench`` (the demo's stamp installs ``-e .`` and nothing else)."""
    dry = subprocess.run(
        ["make", "-n", "-B", "-o", "sysdeps", "demo"],
        cwd=REPO,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.decode()
    installs = [line for line in dry.splitlines() if "pip install" in line and " -e " in line]
    assert installs, dry
    assert all("[dev" not in line and "bench" not in line for line in installs), installs
