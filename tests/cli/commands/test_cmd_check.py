"""``memstaged check FILE...``: decide files without touching them; the exit code says how bad."""

from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path

import pytest
from support.commands import BAD_TRIGGER, json_lines, one_line_error, run
from support.decision_log import decisions, read_events
from support.documents import lesson, one_of_each, settled, staging_doc, write
from support.helpers import DEMO

from memstaged.cli.main import main
from memstaged.core.decide import Context, Decision, decide

pytestmark = pytest.mark.usefixtures("plain_output")


@pytest.fixture
def files(project: Path, memory_dir: Path) -> dict[str, Path]:
    staging = memory_dir / "staging"
    no_triggers = staging_doc(project, "fix")
    del no_triggers["candidates"]["lessons"][0]["triggers"]
    paths = {
        "valid": staging / "valid.json",
        "repairable": staging / "repairable.json",
        "quarantined": staging / "bad.json",
        "foreign": staging / "foreign.json",
    }
    write(paths["valid"], staging_doc(project, "ok"))
    write(paths["repairable"], no_triggers)
    write(
        paths["quarantined"],
        staging_doc(project, "bad", candidates={"lessons": [lesson(triggers=BAD_TRIGGER)]}),
    )
    write(paths["foreign"], staging_doc("/elsewhere/project", "far"))
    return paths


@pytest.mark.parametrize(
    ("kind", "code"), [("valid", 0), ("repairable", 3), ("quarantined", 4), ("foreign", 5)]
)
def test_exit_code_per_decision(
    capsys: pytest.CaptureFixture[str], files: dict[str, Path], project: Path, kind: str, code: int
) -> None:
    """Each decision has its exit code (0 valid, 3 repairable, 4 quarantine, 5 foreign), and the
    --json line names the same decision."""
    got, out, _ = run(capsys, "check", "--json", "--project-root", str(project), str(files[kind]))
    assert got == code
    [line] = json_lines(out)
    expected = {"repairable": "repaired"}.get(kind, kind)
    assert line["decision"] == expected
    assert line["path"] == str(files[kind])


def test_foreign_follows_the_project_root_given(
    capsys: pytest.CaptureFixture[str], files: dict[str, Path]
) -> None:
    """With --project-root naming another project, a file of this project is foreign (5)."""
    code, out, _ = run(
        capsys, "check", "--json", "--project-root", "/not/this/one", str(files["valid"])
    )
    assert code == 5
    assert json_lines(out)[0]["decision"] == "foreign"


def test_worst_decision_wins_and_nothing_is_touched(
    capsys: pytest.CaptureFixture[str], files: dict[str, Path]
) -> None:
    """Over several files the exit code is the worst one, and no file changes on disk."""
    before = {k: p.read_bytes() for k, p in files.items()}
    code, out, _ = run(capsys, "check", "--json", *(str(p) for p in files.values()))
    assert code == 4
    assert len(json_lines(out)) == 4
    assert {k: p.read_bytes() for k, p in files.items()} == before


def test_diff_shows_the_repair(capsys: pytest.CaptureFixture[str], files: dict[str, Path]) -> None:
    """--diff prints a unified diff whose added lines are the derived trigger."""
    code, out, _ = run(capsys, "check", "--diff", str(files["repairable"]))
    assert code == 3
    assert f"--- {files['repairable']}" in out
    assert f"+++ {files['repairable']} (repaired)" in out
    added = [line for line in out.splitlines() if line.startswith("+") and "topic" in line]
    assert added, out


def test_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, project: Path
) -> None:
    """``-`` reads the file from stdin; its project root is the one given (or the cwd)."""
    data = write(project / "x.json", staging_doc(project, "piped"))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    code, out, _ = run(capsys, "check", "--json", "--project-root", str(project), "-")
    assert code == 0
    assert json_lines(out)[0]["session_id"] == "piped"


def test_repaired_output_is_valid(
    capsys: pytest.CaptureFixture[str], files: dict[str, Path], project: Path
) -> None:
    """The repaired file check prints is what the engine then calls valid."""
    code, out, _ = run(capsys, "check", str(files["repairable"]))
    assert code == 3
    body = out.split("  repaired file:\n", 1)[1]
    verdict = decide(body.encode(), Context(project_root=str(project), file_name="x.json"))
    assert verdict.decision is Decision.VALID


@pytest.mark.parametrize(
    "argv", [["check"], ["check", "--bogus", "x.json"], ["check", "/no/such/file.json"]]
)
def test_usage_errors_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """No file, an unknown option, an unreadable file: exit 2 and one line on stderr."""
    code, _, err = run(capsys, *argv)
    assert code == 2
    line = one_line_error(err)
    if argv[-1].startswith("/no/"):
        assert "/no/such/file.json" in line


