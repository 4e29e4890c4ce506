"""Fuzzing the command line: no argument list gives a traceback (issue 13 item 4).

Hypothesis builds argument lists from the parser's own options (every command's) and hostile
values (infinities, huge numbers and durations, NUL, a lone surrogate, empty strings, paths that
are not memory dirs, a config file that is not UTF-8, a FIFO), and runs them through
``cli.main(argv)`` in this process. Whatever happens, nothing but a one-line error reaches the
user: a usage error is exit 2 with exactly one line on stderr; no run shows a traceback.

Every numeric option (found in the parser: a ``type=`` or a metavar that names a number) also gets
huge, negative, fractional and non-numeric values, each one in turn and drawn at random (issue 19
item 2: ``log -n 99999999999999999999999`` ended in an ``OverflowError`` traceback).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.documents import staging_doc, write

from memstaged.cli import option_types
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


@pytest.fixture
def world(tmp_path: Path) -> dict[str, str]:
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
    with ``memstaged`` (``check`` may say one line per unreadable file); no traceback."""
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
        usage = [line for line in lines if not line.startswith("{")]  # JSON: decisions logged
        assert usage, (argv, err)
        assert all(line.startswith("memstaged") for line in usage), (argv, err)
        if argv[0] != "check":
            assert len(usage) == 1, (argv, err)


# -- numeric options (issue 19 item 2) ----------------------------------------------------------

#: Metavars that say an option takes a number or a duration.
_NUMERIC_METAVARS = {"N", "SECONDS", "DURATION"}
#: What each command needs besides the option under test to get as far as using its value.
_NEEDS: dict[tuple[str, ...], list[str]] = {
    (): ["--once", "--dry-run"],
    ("check",): ["{file}"],
    ("deadletter",): ["list"],
    ("deadletter", "show"): ["{record}"],
    ("deadletter", "recover"): ["--all", "--dry-run"],
    ("deadletter", "purge"): ["--older-than", "1d"],
}


def _is_numeric(action: argparse.Action) -> bool:
    return (
        bool(action.option_strings)
        and action.type is not option_types.record_id  # an ID: tests/system/test_deadletter_ids.py
        and (action.type is not None or action.metavar in _NUMERIC_METAVARS)
    )


def _numeric_options(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.Action]]:
    """(command words, option) for every numeric option of every command but ``service``."""
    found = []
    for action in parser._actions:
        if _is_numeric(action):
            found.append((path, action))
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if name != "service":
                    found += _numeric_options(sub, (*path, name))
    return found


NUMERIC = _numeric_options(build_parser())
_NUMERIC_IDS = [" ".join((*path, max(a.option_strings, key=len))) for path, a in NUMERIC]
#: Hostile numbers: huge (beyond C's ssize_t, beyond Python's int-string limit), negative,
#: fractional, not finite, and not numbers at all.
HUGE = ["99999999999999999999999", "9" * 400, "9" * 5000, "1e999", "1e308"]
NEGATIVE = ["-1", "-99999999999999999999999", "-1e999", "-inf", "-0.5"]
FRACTIONAL = ["1.5", "0.000001", "1e-999", "2.5h"]
NOT_NUMBERS = ["", " ", "x", "nan", "-nan", "inf", "infinity", "0x10", "1_000", "\u0663", "a\x00b"]
NUMBERS = HUGE + NEGATIVE + FRACTIONAL + NOT_NUMBERS + ["0", "-0", "007", "99999999999d"]
#: Refused by every numeric option: negative, not finite, or not a number.
ALWAYS_REFUSED = [*NEGATIVE[:-1], "-0.5", "", " ", "x", "nan", "inf", "1e999", "a\x00b"]


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


def _run_numeric(
    path: tuple[str, ...],
    action: argparse.Action,
    value: str,
    world: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> tuple[int, str, str]:
    """``memstaged <path> --option=VALUE ...``: the exit code, stdout and the usage line(s)."""
    option = max(action.option_strings, key=len)
    needs = [] if option == "--older-than" else _NEEDS.get(path, [])
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


@pytest.fixture
def one_event(log_file: Path) -> Path:
    """A decision log with one event, so ``log`` has something to show."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.write_text('{"timestamp":"2026-01-01T00:00:00Z","event":"start","version":"x"}\n')
    return log_file


@pytest.fixture
def numeric_world(
    world: dict[str, str], one_event: Path, capsys: pytest.CaptureFixture[str]
) -> dict[str, str]:
    """The world with ``bad.json`` quarantined, so ``deadletter show`` has a record to show."""
    assert main(["--once", "--memory-dir", world["mdir"]]) == 0
    capsys.readouterr()
    assert main(["deadletter", "list", "--json", "--memory-dir", world["mdir"]]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert records
    return {**world, "record": records[0]["id"]}


@pytest.mark.parametrize(("path", "action"), NUMERIC, ids=_NUMERIC_IDS)
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
        code, _, err = _run_numeric(path, action, value, numeric_world, capsys)
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


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
@pytest.mark.parametrize(("path", "action"), NUMERIC, ids=_NUMERIC_IDS)
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
    _run_numeric(path, action, value, numeric_world, capsys)
