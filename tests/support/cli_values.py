"""Values for a command line: a world of paths a command may be given (a memory dir with a file
of each kind, configs good and bad, a FIFO), and every numeric option of every command with the
hostile numbers each must take, clamp or refuse in one line (issue 13 item 4, issue 19 item 2).
The fixtures built on them are in ``tests/conftest.py``: ``world``, ``one_event``,
``numeric_world``."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from memstaged.cli import option_types
from memstaged.cli.main import build_parser, main
from support.documents import staging_doc, write


def cli_world(tmp_path: Path) -> dict[str, str]:
    """A memory dir with one settled file of each kind, configs good and bad, a FIFO."""
    project = tmp_path / "example-project"
    mdir = project / ".pi" / "memory" / "project"
    (mdir / "staging").mkdir(parents=True)
    good = mdir / "staging" / "good.json"
    write(good, staging_doc(project, "good"))
    write(mdir / "staging" / "bad.json", b"{nope")
    for path in (mdir / "staging").iterdir():
        os.utime(path, (1_700_000_000, 1_700_000_000))
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "bad.toml").write_bytes(b"settle = \xff\n")
    (tmp_path / "inf.toml").write_text("settle = inf\nmax_file_size = -1\n")
    (tmp_path / "ok.toml").write_text(f'memory_dirs = ["{mdir}"]\n')
    return {
        "mdir": str(mdir),
        "project": str(project),
        "file": str(good),
        "fifo": str(tmp_path / "fifo.json"),
        "bad_config": str(tmp_path / "bad.toml"),
        "inf_config": str(tmp_path / "inf.toml"),
        "ok_config": str(tmp_path / "ok.toml"),
        "missing": str(tmp_path / "missing"),
    }


#: Metavars that say an option takes a number or a duration.
NUMERIC_METAVARS = {"N", "SECONDS", "DURATION"}


#: What each command needs besides the option under test to get as far as using its value.
NEEDS: dict[tuple[str, ...], list[str]] = {
    (): ["--once", "--dry-run"],
    ("check",): ["{file}"],
    ("deadletter",): ["list"],
    ("deadletter", "show"): ["{record}"],
    ("deadletter", "recover"): ["--all", "--dry-run"],
    ("deadletter", "purge"): ["--older-than", "1d"],
}


def is_numeric(action: argparse.Action) -> bool:
    return (
        bool(action.option_strings)
        and action.type is not option_types.record_id  # an ID: tests/system/test_deadletter_ids.py
        and (action.type is not None or action.metavar in NUMERIC_METAVARS)
    )


def numeric_options(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.Action]]:
    """(command words, option) for every numeric option of every command but ``service``."""
    found = []
    for action in parser._actions:
        if is_numeric(action):
            found.append((path, action))
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if name != "service":
                    found += numeric_options(sub, (*path, name))
    return found


NUMERIC = numeric_options(build_parser())


NUMERIC_IDS = [" ".join((*path, max(a.option_strings, key=len))) for path, a in NUMERIC]


#: Hostile numbers: huge (beyond C's ssize_t, beyond Python's int-string limit), negative,
#: fractional, not finite, and not numbers at all.
HUGE = ["99999999999999999999999", "9" * 400, "9" * 5000, "1e999", "1e308"]


NEGATIVE = ["-1", "-99999999999999999999999", "-1e999", "-inf", "-0.5"]


FRACTIONAL = ["1.5", "0.000001", "1e-999", "2.5h"]


NOT_NUMBERS = ["", " ", "x", "nan", "-nan", "inf", "infinity", "0x10", "1_000", "\u0663", "a\x00b"]


NUMBERS = HUGE + NEGATIVE + FRACTIONAL + NOT_NUMBERS + ["0", "-0", "007", "99999999999d"]


#: Refused by every numeric option: negative, not finite, or not a number.
ALWAYS_REFUSED = [*NEGATIVE[:-1], "-0.5", "", " ", "x", "nan", "inf", "1e999", "a\x00b"]


def run_numeric(
    path: tuple[str, ...],
    action: argparse.Action,
    value: str,
    world: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> tuple[int, str, str]:
    """``memstaged <path> --option=VALUE ...``: the exit code, stdout and the usage line(s)."""
    option = max(action.option_strings, key=len)
    needs = [] if option == "--older-than" else NEEDS.get(path, [])
    argv = [*path, f"{option}={value}", *(word.format(**world) for word in needs)]
    capsys.readouterr()
    code = main(argv)  # a traceback here fails the test: main must return, whatever the value
    out, err = capsys.readouterr()
    assert "Traceback" not in err, (argv, err)
    assert code in (0, 1, 2), (argv, code, err)
    usage = [line for line in err.splitlines() if line.strip() and not line.startswith("{")]
    if code == 2:
        assert len(usage) == 1, (argv, err)
        assert usage[0].startswith("memstaged"), (argv, err)
        assert option in usage[0] or (set(action.option_strings) & set(usage[0].split())), (
            argv,
            err,
        )
    return code, out, "\n".join(usage)


def one_event_log(log_file: Path) -> Path:
    """A decision log with one event, so ``log`` has something to show."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.write_text('{"timestamp":"2026-01-01T00:00:00Z","event":"start","version":"x"}\n')
    return log_file


def with_a_record(world: dict[str, str], capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """The world with ``bad.json`` quarantined, so ``deadletter show`` has a record to show."""
    assert main(["--once", "--memory-dir", world["mdir"]]) == 0
    capsys.readouterr()
    assert main(["deadletter", "list", "--json", "--memory-dir", world["mdir"]]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert records
    return {**world, "record": records[0]["id"]}
