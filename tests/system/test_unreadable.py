"""Files and directories memstaged may not read (SPEC 5: deferred, with the reason), as a user
who may not read them: ``nobody`` (:mod:`support.as_nobody`), or root without the capabilities
that let it read anything (``setpriv``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import as_nobody
from support.decision_log import read_events
from support.documents import malformed, put, repairable
from support.helpers import (
    REPO,
    make_memory_dir,
    memstaged_cmd,
    memstaged_env,
    project_root_of,
    run_once,
    without_dac_override,
)
from support.waiting import wait_for

pytestmark = pytest.mark.usefixtures("plain_output")


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
        assert wait_for(
            lambda: any(e.get("event") == "ready" for e in read_events(log, strict=False)), 30
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        (memory_dir / "staging").chmod(0o700)
    assert code == 0
    events = [e.get("event") for e in read_events(log, strict=False)]
    [unreadable] = [
        e for e in read_events(log, strict=False) if e.get("event") == "staging_unreadable"
    ]
    assert events.index("staging_unreadable") < events.index("ready")
    assert unreadable["level"] == "error"
    assert unreadable["path"] == str(memory_dir / "staging")
    assert "ermission denied" in unreadable["error"]


def test_an_unreadable_staging_dir_is_an_error_not_a_silent_success(tmp_path: Path) -> None:
    """Issue 13 item 3: ``chmod 000 staging/`` as a normal user: ``--once`` exits 1 and says
    why in one line. Root reads anything, so as root the run drops the capabilities that let
    it (``setpriv``), which makes it a normal user as far as permissions go."""
    prefix = without_dac_override()
    mdir = make_memory_dir(tmp_path)
    env = memstaged_env(tmp_path / "work")
    (mdir / "staging").chmod(0)
    try:
        done = run_once(mdir, env, prefix=prefix)
    finally:
        (mdir / "staging").chmod(0o700)
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.decode().splitlines() if line.startswith("memstaged:")]
    assert len(lines) == 1 and "staging" in lines[0] and "ermission denied" in lines[0], lines


def test_a_file_memstaged_may_not_read(tmp_path: Path) -> None:
    """Run as an unprivileged user (root would bypass permissions), ``--once`` meets a file it
    may not read: it is left as it is, ``deferred`` with "permission denied" (exit 1), and the
    other files are decided. Issue 29 item 14: passes wherever the clone is (in /root too), as
    ``nobody`` runs memstaged from a venv it can reach (:mod:`support.as_nobody`)."""
    with _unreadable_world(fix=True) as (base, mdir, env, secret):
        result = _as_nobody(base, env, "--once", "--settle", "0", "--memory-dir", str(mdir))
        assert result.returncode == 1, result.stderr
        assert (mdir / "staging" / "secret.json").read_bytes() == secret
        events = [
            e
            for e in read_events(base / "decisions.jsonl", strict=False)
            if e.get("event") == "decision" and not e.get("own_rewrite")
        ]
        by_name = {Path(e["path"]).name: e for e in events}
        # Said with what the run printed: a bare KeyError said nothing (issue 19 item 8).
        assert set(by_name) == {"secret.json", "fix.json"}, (events, result.stderr)
        assert by_name["secret.json"]["decision"] == "deferred"
        assert "permission denied" in by_name["secret.json"]["reasons"][0]
        assert by_name["fix.json"]["decision"] == "repaired"


@contextlib.contextmanager
def _unreadable_world(*, fix: bool) -> Iterator[tuple[Path, Path, dict[str, str], bytes]]:
    """A memory dir owned by ``nobody`` whose ``secret.json`` (malformed) only root may read,
    and with ``fix`` a repairable ``fix.json``: (base, memory dir, environment, secret's bytes).
    In a workspace ``nobody`` can reach (a test's tmp_path may not be)."""
    uid, gid = as_nobody.ids()
    with as_nobody.workspace("memstaged-nobody-") as base:
        mdir = make_memory_dir(base)
        root = project_root_of(mdir)
        secret = put(mdir / "staging" / "secret.json", malformed(root))
        os.chmod(mdir / "staging" / "secret.json", 0o600)  # owned by root
        if fix:
            put(mdir / "staging" / "fix.json", repairable(root))
        for path in [base, *base.rglob("*")]:
            if path.name != "secret.json":
                os.chown(path, uid, gid)
        env = memstaged_env(base)
        env["HOME"] = str(base)
        os.chown(base / "xdg-config", uid, gid)
        yield base, mdir, env, secret


def _as_nobody(base: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``memstaged ARGS`` as ``nobody`` (root would bypass permissions)."""
    return as_nobody.run_memstaged(*args, env=env, cwd=base)


def test_check_status_and_once_agree_on_a_file_memstaged_may_not_read() -> None:
    """Issue 20 (one reader, one answer): a file memstaged may not read is ``deferred`` with
    "permission denied" (SPEC 5) for ``check`` (exit 1), ``status`` and ``--once`` alike;
    ``check`` and ``status`` said ``unreadable`` (exit 2) where ``--once`` deferred it. Issue 29
    item 14: run as ``nobody`` from a venv it can reach, in a clone under /root too."""
    with _unreadable_world(fix=False) as (base, mdir, env, secret):
        target = str(mdir / "staging" / "secret.json")
        check = _as_nobody(base, env, "check", "--json", "--settle", "0", target)
        assert check.returncode == 1, (check.stdout, check.stderr)
        [line] = [json.loads(x) for x in check.stdout.splitlines() if x.strip()]
        assert line["decision"] == "deferred", line
        status = _as_nobody(base, env, "status", "--json", "--files", "--memory-dir", str(mdir))
        [report] = [json.loads(x) for x in status.stdout.splitlines() if x.strip()]
        assert report["staging"]["deferred"] == 1, report
        [entry] = report["files"]
        assert entry["decision"] == "deferred", entry
        assert "permission denied" in entry["reason"], entry
        assert any("secret.json" in a for a in report["attention"]), report
        once = _as_nobody(base, env, "--once", "--settle", "0", "--memory-dir", str(mdir))
        assert once.returncode == 1, once.stderr
        [event] = [
            e
            for e in read_events(base / "decisions.jsonl", strict=False)
            if e.get("event") == "decision"
        ]
        assert event["decision"] == "deferred"
        assert entry["reason"] == event["reasons"][0]
        assert (mdir / "staging" / "secret.json").read_bytes() == secret


def test_a_config_dir_memstaged_may_not_enter_is_one_line_for_every_command(
    tmp_path: Path,
) -> None:
    """The default config file behind a directory memstaged may not search (``chmod 000
    ~/.config/memstaged``) gave a ``PermissionError`` traceback from every command (exit 1).
    It is one line naming the file and the cause: a usage error (exit 2), UNKNOWN (exit 3) for
    ``status --check``; the file is not silently left out."""
    prefix = without_dac_override()
    env = memstaged_env(tmp_path)
    mdir = make_memory_dir(tmp_path)
    config_dir = Path(env["XDG_CONFIG_HOME"]) / "memstaged"
    config_dir.mkdir()
    (config_dir / "config.toml").write_text("settle = 0\n")
    config_dir.chmod(0)
    try:
        for args, code in (
            (["config", "check"], 2),
            (["config", "show"], 2),
            (["status"], 2),
            (["status", "--check"], 3),
            (["--once"], 2),
            (["deadletter", "list"], 2),
        ):
            result = subprocess.run(
                [*prefix, *memstaged_cmd(*args)],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
                cwd=project_root_of(mdir),
            )
            output = (result.stdout + result.stderr).strip().splitlines()
            assert result.returncode == code, (args, result.stderr)
            assert len(output) == 1, (args, output)
            assert f"{config_dir / 'config.toml'}: cannot read: Permission denied" in output[0]
    finally:
        config_dir.chmod(0o700)
