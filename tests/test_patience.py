"""Waiting with a deadline (:func:`memstaged.patience.poll`), on a clock the test moves."""

from __future__ import annotations

from memstaged.patience import poll


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.pauses: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def test_the_first_answer_is_returned_without_a_pause() -> None:
    clock = _Clock()
    assert poll(lambda: "had", 5.0, first=0.1, most=1.0, clock=clock, sleep=clock.sleep) == "had"
    assert clock.pauses == []


def test_pauses_double_up_to_most_and_never_pass_the_deadline() -> None:
    """Nothing had: tried after each pause, the pauses 0.1, 0.2, 0.4, 0.8, 1, 1, then what is
    left; ``None`` at the deadline, after one last try."""
    clock = _Clock()
    tries: list[float] = []

    def attempt() -> None:
        tries.append(clock.now)

    assert poll(attempt, 4.0, first=0.1, most=1.0, clock=clock, sleep=clock.sleep) is None
    assert [round(p, 6) for p in clock.pauses] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 0.5]
    assert round(clock.now, 6) == 104.0
    assert len(tries) == len(clock.pauses) + 1
    assert round(tries[-1], 6) == 104.0


def test_an_answer_after_some_pauses() -> None:
    clock = _Clock()
    answers = iter([None, None, 7])
    assert poll(lambda: next(answers), 10.0, first=1, most=1, clock=clock, sleep=clock.sleep) == 7
    assert clock.pauses == [1, 1]


def test_no_time_allowed_is_one_try() -> None:
    clock = _Clock()
    calls: list[int] = []
    assert (
        poll(lambda: calls.append(1), 0.0, first=1, most=1, clock=clock, sleep=clock.sleep) is None
    )
    assert calls == [1]
    assert clock.pauses == []
