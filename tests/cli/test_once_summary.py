"""``--once``'s summary, in each of its forms, for a look at a rewrite that waits for the log."""

from __future__ import annotations

import io
import json
from collections import Counter

import pytest

from memstaged import safe_text
from memstaged.cli import once_summary
from memstaged.run.once import LOOKS_WAITING, Report


def _report(waiting: int) -> Report:
    counts = Counter({"repaired": 1, "valid": 2})
    if waiting:
        counts[LOOKS_WAITING] = waiting
    return Report({"/m": counts}, {"/m": 0}, {}, dry_run=False)


@pytest.mark.parametrize("form", ["lines", "table", "json"])
@pytest.mark.parametrize("waiting", [0, 1])
def test_a_waiting_look_is_said_in_every_form_and_is_no_file_of_its_own(
    monkeypatch: pytest.MonkeyPatch, form: str, waiting: int
) -> None:
    """Exit 1 and ``looks_waiting`` said when a look waits for the log (not in the total: no
    file of its own); neither when none does. The table said nothing before, and exited 1."""
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr(safe_text, "is_terminal", lambda _out: form == "table")
    code = once_summary.print_summary(_report(waiting), as_json=form == "json")
    text = out.getvalue()
    assert code == waiting
    if form == "json":
        summary = json.loads(text)
        assert summary["total"] == 3
        assert summary.get(LOOKS_WAITING, 0) == waiting
    elif form == "lines":
        assert "total=3 " in text
        assert (f"{LOOKS_WAITING}=1" in text) == bool(waiting)
    else:
        assert text.splitlines()[2].split()[-1] == "3"  # the total column
        assert (LOOKS_WAITING in text) == bool(waiting)
