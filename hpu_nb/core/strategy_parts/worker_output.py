"""A forked worker's notebook output in the order it was written (one pipe to the kernel, not one per message).

ipykernel sends every message of a forked child (stdout, display_data, widget updates) on a new ZMQ socket it
connects, sends on and closes (`IOPubThread._really_send`, "new context/socket for every pipe-out"). The kernel reads
those sockets fair-queued, so two messages a child sent in a row can reach the front end in the other order. Rich's
live progress bar (Lightning's default bar, drawn by the forked rank 0) shows each frame inside an `ipywidgets.Output`
whose `msg_id` it sets, then clears, around every frame: a frame that arrives after the clear lands in the cell itself,
a second bar frozen at that step (issue 20: "17/30" under the finished "30/30"). One socket per child keeps its
messages in order; it is flushed when the worker exits (a multiprocessing finalizer: workers end with os._exit), and
the kernel, once its workers ended, waits until it has read what they sent (`wait_for_worker_output`): a cell that ends
right after its workers still shows their last lines (the front end drops what comes after the cell's end).

The fork launchers call both (`parallel.WorkerLivenessMixin`: the Trainer's DDP / FSDP / DeepSpeed and Fabric's), so
every forked fit does, with or without a MemoryMonitor. It imports nothing of IPython; outside a kernel both do nothing.
"""

from __future__ import annotations

import multiprocessing.util
import os
import sys
import threading
import time
from typing import Any

LINGER_MS = 3000  # as ipykernel's own pipe-out: how long a closing socket may take to deliver what it holds
QUIET_CHECKS = 3  # the workers' pipe found empty this many times in a row (10 ms apart): all they sent was read


def keep_worker_output_in_order() -> bool:
    """In a process forked from an IPython kernel: send its output to the kernel on one socket, in order. Returns
    whether it did (False in the kernel itself, outside a kernel, or with an ipykernel that works otherwise)."""
    thread = _iopub_thread()
    if thread is None or getattr(thread, "_hpu_nb_ordered_pid", None) == os.getpid():
        return thread is not None
    try:
        if thread._is_master_process() or not thread._pipe_flag:
            return False
        context, pipe = thread._setup_pipe_out()
        prefix = thread._pipe_uuid
    except Exception:  # an ipykernel without this pipe: its own way stays
        return False

    original = thread._really_send  # ipykernel's: a new socket per message (safe from any thread or process)
    lock, owner = threading.Lock(), os.getpid()

    def send_in_order(msg: list[Any], *args: Any, **kwargs: Any) -> None:
        if os.getpid() != owner:  # a process forked from this worker (a DataLoader's): not our socket
            original(msg, *args, **kwargs)
            return
        with lock:  # one ZMQ socket, several threads of this worker
            pipe.send_multipart([prefix, *msg], *args, **kwargs)

    def close() -> None:
        with lock:
            vars(thread).pop("_really_send", None)  # what is written after this (the last flush) goes ipykernel's way
            pipe.close(linger=LINGER_MS)
            context.term()

    thread._really_send = send_in_order  # what IOPubThread.send_multipart calls in a child (its thread is not alive)
    thread._hpu_nb_ordered_pid = owner
    multiprocessing.util.Finalize(None, close, exitpriority=100)  # before the process's os._exit
    return True


def wait_for_worker_output(timeout: float = 2.0) -> bool:
    """In the kernel, after its forked workers ended: wait (at most `timeout` s) until the kernel's IOPub thread has
    read everything the workers sent, so it is published before what the cell does next. Returns whether it saw the
    pipe empty (False outside a kernel, or if the pipe was still busy at the timeout)."""
    thread = _iopub_thread()
    pipe_in, loop = getattr(thread, "_pipe_in", None), getattr(thread, "io_loop", None)
    try:
        if pipe_in is None or loop is None or not thread._is_master_process() or not thread.thread.is_alive():
            return False
    except Exception:
        return False
    deadline = time.monotonic() + timeout
    quiet, done, drained = [0], threading.Event(), [False]

    def check() -> None:  # on the IOPub thread: the only thread that may touch its sockets
        try:
            pending = bool(pipe_in.socket.poll(0))
        except Exception:
            done.set()
            return
        quiet[0] = 0 if pending else quiet[0] + 1
        if quiet[0] >= QUIET_CHECKS:
            drained[0] = True
            done.set()
        elif time.monotonic() < deadline:
            loop.call_later(0.01, check)
        else:
            done.set()

    loop.add_callback(check)
    done.wait(timeout + 1.0)
    return drained[0]


def _iopub_thread() -> Any:
    """The kernel's IOPubThread this process writes through (its stdout's), or None outside a kernel."""
    thread = getattr(sys.stdout, "pub_thread", None)
    return thread if callable(getattr(thread, "_setup_pipe_out", None)) else None
