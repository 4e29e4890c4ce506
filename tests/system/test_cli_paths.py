"""Found by attacking the merged main: hostile path arguments to the installed command.
A user error is one line on stderr and exit 2, never a traceback (STYLE, SPEC 5 "refuses, with
one line and exit 2, a --memory-dir that is not one")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.helpers import without_dac_override

#: Every command that takes --memory-dir and checks it (the daemon last: it must not start).
COMMANDS = [
    ["--once"],
    ["status"],
    ["deadletter", "list"],
    ["deadletter", "recover", "--all"],
    [],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "daemon")
def test_memory_dir_name_too_long_is_one_line_and_exit_2(
    tmp_path: Path, command: list[str]
) -> None:
    """A --memory-dir whose last component is 300 bytes (the kernel says ENAMETOOLONG) is not a
    memory dir: one line naming it, exit 2, no traceback, and the daemon does not start."""
    too_long = tmp_path / ("a" * 300)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTAGED_")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "c"), XDG_STATE_HOME=str(tmp_path / "s"))
    proc = subprocess.run(
        [sys.executable, "-m", "memstaged", *command, "--memory-dir", str(too_long)],
        env=env,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=30,
        check=False,
    )
    err = proc.stderr.decode(errors="replace")
    assert "Traceback" not in err, err
    assert proc.returncode == 2
    assert len(err.strip().splitlines()) == 1, err


def test_a_linked_memory_dir_among_glob_matches_leaves_the_others_decided(tmp_path: Path) -> None:
    """SPEC 6: below the configured path a link is "not followed, and is reported"; README: "a
    glob match that is not a memory dir is just not one". With projects a, b and c under one
    glob and b's memory dir a symbolic link to a directory elsewhere, ``--once`` must decide the
    files of a and c (quarantine their malformed files), leave the file behind b's link alone,
    and exit 0 or 1, not stop at b with exit 2."""
    src = tmp_path / "src"
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "staging").mkdir(parents=True)
    (elsewhere / "staging" / "e.json").write_bytes(b"{not json")
    for name in ("a", "c"):
        staging = src / name / ".pi" / "memory" / "project" / "staging"
        staging.mkdir(parents=True)
        (staging / f"{name}.json").write_bytes(b"{not json")
    (src / "b" / ".pi" / "memory").mkdir(parents=True)
    (src / "b" / ".pi" / "memory" / "project").symlink_to(elsewhere)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTAGED_")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "c"), XDG_STATE_HOME=str(tmp_path / "s"))
    pattern = str(src / "*" / ".pi" / "memory" / "project")
    proc = subprocess.run(
        [sys.executable, "-m", "memstaged", "--once", "--settle", "0", "--memory-dir", pattern],
        env=env,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
        check=False,
    )
    assert (elsewhere / "staging" / "e.json").read_bytes() == b"{not json"
    assert proc.returncode in (0, 1), proc.stderr.decode(errors="replace")[-500:]
    for name in ("a", "c"):
        assert not (src / name / ".pi" / "memory" / "project" / "staging" / f"{name}.json").exists()


def _as_a_user(python_args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """``python <python_args>`` obeying file permissions (root's DAC override dropped)."""
    return subprocess.run(
        [*without_dac_override(), sys.executable, *python_args],
        env=env,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
        check=False,
    )


def test_an_unwritable_glob_match_leaves_the_others_decided(tmp_path: Path) -> None:
    """A glob's match is only what it matched (README): with projects a and b under one glob
    and a's memory dir not writable (mode 0500, run without root's DAC override), ``--once``
    says so in one line, leaves a's file alone, quarantines b's malformed file and exits 1 (a
    memory dir left undecided), where it used to stop everything with exit 2. The same memory
    dir named literally is still exit 2."""
    src = tmp_path / "src"
    for name in ("a", "b"):
        staging = src / name / ".pi" / "memory" / "project" / "staging"
        staging.mkdir(parents=True)
        (staging / f"{name}.json").write_bytes(b"{not json")
    locked = src / "a" / ".pi" / "memory" / "project"
    os.chmod(locked / "staging", 0o500)
    os.chmod(locked, 0o500)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTAGED_")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "c"), XDG_STATE_HOME=str(tmp_path / "s"))

    once = ["-m", "memstaged", "--once", "--settle", "0", "--memory-dir"]
    try:
        proc = _as_a_user([*once, str(src / "*" / ".pi" / "memory" / "project")], env)
        literal = _as_a_user([*once, str(locked)], env)
    finally:
        os.chmod(locked, 0o700)
        os.chmod(locked / "staging", 0o700)
    stderr = proc.stderr.decode(errors="replace")
    assert proc.returncode == 1, stderr[-500:]
    assert f"memstaged: memory dir {locked}: not writable" in stderr.splitlines()
    assert "Traceback" not in stderr
    assert (locked / "staging" / "a.json").read_bytes() == b"{not json"
    assert not (src / "b" / ".pi" / "memory" / "project" / "staging" / "b.json").exists()
    assert literal.returncode == 2
    assert literal.stderr.decode().splitlines() == [f"memstaged: memory dir {locked}: not writable"]


@pytest.mark.parametrize("key", ["memory_dirs", "log_file"])
def test_nul_in_a_config_path_is_one_line_and_exit_2(tmp_path: Path, key: str) -> None:
    """A config file is hostile input too (README: wrong values are errors, exit 2, one line
    naming the key). TOML lets a string hold U+0000 (``"\\u0000"``), which no path can: ``--once``
    with such a ``memory_dirs`` entry or ``log_file`` must say so in one line and exit 2."""
    value = json.dumps("/tmp/a\u0000b").replace("\\u0000", "\\u0000")
    conf = tmp_path / "config.toml"
    conf.write_text(f"{key} = [{value}]\n" if key == "memory_dirs" else f"{key} = {value}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTAGED_")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "c"), XDG_STATE_HOME=str(tmp_path / "s"))
    proc = subprocess.run(
        [sys.executable, "-m", "memstaged", "--once", "--config", str(conf)],
        env=env,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=30,
        check=False,
        cwd=tmp_path,
    )
    err = proc.stderr.decode(errors="replace")
    assert "Traceback" not in err, err[-300:]
    assert proc.returncode == 2
    assert len(err.strip().splitlines()) == 1, err


