"""The seen cache is dropped whenever the code of the decision changes (docs/design.md).

The cache keeps ``valid`` and ``foreign`` decisions across runs and upgrades, keyed by a
fingerprint of the engine: the code's bytes, not the version (each build has its own). A copy
of the package is edited, one module at a time, and run from a fresh interpreter, as an upgrade
would be.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.decision_log import decisions
from support.documents import staging_doc, write
from support.helpers import PYTHON, make_memory_dir, memstaged_env, project_root_of

import memstaged

#: Decides bytes of every kind, then prints the memstaged modules that were loaded for it.
_LOADED = """
import base64, json, sys
import memstaged
from memstaged.core.decide import Context, decide

assert memstaged.__file__.startswith(sys.argv[1]), memstaged.__file__
corpus = [base64.b64decode(data) for data in json.loads(sys.stdin.read())]
for split in (False, True):
    for data in corpus:
        ctx = Context(project_root="/p", file_name="a.json", source_path="/p/staging/a.json",
                      settled=True, split_invalid_candidates=split)
        decide(data, ctx)
names = sorted({m.__file__ for m in list(sys.modules.values())
                if m.__name__.split(".")[0] == "memstaged" and getattr(m, "__file__", None)})
print(json.dumps(names))
"""
_FINGERPRINT = "from memstaged.run import seen_cache; print(seen_cache._engine_hash())"


def _corpus() -> list[bytes]:
    """Files that take every path of the decision: valid, repaired (legacy and ISO dates, a
    missing topic), quarantined, foreign, not JSON, not UTF-8, too deep for a recursive parser."""
    valid = staging_doc("/p")
    legacy = staging_doc("/p", produced_at="Tue, 01 Jan 2026 00:00:00 GMT")
    local = staging_doc("/p", produced_at="2026-06-10 10:00:00")
    broken = staging_doc("/p", candidates={"lessons": [{"summary": ""}]})
    return [
        json.dumps(doc).encode()
        for doc in (valid, legacy, local, broken, staging_doc("/elsewhere"), {"x": 1})
    ] + [b"{", b"\xff\xfe", b"[" * 50_000 + b"]" * 50_000, b"\xef\xbb\xbf" + b"{}"]


def _run(site: Path, code: str, stdin: str = "") -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env |= {"PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run(
        [PYTHON, "-c", code, str(site)],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=site,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def _copy(tmp_path: Path) -> Path:
    """A copy of the package under test, to put first on ``PYTHONPATH``."""
    site = tmp_path / "site"
    package = Path(memstaged.__file__).parent
    shutil.copytree(package, site / "memstaged", ignore=shutil.ignore_patterns("__pycache__"))
    return site


def test_an_edit_of_any_module_the_decision_runs_changes_the_fingerprint(tmp_path: Path) -> None:
    """Issue 29 item 13: the fingerprint was a hand-kept list that left out ``dateparse.py``
    and ``datescan.py``, so a fix of ``Date.parse`` kept stale ``valid`` decisions. Every
    memstaged module loaded while files of every kind are decided, edited alone in a copy
    (a comment appended), gives another fingerprint in a fresh interpreter."""
    site = _copy(tmp_path)
    corpus = json.dumps([base64.b64encode(b).decode() for b in _corpus()])
    loaded = [Path(p) for p in json.loads(_run(site, _LOADED, corpus))]
    names = {p.name for p in loaded}
    assert {"decide.py", "date_parse.py", "date_scan.py", "timestamps.py", "ecma.py"} <= names
    before = _run(site, _FINGERPRINT)
    unchanged = []
    for module in loaded:
        original = module.read_bytes()
        module.write_bytes(original + b"\n# an upgrade\n")
        try:
            if _run(site, _FINGERPRINT) == before:
                unchanged.append(module.name)
        finally:
            module.write_bytes(original)
    assert not unchanged, f"editing these left the fingerprint as it was: {unchanged}"
    assert _run(site, _FINGERPRINT) == before  # restored: the same code, the same fingerprint


@pytest.mark.parametrize("module", ["core/js/date_parse.py", "core/js/date_scan.py"])
def test_a_run_after_an_upgrade_of_date_parse_decides_cached_files_again(
    tmp_path: Path, module: str
) -> None:
    """Issue 29 item 13, end to end: ``--once`` from a copy of the package reuses its cache
    (the valid file is ``unchanged``) until the ``Date.parse`` code is edited; the next run
    decides the file again."""
    site = _copy(tmp_path)
    mdir = make_memory_dir(tmp_path)
    write(mdir / "staging" / "a.json", staging_doc(project_root_of(mdir)))
    env = memstaged_env(tmp_path) | {"PYTHONPATH": str(site)}
    log = tmp_path / "decisions.jsonl"

    def once() -> dict[str, str]:
        if log.exists():
            log.unlink()
        result = subprocess.run(
            [PYTHON, "-m", "memstaged", "--once", "--memory-dir", str(mdir)],
            env=env,
            capture_output=True,
            text=True,
            cwd=site,
            timeout=300,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return decisions(log) if log.exists() else {}

    assert once() == {"a.json": "valid"}
    assert once() == {}  # decided before and unchanged: not read again
    path = site / "memstaged" / module
    path.write_bytes(path.read_bytes() + b"\n# an upgrade\n")
    assert once() == {"a.json": "valid"}
