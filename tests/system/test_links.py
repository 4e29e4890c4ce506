"""Symbolic links memstaged never follows (SPEC 6): a ``staging/`` or ``deadletter/`` that is a
link, a project reached through a link below the configured literal prefix, with real ``--once``
and daemon processes. Crash recovery at start-up deletes nothing through a link either (issue 10
items 7 and 8).

The same links decided in this process, through the pipeline, are in
``tests/run/test_pipeline.py``; a glob match that is a link, for the daemon, in
``tests/system/test_discovery_links.py``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from support.daemon_fakes import decide_one
from support.decision_log import read_events
from support.documents import malformed, put, unparseable
from support.helpers import (
    daemon,
    make_memory_dir,
    memstaged_env,
    project_root_of,
    run_once,
    temps_in,
)
from support.waiting import wait_for

from memstaged.core.decide import Decision
from memstaged.files import temp_names


def test_a_linked_deadletter_is_not_followed_by_crash_recovery(tmp_path: Path) -> None:
    """Issue 10 item 7: ``deadletter/`` a link to an outside directory holding files named like
    memstaged's temps: start-up recovery deletes nothing there."""
    mdir = make_memory_dir(tmp_path)
    outside = tmp_path / "outside"
    (outside / "originals").mkdir(parents=True)
    victims = [
        outside / f"{temp_names.TEMP_PREFIX}rec~x.json~0123456789ab",
        outside / "originals" / (f"{temp_names.TEMP_PREFIX}orig~x.json~0123456789ab"),
    ]
    for victim in victims:
        victim.write_bytes(b"precious")
    (mdir / "deadletter").symlink_to(outside)
    done = run_once(mdir, memstaged_env(tmp_path / "work"))
    assert done.returncode == 0, done.stderr
    assert all(v.read_bytes() == b"precious" for v in victims)


def test_no_link_is_followed_below_the_configured_prefix(tmp_path: Path) -> None:
    """Issue 10 item 8: a project under a glob whose ``.pi`` is a link to elsewhere: memstaged
    writes nothing there. The literal prefix of the glob may itself be a link (SPEC 6)."""
    real_base = tmp_path / "real-src"
    good = make_memory_dir(real_base, "good")
    elsewhere = tmp_path / "elsewhere"
    target = make_memory_dir(elsewhere, "victim")
    (real_base / "linked").mkdir()
    (real_base / "linked" / ".pi").symlink_to(target.parents[1])
    root_good = str(good.parents[2])
    put(good / "staging" / "bad.json", unparseable(root_good, "g"))
    put(target / "staging" / "bad.json", unparseable(str(real_base / "linked"), "v"))
    base = tmp_path / "src"
    base.symlink_to(real_base)  # the literal prefix: a link there is followed
    env = memstaged_env(tmp_path / "work")
    done = run_once(f"{base}/*/.pi/memory/project", env)
    assert done.returncode in (0, 1), done.stderr
    assert not (target / "deadletter").exists()
    assert (target / "staging" / "bad.json").exists()
    assert not (good / "staging" / "bad.json").exists()  # the good project was decided


def test_staging_or_deadletter_replaced_by_a_link(tmp_path: Path) -> None:
    """A ``staging/`` that is a symbolic link is never followed (``skipped``, and ``--once``
    logs why); a ``deadletter/`` that is one is never written through: the malformed file stays
    in ``staging/``, ``deferred`` with the reason, and is retried (not given up as skipped)."""
    mdir = make_memory_dir(tmp_path)
    root = project_root_of(mdir)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    data = put(mdir / "staging" / "bad.json", malformed(root))
    os.symlink(elsewhere, mdir / "deadletter")
    outcome, event, _log = decide_one(mdir, "bad.json")
    assert outcome.decision is Decision.DEFERRED
    assert any("deadletter/ is a symbolic link" in r for r in event["reasons"])
    assert outcome.retry_at is not None
    assert (mdir / "staging" / "bad.json").read_bytes() == data
    assert list(elsewhere.iterdir()) == []
    assert not temps_in(mdir)

    other = make_memory_dir(tmp_path / "b")
    shutil.rmtree(other / "staging")
    real_staging = tmp_path / "real-staging"
    real_staging.mkdir()
    bad = put(real_staging / "bad.json", malformed(project_root_of(other)))
    os.symlink(real_staging, other / "staging")
    outcome, event, _log = decide_one(other, "bad.json")
    assert outcome.decision is Decision.SKIPPED
    assert "staging/ is a symbolic link" in event["reasons"][0]
    env = memstaged_env(tmp_path / "b")
    result = run_once(other, env, "--settle", "0")
    assert result.returncode == 0, result.stderr
    assert (real_staging / "bad.json").read_bytes() == bad
    assert not (other / "deadletter").exists()
    events = read_events(tmp_path / "b" / "decisions.jsonl", strict=False)
    assert any(
        e.get("decision") == "skipped" and "staging/ is a symbolic link" in e["reasons"][0]
        for e in events
    ), events


def test_the_daemon_says_why_it_ignores_a_staging_link(tmp_path: Path) -> None:
    """A ``staging/`` that is a symbolic link is never followed by the daemon, and the log says
    so (a ``skipped`` event naming the reason), as ``--once`` does."""
    mdir = make_memory_dir(tmp_path)
    shutil.rmtree(mdir / "staging")
    real = tmp_path / "real"
    real.mkdir()
    put(real / "bad.json", b"{")
    os.symlink(real, mdir / "staging")
    env = memstaged_env(tmp_path)
    log = tmp_path / "decisions.jsonl"
    with daemon([mdir], env, "--settle", "0"):
        assert wait_for(
            lambda: any(e.get("event") == "ready" for e in read_events(log, strict=False)), 30
        )
        assert wait_for(
            lambda: any(
                "staging/ is a symbolic link" in " ".join(e.get("reasons", []))
                for e in read_events(log, strict=False)
            ),
            5,
        )
    assert (real / "bad.json").read_bytes() == b"{"