def test_purge_refuses_an_unwritable_glob_match_before_changing_anything(tmp_path: Path) -> None:
    """docs/inspection.md: ``deadletter purge --yes`` over a config file's glob with projects a
    and z, z's memory dir not writable: one line naming z, exit 2, and a's records and original
    are all still there (it used to purge the matches before the failing one, then exit 2)."""
    src = tmp_path / "src"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTAGED_")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "c"), XDG_STATE_HOME=str(tmp_path / "s"))
    env["MEMSTAGED_LOG_FILE"] = str(tmp_path / "log.jsonl")
    config = tmp_path / "config.toml"
    config.write_text(f"memory_dirs = [{json.dumps(str(src / '*/.pi/memory/project'))}]\n")
    for name in ("a", "z"):
        staging = src / name / ".pi" / "memory" / "project" / "staging"
        staging.mkdir(parents=True)
        (staging / f"{name}.json").write_bytes(b"{not json")
    base = [sys.executable, "-m", "memstaged", "--config", str(config)]
    once = subprocess.run(
        [*base, "--once", "--settle", "0"], env=env, capture_output=True, check=False
    )
    assert once.returncode == 0, once.stderr
    kept = sorted(p.name for p in (src / "a").rglob("deadletter/**/*") if p.is_file())
    assert kept
    locked = src / "z" / ".pi" / "memory" / "project"
    os.chmod(locked, 0o500)
    try:
        proc = _as_a_user([*base[1:], "deadletter", "purge", "--older-than", "0s", "--yes"], env)
    finally:
        os.chmod(locked, 0o700)
    assert sorted(p.name for p in (src / "a").rglob("deadletter/**/*") if p.is_file()) == kept
    assert proc.returncode == 2
    assert proc.stderr.decode().splitlines() == [f"memstaged: memory dir {locked}: not writable"]
