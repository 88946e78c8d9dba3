"""Which accelerator torch serves once the emulated card is used: `torch.accelerator` on every build of torch.

torch answers "which accelerator?" (``torch.accelerator.current_accelerator()``, and internally autograd, dynamo and
``init_process_group``) from the hooks of its compiled-in accelerators, and refuses two. Its autograd serves one
accelerator per process (in current torch, measured on 2.14, a backward through tensors of an accelerator device type
uses *the* accelerator's streams). So the emulated card settles the question when it is first used (hpu_device.cpp,
``claim_accelerator``):

* a CPU build of torch: ``hpu`` is the process's accelerator, as on a Gaudi;
* a CUDA (XPU, ROCm) build with no usable device -- PyPI's torch on a machine without a GPU, or with the GPUs hidden
  by ``CUDA_VISIBLE_DEVICES=``: that build's hooks answer "not built", as a CPU build's do, and ``hpu`` is the
  accelerator; ``torch.cuda.is_available()`` stays False;
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
    """A usable GPU keeps torch's accelerator in this process, and this torch cannot train on `hpu` beside it."""


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
    """Settle the accelerator question for this process (once), and make sure `hpu` can train under the answer."""
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
    name = settled.accelerator
    hidden = {"cuda": "CUDA_VISIBLE_DEVICES", "hip": "HIP_VISIBLE_DEVICES", "xpu": "ZE_AFFINITY_MASK"}.get(name)
    why = f" ({settled.reason})" if settled.reason else f": this process can use a {name} device"
    hide = (
        f" Run the emulated Gaudi in a process that does not see the {name} device: `{hidden}= python train.py`, or"
        f" `os.environ[{hidden!r}] = \"\"` before `import torch` in a notebook; keep {name} work in another process."
        if hidden else f" Run the emulated Gaudi in a process without the {name} device."
    )
    cause = f" (torch said: {str(err).splitlines()[0][:200]})" if err is not None and str(err) else ""
    return (
        f"The emulated Gaudi cannot train in this process: torch {torch.__version__} serves one accelerator per"
        f" process, and here it is {name}{why}. Backward passes on `hpu` tensors would fail.{hide}{cause}"
    )
