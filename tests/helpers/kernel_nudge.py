"""Nudge a kernel that never saw a notebook cell's request (a third-party flake under CPU load, not hpu_nb's).

ipykernel's shell socket is edge-triggered: under load its ZMQ wake-up can be lost, and the request then waits in the
socket, the kernel idle, until another message reaches it (ipython/ipykernel#1554; README, "Development"). While
nbclient (nbmake's runner too) waits for a cell's reply and the kernel has not gone busy for that cell, this sends a
`kernel_info` request to the shell every NUDGE_S seconds: the new message wakes the kernel, which then reads both. A
kernel that is running the cell is never nudged. nbclient ignores replies to other requests, as it always has.

Installed by tests/conftest.py for the pytest process; nbclient's method it wraps is checked by
tests/test_suite_plugins_tripwire.py. Every nudge is recorded in NUDGES (the cell's first line, seconds waited), and
`make test` prints them at the end, so a stall the nudge saved stays visible.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

NUDGE_S = 10.0  # a cell's request unanswered and not started this long: nudge (a cell usually starts in ms)
NUDGES: list[tuple[str, float]] = []


def _started(cell: Any) -> bool:
    """Whether the kernel said busy for this cell (nbclient records it with record_timing, its default)."""
    return bool(cell.get("metadata", {}).get("execution", {}).get("iopub.status.busy"))


def install() -> None:
    from nbclient.client import NotebookClient

    original = NotebookClient._async_poll_for_reply
    if getattr(original, "_nudges_kernel", False):
        return

    async def poll_for_reply(self: Any, msg_id: str, cell: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        waiting = asyncio.ensure_future(original(self, msg_id, cell, *args, **kwargs))
        start = time.monotonic()
        try:
            while True:
                done, _ = await asyncio.wait({waiting}, timeout=NUDGE_S)
                if done:
                    return waiting.result()
                if self.kc is not None and self.record_timing and not _started(cell):
                    self.kc.kernel_info()
                    first_line = (cell.get("source") or "").splitlines()[:1]
                    NUDGES.append((first_line[0] if first_line else "", round(time.monotonic() - start, 1)))
        finally:
            if not waiting.done():
                waiting.cancel()

    poll_for_reply._nudges_kernel = True  # type: ignore[attr-defined]
    poll_for_reply.__wrapped__ = original  # type: ignore[attr-defined]
    NotebookClient._async_poll_for_reply = poll_for_reply  # type: ignore[method-assign]