def test_lone_surrogates_never_raise(capsys: pytest.CaptureFixture[str], project: Path) -> None:
    """A session id with a lone surrogate escape (JSON.parse accepts it) is printed as an escape,
    in --json and in text; the JSON line still parses back to the same value."""
    doc = staging_doc(project, "s")
    path = project / "odd.json"
    path.write_bytes(json.dumps(doc).replace('"s"', '"s\\ud800"', 1).encode())
    code, out, err = run(capsys, "check", "--json", "--project-root", str(project), str(path))
    assert (code, err) == (0, "")
    assert json_lines(out)[0]["session_id"] == "s\ud800"
    code, out, err = run(capsys, "check", "--project-root", str(project), str(path))
    assert code == 0
    assert "Traceback" not in err


def test_check_and_once_agree_on_a_file_dated_in_the_future(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """Issue 20 (one reader, one answer): a file that does not parse, dated a day ahead, settles
    counting from when memstaged first saw it (SPEC 5), so with ``--settle 0`` both ``check``
    and ``--once`` quarantine it; ``check`` compared the clock with the future mtime and said
    ``deferred`` for a day."""
    path = memory_dir / "staging" / "ahead.json"
    path.write_bytes(json.dumps(staging_doc(project, "ahead")).encode()[:40])  # does not parse
    ahead = time.time() + 86_400
    os.utime(path, (ahead, ahead))
    code, out, _ = run(capsys, "check", "--json", "--settle", "0", str(path))
    assert (code, json_lines(out)[0]["decision"]) == (4, "quarantined")
    code, _, _ = run(capsys, "--once", "--settle", "0", "--memory-dir", str(memory_dir))
    assert code == 0
    assert decisions(log_file) == {"ahead.json": "quarantined"}


def test_check_decides_exactly_as_once(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    project: Path,
    memory_dir: Path,
    log_file: Path,
) -> None:
    """Issue 13 item 5: on the same files and settings (a config with a small size limit),
    ``check`` gives each file the decision ``--once --dry-run`` logs for it: a file over the
    limit is quarantined for its size (check called a 9 MB file valid), a FIFO and a link are
    skipped (check hung on the FIFO), a fresh unparseable file is deferred."""
    files = one_of_each(project, memory_dir)
    staging = memory_dir / "staging"
    big = staging / "big.json"
    write(big, staging_doc(project, "big", padding="x" * 5000))
    os.mkfifo(staging / "fifo.json")
    os.symlink(files["valid"], staging / "link.json")
    write(staging / "fresh.json", b'{"half')
    settled(big)
    config = tmp_path / "c.toml"
    config.write_text("max_file_size = 4096\nsettle = 600\n")
    names = sorted(p.name for p in staging.iterdir())
    code, out, _ = run(
        capsys, "check", "--json", "--config", str(config), *(str(staging / n) for n in names)
    )
    checked = {Path(e["path"]).name: e["decision"] for e in map(json.loads, out.splitlines())}
    assert checked["big.json"] == "quarantined"
    assert checked["fifo.json"] == checked["link.json"] == "skipped"
    assert checked["fresh.json"] == "deferred"
    once_argv = ["--once", "--dry-run", "--settle", "0", "--memory-dir", str(memory_dir)]
    # --once waits for the fresh file to settle: compare it with a zero settle on both sides
    code_once, _, _ = run(capsys, *once_argv, "--config", str(config))
    assert code_once == 0
    logged = {
        Path(e["path"]).name: e["decision"]
        for e in read_events(log_file)
        if e["event"] == "decision"
    }
    _, out, _ = run(
        capsys,
        "check",
        "--json",
        "--settle",
        "0",
        "--config",
        str(config),
        *(str(staging / n) for n in names),
    )
    checked = {Path(e["path"]).name: e["decision"] for e in map(json.loads, out.splitlines())}
    assert checked == logged
    assert code == 6  # the worst: skipped


def test_check_hints_at_project_root_when_every_file_is_foreign(
    capsys: pytest.CaptureFixture[str], log_file: Path
) -> None:
    """Issue 13 item 5: on the shipped examples (whose project is not where the clone is) every
    file is foreign, and check says to pass --project-root; with it, the files are decided."""
    examples = sorted(DEMO.iterdir())
    code, _, err = run(capsys, "check", *map(str, examples))
    assert code == 4  # foreign, and one that is not even JSON
    assert "--project-root" in one_line_error(err)
    code, out, err = run(
        capsys, "check", "--project-root", "/x/example-project", *map(str, examples)
    )
    assert err == ""
    assert code == 4 and ": valid" in out and ": repaired" in out


def test_check_help_says_it_decides_as_once_and_gives_the_exit_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 13 item 5: ``check --help`` says it decides as --once would, with the codes."""
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    text = capsys.readouterr().out
    assert "decides exactly as --once" in text
    for line in ("0  valid", "3  repairable", "4  would be quarantined", "5  foreign"):
        assert line in text
