"""The command line (:mod:`memstaged.cli.main`): argv to a command, and whatever goes wrong on
the way (a path that is not a memory dir, a config that cannot be read, an option out of
range) said in one line with exit 2, never as a traceback, by every command."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from support.commands import one_line_error, run
from support.documents import staging_doc, write

from memstaged.cli.main import _named_command, main

pytestmark = pytest.mark.usefixtures("plain_output")


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


_REFUSED: dict[str, Callable[[Path], str]] = {
    "project-root": str,
    "empty": lambda project: "",
    "root": lambda project: "/",
}


_COMMANDS = {
    "once": ["--once"],
    "once-dry-run": ["--once", "--dry-run"],
    "status": ["status"],
    "deadletter-list": ["deadletter", "list"],
    "recover": ["deadletter", "recover", "--all"],
    "purge": ["deadletter", "purge", "--older-than", "1d", "--yes"],
}


@pytest.mark.parametrize("command", list(_COMMANDS))
@pytest.mark.parametrize("where", list(_REFUSED))
def test_a_path_that_is_not_a_memory_dir_is_refused_and_left_alone(
    capsys: pytest.CaptureFixture[str],
    project: Path,
    memory_dir: Path,
    log_file: Path,
    where: str,
    command: str,
) -> None:
    """Issue 13 item 2 (SPEC 5): ``--memory-dir`` naming the project root, ``''`` or ``/`` is
    refused with one line and exit 2 by ``--once`` (dry run too) and every command that takes
    it, and nothing is created there (it was a silent ``total=0`` that left a lock file)."""
    target = _REFUSED[where](project)
    before = _tree(project)
    code, _, err = run(capsys, *_COMMANDS[command], "--memory-dir", target)
    assert code == 2
    line = one_line_error(err)
    assert "not a memory dir" in line or "empty" in line
    assert not line.startswith("memstaged: memstaged")
    assert _tree(project) == before
    assert not Path("/.memstaged.lock").exists()


_CONFIG_COMMANDS = [
    ["--once"],
    [],  # the daemon
    ["status"],
    ["log"],
    ["stats"],
    ["deadletter", "list"],
    ["deadletter", "show", "x"],
    ["deadletter", "recover", "--all"],
    ["deadletter", "purge", "--older-than", "1d"],
    ["check", "FILE"],
]


@pytest.mark.parametrize("argv", _CONFIG_COMMANDS, ids=lambda a: "-".join(a) or "daemon")
def test_a_config_file_that_is_not_utf8_is_one_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    project: Path,
    memory_dir: Path,
    log_file: Path,
    argv: list[str],
) -> None:
    """Issue 13 item 4: a config file with a byte that is not UTF-8 is exit 2 and one line
    naming the file, in every command (it was a UnicodeDecodeError traceback)."""
    config = tmp_path / "config.toml"
    config.write_bytes(b"settle = 1 # caf\xe9\n")
    write(memory_dir / "staging" / "a.json", staging_doc(project))
    file = str(memory_dir / "staging" / "a.json")
    argv = [file if a == "FILE" else a for a in argv]
    code, _, err = run(capsys, *argv, "--config", str(config), "--memory-dir", str(memory_dir))
    if argv and argv[0] == "check":
        code, _, err = run(capsys, *argv, "--config", str(config))
    assert code == 2
    assert f"{config}: not UTF-8" in one_line_error(err)


@pytest.mark.parametrize("argv", _CONFIG_COMMANDS, ids=lambda a: "-".join(a) or "daemon")
def test_a_config_path_with_a_nul_byte_is_one_line(
    capsys: pytest.CaptureFixture[str], memory_dir: Path, log_file: Path, argv: list[str]
) -> None:
    """Issue 13 item 4 (found by the argv fuzz test): ``--config 'a<NUL>b'`` is exit 2 and one
    line in every command (``os.open``'s ValueError was a traceback)."""
    argv = [str(memory_dir / "staging" / "a.json") if a == "FILE" else a for a in argv]
    code, _, err = run(capsys, *argv, "--config", "a\x00b", "--memory-dir", str(memory_dir))
    if argv and argv[0] == "check":
        code, _, err = run(capsys, *argv, "--config", "a\x00b")
    assert code == 2
    assert "NUL byte" in one_line_error(err)


@pytest.mark.parametrize("value", ["inf", "1e308", "99999999999", "nan", "-1", "-inf"])
def test_settle_out_of_range_is_one_line(
    capsys: pytest.CaptureFixture[str], memory_dir: Path, log_file: Path, value: str
) -> None:
    """Issue 13 item 4: ``--settle inf/1e308/99999999999`` (OverflowError) and ``nan`` (was
    accepted) are refused with one line and exit 2."""
    code, _, err = run(capsys, "--once", "--settle", value, "--memory-dir", str(memory_dir))
    assert code == 2
    assert "--settle" in one_line_error(err)


@pytest.mark.parametrize("source", ["env", "file"])
def test_settle_out_of_range_from_the_environment_or_the_file(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    memory_dir: Path,
    log_file: Path,
    source: str,
) -> None:
    """Issue 13 item 4: the same bound holds for ``MEMSTAGED_SETTLE`` and the file's
    ``settle`` (TOML has ``inf`` and ``nan``)."""
    argv = ["--once", "--memory-dir", str(memory_dir)]
    if source == "env":
        monkeypatch.setenv("MEMSTAGED_SETTLE", "inf")
    else:
        config = tmp_path / "c.toml"
        config.write_text("settle = nan\n")
        argv += ["--config", str(config)]
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert "settle" in one_line_error(err).lower()


def test_argparse_errors_are_one_line_and_not_doubled(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 13: argparse errors said ``memstaged: memstaged: ...``; now once, and one line."""
    code, _, err = run(capsys, "log", "--lines", "many")
    assert code == 2
    line = one_line_error(err)
    assert line.startswith("memstaged log: argument -n/--lines")
    assert "memstaged: memstaged" not in line


# -- argv to a command -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--once", "--memory-dir", "status"], ""),  # a memory dir called "status"
        (["--memory-dir", "d", "status"], "status"),
        (["--mem", "d", "check", "f"], "check"),  # an abbreviation argparse accepts
        (["--config=c", "log", "-n", "3"], "log"),
        (["-v", "--once"], ""),
        (["stat"], None),  # no such command: argparse says so, with every choice listed
        (["--help"], None),
        (["--", "status"], None),
        (["--dry", "status"], None),  # an abbreviation left to argparse
    ],
)
def test_only_the_named_subcommand_is_built(argv: list[str], named: str | None) -> None:
    """Issue 14 start-up: the subcommand a command line names is found without argparse, so
    only its module is imported; anything unclear (help, ``--``, a typo) builds them all."""
    assert _named_command(argv) == named


def test_a_mistyped_command_still_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    """Building one subcommand's parser does not change what a typo gets: one line naming
    every choice, exit 2."""
    assert main(["stat"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    for name in ("check", "service", "log", "stats", "status", "deadletter"):
        assert f"'{name}'" in err


def test_verbose_is_for_once_only(capsys: pytest.CaptureFixture[str]) -> None:
    """``--verbose`` without ``--once`` is a usage error in one line, exit 2."""
    assert main(["--verbose"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
