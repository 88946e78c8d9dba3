"""An HPU Trainer prints one line naming the HPU backend at construction: no GPU / TPU lines, no tips, no repeat."""

from __future__ import annotations

import logging
import warnings

import lightning as L
import pytest

from hpu_nb.core import trainer_output
from hpu_nb.core.trainer_output import RANK_ZERO_LOGGER, HPUTrainerNoiseFilter
from tests.helpers.models import LinearModel, regression_data


@pytest.fixture
def records(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    assert trainer_output.install() and trainer_output.install()  # idempotent
    caplog.set_level(logging.INFO, logger=trainer_output.RANK_ZERO_LOGGER)
    return caplog


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    # what the handlers receive once the logger's filters ran (caplog's handler sits below the filter)
    logger = logging.getLogger(trainer_output.RANK_ZERO_LOGGER)
    return [r.getMessage() for r in caplog.records if all(f.filter(r) for f in logger.filters)]


def test_hpu_trainer_prints_one_hpu_line(records: pytest.LogCaptureFixture) -> None:
    trainer = L.Trainer(accelerator="hpu", devices=1, max_steps=1, enable_progress_bar=False,
                        enable_model_summary=False)
    built = _messages(records)
    assert built[0] == "HPU: using 1 of 8 x GAUDI2 (emulated Gaudi on the CPU)"
    assert not [m for m in built if m.startswith(("GPU available", "TPU available", "💡"))], built
    records.clear()
    with warnings.catch_warnings(record=True) as caught:  # the filters in force, as install() left them
        trainer_output.install()
        trainer.fit(LinearModel(8), regression_data(n=16, features=8, batch_size=16))
    assert not [m for m in _messages(records) if "available" in m]  # the fact is not repeated at fit
    assert not [w for w in caught if "LeafSpec" in str(w.message)]


def test_other_trainers_keep_lightnings_lines(records: pytest.LogCaptureFixture) -> None:
    L.Trainer(accelerator="hpu", devices=1)
    records.clear()
    L.Trainer(accelerator="cpu", devices=1)
    shown = _messages(records)
    assert any(m.startswith("GPU available") for m in shown) and any(m.startswith("TPU available") for m in shown)
    assert not any(m.startswith("HPU:") for m in shown)
    # Lightning's tips (printed or not, by its own rules) are not filtered out after a non-HPU Trainer
    tip = logging.LogRecord(RANK_ZERO_LOGGER, logging.INFO, __file__, 0, "💡 Tip: something", None, None)
    assert HPUTrainerNoiseFilter().filter(tip)
    L.Trainer(accelerator="hpu", devices=1)
    assert not HPUTrainerNoiseFilter().filter(tip)


def test_lightning_still_logs_device_info_where_we_wrap_it() -> None:
    """Tripwire: the Trainer calls `setup._log_device_info(self)` while it is built, and that function logs the
    GPU / TPU lines; if a Lightning upgrade moves either, the one-line output must be revisited."""
    import inspect

    from lightning.pytorch.trainer import setup as trainer_setup

    assert "setup._log_device_info(self)" in inspect.getsource(L.Trainer.__init__)
    original = inspect.unwrap(trainer_setup._log_device_info)
    source = inspect.getsource(original)
    assert "GPU available" in source and "TPU available" in source


def test_importing_hpu_nb_installs_the_one_line_output() -> None:
    from lightning.pytorch.trainer import setup as trainer_setup

    import hpu_nb.core.registration as registration

    registration.register_all()
    assert getattr(trainer_setup._log_device_info, "_hpu_nb_wrapped", False)


def test_a_fit_under_error_futurewarning_raises_no_leafspec_warning() -> None:
    """lightning-habana's pytest settings turn every FutureWarning into an error; Lightning 2.6's _pytree builds torch
    2.13's deprecated LeafSpec on every batch. The warning is not raised at all (a filter would lose to pytest's)."""
    import inspect

    from lightning.pytorch.utilities import _pytree as lightning_pytree

    source = inspect.getsource(lightning_pytree)
    # the name is only imported and called (a factory in its place cannot serve isinstance checks)
    assert source.count("LeafSpec") == source.count("LeafSpec()") + 1, source
    trainer_output.install()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        trainer = L.Trainer(accelerator="hpu", devices=1, max_steps=1, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, enable_checkpointing=False)
        trainer.fit(LinearModel(8), regression_data(n=16, features=8, batch_size=16))
    assert trainer.global_step == 1
