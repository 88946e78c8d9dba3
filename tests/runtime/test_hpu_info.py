"""%hpu_info: says plainly when the Gaudi is emulated, is fast, never raises, and has text and HTML forms."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hpu_nb.notebook.info import HPUInfoReport, parse_args, render_html, render_text
from hpu_nb.runtime import get_backend
from hpu_nb.runtime.env import FLAGS
from hpu_nb.runtime.info import collect_info
from tests.fake_habana.fixture import fake_hlsmi, make_fake_gaudi  # noqa: F401


def test_emulated_is_said_plainly_and_cheap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPU_NB_DEVICE", "gaudi3")
    monkeypatch.setenv("HPU_NB_DEVICE_COUNT", "2")
    monkeypatch.setenv("HPU_NB_MEMORY_LIMIT", "512MiB")
    monkeypatch.setattr(subprocess, "Popen", _no_subprocess)  # cheap: no tool is started on the emulated Gaudi
    info = collect_info()
    assert info.is_emulated and info.backend == "emulated"
    assert info.device_count == 2 and [d.index for d in info.devices] == [0, 1]
    assert info.devices[0].memory_total == 512 * 2**20
    text = render_text(info)
    assert text.startswith("Emulated Gaudi on the CPU: 2 x GAUDI3 (emulated)")
    assert "not a real Gaudi" in text
    assert "HPU_NB_MEMORY_LIMIT=512MiB" in text and "HPU_NB_DEVICE=gaudi3" in text
    html = render_html(info)
    assert "Emulated Gaudi on the CPU" in html and 'class="badge emulated"' in html
    for flag in FLAGS:  # every flag is listed with what it means
        assert flag in html
        assert FLAGS[flag].split("(")[0].strip()[:20].replace("<", "&lt;").replace(">", "&gt;") in html


def _no_subprocess(*args: object, **kwargs: object) -> None:
    raise AssertionError(f"a subprocess was started: {args}")


def test_collecting_on_the_emulated_gaudi_imports_no_lightning() -> None:
    script = ("import sys; from hpu_nb.runtime.info import collect_info; from hpu_nb.notebook.info import render_text;"
              "render_text(collect_info()); print(sorted(m for m in ('lightning', 'IPython') if m in sys.modules))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPU_NB_")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr[-2000:]


@pytest.mark.parametrize("count", [1_000_000, 100_000_000])
def test_a_huge_card_count_is_a_short_clear_answer(count: int, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Issue 13: 1e6 emulated cards rendered 137 MB of HTML; 1e8 never returned. No machine has that many cards."""
    from hpu_nb.notebook.info import hpu_info

    monkeypatch.setenv("HPU_NB_DEVICE_COUNT", str(count))
    hpu_info("--text")
    out = capsys.readouterr().out
    assert len(out) < 2_000
    assert f"HPU_NB_DEVICE_COUNT='{count}': the emulated machine has between 1 and 64 cards" in out


def test_identical_cards_share_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPU_NB_DEVICE_COUNT", "64")
    text = render_text(collect_info())
    assert "[1-63] GAUDI2 (emulated): total 96.00 GiB, in use 0 B" in text and "more cards" not in text


def test_memory_figures_are_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from hpu_nb.emulator import hpu_device

    get_backend()
    hpu_device.fresh_card()
    big = torch.ones(1 << 20, device="hpu")  # 4 MiB
    del big
    small = torch.ones(1 << 10, device="hpu")  # 4 KiB
    device0 = collect_info().devices[0]
    assert device0.memory_used == 4096
    assert device0.memory_peak == 4 * 2**20
    assert "peak 4.00 MiB" in render_text(collect_info())
    del small


def test_first_generation_has_no_fp8_or_fp16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPU_NB_DEVICE", "gaudi")
    info = collect_info()
    assert info.fp8[0] is False and "Gaudi2 or newer" in info.fp8[1]
    assert info.fp16[0] is False
    assert "fp8                   no — fp8 is not supported on GAUDI" in render_text(info)


def test_lazy_flag_and_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    info = collect_info()
    assert info.lazy_mode is False
    import lightning
    import torch

    assert info.versions.torch == torch.__version__ and info.versions.lightning == lightning.__version__
    text = render_text(info)
    assert "execution mode        eager" in text and "PT_HPU_LAZY_MODE=0" in text
    assert "SynapseAI             n/a (emulated)" in text


def test_broken_backend_degrades_without_raising() -> None:
    from hpu_nb.emulator.backend import EmulatedBackend

    class Broken(EmulatedBackend):
        def device_facts(self, timeout: float = 2.0):
            raise OSError("hl-smi exploded")

        def versions(self):
            raise RuntimeError("no versions today")

    info = collect_info(Broken(device_count=3))
    assert len(info.devices) == 3 and info.devices[2].memory_total == 96 * 2**30
    assert any("hl-smi exploded" in p for p in info.problems)
    assert any("no versions today" in p for p in info.problems)
    assert "Problems" in render_text(info) and "hl-smi exploded" in render_html(info)


