"""HPUProfiler: Lightning's PyTorchProfiler that records HPU activity on a Gaudi and says when it could not.

On a Gaudi it asks torch.profiler for CPU + HPU activity (the HPU member exists only once
habana_frameworks.torch has replaced `torch.profiler.ProfilerActivity`; we look it up when the
profiler is created, not at import, so hpu_nb and lightning may be imported in any order). On the
emulated Gaudi it records CPU activity only and writes that fact into each trace's metadata
(top-level key "hpu_nb"), so every viewer of the trace can say so. Its `summary()` is a real one,
read back from the Chrome traces it wrote, and `show()` opens the inline viewer.
"""

from __future__ import annotations

import functools
import glob
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.profilers import PyTorchProfiler
from lightning.pytorch.trainer import setup
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from typing_extensions import override

from hpu_nb.core.noise import (
    CPU_ALLOCATOR_UNKNOWN_BLOCK,
    PROFILER_NATIVE,
    OnceNativeMessage,
    native_stderr_without,
)
from hpu_nb.runtime import get_backend
from hpu_nb.traces import load
from hpu_nb.wiring.viewer_slot import registered_trace_viewer

log = logging.getLogger(__name__)

ALLOWED_HABANA_PROFILE = ("", "profile_api_light")
EMULATED_NOTE = "emulated Gaudi, CPU activity only"
PROFILER_STRING = "hpu"
TRAINING_BATCH_ACTION = "run_training_batch"  # what Lightning's training epoch loop profiles each batch as
ALLOCATOR_NOTE_BATCHES = 32  # training batches caught, at most, waiting for c10's allocator note (profile_memory)
VIEWER_MISSING = ("HPUProfiler.show(): no trace viewer is loaded (it comes with the notebook layer): run "
                  "`%load_ext hpu_nb` in the notebook (or `import hpu_nb.notebook.trace_viewer`) and call show() again."
                  " The trace's text summary:")


class TraceSummaryText:
    """What `show()` gives without the notebook layer: how to get the viewer, then the trace's text summary."""

    def __init__(self, hint: str, summary: str) -> None:
        self.hint, self.summary = hint, summary

    def __repr__(self) -> str:
        return f"{self.hint}\n\n{self.summary}"


