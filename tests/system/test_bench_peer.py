"""The benchmark's JavaScript peer and breakdown helpers (issue 14): they measure the right thing.

A ratio to the peer means something only if the peer and memstaged do the same work; these tests
run both for real (Node 20 and ``python -m memstaged --once``) on a small peer corpus and check
the outcome comparison that ``make bench`` relies on. Nothing here is timed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import corpus  # noqa: E402 - bench/ scripts import each other as top-level modules
import costs  # noqa: E402
import peer  # noqa: E402

NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="node (Node.js 20) is not on PATH")


def _memory_dir(root: Path, name: str) -> Path:
    return root / name / "proj" / ".pi" / "memory" / "project"


def _run_both(tmp_path: Path, n: int = 60) -> tuple[corpus.Manifest, Path, Path]:
    """The peer corpus in two copies, decided by the peer and by memstaged --once."""
    node_dir = _memory_dir(tmp_path, "node")
    mem_dir = _memory_dir(tmp_path, "memstaged")
    manifest = corpus.generate(node_dir, n, 7, **corpus.PEER_CORPUS)
    peer.copy_corpus(node_dir, mem_dir)
    assert NODE is not None
    counts = peer.run_peer(NODE, node_dir, manifest.project_root, peer.node_env())
    assert counts["records"] == sum(e.records for e in manifest.files)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMSTAGED_")}
    env.update(HOME=str(tmp_path / "home"), MEMSTAGED_LOG_FILE=str(tmp_path / "log.jsonl"))
    for key in ("XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "JOURNAL_STREAM"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "memstaged", "--once", "--memory-dir", str(mem_dir)]
    cmd += ["--project-root", manifest.project_root]
    proc = subprocess.run(cmd, env=env, capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-500:]
    return manifest, node_dir, mem_dir


@needs_node
def test_peer_does_the_work_memstaged_does(tmp_path: Path) -> None:
    """issue 14 item 1: on the peer corpus, the JS peer and memstaged leave the same files
    untouched, repair the same files to the same JSON (same derived triggers), dead-letter the
    same files with the same original bytes and the same SPEC 4 records."""
    manifest, node_dir, mem_dir = _run_both(tmp_path)
    ours, theirs = peer.outcome(mem_dir), peer.outcome(node_dir)
    assert peer.differences(ours, theirs, "memstaged", "the peer") == []
    kinds = [e.kind for e in manifest.files]
    assert len(ours.untouched) == kinds.count("valid")
    assert len(ours.repaired) == kinds.count("repairable")
    assert len(ours.gone) == kinds.count("malformed")
    assert sum(theirs.records.values()) == sum(e.records for e in manifest.files)
    repaired = json.loads((node_dir / "staging" / sorted(theirs.repaired)[0]).read_bytes())
    triggers = [t for lesson in repaired["candidates"]["lessons"] for t in lesson["triggers"]]
    assert {"type": "topic", "value": "proj"} in triggers  # SPEC 3.1: project_root's basename


@needs_node
def test_a_different_repair_is_reported(tmp_path: Path) -> None:
    """issue 14 item 1: the comparison behind "same work" notices when one side repaired a file
    differently (another trigger) or kept a file the other dead-lettered."""
    _, node_dir, mem_dir = _run_both(tmp_path)
    theirs = peer.outcome(node_dir)
    name = sorted(theirs.repaired)[0]
    path = mem_dir / "staging" / name
    doc = json.loads(path.read_bytes())
    doc["candidates"]["lessons"][0]["triggers"] = [{"type": "topic", "value": "other"}]
    path.write_text(json.dumps(doc))
    gone = sorted(theirs.gone)[0]
    shutil.copy2(mem_dir / corpus.PRISTINE_NAME / gone, mem_dir / "staging" / gone)
    found = peer.differences(peer.outcome(mem_dir), theirs, "memstaged", "the peer")
    assert any(line.startswith("repaired differently") for line in found)
    assert any(line.startswith("dead-lettered") for line in found)


def test_importtime_names_what_a_command_imports(tmp_path: Path) -> None:
    """issue 14 item 2: ``-X importtime`` is parsed into modules with their cumulative time, and
    a module imported by another is one level deeper."""
    entries = costs.importtime(["-c", "import json"], dict(os.environ), cwd=tmp_path)
    by_name = {e.module: e for e in entries}
    assert by_name["json"].depth == 0
    assert by_name["json.decoder"].depth >= 1
    assert by_name["json"].cumulative_ms >= by_name["json.decoder"].cumulative_ms
