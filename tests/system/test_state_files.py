"""memstaged's own files (the config, the seen cache, the ack marks) as hostile users leave them:
a FIFO where a file was expected, a value nested deeper than a parser recurses. Every command
run here is a real ``python -m memstaged`` process; the timeouts only bound a failure (a hang).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from support.documents import staging_doc, write
from support.helpers import REPO, memstaged_cmd, memstaged_env

from memstaged.core import digests
from memstaged.deadletter import acks

#: A hang is what these tests look for: a command still running after this long is one.
HANG = 60.0


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            memstaged_cmd(*args),
            env=env,
            capture_output=True,
            text=True,
            timeout=HANG,
            check=False,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"memstaged {' '.join(args)} still ran after {HANG}s", pytrace=False)


def _deep_toml(path: Path, depth: int = 1000) -> Path:
    path.write_text("settle = " + "[" * depth + "]" * depth + "\n")
    return path


@pytest.mark.parametrize(
    "args",
    [("config", "check"), ("config", "show"), ("status",), ("--once",)],
    ids=["config-check", "config-show", "status", "once"],
)
def test_a_config_nested_too_deep_is_one_line(
    tmp_path: Path, memory_dir: Path, args: tuple[str, ...]
) -> None:
    """Issue 29 item 3: a 2 KB config with a value nested 1,000 deep gave a 3,000-line
    ``RecursionError`` traceback (exit 1). It is one line naming the file, and exit 2."""
    conf = _deep_toml(tmp_path / "config.toml")
    assert conf.stat().st_size < 4096
    env = memstaged_env(tmp_path, MEMSTAGED_CONFIG=str(conf))
    extra = ("--memory-dir", str(memory_dir)) if args[0] in ("status", "--once") else ()
    done = _run(env, *args, *extra)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        f"memstaged: {conf}: not valid TOML: a value is nested too deep"
    ]


def _quarantined_record(tmp_path: Path, memory_dir: Path) -> tuple[dict[str, str], str]:
    """A memory dir holding one dead-letter record; the env that made it, and the record's ID."""
    env = memstaged_env(tmp_path)
    path = memory_dir / "staging" / "bad.json"
    path.write_bytes(b"not JSON: one record for the whole file")
    os.utime(path, (1, 1))
    done = _run(env, "--once", "--memory-dir", str(memory_dir))
    assert done.returncode == 0, done.stderr
    records = [p.stem for p in (memory_dir / "deadletter").glob("*.json")]
    assert len(records) == 1
    return env, records[0]


def _fifo_at(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.mkfifo(path, 0o600)


def _seen_path(state: Path, memory_dir: Path) -> Path:
    name = digests.sha256(os.fsencode(str(memory_dir))).hexdigest()[:24]
    return state / "memstaged" / "seen" / f"{name}.msgpack"


def test_fifos_at_the_marks_and_the_seen_cache_block_no_command(
    tmp_path: Path, project: Path, memory_dir: Path
) -> None:
    """Issue 29 item 4: a FIFO at ``acked/<hash>.json`` or ``seen/<hash>.msgpack`` made
    ``status``, ``status --check`` and ``deadletter ack`` block for ever, and ``--once`` block on
    the seen cache. Each now reads past it as "no marks" / "no cache" and finishes; ``ack``
    replaces the FIFO with its marks, and ``--once`` with its cache."""
    env, record = _quarantined_record(tmp_path, memory_dir)
    state = Path(env["XDG_STATE_HOME"])
    marks = state / "memstaged" / acks.ACKED_DIR / acks.file_name(str(memory_dir))
    seen = _seen_path(state, memory_dir)
    if seen.exists():
        seen.unlink()
    _fifo_at(marks)
    _fifo_at(seen)
    where = ("--memory-dir", str(memory_dir))

    status = _run(env, "status", *where)
    assert status.returncode == 1, status.stderr  # one unseen record needs attention
    assert "Traceback" not in status.stderr
    check = _run(env, "status", "--check", *where)
    assert check.returncode == 1, check.stdout + check.stderr  # WARNING: an unseen record
    assert check.stdout.startswith("MEMSTAGED WARNING")

    write(memory_dir / "staging" / "good.json", staging_doc(project, "good"))
    once = _run(env, "--once", *where)
    assert once.returncode == 0, once.stderr
    assert seen.is_file()  # the FIFO replaced by the cache the run wrote

    ack = _run(env, "deadletter", "ack", record, *where)
    assert ack.returncode == 0, ack.stderr
    assert marks.is_file()
    assert json.loads(marks.read_bytes())["seen"] == [f"{record}.json"]
    after = _run(env, "status", "--check", *where)
    assert after.returncode == 0, after.stdout + after.stderr