class HPUProfiler(PyTorchProfiler):
    """PyTorchProfiler for Gaudi: HPU activity on a Gaudi, a trace summary, and an inline viewer.

    Same arguments as Lightning's ``PyTorchProfiler`` (``dirpath``, ``filename`` for one trace per
    rank, ``schedule``, ``profile_memory``, ...). Traces are Chrome-trace JSON files
    (``<stage>-<filename>-<rank>-<action>.<time>.pt.trace.json``) under ``dirpath`` that TensorBoard's
    torch-tb-profiler plugin and chrome://tracing also open.
    """

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None, **kwargs: Any) -> None:
        _refuse_habana_profile()
        self._backend = get_backend()
        self._device_info = _device_info(self._backend)
        self._activities_given = kwargs.get("activities") is not None
        self._started_at = time.time()
        # profile_memory=True: c10 logs "Memory block of unknown size was allocated before the profiling started" at
        # the first free of a tensor older than the recording (in a training batch): dropped (hpu_nb.core.noise)
        self._allocator_note = (OnceNativeMessage(CPU_ALLOCATOR_UNKNOWN_BLOCK, max_calls=ALLOCATOR_NOTE_BATCHES)
                                if kwargs.get("profile_memory") else None)
        self._batch_block: Any = None  # the open catch of file descriptor 2 around one training batch
        super().__init__(dirpath=dirpath, filename=filename, **kwargs)

    @override
    def __del__(self) -> None:
        """Lightning's tears down at collection; an HPUProfiler refused in __init__ (HABANA_PROFILE) never set up."""
        if hasattr(self, "_stage"):
            super().__del__()

    # -- what we ask of torch.profiler ---------------------------------------------------------
    @override
    def _default_activities(self) -> list[Any]:
        """CPU, plus HPU on a Gaudi (the Enum habana_frameworks installs); CPU only on the emulated Gaudi."""
        return self.profile_hpu_activities([torch.profiler.ProfilerActivity.CPU])

    def profile_hpu_activities(self, activities: list[Any] | None) -> list[Any]:
        """`activities` plus the HPU activity on a Gaudi (lightning-habana's name). The emulated Gaudi has no HPU
        activity to record: the list comes back unchanged (the trace metadata says CPU activity only)."""
        activities = list(activities or [])
        if not self._backend.records_hpu_activity:
            return activities
        hpu = getattr(torch.profiler.ProfilerActivity, "HPU", None)  # looked up now: habana_frameworks replaces it
        if hpu is None:
            raise RuntimeError(
                "HPUProfiler on a Gaudi needs torch.profiler.ProfilerActivity.HPU, which habana_frameworks.torch "
                "adds when it is imported; it is missing here. Import habana_frameworks.torch (or hpu_nb) before "
                "creating the profiler."
            )
        return activities if hpu in activities else activities + [hpu]

    @property
    def activities(self) -> list[Any]:
        """The torch.profiler activities this profiler records."""
        return list(self._profiler_kwargs.get("activities") or [])

    # -- recording -----------------------------------------------------------------------------
    # kineto's "USDT: ... profiler_start / profiler_stop" lines and torch's collection warning about the optimizer's
    # step go straight to file descriptor 2 at these calls: caught, written back without them (hpu_nb.core.noise)
    @override
    def start(self, action_name: str) -> None:
        if action_name == TRAINING_BATCH_ACTION:
            self._catch_allocator_note()
        with native_stderr_without(*PROFILER_NATIVE):
            super().start(action_name)
        self._add_trace_metadata()

    @override
    def stop(self, action_name: str) -> None:
        with native_stderr_without(*PROFILER_NATIVE):
            super().stop(action_name)
        self._add_trace_metadata()
        if action_name == TRAINING_BATCH_ACTION:
            self._release_allocator_note()

    @override
    def _delete_profilers(self) -> None:
        self._release_allocator_note()
        with native_stderr_without(*PROFILER_NATIVE):
            super()._delete_profilers()

    def _catch_allocator_note(self) -> None:
        """A training batch starts: catch file descriptor 2 until it ends, while c10's allocator note is still due."""
        note = self._allocator_note
        if note is None or note.calls_left <= 0 or self._batch_block is not None:
            return
        self._batch_block = note()
        self._batch_block.__enter__()

    def _release_allocator_note(self) -> None:
        """The batch ended (or the recording did): what it wrote to descriptor 2 goes out, but the allocator note."""
        block, self._batch_block = self._batch_block, None
        if block is not None:
            block.__exit__(None, None, None)

    def _add_trace_metadata(self) -> None:
        """Write the device facts (emulated or not, which activities) into the trace's top-level 'hpu_nb' key."""
        prof = self.profiler
        if prof is None or not hasattr(prof, "add_metadata_json"):
            return
        action = getattr(prof, "current_action", None)
        recording = (torch.profiler.ProfilerAction.RECORD, torch.profiler.ProfilerAction.RECORD_AND_SAVE)
        if action is not None and action not in recording:
            return  # between recording cycles the profiler takes no metadata (and says so on stderr)
        info = dict(self._device_info, activities=[_activity_name(a) for a in self.activities])
        try:
            prof.add_metadata_json("hpu_nb", json.dumps(info))
        except Exception as err:
            log.debug("HPUProfiler could not add trace metadata: %s", err)

    # -- results -------------------------------------------------------------------------------
    def trace_paths(self) -> list[str]:
        """The Chrome traces this profiler wrote (this rank and filename), oldest first."""
        if self.dirpath is None:
            return []
        prefix = self._prepare_filename(extension="")
        pattern = os.path.join(os.fspath(self.dirpath), "*.pt.trace.json*")
        found = [
            p
            for p in glob.glob(pattern)
            if os.path.basename(p).startswith((prefix + "-", prefix + "."))  # rank 1 is not rank 10
            and os.path.getmtime(p) >= self._started_at - 1
        ]
        return sorted(found, key=os.path.getmtime)

    def last_trace_path(self) -> str:
        paths = self.trace_paths()
        if not paths:
            where = self.dirpath if self.dirpath is not None else "(no dirpath: pass dirpath= or use a logger)"
            raise FileNotFoundError(
                f"HPUProfiler has written no trace yet in {where}. Run trainer.fit(...) with this profiler first "
                "(the default schedule records steps 2-4, so train at least 2 batches)."
            )
        return paths[-1]

    def load_trace(self, path: str | None = None) -> Any:
        """The last trace this profiler wrote (or `path`), as an hpu_nb.traces.Trace."""
        return load(path or self.last_trace_path())

    @override
    def summary(self) -> str:
        """A summary of the last trace written: top ops by self / total time, steps, tracks, gaps, memory.

        Falls back to torch's key-averages table when no Chrome trace was exported.
        """
        if self.profiler is not None:
            self._delete_profilers()  # finishes the recording, which writes the trace
        try:
            path = self.last_trace_path()
        except FileNotFoundError:
            return super().summary()
        summary = self.load_trace(path).summary(top=self._row_limit if self._row_limit > 0 else 50)
        return self._stats_to_str({os.path.basename(path): repr(summary)})

    @override
    def describe(self) -> None:
        """After a run: the report goes to the file `filename` names, as Lightning's; without one, one line says where
        the trace is instead of the ~75-line table in the log (red in a notebook): `summary()` / `show()` on demand."""
        if self.filename:
            return super().describe()
        self._delete_profilers()  # finishes the recording, which writes the trace
        try:
            where = f"trace {self.last_trace_path()}"
        except FileNotFoundError:
            where = "no trace written"
        self._rank_zero_info(f"HPUProfiler: {where}; profiler.summary() for its report, profiler.show() to view it.")
        self.teardown(stage=self._stage)
        return None

    def show(self, path: str | None = None, **kwargs: Any) -> Any:
        """The inline trace viewer for the last trace written (an anywidget; static HTML when headless).

        The viewer belongs to the notebook layer, which registers it (hpu_nb.wiring.viewer_slot) when imported or
        on `%load_ext hpu_nb`; without it this returns the trace's text summary, headed by how to get the viewer.
        """
        viewer = registered_trace_viewer()
        path = path or self.last_trace_path()
        shown = viewer(path, **kwargs) if viewer is not None else None  # None: the viewer's layer could not load
        if shown is not None:
            return shown
        return TraceSummaryText(VIEWER_MISSING, repr(self.load_trace(path).summary(top=kwargs.get("top", 25))))

    def __repr__(self) -> str:
        acts = ", ".join(_activity_name(a) for a in self.activities) or "none"
        note = "" if self._backend.records_hpu_activity else f" ({EMULATED_NOTE})"
        return f"HPUProfiler(dirpath={self.dirpath!r}, filename={self.filename!r}, activities=[{acts}]){note}"


