"""Forked workers to the kernel: the kernel's end of the pipe rank 0 of the workers writes its samples to."""

from __future__ import annotations

import threading
from typing import Any, Protocol


class RelayedMonitor(Protocol):
    """What the relay needs of the kernel's monitor."""

    def _received(self, kind: str, message: dict[str, Any]) -> None: ...

    def _disable(self, reason: str) -> None: ...


class WorkerRelay:
    """The kernel's end of the pipe from the workers' rank 0: a thread hands each message to the monitor while the
    cell waits for the workers (the chart's updates are widget messages: any thread of the kernel may send them)."""

    def __init__(self, monitor: RelayedMonitor, receiving: Any) -> None:
        self.monitor, self.receiving = monitor, receiving
        self.thread = threading.Thread(target=self._run, name="MemoryMonitor relay", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, sending: Any) -> None:
        """After the workers ended: everything they sent is read, then the thread ends on our own last message."""
        try:
            sending.send(("end", {}))
        finally:
            sending.close()
        self.thread.join(timeout=30)
        self.receiving.close()

    def _run(self) -> None:
        while True:
            try:
                kind, message = self.receiving.recv()
            except (EOFError, OSError):
                return
            if kind == "end":
                return
            try:
                self.monitor._received(kind, message)
            except Exception as err:
                self.monitor._disable(f"following the workers failed: {type(err).__name__}: {err}")
