"""The smaller habana_frameworks calls on the emulated Gaudi: HPU-graph cache helpers, core's inference set-up, utils
(experimental's recompilation detector, lib_utils, debug), activity_profiler and autoload - Habana's names and
signatures (gaudi-pytorch-bridge 1.19), and what they do here."""

from __future__ import annotations

import csv
import importlib
import inspect
import os

import habana_frameworks.torch.core as htcore
import pytest
import torch
from habana_frameworks.torch.hpu import graphs
from torch import nn
from torch.utils.data import DataLoader

NEW_MODULES = (
    "habana_frameworks.torch.hpex.optimizers",
    "habana_frameworks.torch.hpex.optimizers.distributed.FusedAdamW",
    "habana_frameworks.torch.hpex.movingavrg",
    "habana_frameworks.torch.utils.experimental",
    "habana_frameworks.torch.utils.experimental.detect_recompilation",
    "habana_frameworks.torch.utils.lib_utils",
    "habana_frameworks.torch.utils.debug",
    "habana_frameworks.torch.activity_profiler",
    "habana_frameworks.autoload",
)


@pytest.mark.parametrize("name", NEW_MODULES)
def test_every_new_module_says_it_is_emulated(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__emulated__ is True
    assert "emulated" in module.__doc__


# ------------------------------------------------------------------------------------------------- graph helpers


def test_input_hash_keys_on_shape_view_and_autocast_not_on_values() -> None:
    a, b = torch.zeros(4, 6).to("hpu"), torch.randn(4, 6).to("hpu")
    h = graphs.input_hash
    assert h(a) == h(b)  # same signature, other data: the same cached graph
    assert h(a) != h(torch.zeros(4, 7).to("hpu"))
    assert h(torch.zeros(6, 4).to("hpu").t()) != h(a)  # same shape, another view (strides)
    assert h(a) != h(a.bfloat16())
    assert h({"x": a, "n": [1, 2]}) == h({"x": b, "n": [1, 2]})
    assert h({"x": a, "n": [1, 2]}) != h({"x": a, "n": [1, 3]})
    with torch.autocast("hpu", dtype=torch.bfloat16):
        inside = h((a, 1))
    assert inside != h((a, 1))  # autocast on runs another graph


def test_copy_to_fills_static_inputs_through_nesting_and_refuses_mismatches() -> None:
    static = {"x": torch.zeros(2, 3).to("hpu"), "rest": [torch.zeros(2).to("hpu"), (torch.zeros(1).to("hpu"),)]}
    new = {"x": torch.ones(2, 3).to("hpu"),
           "rest": [torch.full((2,), 2.0).to("hpu"), (torch.full((1,), 3.0).to("hpu"),)]}
    keep = static["x"]
    graphs.copy_to(static, new)
    assert static["x"] is keep  # copied into, not replaced
    assert static["x"].cpu().eq(1).all() and static["rest"][0].cpu().eq(2).all() and static["rest"][1][0].item() == 3
    with pytest.raises(AssertionError):
        graphs.copy_to([torch.zeros(1)], (torch.zeros(1),))
    with pytest.raises(AssertionError):
        graphs.copy_to({"a": torch.zeros(1)}, {"b": torch.zeros(1)})


def test_a_graph_cache_built_from_the_helpers_replays_new_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """optimum-habana's diffusion pipelines: key by input_hash, capture once into CachedParams, copy_to + replay."""
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    import habana_frameworks.torch as ht

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh()).to("hpu")
    cache: dict[int, graphs.CachedParams] = {}

    def run(x: torch.Tensor) -> torch.Tensor:
        inputs = [x]
        key = ht.hpu.input_hash(inputs)
        cached = cache.get(key)
        if cached is None:
            graph = ht.hpu.HPUGraph()
            static_inputs = [x.clone()]
            with ht.hpu.graph(graph):
                outputs = model(*static_inputs)
            cache[key] = ht.hpu.CachedParams(static_inputs, outputs, graph)
            return outputs
        ht.hpu.copy_to(cached.graph_inputs, inputs)
        cached.graph.replay()
        return cached.graph_outputs

    with torch.no_grad(), pytest.warns(UserWarning, match="captures no HPU graph"):
        xs = [torch.randn(3, 5).to("hpu") for _ in range(3)]
        outs = [run(x).clone() for x in xs]
        expected = [model(x) for x in xs]
    assert len(cache) == 1
    for got, want in zip(outs, expected):
        torch.testing.assert_close(got.cpu(), want.cpu())
    cached = next(iter(cache.values()))
    assert cached.out_tinfo_list is None and cached.asynchronous is False


