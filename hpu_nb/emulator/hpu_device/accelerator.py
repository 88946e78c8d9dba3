"""Which accelerator torch serves once the emulated card is used: `torch.accelerator` on every build of torch.

torch answers "which accelerator?" (``torch.accelerator.current_accelerator()``, and internally autograd, dynamo and
``init_process_group``) from the hooks of its compiled-in accelerators, and refuses two. Its autograd serves one
accelerator per process (in current torch, measured on 2.14, a backward through tensors of an accelerator device type
uses *the* accelerator's streams). So the emulated card settles the question when it is first used (hpu_device.cpp,
``claim_accelerator``):

* a CPU build of torch: ``hpu`` is the process's accelerator, as on a Gaudi;
* a CUDA (XPU, ROCm) build with no usable device -- PyPI's torch on a machine without a GPU, or with the GPUs hidden
  by ``CUDA_VISIBLE_DEVICES=``: that build's hooks object answers "not built", as a CPU build's does, and ``hpu`` is
  the accelerator; ``torch.cuda.is_available()`` stays False. The device library gives that one heap object its own
  copy of its virtual table (nothing of torch's libraries is written, so sealed read-only pages do not matter); where
  that cannot be done (signed virtual tables on arm64e, a stripped library), the first use of ``hpu`` says to install
  torch's CPU build (:class:`AcceleratorInUseError`);
* a build whose accelerator has a usable device (a GPU workstation): the GPU keeps the question (``Trainer()`` and
  ``accelerator="auto"`` choose it, CUDA training is untouched), and ``hpu`` works beside it where this torch's
  autograd allows. Where it does not, the first use of ``hpu`` says so and what to do (:class:`AcceleratorInUseError`),
  rather than the first backward of a training run failing deep in torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["AcceleratorClaim", "AcceleratorInUseError", "claim", "current_claim", "parse_claim"]


class AcceleratorInUseError(RuntimeError):
    """Another accelerator keeps torch's accelerator in this process, and this torch cannot train on `hpu` beside it:
    a usable GPU is here (hide it, or use another process), or the other build's answer could not be changed
    (install torch's CPU build)."""


@dataclass(frozen=True)
class AcceleratorClaim:
    """What `torch.accelerator` serves in this process now that the emulated card is used, and why."""

    accelerator: str  # the device type torch.accelerator.current_accelerator() names: "hpu", or the other's
    beside: str = ""  # the other compiled-in accelerator that keeps the question ("cuda"), if any
    reason: str = ""  # why the other's answer was kept although it has no device (an unknown ABI), if so

    @property
    def is_hpu(self) -> bool:
        return self.accelerator == "hpu"

    def describe(self) -> str:
        """One sentence for %hpu_info and logs."""
        if self.is_hpu:
            return "torch.accelerator is hpu"
        if self.reason:
            return f"torch.accelerator stays {self.accelerator} (its answer could not be changed: {self.reason})"
        return f"torch.accelerator stays {self.accelerator}: this process has a usable {self.accelerator} device"


_claim: AcceleratorClaim | None = None
_probing = False  # the probe's own use of the device may come back here (torch.hpu's first import loads the device)


def parse_claim(report: str) -> AcceleratorClaim:
    """The claim from hpu_device.cpp's report: "hpu", "beside:<name>" or "refused:<name>:<why>"."""
    kind, _, rest = report.partition(":")
    if kind == "hpu":
        return AcceleratorClaim("hpu")
    if kind == "beside":
        return AcceleratorClaim(rest, beside=rest)
    if kind == "refused":
        name, _, why = rest.partition(":")
        return AcceleratorClaim(name, beside=name, reason=why)
    raise ValueError(f"unknown accelerator report {report!r}")


def current_claim() -> AcceleratorClaim | None:
    """The claim made when the emulated card was first used here; None before that."""
    return _claim


def claim() -> AcceleratorClaim:
    """Settle the accelerator question for this process (once), and make sure `hpu` can train under the answer.
    Its callers (hpu_device.load and announce) hold the device's lock: two threads first using `hpu` at once settle it
    once (the device library settles it once per process as well)."""
    global _claim, _probing
    if _claim is None:
        settled = parse_claim(torch.ops.hpu_emu.claim_accelerator())
        if not settled.is_hpu and _probing:
            return settled  # asked again by the probe's own device use: the probe's outcome decides, not this
        if not settled.is_hpu:
            _probing = True
            try:
                check_backward_beside(settled)
            finally:
                _probing = False
        _claim = settled
    return _claim


def check_backward_beside(settled: AcceleratorClaim) -> None:
    """Run one tiny backward on `hpu`: where this torch's autograd cannot serve hpu beside the process's accelerator,
    say so now, with what to do, instead of at the first backward of a training run."""
    try:
        probe = torch.ones(2, device="hpu", requires_grad=True)
        (probe * probe).sum().backward()
    except Exception as err:
        raise AcceleratorInUseError(conflict_message(settled, err)) from err


def conflict_message(settled: AcceleratorClaim, err: BaseException | None = None) -> str:
    """What AcceleratorInUseError says: why `hpu` cannot train in this process, and the way out that works here."""
    cause = f" (torch said: {str(err).splitlines()[0][:200]})" if err is not None and str(err) else ""
    return (unchangeable_message(settled) if settled.reason else usable_device_message(settled)) + cause


def cpu_build_command(version: str | None = None) -> str:
    """The pip command installing the CPU build of this torch release (the same version: nothing else changes)."""
    release = (version or torch.__version__).split("+")[0]
    return f"pip install torch=={release} --index-url https://download.pytorch.org/whl/cpu"


def unchangeable_message(settled: AcceleratorClaim) -> str:
    """The other build's accelerator has no usable device, but its answer could not be changed here (settled.reason):
    hiding devices changes nothing (there are none to hide); torch's CPU build has no other accelerator to answer."""
    name = settled.accelerator
    return (
        f"The emulated Gaudi cannot train in this process: this torch ({torch.__version__}) is a {name} build, and"
        f" torch serves one accelerator per process; {name} has no usable device here, but its answer could not be"
        f" changed to hpu ({settled.reason}). Backward passes on `hpu` tensors would fail. Install torch's CPU build"
        f" of the same release, which has no other accelerator: `{cpu_build_command()}`."
    )


def usable_device_message(settled: AcceleratorClaim) -> str:
    """A usable device of another accelerator keeps torch's accelerator: hide it from this process, or use another."""
    name = settled.accelerator
    hidden = {"cuda": "CUDA_VISIBLE_DEVICES", "hip": "HIP_VISIBLE_DEVICES", "xpu": "ZE_AFFINITY_MASK"}.get(name)
    hide = (
        f" Run the emulated Gaudi in a process that does not see the {name} device: `{hidden}= python train.py`, or"
        f" `os.environ[{hidden!r}] = \"\"` before `import torch` in a notebook; keep {name} work in another process."
        if hidden else f" Run the emulated Gaudi in a process without the {name} device."
    )
    return (
        f"The emulated Gaudi cannot train in this process: torch {torch.__version__} serves one accelerator per"
        f" process, and here it is {name}: this process can use a {name} device. Backward passes on `hpu` tensors"
        f" would fail.{hide}"
    )