def test_gaudi_with_hanging_hlsmi_respects_the_timeout(make_fake_gaudi, fake_hlsmi) -> None:  # noqa: F811
    make_fake_gaudi(device_count=2, device_name="GAUDI2")
    fake_hlsmi.device_count = 2
    fake_hlsmi.mode = "hanging"
    info = collect_info(timeout=0.5)  # the hung tool is stopped at the timeout (tests/runtime/test_hlsmi.py checks it)
    assert not info.is_emulated and info.backend == "gaudi"
    assert [d.source for d in info.devices] == ["runtime", "runtime"]  # hl-smi was given up on: the runtime's facts
    text = render_text(info)
    assert text.startswith("Intel Gaudi: 2 x GAUDI2") and "emulated" not in text.splitlines()[0]


def test_gaudi_info_acquires_no_card_and_says_the_release_and_mode(make_fake_gaudi, fake_hlsmi) -> None:  # noqa: F811
    """%hpu_info in a kernel must not take a card: the kernel could then not fork multi-card workers."""
    fake = make_fake_gaudi(device_count=2, release="1.21.0")
    info = collect_info(timeout=5)
    assert fake.acquisitions() == [] and not get_backend().device_acquired()
    assert info.devices[0].memory_peak is None  # this process's own counters are read only once it holds its card
    assert (info.release, info.lazy_mode, info.compile_backend) == ("1.21", False, "hpu_backend")
    get_backend().memory_stats()  # now it holds one
    assert collect_info(timeout=5).devices[0].memory_peak is not None and len(fake.acquisitions()) == 1


def test_gaudi_facts_from_hlsmi(make_fake_gaudi, fake_hlsmi) -> None:  # noqa: F811
    make_fake_gaudi(device_count=2, device_name="GAUDI2")
    fake_hlsmi.device_count = 2
    fake_hlsmi.memory_used_mib = [1024, 2048]
    fake_hlsmi.write()
    info = collect_info(timeout=5)
    assert info.versions.synapseai == "1.17.2" and info.versions.firmware.startswith("51.5.1")
    assert [d.source for d in info.devices] == ["hl-smi", "hl-smi"]
    assert info.devices[1].memory_used == 2048 * 2**20
    assert "SynapseAI             1.17.2" in render_text(info)


def test_report_reprs_and_args() -> None:
    report = HPUInfoReport(collect_info())
    assert "<table>" in report._repr_html_() and repr(report).startswith("Emulated Gaudi")
    assert parse_args("") == (False, 2.0)
    assert parse_args("--text --timeout 0.5") == (True, 0.5)
    assert parse_args("--timeout=3") == (False, 3.0)
    for bad in ("--bogus", "--timeout", "--timeout x", "--timeout -1"):
        with pytest.raises(ValueError, match="Usage: %hpu_info"):
            parse_args(bad)


def test_magic_displays_html_and_text(capsys: pytest.CaptureFixture) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "hpu_nb")
    try:
        shown = []
        ip.display_pub.publish = lambda data, metadata=None, **kw: shown.append(data)  # type: ignore[method-assign]
        ip.run_line_magic("hpu_info", "")
        ip.run_line_magic("hpu_info", "--text")
        ip.run_line_magic("hpu_info", "--nope")
    finally:
        del ip.display_pub.publish
        ip.run_line_magic("unload_ext", "hpu_nb")
    assert "text/html" in shown[0] and "Emulated Gaudi" in shown[0]["text/plain"]
    assert "text/html" not in shown[1] and shown[1]["text/plain"].startswith("Emulated Gaudi on the CPU")
    assert "Unknown argument '--nope'" in capsys.readouterr().out


def test_magic_explains_a_backend_that_cannot_start(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture) -> None:
    from hpu_nb.notebook.info import hpu_info
    from tests.fake_habana import block_habana

    monkeypatch.setenv("HPU_NB_BACKEND", "gaudi")
    with block_habana():
        hpu_info("--text")
    out = capsys.readouterr().out
    assert out.startswith("%hpu_info: no device backend could be set up: HPUNotAvailableError")
    assert "HPU_NB_BACKEND=gaudi" in out


def test_metric_times_carry_their_unit() -> None:
    """Habana reports TotalTime / AvgTime in microseconds: the report says so (never a bare 890239)."""
    from types import SimpleNamespace

    from hpu_nb.notebook.info import metric_rows

    info = SimpleNamespace(metrics={
        "graph_compilation": {"TotalNumber": 3, "TotalTime": 890239, "AvgTime": 296746.3},
        "memory_defragmentation": {"TotalNumber": 1, "TotalTime": 12},
        "recipe_cache": {"TotalHit": 4, "TotalMiss": 2, "Recipes": {"a": 1, "b": 2}},
    })
    rows = dict(metric_rows(info))  # type: ignore[arg-type]
    assert rows["graph_compilation"] == "TotalNumber 3, TotalTime 890.2 ms, AvgTime 296.7 ms"
    assert rows["memory_defragmentation"] == "TotalNumber 1, TotalTime 12 us"
    assert rows["recipe_cache"] == "TotalHit 4, TotalMiss 2, Recipes 2 entries"
    assert dict(metric_rows(SimpleNamespace(metrics={"g": {"TotalTime": 2_500_000}})))["g"] == "TotalTime 2.50 s"
