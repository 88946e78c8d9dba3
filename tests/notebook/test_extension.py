"""%load_ext hpu_nb: registers the magics, is idempotent, and %unload_ext removes exactly what it added."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("IPython")
from IPython.core.interactiveshell import InteractiveShell

from hpu_nb.runtime import get_backend


@pytest.fixture
def ip():
    shell = InteractiveShell.instance()
    yield shell
    shell.run_line_magic("unload_ext", "hpu_nb") if "hpu_nb" in shell.extension_manager.loaded else None


def _line_magics(shell: InteractiveShell) -> dict:
    return shell.magics_manager.magics["line"]


def test_load_registers_magics_and_twice_is_harmless(ip: InteractiveShell, capsys: pytest.CaptureFixture) -> None:
    assert "hpu_info" not in _line_magics(ip)
    ip.run_line_magic("load_ext", "hpu_nb")
    assert {"hpu_info", "hpu_trace"} <= set(_line_magics(ip))
    first = _line_magics(ip)["hpu_info"]
    # loading again (also via the module function directly) keeps one working registration
    import hpu_nb

    hpu_nb.load_ipython_extension(ip)
    ip.run_line_magic("load_ext", "hpu_nb")
    assert _line_magics(ip)["hpu_info"] is first
    ip.run_line_magic("hpu_info", "--text")
    out = capsys.readouterr().out
    assert out.count("Emulated Gaudi on the CPU") == 1


def test_unload_removes_magics_and_formatter(ip: InteractiveShell) -> None:
    ip.run_line_magic("load_ext", "hpu_nb")
    html = ip.display_formatter.formatters["text/html"]
    assert "emulated Gaudi on the CPU" in html(get_backend())
    ip.run_line_magic("unload_ext", "hpu_nb")
    assert "hpu_info" not in _line_magics(ip) and "hpu_trace" not in _line_magics(ip)
    assert html(get_backend()) is None
    # unloading an extension that is not loaded is harmless too
    import hpu_nb

    hpu_nb.unload_ipython_extension(ip)
    ip.run_line_magic("load_ext", "hpu_nb")  # and it can come back
    assert "hpu_info" in _line_magics(ip)


def test_unload_leaves_other_magics_of_the_same_name_alone(ip: InteractiveShell) -> None:
    ip.run_line_magic("load_ext", "hpu_nb")
    ip.run_line_magic("unload_ext", "hpu_nb")

    def hpu_trace(line: str) -> str:
        return "someone else's"

    ip.register_magic_function(hpu_trace, magic_name="hpu_trace")
    import hpu_nb

    hpu_nb.unload_ipython_extension(ip)
    assert ip.run_line_magic("hpu_trace", "") == "someone else's"
    del _line_magics(ip)["hpu_trace"]


def test_hpu_trace_delegates_to_the_viewer(ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    calls = []
    viewer = types.ModuleType("hpu_nb.notebook.trace_viewer")
    viewer.hpu_trace_magic = lambda line: calls.append(line) or "viewer"
    monkeypatch.setitem(sys.modules, "hpu_nb.notebook.trace_viewer", viewer)
    ip.run_line_magic("load_ext", "hpu_nb")
    assert ip.run_line_magic("hpu_trace", "run/trace.json --top 5") == "viewer"
    assert calls == ["run/trace.json --top 5"]


def test_loading_says_once_what_it_gave_and_puts_hpu_nb_in_the_namespace(
    ip: InteractiveShell, capsys: pytest.CaptureFixture
) -> None:
    ip.user_ns.pop("hpu_nb", None)
    ip._hpu_nb_said_loaded = False  # a fresh kernel (the test shell is shared)
    ip.run_line_magic("load_ext", "hpu_nb")
    ip.run_line_magic("reload_ext", "hpu_nb")  # loaded again: said once per kernel, not per load
    import hpu_nb

    out = capsys.readouterr().out
    assert out.count("hpu_nb loaded: %hpu_info") == 1 and "hpu_nb.TrainerConfigWidget()" in out
    assert ip.user_ns["hpu_nb"] is hpu_nb
    ip.user_ns["hpu_nb"] = "the user's own"  # a name the user bound is left alone
    ip.run_line_magic("unload_ext", "hpu_nb")
    ip.run_line_magic("load_ext", "hpu_nb")
    assert ip.user_ns["hpu_nb"] == "the user's own"
