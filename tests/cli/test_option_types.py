"""Option values (:mod:`memstaged.cli.option_types`): every number and duration a command takes
is bounded, and a value out of range is one line and exit 2, not a traceback."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from support.cli_values import ALWAYS_REFUSED, HUGE, NUMBERS, NUMERIC, NUMERIC_IDS, run_numeric
from support.commands import one_line_error, run
from support.documents import one_of_each

from memstaged.cli import option_types
from memstaged.cli.main import main

pytestmark = pytest.mark.usefixtures("plain_output")


def test_huge_durations(
    capsys: pytest.CaptureFixture[str], project: Path, memory_dir: Path, log_file: Path
) -> None:
    """Issue 13 item 4: ``log --since 3000000d`` shows everything (a time before the first
    date), ``purge --older-than 99999999999d`` is one line and exit 2; both were a
    ValueError traceback."""
    one_of_each(project, memory_dir)
    assert run(capsys, "--once", "--memory-dir", str(memory_dir))[0] == 0
    code, out, err = run(capsys, "log", "--since", "3000000d", "--json")
    assert code == 0, err
    assert len(out.splitlines()) == 5  # four decisions and the look at fix.json's rewrite
    code, _, err = run(capsys, "deadletter", "purge", "--older-than", "99999999999d")
    assert code == 2
    assert "--older-than" in one_line_error(err)


# -- numeric options (issue 19 item 2) -------------------------------------------------------------


def test_every_numeric_option_is_parsed_by_a_function_that_bounds_it() -> None:
    """Issue 19 item 2: no numeric option takes its value with bare ``int`` or ``float``, which
    let ``log -n 99999999999999999999999`` through to ``deque(maxlen=)``; the options found
    include every one the issue and the code name."""
    names = {name for _, action in NUMERIC for name in action.option_strings}
    assert {"--settle", "--lines", "--top", "--max-bytes", "--wait", "--older-than"} <= names
    for path, action in NUMERIC:
        assert action.type not in (int, float), (path, action.option_strings)
    counts = {max(a.option_strings, key=len) for _, a in NUMERIC if a.type is option_types.count}
    assert counts == {"--lines", "--top", "--max-bytes", "--max-unseen"}


@pytest.mark.parametrize(("path", "action"), NUMERIC, ids=NUMERIC_IDS)
def test_a_numeric_option_takes_clamps_or_refuses_any_value(
    path: tuple[str, ...],
    action: argparse.Action,
    numeric_world: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 19 item 2: every numeric option of every command, given each huge, negative,
    fractional or non-numeric value in turn, exits 0, 1 or 2; exit 2 is one line naming the
    option; never a traceback. Negative, infinite and non-numeric values are refused."""
    monkeypatch.chdir(numeric_world["project"])
    for value in NUMBERS:
        code, _, err = run_numeric(path, action, value, numeric_world, capsys)
        if value in ALWAYS_REFUSED:
            assert code == 2, (path, action.option_strings, value, err)


@pytest.mark.parametrize("reverse", [[], ["--reverse"]], ids=["oldest-first", "reverse"])
@pytest.mark.parametrize("value", HUGE[:3])
def test_a_huge_log_count_shows_every_event(
    value: str,
    reverse: list[str],
    one_event: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 19 item 2: ``log -n 99999999999999999999999`` (and with ``--reverse``) ended in
    ``OverflowError`` from ``deque(maxlen=)`` (``ValueError`` from ``islice``); a count larger
    than any log is clamped, as ``tail -n`` does, and shows every event."""
    capsys.readouterr()
    code = main(["log", "-n", value, "--no-pager", *reverse])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert out.count("start") == 1, out
