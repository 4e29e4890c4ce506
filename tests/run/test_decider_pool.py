"""How long the main process waits on a decider (:mod:`memstaged.run.decider_pool`)."""

from __future__ import annotations

import math

import pytest

from memstaged.run.decider_pool import ANSWER_SECONDS, ANSWER_SECONDS_PER_MIB, answer_seconds


@pytest.mark.parametrize("nbytes", [0, 1, 100 << 10, 450 << 10, 1 << 20, 1600 << 10, 16 << 20])
def test_a_chunk_s_answer_is_waited_for_its_bound_and_at_most_1_42_times_that(nbytes: int) -> None:
    """A stopped worker costs the answer bound of the chunk it holds (the send buffer takes
    chunks in whole, so no send stalls first): ten seconds and twenty per MiB, rounded up to a
    step of ratio √2 and a whole second. Rounded up to a power of two, a chunk of 450 KB waited
    32 s for a bound of 18.8 s."""
    wanted = ANSWER_SECONDS + ANSWER_SECONDS_PER_MIB * nbytes / (1 << 20)
    assert wanted <= answer_seconds(nbytes) <= math.sqrt(2) * wanted + 1


def test_chunks_of_like_sizes_share_one_bound() -> None:
    """One bound for the chunks of ordinary files (set on a worker's socket once, not for each
    chunk: four system calls each)."""
    assert len({answer_seconds(n << 10) for n in range(400, 650, 10)}) == 1
