"""Tests never write into the real user's home (issue 19 item 9).

``tests/conftest.py`` points ``HOME`` and the ``XDG_*`` directories at each test's temp dir, and
fails the run when anything memstaged could write under the real home changed. These tests run
memstaged as a user would (in this process, and as a separate pytest run whose "real home" is a
temp dir) and look at where the bytes land.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.decision_log import read_events
from support.documents import staging_doc, write

from memstaged.cli.main import main

TESTS = Path(__file__).resolve().parents[1]


def _memory_dir(tmp_path: Path) -> Path:
    project = tmp_path / "example-project"
    mdir = project / ".pi" / "memory" / "project"
    (mdir / "staging").mkdir(parents=True)
    write(mdir / "staging" / "a.json", staging_doc(project, "a"))
    return mdir


def test_a_decision_is_logged_in_the_tests_own_home_even_after_monkeypatch_undo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 19 item 9: a test that calls ``monkeypatch.undo()`` (as two of test_cmd_deadletter's
    did) and then runs memstaged with the default log still logs into its own temp dir's
    ``~/.local/state/memstaged/decisions.jsonl``, not the real user's; so does a subprocess."""
    monkeypatch.setenv("XDG_STATE_HOME", "/nonexistent")
    monkeypatch.undo()
    for name in ("HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR"):
        assert Path(os.environ[name]).is_relative_to(tmp_path), name
    mdir = _memory_dir(tmp_path)
    assert main(["--once", "--memory-dir", str(mdir)]) == 0
    capsys.readouterr()
    log = tmp_path / "home" / ".local" / "state" / "memstaged" / "decisions.jsonl"
    assert [e["decision"] for e in read_events(log) if e["event"] == "decision"] == ["valid"]
    write(mdir / "staging" / "b.json", b"{nope")
    os.utime(mdir / "staging" / "b.json", (1_700_000_000, 1_700_000_000))
    done = subprocess.run(
        [sys.executable, "-m", "memstaged", "--once", "--memory-dir", str(mdir)],
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert [e["decision"] for e in read_events(log) if e["event"] == "decision"] == [
        "valid",
        "quarantined",
    ]


_INNER_TEST = """
import os
from pathlib import Path

from memstaged.cli.main import main

#: Read when the module is imported, as a careless test might: the real home's decision log.
REAL_LOG = Path(os.environ["HOME"]) / ".local" / "state" / "memstaged" / "decisions.jsonl"


def test_quarantines_a_file(tmp_path, monkeypatch):
    mdir = tmp_path / "p" / ".pi" / "memory" / "project"
    (mdir / "staging").mkdir(parents=True)
    (mdir / "staging" / "bad.json").write_bytes(b"{nope")
    os.utime(mdir / "staging" / "bad.json", (1_700_000_000, 1_700_000_000))
    if os.environ.get("WRITE_REAL"):
        monkeypatch.setenv("MEMSTAGED_LOG_FILE", str(REAL_LOG))
    assert main(["--once", "--memory-dir", str(mdir)]) == 0
"""


@pytest.mark.parametrize("write_real", [False, True], ids=["own-home", "real-home"])
def test_the_run_fails_when_a_test_writes_into_the_real_home(
    tmp_path: Path, write_real: bool
) -> None:
    """Issue 19 item 9: a pytest run (with this suite's conftest) in which a test writes into
    the real home's ``.local/state/memstaged/decisions.jsonl`` fails, naming the file; the same
    run writing only in its temp dir passes. The "real home" is a temp dir here."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_bytes((TESTS / "conftest.py").read_bytes())
    (suite / "test_inner.py").write_text(_INNER_TEST)
    # The conftest imports the support package, found as this suite finds it.
    (suite / "pytest.ini").write_text(f"[pytest]\npythonpath = {TESTS}\n")
    real_home = tmp_path / "real-home"
    (real_home / ".local" / "state" / "memstaged").mkdir(parents=True)
    real_log = real_home / ".local" / "state" / "memstaged" / "decisions.jsonl"
    real_log.write_text('{"event": "start"}\n')
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "MEMSTAGED_", "PYTEST"))
    }
    env["HOME"] = str(real_home)
    if write_real:
        env["WRITE_REAL"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite)],
        check=False,
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if write_real:
        assert done.returncode != 0, done.stdout
        assert "the tests changed the real home" in done.stdout, done.stdout
        assert f"changed: {real_log}" in done.stdout, done.stdout
        assert "1 passed, 1 error" in done.stdout, done.stdout
    else:
        assert done.returncode == 0, done.stdout
        assert real_log.read_text() == '{"event": "start"}\n'


def test_the_inspection_bench_run_on_its_own_keeps_memstaged_in_its_work_dir(
    tmp_path: Path,
) -> None:
    """Issue 19 item 9, ``bench/``: ``python bench/inspection.py`` run on its own (not in
    run.py's sandbox) seeds its data with ``memstaged --once``, whose seen cache went to the
    caller's ``~/.local/state/memstaged``; it now goes to the bench's own work dir."""
    sys.path.insert(0, str(TESTS.parent / "bench"))
    try:
        import inspection
    finally:
        sys.path.remove(str(TESTS.parent / "bench"))
    work = tmp_path / "work"
    work.mkdir()
    _, decisions = inspection.seed(work)
    assert decisions
    caller_home = Path(os.environ["HOME"])
    assert not (caller_home / ".local" / "state" / "memstaged").exists()
    assert list((work / "home" / ".local" / "state" / "memstaged" / "seen").iterdir())
