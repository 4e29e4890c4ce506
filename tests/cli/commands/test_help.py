"""``memstaged help [COMMAND [ACTION]]``."""

from __future__ import annotations

import pytest

from memstaged.cli.main import main


@pytest.mark.parametrize("words", [[], ["status"], ["deadletter", "recover"]])
def test_help_prints_what_dash_dash_help_prints(
    capsys: pytest.CaptureFixture[str], words: list[str]
) -> None:
    """Issue 31 polish: ``memstaged help X Y`` is ``memstaged X Y --help``, exit 0."""
    with pytest.raises(SystemExit) as stopped:
        main([*words, "--help"])
    assert stopped.value.code == 0
    expected = capsys.readouterr().out
    assert main(["help", *words]) == 0
    assert capsys.readouterr().out == expected
    assert expected.startswith("usage: memstaged")


@pytest.mark.parametrize(
    ("words", "line"),
    [
        (["nope"], "memstaged: 'nope' is not a command of memstaged (its commands: check,"),
        (["deadletter", "ids"], "memstaged: 'ids' is not a command of memstaged deadletter"),
        (
            ["status", "x"],
            "memstaged: 'x' is not a command of memstaged status (its commands: none)",
        ),
        (["-x"], "memstaged: unrecognized arguments: -x"),
    ],
)
def test_help_of_no_command_is_one_line(
    capsys: pytest.CaptureFixture[str], words: list[str], line: str
) -> None:
    """A word that names no command is one line on stderr, exit 2; the internal ``ids`` action
    (what Tab completion runs) is not offered."""
    assert main(["help", *words]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(line), err
    assert len(err.splitlines()) == 1
    assert "ids" not in err.split("(its commands:")[-1]