def test_hthpu_has_the_graph_helpers_in_lazy_mode_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import habana_frameworks.torch.hpu as hthpu

    with pytest.raises(AttributeError, match="lazy mode"):
        hthpu.input_hash  # noqa: B018
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    assert hthpu.input_hash is graphs.input_hash and hthpu.copy_to is graphs.copy_to
    assert hthpu.CachedParams is graphs.CachedParams


# ------------------------------------------------------------------------------------------------------------ core


def test_core_inference_set_up_returns_what_habanas_returns() -> None:
    model = nn.Linear(3, 3)
    assert htcore.hpu_set_inference_env() is None
    assert htcore.hpu_set_inference_env(model) is model
    assert htcore.hpu_set_env(model) is model
    params = list(inspect.signature(htcore.hpu_inference_initialize).parameters)
    assert params[:4] == ["model", "mark_only_scales_as_const", "optimizer", "args"]
    assert htcore.hpu_inference_initialize(model.to("hpu"), mark_only_scales_as_const=True) is None
    assert htcore.hpu_inference_initialize(model, mark_non_scales=False) is None  # optimum-habana's pt2e call
    assert htcore.hpu_initialize(model) is None
    assert htcore.hpu_teardown_inference_env() is None and htcore.hpu_reset_env() is None


# ---------------------------------------------------------------------------------------------- utils.experimental


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).relu()


def test_detect_recompilation_auto_model_logs_signatures_and_writes_its_tables(tmp_path, capsys) -> None:
    from habana_frameworks.torch.utils.experimental import detect_recompilation_auto_model

    net = nn.Sequential(Inner(), nn.Linear(4, 2)).to("hpu")
    out_prefix = str(tmp_path / "report")
    net = detect_recompilation_auto_model(net, mdlname="Net", waittime=0.5, csv_out=out_prefix)
    for batch in (2, 2, 3):
        net(torch.randn(batch, 4).to("hpu"))
    logs = net.raw_logs()
    registered = [ln for ln in logs if "Registering hooks for" in ln]
    assert [ln.split("hooks for ")[1].split(" of type")[0] for ln in registered] == [
        "Net", "Net/0", "Net/0/fc", "Net/1"]
    top = [ln for ln in logs if ln.startswith("[DETECT_RECOMPILE_AUTO][Net]")]
    assert [ln.split("]")[2].split(" ")[0] for ln in top] == ["step:0", "step:1", "step:2"]
    assert "Found new input signature" in top[0] and "Found new input signature" not in top[1]
    assert "Found new input signature" in top[2]  # batch 3: a new shape
    assert all("num_graphs:0" in ln and "Recompilation!" not in ln for ln in top)  # eager: nothing compiled
    counts = net.analyse_dynamicity()
    assert counts == {}
    with open(out_prefix + "_1.csv") as f:
        assert next(csv.reader(f))[:2] == ["Step", "Recompiling modules"]
    assert os.path.exists(out_prefix + "_2.csv")
    assert "Recompile count" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="raw_logs"):
        detect_recompilation_auto_model(net)


def test_data_dynamicity_and_const_shape_dataloader(capsys) -> None:
    from habana_frameworks.torch.utils.experimental import const_shape_dataloader, data_dynamicity

    data = [torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(2, 3)]
    loader = DataLoader(data, batch_size=None)
    assert data_dynamicity(loader) == {(2, 3): 3, (4, 3): 1}
    assert "a little dynamicity" in capsys.readouterr().out
    const = list(const_shape_dataloader(loader, maxlen=2))
    assert len(const) == 2 and all(t.shape == (2, 3) for t in const)
    assert [t.shape for t in const_shape_dataloader(loader, maxlen=10)] == [(2, 3)] * 3


