"""Record IDs: ``memstaged deadletter ids``, the hidden listing the completion scripts call for
them, and the IDs ``show``, ``recover --id``, ``purge --id`` and ``ack`` take.

Issue 22 item 7: ``deadletter show <Tab>``, ``recover --id <Tab>`` and ``purge --id <Tab>``
offer the IDs of the configured memory dirs, from a listing that reads only names and prints
nothing at all when it cannot (whatever it printed would land under the user's prompt). Run as
the shell runs it: a real ``memstaged`` process, against a store a real ``--once`` wrote. The
Tab presses themselves are in tests/system/test_install.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.commands import prepare, record_files
from support.documents import staging_doc, write
from support.helpers import (
    REPO,
    make_memory_dir,
    memstaged_cmd,
    memstaged_env,
    project_root_of,
    run_once,
)


def _ids(work: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        memstaged_cmd("deadletter", "ids", *argv),
        env=memstaged_env(work, **env),
        cwd=work,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_ids_lists_every_record_of_the_configured_memory_dirs_by_name_only(
    tmp_path: Path, project: Path, memory_dir: Path, log_file: Path
) -> None:
    """Issue 22 item 7: one ID per line (the record's name without .json, what show and --id
    take), sorted, from every configured memory dir; memstaged's temp files, other files and
    a name a shell would have to quote are not offered; a prefix keeps those starting with it.
    Records are not opened: one made unreadable (a FIFO, which an open would wait on) is
    listed as its name says."""
    prepare(project, memory_dir, log_file)
    expected = sorted(n[: -len(".json")] for n in record_files(memory_dir))
    assert len(expected) >= 2
    store = memory_dir / "deadletter"
    os.mkfifo(store / "agent-made-fifo.json")
    (store / ".tmp-memstaged-1.json").write_bytes(b"{}")
    (store / "notes.txt").write_bytes(b"{}")
    (store / "two words.json").write_bytes(b"{}")
    other = tmp_path / "other" / ".pi" / "memory" / "project"
    (other / "staging").mkdir(parents=True)
    (other / "deadletter").mkdir()
    (other / "deadletter" / "elsewhere-1.json").write_bytes(b"{}")
    config = tmp_path / "memstaged.toml"
    config.write_text(f'memory_dirs = ["{memory_dir}", "{other}"]\n')

    listed = _ids(tmp_path, "--config", str(config))
    assert (listed.returncode, listed.stderr) == (0, "")
    assert listed.stdout.splitlines() == sorted([*expected, "agent-made-fifo", "elsewhere-1"])

    first = expected[0]
    prefixed = _ids(tmp_path, "--config", str(config), "--", first[:-1])
    assert prefixed.stdout.splitlines() == [first]

    by_env = _ids(tmp_path, MEMSTAGED_MEMORY_DIRS=str(other))
    assert by_env.stdout.splitlines() == ["elsewhere-1"]


def test_ids_prints_nothing_when_it_cannot_list(tmp_path: Path, memory_dir: Path) -> None:
    """Issue 22 item 7: a completion that fails prints nothing, neither on stdout (it would be
    offered as an ID) nor on stderr (it would land under the prompt): a broken config file, a
    memory dir that does not exist, a linked deadletter/ (not followed, as by every command),
    a bad option. The exit code says it, but where there is no store (none, or a link that is
    not followed, as ``deadletter list`` says "no dead-letter records" there)."""
    broken = tmp_path / "broken.toml"
    broken.write_text("memory_dirs = [\n")
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_bytes(b"")
    store = tmp_path / "elsewhere"
    store.mkdir()
    (store / "not-mine-1.json").write_bytes(b"{}")
    (memory_dir / "deadletter").symlink_to(store)
    for argv, env, code in [
        (["--config", str(broken)], {}, 1),
        (["--memory-dir", str(tmp_path / "nowhere")], {}, 0),
        (["--memory-dir", str(memory_dir)], {}, 0),  # as deadletter list: no store there
        (["--memory-dir", str(not_a_dir)], {}, 1),
        (["--no-such-option"], {}, 2),
        ([], {"MEMSTAGED_CONFIG": str(broken)}, 1),
    ]:
        listed = _ids(tmp_path, *argv, **env)
        assert (listed.returncode, listed.stdout, listed.stderr) == (code, "", ""), argv


def test_ids_on_ten_thousand_records_opens_none_of_them(tmp_path: Path) -> None:
    """Issue 22 item 7 ("fast enough for a keypress on 10,000 records"): a Tab press must not
    cost a read per record. Under strace, ``deadletter ids`` on a store of 10,000 records
    prints every ID and opens ``deadletter/`` itself and nothing inside it: no ``open``,
    ``openat`` or ``openat2`` of a record (and no ``stat`` of one either). Its time is a bench
    row (bench/inspection.py), not a test."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed (make sysdeps installs it)")
    mdir = tmp_path / "proj" / ".pi" / "memory" / "project"
    (mdir / "staging").mkdir(parents=True)
    store = mdir / "deadletter"
    store.mkdir()
    expected = [f"session-{i:05d}-{i:016x}-lessons-0" for i in range(10_000)]
    for name in expected:
        (store / f"{name}.json").write_bytes(b"{}\n")
    trace = tmp_path / "trace"
    listed = subprocess.run(
        [
            "strace",
            "-f",
            "-qq",
            "-e",
            "trace=open,openat,openat2,stat,lstat,newfstatat,statx",
            "-o",
            str(trace),
            *memstaged_cmd("deadletter", "ids", "--memory-dir", str(mdir)),
        ],
        env=memstaged_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (listed.returncode, listed.stderr) == (0, "")
    assert listed.stdout.splitlines() == expected
    calls = trace.read_text().splitlines()
    assert any('"deadletter"' in call or f'"{store}"' in call for call in calls)  # the premise
    touched = [call for call in calls if "-lessons-0.json" in call]
    assert touched == [], touched[:3]


def _files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_an_empty_blank_or_wildcard_id_chooses_no_record(tmp_path: Path) -> None:
    """Issue 29 item 7: with one record in the store, ``purge --id '' --yes`` deleted it and its
    original (exit 0): the empty string is the start of every ID, so a unique prefix of the only
    one. An empty, blank or wildcard ID is a usage error, for every command that takes an ID
    (``purge --id``, ``recover --id``, ``ack``, ``show``): exit 2, one line naming the ID, and
    nothing changed (the memory dir byte for byte, no mark kept). A real prefix still works."""
    mdir = make_memory_dir(tmp_path)
    doc = staging_doc(project_root_of(mdir), "only", candidates={"lessons": [{}]})
    write(mdir / "staging" / "only.json", doc)
    os.utime(mdir / "staging" / "only.json", (1, 1))
    env = memstaged_env(tmp_path)
    assert run_once(mdir, env).returncode == 0
    [record] = [p.stem for p in (mdir / "deadletter").glob("*.json")]
    assert list((mdir / "deadletter" / "originals").iterdir())
    before = _files_under(tmp_path)
    at = ["--memory-dir", str(mdir)]
    refused = ["", " ", "\t", "*", "?", "[a-z]*", f"{record[:4]}*"]
    commands = [
        *(["deadletter", "purge", f"--id={v}", "--yes", *at] for v in refused),
        *(["deadletter", "purge", "--id", v, "--yes", *at] for v in ("", " ")),
        *(["deadletter", "recover", f"--id={v}", *at] for v in ("", " ", "*")),
        *(["deadletter", "ack", v, *at] for v in ("", " ", "*")),
        *(["deadletter", "show", v, *at] for v in ("", "*")),
    ]
    for argv in commands:
        done = subprocess.run(
            memstaged_cmd(*argv),
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert (done.returncode, done.stdout) == (2, ""), (argv, done.stdout, done.stderr)
        [line] = done.stderr.splitlines()
        assert line.startswith("memstaged deadletter ") and "ID" in line, (argv, line)
        assert _files_under(tmp_path) == before, argv
    shown = subprocess.run(
        memstaged_cmd("deadletter", "show", record[:4], *at),
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (shown.returncode, shown.stderr) == (0, ""), shown.stderr
    assert record in shown.stdout
