"""Tripwire: hpu_nb.core.strategies.worker_output leans on ipykernel's IOPubThread internals.

A forked worker's output reaches the kernel through IOPubThread's child pipe; worker_output replaces the thread's
`_really_send` in the worker (one socket, messages in order) and, in the kernel, reads `_pipe_in` / `io_loop` to wait
until the pipe is drained. If an ipykernel upgrade renames or reshapes any of these, the code steps aside silently
(by design: a notebook must not break), and the frozen second progress bar could come back unnoticed. This test fails
loudly instead.
"""

from __future__ import annotations

import inspect

import pytest

iostream = pytest.importorskip("ipykernel.iostream")


def test_iopub_thread_has_the_members_worker_output_uses() -> None:
    thread_cls = iostream.IOPubThread
    for name in ("_really_send", "_is_master_process", "_setup_pipe_out", "send_multipart", "schedule"):
        assert callable(getattr(thread_cls, name, None)), f"ipykernel's IOPubThread.{name} is gone"
    # set in __init__ (instance attributes): read from its source
    init = inspect.getsource(thread_cls.__init__) + inspect.getsource(thread_cls)
    for attribute in ("_pipe_flag", "_pipe_uuid", "_pipe_in", "io_loop", "self.thread"):
        assert attribute in init, f"ipykernel's IOPubThread no longer sets {attribute}"


def test_send_multipart_still_goes_through_really_send() -> None:
    """worker_output patches the instance's `_really_send`: send_multipart must still look it up on self."""
    source = inspect.getsource(iostream.IOPubThread.send_multipart)
    assert "self._really_send(" in source


def test_a_child_still_opens_a_new_socket_per_message() -> None:
    """The behaviour worker_output corrects: in a forked child, each message goes out on a new pipe socket (so two
    messages can arrive out of order). If ipykernel keeps one socket per child, the patch is no longer needed."""
    source = inspect.getsource(iostream.IOPubThread._really_send)
    assert "_setup_pipe_out()" in source and "CHILD" in source
    assert "pipe_out.close()" in source and "ctx.term()" in source