def test_experimental_still_tells_the_generation() -> None:
    from habana_frameworks.torch.utils.experimental import _get_device_type, synDeviceType

    assert _get_device_type() == synDeviceType.synDeviceGaudi2  # the tests' emulated card


# ------------------------------------------------------------------------------------------- lib_utils and debug


def test_lib_utils_paths_are_habanas_layout() -> None:
    import habana_frameworks.torch as hftorch
    from habana_frameworks.torch.utils.lib_utils import get_include_dir, get_lib_dir

    assert get_include_dir() == os.path.join(hftorch.__path__[0], "include")
    assert get_lib_dir() == os.path.join(hftorch.__path__[0], "lib")


def test_debug_answers_for_a_card_that_runs_every_op() -> None:
    import habana_frameworks.torch.utils.debug as htdebug

    assert htdebug._is_enabled_synapse_layout_handling() is True  # Model-References' main.py asks this
    assert htdebug._get_fallback_op_count() == {}
    assert htdebug._is_enabled_weight_permute_pass() is False
    t = torch.randn(5, 3).to("hpu")
    ptr, nbytes = htdebug.get_tensor_info(t)
    assert nbytes == 5 * 3 * 4 and ptr == t.untyped_storage().data_ptr()
    assert htdebug.get_tensor_info(torch.zeros(2)) is None
    htdebug._memstat_livealloc("x")
    htdebug._hg_print("x")
    htdebug._bridge_cleanup()


# ------------------------------------------------------------------------------------------------ activity_profiler


def test_activity_profiler_gives_torch_profiler_the_hpu_activity() -> None:
    from habana_frameworks.torch import activity_profiler

    original = torch.profiler.ProfilerActivity, torch.profiler.profile, torch.autograd.profiler.profile
    try:
        activity_profiler.register_habana_activity_profiler()
        activity_profiler.register_habana_activity_profiler()  # twice: no double wrapping
        assert torch.profiler.ProfilerActivity.HPU.name == "HPU"
        a, b = torch.randn(8, 8).to("hpu"), torch.randn(8, 8).to("hpu")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.HPU],
                                    debug_activities=[activity_profiler.DebugActivity.BRIDGE_FUNCTION_CALLS]) as prof:
            torch.mm(a, b)
        assert prof.hpu_profiling_active
        assert any(e.name == "aten::mm" for e in prof.events())  # the card's op, recorded as a CPU event
        assert torch.profiler.profile.__mro__[1] is original[1]
    finally:
        activity_profiler.restore_torch_profiler()
    assert (torch.profiler.ProfilerActivity, torch.profiler.profile, torch.autograd.profiler.profile) == original


# ------------------------------------------------------------------------------------------------------- autoload


@pytest.mark.parametrize("env,enabled", [({}, True), ({"PT_HPU_LAZY_MODE": "1"}, False),
                                         ({"PT_HPU_LAZY_MODE": "1", "PT_HPU_AUTOLOAD": "1"}, True),
                                         ({"PT_HPU_AUTOLOAD": "0"}, False)])
def test_autoload_rule_is_habanas(monkeypatch: pytest.MonkeyPatch, env: dict, enabled: bool) -> None:
    import habana_frameworks.autoload as autoload

    monkeypatch.delenv("PT_HPU_AUTOLOAD", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert autoload.is_autoload_enabled() is enabled


def test_autoload_entry_is_harmless_and_idempotent() -> None:
    import habana_frameworks.autoload as autoload

    entry = getattr(autoload, "__autoload")
    assert autoload.is_loaded is True  # habana_frameworks.torch is already imported here
    hpu_module = torch.hpu
    assert entry() is None and entry() is None
    assert torch.hpu is hpu_module and autoload.is_loaded is True
