"""Any file name, UTF-8 or not, is decided, logged, cached and shown without loss (SPEC 6).

Issue 13 item 1: a valid file saved as ``staging/caf\\xe9.json`` made ``--once`` print a
traceback (the seen cache could not encode the name), the daemon crash at every stop, and
``memstaged log`` skip the decision's line as "not JSON". Issue 10 item 16: names with ESC or a
newline reached the terminal raw.
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
from support.documents import staging_doc
from support.helpers import daemon, memstaged_env, read_events, run_once
from support.waiting import wait_for

from memstaged import safe_text
from memstaged.log.reader import parse_line

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
    out: dict[bytes, str] = {}
    for line in log.read_bytes().splitlines():
        event = parse_line(line)
        assert event is not None, f"a log line memstaged cannot read back: {line!r}"
        if event.get("event") == "decision":
            out[os.path.basename(os.fsencode(event["path"]))] = event["decision"]
    return out


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


def test_seen_cache_keeps_names_that_are_not_utf8(tmp_path: Path) -> None:
    """Issue 13 item 1: the msgpack seen cache stores a non-UTF-8 name by its bytes and gives
    back the same string (it raised UnicodeEncodeError: "surrogates not allowed")."""
    from memstaged.run.seen_cache import SeenCache

    name = os.fsdecode(b"caf\xe9\x1b.json")
    cache = SeenCache.load(tmp_path, "/m", "/p", "k")
    cache.remember(name, (1, 2, 3, 4, 5), "valid")
    cache.remember("plain.json", (1, 3, 3, 4, 5), "foreign")
    cache.save()
    again = SeenCache.load(tmp_path, "/m", "/p", "k")
    assert again.entries == {
        name: ((1, 2, 3, 4, 5), "valid"),
        "plain.json": ((1, 3, 3, 4, 5), "foreign"),
    }


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
    assert any(e.get("event") == "stop" for e in read_events(log))


def test_console_and_journal_message_escape_control_characters() -> None:
    """Issue 10 item 16: the readable line (console on a TTY, journal MESSAGE) of a decision
    about a name with ESC and a newline, and a reason quoting content, holds no raw control
    character: it cannot fake a log line, clear the screen or set the title."""
    from memstaged.log.format import message
    from memstaged.log.writer import _readable_renderer

    event = {
        "event": "decision",
        "decision": "quarantined",
        "path": os.fsdecode(b"/m/staging/a\x1b]0;pwned\x07\nFAKE LINE\xff.json"),
        "reasons": ["not JSON: bad \x1b[2J byte"],
        "timestamp": "2026-12-01T10:00:00.000000Z",
        "level": "warning",
    }
    for text in (message(event), _readable_renderer(colors=False)(event).rstrip("\n")):
        assert not any(ord(c) < 0x20 or ord(c) == 0x7F for c in text), repr(text)
        assert "\\x1b]0;pwned\\x07\\nFAKE LINE\\xff.json" in text
    shown = message(event).removeprefix("quarantined ").rsplit(": not JSON", 1)[0]
    assert os.fsencode(_unquote(shown)) == b"/m/staging/a\x1b]0;pwned\x07\nFAKE LINE\xff.json"


@pytest.mark.parametrize(
    "raw",
    [
        b"caf\xe9.json",
        b'"quoted".json',
        b"back\\slash.json",
        "rtl\u202eexe.json".encode(),
        b"ok.json",
    ],
)
def test_shown_names_are_reversible(raw: bytes) -> None:
    """SPEC 6 "escaped reversibly": what display.name shows gives the bytes back, and a name
    that needs nothing is shown as it is."""
    shown = safe_text.name(os.fsdecode(raw))
    assert shown.isprintable()
    assert os.fsencode(_unquote(shown)) == raw
    if raw == b"ok.json":
        assert shown == "ok.json"


#: JSON keeps these raw in a string; a terminal may act on them (U+009B is a one-character CSI).
_TERMINAL_ACTS_ON = "\x7f\u009b\u0085\u202e\u2028\u2066"


def test_json_output_holds_no_character_a_terminal_acts_on(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, log_file: Path
) -> None:
    """SPEC 6 (control characters never passed raw to a terminal), issue 13: ``--json`` output
    goes to terminals too. A name and contents with DEL, C1 controls (CSI), bidi overrides and
    U+2028 come out of ``log --json``, ``check --json`` and ``deadletter list --json`` as
    ``\\uXXXX`` escapes: none of them raw, and each line reads back to the very same values."""
    project, mdir = _memory_dir(tmp_path)
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


def _unquote(shown: str) -> str:
    """The name :func:`memstaged.safe_text.name` showed, as ``os.fsdecode`` gives it: the
    proof that what is shown names the file without loss."""
    if not shown.startswith('"'):
        return shown
    body = shown[1:-1]
    out: list[str] = []
    i = 0
    while i < len(body):
        char = body[i]
        if char != "\\":
            out.append(char)
            i += 1
            continue
        kind = body[i + 1]
        if kind == "x":
            code = int(body[i + 2 : i + 4], 16)
            out.append(chr(0xDC00 + code) if code >= 0x80 else chr(code))
            i += 4
            continue
        if kind in "uU":
            width = 4 if kind == "u" else 8
            out.append(chr(int(body[i + 2 : i + 2 + width], 16)))
            i += 2 + width
            continue
        out.append({"n": "\n", "r": "\r", "t": "\t"}.get(kind, kind))
        i += 2
    return "".join(out)