def _activity_name(activity: Any) -> str:
    name = getattr(activity, "name", None)
    return str(name) if name else str(activity).rsplit(".", 1)[-1]


def _device_info(backend: Any) -> dict[str, Any]:
    info: dict[str, Any] = {"backend": backend.name, "emulated": bool(backend.is_emulated)}
    try:
        info["device"] = backend.device_name()
    except Exception as err:
        log.debug("HPUProfiler could not read the device name: %s", err)
    if not backend.records_hpu_activity:
        info["note"] = EMULATED_NOTE
    return info


class HabanaProfileConflict(MisconfigurationException, AssertionError):
    """HABANA_PROFILE asks Habana's own profiler, which conflicts with the PyTorch profiler on HPU. A configuration
    error; an AssertionError too, the type lightning-habana raised (its users' tests catch that)."""


def _refuse_habana_profile() -> None:
    """Refuse HABANA_PROFILE other than unset, "" or "profile_api_light", as lightning-habana's HPUProfiler did (an
    assertion there): the HPU trace would be empty or wrong."""
    value = os.environ.get("HABANA_PROFILE")
    if value is not None and value.strip() not in ALLOWED_HABANA_PROFILE:
        raise HabanaProfileConflict(
            f"`HABANA_PROFILE` should not be set when using `HPUProfiler`: HABANA_PROFILE={value!r} turns on Habana's"
            " own profiler, which conflicts with the PyTorch profiler on HPU (the HPU trace would be empty or wrong)."
            " Unset it, or set it to 'profile_api_light', before starting Python."
        )


def register_profiler_string() -> bool:
    """Make ``Trainer(profiler="hpu")`` build an HPUProfiler. Idempotent; returns whether the hook is in place.

    Lightning resolves profiler strings from a dict local to ``trainer.setup._init_profiler``, which
    the Trainer calls through the module attribute; we wrap that function and delegate every other value.
    """
    current = setup._init_profiler
    if getattr(current, "_hpu_nb_hooked", False):
        return True

    @functools.wraps(current)
    def _init_profiler(trainer: Any, profiler: Any) -> None:
        if isinstance(profiler, str) and profiler.lower() == PROFILER_STRING:
            profiler = HPUProfiler()
        current(trainer, profiler)

    vars(_init_profiler).update(_hpu_nb_hooked=True, _hpu_nb_original=current)  # marks: hooked, and Lightning's own
    setup._init_profiler = _init_profiler
    return True
