"""Any file name, UTF-8 or not, is decided, logged, cached and shown without loss (SPEC 6).

Issue 13 item 1: a valid file saved as ``staging/caf\\xe9.json`` made ``--once`` print a
traceback (the seen cache could not encode the name), the daemon crash at every stop, and
``memstaged log`` skip the decision's line as "not JSON". Names of 255 bytes, with newlines or
tildes, are repaired, quarantined and recovered after a crash like any other. Real ``--once``
and daemon processes; the same names in this process are in tests/run/test_seen_cache.py,
tests/log/test_log.py, tests/test_safe_text.py and tests/cli/test_terminal.py (issue 10 item 16:
names with ESC or a newline reached the terminal raw).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.commands import run
from support.daemon_fakes import decide_one
from support.decision_log import decision_events, read_events
from support.documents import malformed, put, repairable, staging_doc
from support.helpers import (
    Input,
    daemon,
    expected_verdict,
    make_memory_dir,
    memstaged_env,
    project_root_of,
    run_once,
    temps_in,
)
from support.waiting import wait_for

from memstaged import safe_text
from memstaged.core.decide import Decision
from memstaged.core.records import ORIGINALS_DIR

pytestmark = pytest.mark.usefixtures("plain_output")

#: A name's bytes: anything but "/" and NUL, not starting with "." (a writer's temp file).
_NAME_BYTES = st.binary(min_size=1, max_size=12).map(
    lambda b: b.replace(b"/", b"_").replace(b"\0", b"_").lstrip(b".") or b"x"
)
_NAMES = st.lists(_NAME_BYTES, min_size=1, max_size=6, unique=True)


def _memory_dir(base: Path) -> tuple[Path, Path]:
    project = base / "example-project"
    mdir = project / ".pi" / "memory" / "project"
    (mdir / "staging").mkdir(parents=True)
    return project, mdir


def _plant(mdir: Path, project: Path, names: list[bytes]) -> dict[bytes, str]:
    """One file per name: even ones valid, odd ones not JSON (each its own bytes: two files of
    the same bytes whose names sanitize alike share one record, a separate matter reported to
    the apply path's owner); name -> expected decision."""
    staging = os.fsencode(mdir / "staging")
    expected = {}
    for i, raw in enumerate(names):
        name = raw + b".json"
        data = (
            json.dumps(staging_doc(project, f"s{i}")).encode()
            if i % 2 == 0
            else b"{not json %d" % i
        )
        path = os.path.join(staging, name)
        with open(path, "wb") as fh:
            fh.write(data)
        os.utime(path, (1_700_000_000, 1_700_000_000))
        expected[name] = "valid" if i % 2 == 0 else "quarantined"
    return expected


def _decided(log: Path) -> dict[bytes, str]:
    """File name bytes -> decision, as the log file holds them (read as `memstaged log` does)."""
    return {
        os.path.basename(os.fsencode(event["path"])): event["decision"]
        for event in decision_events(read_events(log))  # strict: every line reads back
    }


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(names=_NAMES)
def test_random_byte_names_through_once_the_caches_the_log_and_the_commands(
    names: list[bytes],
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 13 item 1 (property): for names made of random bytes, ``--once`` (a real process)
    exits 0 and logs every file under its exact name; a second run reads the valid ones from
    the seen cache; ``log --json`` gives the names back byte for byte, ``log`` shows each on
    one line, escaped and reversible; ``stats`` counts them; ``deadletter list`` names the
    quarantined ones' source files exactly."""
    work = tmp_path_factory.mktemp("names")
    project, mdir = _memory_dir(work)
    expected = _plant(mdir, project, names)
    env = memstaged_env(work)
    first = run_once(mdir, env, "--json")
    assert first.returncode == 0, first.stderr.decode(errors="replace")[-2000:]
    assert b"Traceback" not in first.stderr
    log = Path(env["MEMSTAGED_LOG_FILE"])
    assert _decided(log) == expected
    second = run_once(mdir, env, "--json")
    assert second.returncode == 0, second.stderr.decode(errors="replace")[-2000:]
    [summary] = [json.loads(line) for line in second.stdout.splitlines()]
    valid = sum(d == "valid" for d in expected.values())
    assert summary["unchanged"] == valid  # the seen cache held every valid name

    for key, value in env.items():
        if key.startswith(("MEMSTAGED_", "XDG_")):
            monkeypatch.setenv(key, value)
    code, out, _ = run(capsys, "log", "--json", "--decision", "valid", "--decision", "quarantined")
    assert code == 0
    logged = [json.loads(line) for line in out.splitlines()]
    assert sorted(os.path.basename(os.fsencode(e["path"])) for e in logged) == sorted(expected)

    code, out, _ = run(capsys, "log", "--decision", "valid", "--decision", "quarantined")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == len(expected)  # a newline in a name does not split its line
    assert "\x1b" not in out and "\r" not in out
    for name in expected:  # the project, then the name within the memory dir (issue 22)
        assert f"  {project.name}  {safe_text.name(os.fsdecode(name))}" in out
    code, out, _ = run(capsys, "log", "--full", "--decision", "valid", "--decision", "quarantined")
    assert code == 0
    assert len(out.splitlines()) == len(expected)
    assert "\x1b" not in out and "\r" not in out
    staging = os.fsencode(mdir / "staging")
    for name in expected:
        assert safe_text.name(os.fsdecode(os.path.join(staging, name))) in out

    code, out, _ = run(capsys, "stats", "--json")
    assert code == 0
    counts = json.loads(out)["decisions"]
    assert counts["valid"] == valid
    assert counts["quarantined"] == len(expected) - valid

    code, out, _ = run(capsys, "deadletter", "list", "--json", "--memory-dir", str(mdir))
    assert code == 0
    sources = {os.fsencode(json.loads(line)["source_file"]) for line in out.splitlines()}
    assert sources == {n for n, d in expected.items() if d == "quarantined"}
    code, out, _ = run(capsys, "deadletter", "list", "--memory-dir", str(mdir))
    assert code == 0
    assert len(out.splitlines()) == len(sources)
    assert "\x1b" not in out


def test_the_daemon_decides_caches_and_stops_cleanly_with_such_a_name(tmp_path: Path) -> None:
    """Issue 13 item 1: the daemon decides ``caf\\xe9.json``, logs it readably, and saves its
    seen cache when it stops: exit 0 (it exited at every stop, and systemd restarted it)."""
    project, mdir = _memory_dir(tmp_path)
    staging = os.fsencode(mdir / "staging")
    with open(os.path.join(staging, b"caf\xe9.json"), "wb") as fh:
        fh.write(json.dumps(staging_doc(project, "cafe")).encode())
    env = memstaged_env(tmp_path)
    log = Path(env["MEMSTAGED_LOG_FILE"])
    with daemon([mdir], env) as proc:
        assert wait_for(lambda: b"caf\xe9.json" in _decided(log) if log.exists() else False, 30)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert _decided(log)[b"caf\xe9.json"] == "valid"
    caches = list((tmp_path / "xdg-state" / "memstaged" / "seen").iterdir())
    assert len(caches) == 1
    stored: Any = msgspec.msgpack.decode(caches[0].read_bytes())
    assert b"caf\xe9.json" in stored["raw_entries"]
    assert any(e.get("event") == "stop" for e in read_events(log, strict=False))


HOSTILE_NAMES = [
    "é" * 125 + ".json",  # 255 bytes: every temp name built from it must still fit
    "漢" * 83 + ".json",  # 254 bytes
    "a" * 250 + ".json",
    "new\nline.json",
    "-dash ~tilde~ .json",
    os.fsdecode(b"latin1-\xe9.json"),  # not UTF-8 at all
]


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=range(len(HOSTILE_NAMES)))
def test_long_and_strange_file_names_are_decided_like_any_other(tmp_path: Path, name: str) -> None:
    """Staging file names of 255 bytes (multibyte characters), with newlines, tildes or bytes
    that are not UTF-8 are repaired and quarantined like any other (memstaged's own temp names
    stay within NAME_MAX), and a crash's leftover temp for such a name is recovered."""
    mdir = make_memory_dir(tmp_path)
    root = project_root_of(mdir)
    data = put(mdir / "staging" / name, repairable(root))
    outcome, event, _log = decide_one(mdir, name)
    assert outcome.decision is Decision.REPAIRED, event
    repaired = (mdir / "staging" / name).read_bytes()
    assert repaired == expected_verdict(mdir, Input(name, data, "")).new_bytes
    bad = put(mdir / "staging" / name, malformed(root))
    outcome, event, _log = decide_one(mdir, name)
    assert outcome.decision is Decision.QUARANTINED, event
    verdict = expected_verdict(mdir, Input(name, bad, ""))
    assert verdict.original is not None
    assert (mdir / "deadletter" / ORIGINALS_DIR / verdict.original).read_bytes() == bad
    assert not temps_in(mdir)
    # A crash right after the rename-away leaves a temp whose name encodes this target.
    again = put(mdir / "staging" / name, malformed(root, "again"))
    env = memstaged_env(tmp_path, MEMSTAGED_CRASH_AT="renamed-away:1")
    killed = run_once(mdir, env, "--settle", "0")
    assert killed.returncode == -signal.SIGKILL
    assert temps_in(mdir)
    result = run_once(mdir, memstaged_env(tmp_path), "--settle", "0")
    assert result.returncode == 0, result.stderr
    assert not temps_in(mdir)
    assert not (mdir / "staging" / name).exists()
    originals = [p.read_bytes() for p in (mdir / "deadletter" / ORIGINALS_DIR).iterdir()]
    assert again in originals
