"""Fuzzing the command line: no argument list gives a traceback (issue 13 item 4).

Hypothesis builds argument lists from the parser's own options (every command's) and hostile
values (infinities, huge numbers and durations, NUL, a lone surrogate, empty strings, paths that
are not memory dirs, a config file that is not UTF-8, a FIFO), and runs them through
``cli.main(argv)`` in this process. Whatever happens, nothing but a one-line error reaches the
user: a usage error is exit 2 with exactly one line on stderr; no run shows a traceback.

Every numeric option (found in the parser: a ``type=`` or a metavar that names a number) also gets
any number hypothesis draws (issue 19 item 2: ``log -n 99999999999999999999999`` ended in an
``OverflowError`` traceback); each huge, negative, fractional and non-numeric value in turn is
``tests/cli/test_option_types.py``'s, and the values themselves are ``support/cli_values.py``'s.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.cli_values import NUMBERS, NUMERIC, NUMERIC_IDS, run_numeric

from memstaged.cli.main import build_parser, main

pytestmark = pytest.mark.usefixtures("plain_output")

#: Options that wait for ever by design (``--follow``) or read what a test must not depend on
#: (the machine's journal), and the command that installs a systemd unit.
_LEFT_OUT = {"--follow", "-f", "--journal", "--journal-dir", "-h", "--help", "--version"}
_COMMANDS = [
    ["--once"],
    ["--once", "--dry-run"],
    ["check"],
    ["log"],
    ["stats"],
    ["status"],
    ["deadletter"],
    ["deadletter", "list"],
    ["deadletter", "show"],
    ["deadletter", "recover"],
    ["deadletter", "purge"],
    ["config", "check"],
    ["config", "show"],
]


def _options(parser: argparse.ArgumentParser) -> set[str]:
    found: set[str] = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if name != "service":
                    found |= _options(sub)
    return found - _LEFT_OUT


OPTIONS = sorted(_options(build_parser()))
_WEIGHTED = ["--config", "--memory-dir", "--settle", "--since", "--older-than", "--project-root"]
VALUES = [
    "",
    " ",
    "inf",
    "-inf",
    "nan",
    "1e308",
    "-1",
    "0",
    "99999999999",
    "9" * 400,
    "3000000d",
    "99999999999d",
    "1e9w",
    "today",
    "yesterday",
    "x",
    "a\x00b",
    "caf\udce9",
    "\x1b[2J",
    "--",
    "/",
    "..",
    "*",
    "[",
    "always",
    "never",
    "hour",
    "valid",
    "quarantined",
]


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_argument_list_gives_a_traceback(
    data: st.DataObject,
    world: dict[str, str],
    log_file: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 13 item 4: for any mix of real options and hostile values after any command,
    ``main`` returns an exit code (never raises); exit 2 means one line on stderr that starts
    with ``memstaged`` (``check`` may say one line per unreadable file), beside the config's own
    warnings; no traceback."""
    monkeypatch.chdir(Path(world["mdir"]).parent.parent.parent.parent)
    option = st.sampled_from(OPTIONS)
    value = st.sampled_from(VALUES) | st.sampled_from(sorted(world.values()))
    # mostly "--option value" pairs, as a person types them; sometimes a lone word of either
    item = st.one_of(
        st.tuples(option, value).map(list),
        option.map(lambda o: [o]),
        value.map(lambda v: [v]),
        # the options whose values went wrong before get hostile values more often
        st.tuples(st.sampled_from(_WEIGHTED), value).map(list),
    )
    items = data.draw(st.lists(item, max_size=4))
    argv = data.draw(st.sampled_from(_COMMANDS)) + [word for group in items for word in group]
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own --help/--version: exit 0, nothing else
        assert exit_.code in (0, None), argv
        return
    _, err = capsys.readouterr()
    assert "Traceback" not in err, (argv, err)
    assert code in (0, 1, 2, 3, 4, 5, 6), (argv, code)
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        # JSON lines are decisions logged; "memstaged: warning:" lines are the lenient config
        # load's, one per key it left out, said before the command's own error
        usage = [
            line
            for line in lines
            if not line.startswith("{") and not line.startswith("memstaged: warning: ")
        ]
        assert usage, (argv, err)
        assert all(line.startswith("memstaged") for line in usage), (argv, err)
        if argv[0] != "check":
            assert len(usage) == 1, (argv, err)


# -- numeric options (issue 19 item 2) ----------------------------------------------------------


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
@pytest.mark.parametrize(("path", "action"), NUMERIC, ids=NUMERIC_IDS)
def test_no_numeric_value_gives_a_traceback(
    path: tuple[str, ...],
    action: argparse.Action,
    data: st.DataObject,
    numeric_world: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 19 item 2: any number hypothesis draws for a numeric option (of any size or sign,
    beyond C's 64 bits either way, fractional, not finite, or not a number) gives exit 0, 1 or
    2, one line for 2, no traceback."""
    monkeypatch.chdir(numeric_world["project"])
    value = data.draw(
        st.one_of(
            st.integers().map(str),
            st.integers(min_value=2**63 - 1).map(str),
            st.integers(max_value=-(2**63)).map(str),
            st.floats().map(str),
            st.floats().map(repr),
            st.decimals(allow_nan=True).map(str),
            st.sampled_from(NUMBERS),
            st.tuples(st.integers(), st.sampled_from("smhdwx")).map(lambda t: f"{t[0]}{t[1]}"),
            st.text(max_size=8),
        )
    )
    run_numeric(path, action, value, numeric_world, capsys)
