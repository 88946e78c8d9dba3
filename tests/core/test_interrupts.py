"""The stop an interrupt agrees on (hpu_nb.core.strategies.interrupts): every rank stops before the same training
batch, whichever rank saw the interrupt first and however their checks interleave; the one line says what the model
holds. Ranks are simulated in one process against a real c10d TCPStore, as the workers use it."""

from __future__ import annotations

import signal
from datetime import timedelta
from types import SimpleNamespace

import pytest
from torch.distributed import TCPStore

from hpu_nb.core.strategies import interrupts
from hpu_nb.core.strategies.interrupts import FitInterrupted, StopAtStepBoundary, stopped_message


@pytest.fixture
def address():
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)
    yield ("127.0.0.1", store.port)
    del store


TRAINER = SimpleNamespace(accumulate_grad_batches=1)


def _starts(rank: StopAtStepBoundary, trainer=TRAINER) -> bool:
    """One training batch start on this rank: whether it stops there."""
    try:
        rank.on_train_batch_start(trainer, None, None, 0)
    except interrupts._StopNow:
        return True
    return False


def test_every_rank_stops_before_the_batch_the_first_interrupted_rank_proposed(address) -> None:
    ranks = [StopAtStepBoundary(address) for _ in range(2)]
    for _ in range(3):  # three batches each, in lock-step
        assert not any(_starts(r) for r in ranks)
    ranks[1]._note(signal.SIGINT, None)  # rank 1 sees the interrupt during batch 3
    ranks[0]._note(signal.SIGINT, None)  # rank 0 too, a moment later
    # batch 4: rank 0 checks first and proposes "stop before 5"; rank 1 proposes too, and reads 5 back
    assert [_starts(r) for r in ranks] == [False, False]
    assert [r._stop_before for r in ranks] == [5, 5]
    assert [_starts(r) for r in ranks] == [True, True]  # both stop before batch 5: weights of 4 batches


def test_a_rank_that_saw_no_interrupt_stops_with_the_others(address) -> None:
    """A rank outside the interrupted process group, or one whose check came before the proposal, still stops before
    the same batch: the proposal names a batch no rank can have started yet."""
    ranks = [StopAtStepBoundary(address) for _ in range(2)]
    assert not _starts(ranks[1])  # rank 1 checks batch 1 before anything was proposed
    ranks[0]._note(signal.SIGINT, None)
    assert not _starts(ranks[0])  # rank 0 at batch 1 proposes "stop before 2"
    assert [_starts(r) for r in ranks] == [True, True]


def test_gradient_accumulation_leaves_room_for_the_ranks_between_syncs(address) -> None:
    ranks = [StopAtStepBoundary(address) for _ in range(2)]
    accumulating = SimpleNamespace(accumulate_grad_batches=4)
    ranks[0]._note(signal.SIGINT, None)
    assert not _starts(ranks[0], accumulating)  # batch 1: proposes "stop before 5", four batches on
    assert not _starts(ranks[1], accumulating) and ranks[1]._stop_before == 5
    for _ in range(3):  # batches 2-4 (rank 1: 2-4 as well, having done 1)
        assert [_starts(r, accumulating) for r in ranks] == [False, False]
    assert [_starts(r, accumulating) for r in ranks] == [True, True]


def test_without_a_store_no_rank_stops_on_its_own() -> None:
    rank = StopAtStepBoundary(None)
    rank._note(signal.SIGINT, None)
    assert not any(_starts(rank) for _ in range(3))  # the launching process ends it after its grace instead


def test_the_one_line() -> None:
    assert stopped_message((7, True)) == (
        "Stopped by you after 7 steps: the model you passed to fit() has the weights of step 7.")
    assert stopped_message((1, True)).startswith("Stopped by you after 1 step:")
    assert "unchanged" in stopped_message((0, True))
    assert "all 30 steps ran" in stopped_message((30, False))
    assert "before fit()" in stopped_message(None)
    assert "fabric.launch()" in stopped_message(None, trainer=False)
    err = FitInterrupted(stopped_message((7, True)))
    assert err._render_traceback_() == [str(err)]  # IPython shows this one line, no traceback
    assert not isinstance(err, (Exception, KeyboardInterrupt))  # not caught by `except Exception`, nor by Lightning's
