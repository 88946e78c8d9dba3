"""The smaller habana_frameworks calls on the emulated Gaudi: HPU-graph cache helpers, core's inference set-up, utils
(experimental's recompilation detector, lib_utils, debug), activity_profiler and autoload - Habana's names and
signatures (gaudi-pytorch-bridge 1.19), and what they do here."""

from __future__ import annotations

import csv
import importlib
import inspect
import logging
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
    "habana_frameworks.torch.dynamo.compile_backend",
    "habana_frameworks.torch.dynamo.compile_backend.experimental",
    "habana_frameworks.torch.core.observer",
    "habana_frameworks.torch.core.quantizer",
)

# Among the 64 habana_frameworks calls used most in public Gaudi code, the four the emulated Gaudi lacked (issue 27).
ISSUE_27_NAMES = (
    "habana_frameworks.torch.dynamo.compile_backend.experimental.enable_compiled_autograd",
    "habana_frameworks.torch.hpu.enable_const_section_serialization",
    "habana_frameworks.torch.hpu.LongTensor",
    "habana_frameworks.torch.core.quantizer",
)


@pytest.mark.parametrize("name", NEW_MODULES)
def test_every_new_module_says_it_is_emulated(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__emulated__ is True
    assert "emulated" in module.__doc__


@pytest.mark.parametrize("dotted", ISSUE_27_NAMES)
def test_habanas_most_used_names_exist(dotted: str) -> None:
    try:
        importlib.import_module(dotted)
    except ModuleNotFoundError:
        module, _, name = dotted.rpartition(".")
        assert callable(getattr(importlib.import_module(module), name))


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
    monkeypatch.setattr(graphs, "_said", False)  # said once per process: another test of this worker may have said it
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


# ------------------------------------------------------------------------------- hthpu's tensor types, const sections


@pytest.mark.parametrize("name,dtype", [("LongTensor", torch.int64), ("FloatTensor", torch.float32),
                                        ("BFloat16Tensor", torch.bfloat16), ("BoolTensor", torch.bool),
                                        ("IntTensor", torch.int32), ("HalfTensor", torch.float16)])
def test_hthpu_legacy_tensor_types_copy_data_to_the_card(name: str, dtype: torch.dtype) -> None:
    import habana_frameworks.torch.hpu as hthpu

    cls = getattr(hthpu, name)
    assert cls.__name__ == name and torch.hpu is hthpu
    t = cls([[1, 0], [2, 3]])
    assert isinstance(t, cls) and isinstance(t, torch.Tensor)
    assert t.device.type == "hpu" and t.dtype == dtype and t.shape == (2, 2)
    assert t.cpu().tolist() == torch.tensor([[1, 0], [2, 3]], dtype=dtype).tolist()
    assert cls([5], device="hpu").dtype == dtype
    with pytest.raises(RuntimeError, match="legacy constructor expects device type: hpu but device type: cpu"):
        cls([1], device="cpu")
    with pytest.raises(RuntimeError, match=f"legacy constructor expects dtype: {dtype} but dtype: torch.float64"):
        cls([1], dtype=torch.float64)


@pytest.mark.parametrize("device", ["hpu:0", torch.device("hpu"), torch.device("hpu", 0)])
def test_hthpu_legacy_tensor_types_take_only_the_string_hpu_as_habanas_do(device) -> None:
    """Habana's constructors compare the device keyword with the string "hpu" (bridge hpu/__init__.py): "hpu:0" and
    torch.device("hpu") are refused on a Gaudi, so they are here (they were accepted), with Habana's message first."""
    import habana_frameworks.torch.hpu as hthpu

    with pytest.raises(RuntimeError, match=f"^legacy constructor expects device type: hpu but device type: {device}"
                                           " was passed .*pass device='hpu' or leave it out"):
        hthpu.LongTensor([1, 2], device=device)
    assert hthpu.LongTensor([1, 2], device="hpu").device == torch.device("hpu", 0)


def test_hthpu_long_tensor_indexes_on_the_card() -> None:
    import habana_frameworks.torch.hpu as hthpu

    index = hthpu.LongTensor([2, 0])
    table = torch.arange(6.0).reshape(3, 2).to("hpu")
    assert table[index].cpu().tolist() == [[4.0, 5.0], [0.0, 1.0]]


def test_const_section_serialization_keeps_habanas_settings_and_writes_nothing(tmp_path) -> None:
    import habana_frameworks.torch.hpu as hthpu

    params = list(inspect.signature(hthpu.enable_const_section_serialization).parameters)
    assert params == ["path", "clear_path", "use_compression"]
    try:
        hthpu.enable_const_section_serialization(tmp_path / "consts", True, False)
        assert hthpu.const_section_serialization_settings() == (str(tmp_path / "consts"), True, False)
        model = nn.Linear(3, 3).to("hpu").eval()
        with torch.no_grad():
            model(torch.randn(2, 3).to("hpu"))
        assert not (tmp_path / "consts").exists()  # no recipe, no const section: nothing is written here
    finally:
        hthpu.disable_const_section_serialization()
    assert hthpu.const_section_serialization_settings() == ("", False, False)


# ------------------------------------------------------------------------------------------------ compiled autograd


def test_enable_compiled_autograd_compiles_backward_with_hpu_backend(fresh_compiler, caplog) -> None:
    from habana_frameworks.torch.dynamo.compile_backend.experimental import enable_compiled_autograd

    from hpu_nb.emulator import graph_compiler

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)).to("hpu")
    x = torch.randn(5, 4).to("hpu")
    model(x).sum().backward()
    eager = [p.grad.cpu().clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    ddp, fallback = torch._dynamo.config.optimize_ddp, torch._C._get_autograd_fallback_mode()
    try:
        enable_compiled_autograd()
        assert "Enabling CompiledAutograd for hpu_backend with torch.compile" in caplog.text
        assert torch._dynamo.config.optimize_ddp == "python_reducer"
        assert torch._C._get_autograd_fallback_mode() == "nothing"
        before = graph_compiler.stats()["graph_compilation"]["TotalNumber"]
        torch.compile(model, backend="hpu_backend")(x).sum().backward()
        compiled = graph_compiler.stats()["graph_compilation"]["TotalNumber"] - before
        assert compiled == 2  # the forward graph, and the backward graph compiled autograd captured
        for expected, parameter in zip(eager, model.parameters()):
            torch.testing.assert_close(parameter.grad.cpu(), expected)
    finally:
        torch._dynamo.reset()  # also drops the autograd compiler
        torch._dynamo.config.optimize_ddp = ddp
        torch._C._set_autograd_fallback_mode(fallback)


# ------------------------------------------------------------------------------------------ core observer, quantizer


def test_abs_max_observers_give_habanas_hardware_aligned_scales() -> None:
    from habana_frameworks.torch.core.observer import AbsMaxObserver, SimpleAbsMaxObserver

    observer = AbsMaxObserver(quant_min=-240, quant_max=240, eps=2**-12, backoff_margin=2)
    observer(torch.tensor([-3.0, 1.0]).to("hpu"))
    observer(torch.tensor([0.5, 2.0]).to("hpu"))
    assert (observer.min_val.item(), observer.max_val.item()) == (-3.0, 2.0)
    scale, zero_point = observer.calculate_qparams()
    # 3 / 240 * 2**2 = 0.05 -> a power of two, 2**-4 -> a power of 2**4 within Gaudi2's 2**-8 .. 2**4: 2**-4
    assert scale.item() == 2.0**-4 and zero_point.item() == 0
    simple = SimpleAbsMaxObserver(quant_min=-240, quant_max=240, backoff_margin=0)
    simple(torch.tensor([-30.0, 1.0]).to("hpu"))
    assert simple.abs_max_val.item() == 30.0
    assert simple.calculate_qparams()[0].item() == 1.0  # 30 / 240 = 0.125 -> 2**-3 -> 2**0
    simple.reset_observer_state()
    simple(torch.tensor([1e6]))
    assert simple.calculate_qparams()[0].item() == 16.0  # Gaudi2's largest scale
    for kwargs, message in (({"dtype": torch.int8}, "dtype only supports"), ({"qscheme": torch.per_tensor_affine},
                            "qscheme only supports"), ({"reduce_range": True}, "reduce_range is not supported")):
        with pytest.raises(NotImplementedError, match=message):
            AbsMaxObserver(**kwargs)


def test_core_quantizer_has_habanas_names_and_annotates_where_pt2e_exists() -> None:
    from habana_frameworks.torch.core import quantizer
    from habana_frameworks.torch.core.observer import AbsMaxObserver, pt2e_api

    assert quantizer.QUANTIZER_MIN_MAX[torch.float8_e4m3fn] == (-240, 240)
    assert quantizer.extra_args_act == {"for_observer": {"eps": 2**-12, "backoff_margin": 2}}
    if pt2e_api() is None:  # torch 2.13 moved PT2E quantization to torchao, and torchao is not installed
        with pytest.raises(ImportError, match="pip install torchao"):
            quantizer.habana_quantizer  # noqa: B018
        return
    config = quantizer.habana_quant_config_symmetric(torch.float8_e4m3fn)
    assert config.input_activation.quant_max == 240 and config.weight.ch_axis == 0
    assert config.input_activation.observer_or_fake_quant_ctr.p.func is AbsMaxObserver
    model = ConvNet().to("hpu").eval()
    x = torch.randn(2, 1, 6, 6).to("hpu")
    graph = torch.export.export(model, (x,), strict=True).module()  # strict: every source partition recorded
    quantizer.habana_quantizer().set_global(config).annotate(graph)
    assert annotated_operands(graph) == {"conv2d": 3, "max_pool2d": 1, "linear": 3, "matmul": 2}
    ao = importlib.import_module(pt2e_api()[0].rsplit(".", 1)[0] + ".quantize_pt2e")
    prepared = ao.prepare_pt2e(graph, quantizer.habana_quantizer().set_global(config))
    prepared(x)
    assert any(isinstance(m, AbsMaxObserver) for m in prepared.modules())
    converted = ao.convert_pt2e(prepared)
    torch.testing.assert_close(converted(x), model(x), atol=0.2, rtol=0.2)  # fp8 (e4m3) quantization error


def annotated_operands(graph: torch.fx.GraphModule) -> dict[str, int]:
    """Per annotated operator node: how many of its operands have a quantization spec."""
    return {n.target.__name__.split(".")[0]: len(n.meta["quantization_annotation"].input_qspec_map)
            for n in graph.graph.nodes
            if n.op == "call_function" and "quantization_annotation" in n.meta}


def test_core_quantizer_annotates_by_habanas_source_partitions_so_non_strict_export_leaves_matmul_float(
        caplog) -> None:
    """Habana's rule (bridge core/quantizer.py): source partitions of nn.Linear / F.linear, torch.matmul, Conv2d,
    MaxPool2d. torch.export's default, non-strict capture records the Conv2d / MaxPool2d / Linear module calls but not
    torch.matmul, and leaves the Linear's parameters out of its partition: Habana's quantizer then quantizes the conv
    and the pool only (the Linear skipped with its warning), and so does the emulated one. It annotated by aten op
    before, quantizing the matmul and the linear where a Gaudi leaves them float."""
    from habana_frameworks.torch.core import quantizer
    from habana_frameworks.torch.core.observer import pt2e_api

    if pt2e_api() is None:
        pytest.skip("PT2E quantization is not installed (torch >= 2.13 needs torchao: the dev extra has it)")
    model = ConvNet().to("hpu").eval()
    x = torch.randn(2, 1, 6, 6).to("hpu")
    graph = torch.export.export(model, (x,)).module()
    config = quantizer.habana_quant_config_symmetric(torch.float8_e4m3fn)
    with caplog.at_level(logging.WARNING, logger=quantizer.logger.name):
        quantizer.habana_quantizer().set_global(config).annotate(graph)
    assert annotated_operands(graph) == {"conv2d": 3, "max_pool2d": 1}
    assert "No weight found in Linear pattern" in caplog.text


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(self.pool(self.conv(x)).flatten(1))
        return torch.matmul(h, h.t())


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
    capsys.readouterr()
    counts = net.analyse_dynamicity()
    assert counts == {}  # measured: nothing was compiled (Habana's tables and CSV files hold only what was measured)
    with open(out_prefix + "_1.csv") as f:
        assert next(csv.reader(f))[:2] == ["Step", "Recompiling modules"]
    assert os.path.exists(out_prefix + "_2.csv")
    printed = capsys.readouterr().out
    assert "Recompile count" in printed
    # said plainly: what the emulated Gaudi cannot see, before the (empty) tables ...
    note = printed.index("Emulated Gaudi: num_graphs and the tables below count only")
    assert note < printed.index("Recompile count")
    assert "empty tables mean 'not seen on the emulated Gaudi', not 'no recompilation on a Gaudi'" in printed
    # ... and, after them, where a Gaudi would compile a new graph: batch 3 at step 2, in every module it reached
    unseen = printed[printed.index("Not compiled on the emulated Gaudi"):]
    assert "where the module runs compiled (torch.compile without dynamic shapes, or lazy mode)" in unseen
    rows = [[cell.strip() for cell in line.split(" | ")] for line in unseen.splitlines()[2:]]
    assert sorted(rows) == [["2", "Net", "Sequential"], ["2", "Net/0", "Inner"], ["2", "Net/0/fc", "Linear"],
                            ["2", "Net/1", "Linear"]]
    with pytest.raises(AssertionError, match="raw_logs"):
        detect_recompilation_auto_model(net)


class CompiledTail(nn.Module):
    """An eager Linear, then a torch.compile'd function (hpu_backend, static shapes): what the detector can measure."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.tail = torch.compile(lambda x: (x * 2).relu(), backend="hpu_backend", dynamic=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tail(self.fc(x))


def test_detect_recompilation_reports_hpu_backend_recompilations_as_measured(fresh_compiler, tmp_path,
                                                                             capsys) -> None:
    from habana_frameworks.torch.utils.experimental import detect_recompilation_auto_model

    net = detect_recompilation_auto_model(CompiledTail().to("hpu"), csv_out=str(tmp_path / "report"))
    for batch in (2, 2, 3):
        net(torch.randn(batch, 4).to("hpu"))
    top = [ln for ln in net.raw_logs() if ln.startswith("[DETECT_RECOMPILE_AUTO][Net]")]
    assert ["Recompilation!" in ln for ln in top] == [True, False, True]  # compiled at step 0, recompiled at step 2
    capsys.readouterr()
    assert net.analyse_dynamicity() == {"Net": 1}
    printed = capsys.readouterr().out
    assert "Emulated Gaudi: num_graphs and the tables below count only" in printed
    assert "empty tables mean" not in printed  # a graph was compiled: the tables hold what was measured
    assert "Recompiled due to new input shape" in printed
    unseen = printed[printed.index("Not compiled on the emulated Gaudi"):]
    assert [line.split(" | ")[1].strip() for line in unseen.splitlines()[2:]] == ["Net/fc"]  # Net was measured


def test_metrics_say_what_the_emulated_gaudi_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    from habana_frameworks.torch.hpu import metrics

    monkeypatch.setenv("PT_HPU_ENABLE_CACHE_METRICS", "1")
    compilation = metrics.metric_global("graph_compilation")
    assert "counts only the graphs torch.compile(backend='hpu_backend') compiled" in repr(compilation)
    assert "lazy mode compile nothing on the emulated card" in compilation.what_it_sees()
    assert dict(compilation.stats()).keys() == {"TotalNumber", "TotalTime", "AvgTime"}  # Habana's tags, unchanged
    assert "nothing falls back" in repr(metrics.metric_global("cpu_fallback"))
    assert "a later call of an hpu_backend graph" in repr(metrics.metric_global("recipe_cache"))


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


def test_habana_dataloader_falls_back_to_torchs_with_the_same_batches(capsys, monkeypatch):
    """Model-References' scripts `import habana_dataloader`: with no media pipeline, every dataset takes Habana's
    fallback to torch's DataLoader (same arguments, same batches), saying so; DATALOADER_FALLBACK_EN="" refuses."""
    import habana_dataloader
    from torch.utils.data import DataLoader, TensorDataset

    from hpu_nb.runtime.habana_install import is_emulated

    dataset = TensorDataset(torch.arange(20.0).view(10, 2), torch.arange(10))
    torch.manual_seed(3)
    loader = habana_dataloader.HabanaDataLoader(dataset, batch_size=4, shuffle=True, drop_last=True)
    assert "Running with PyTorch Dataloader" in capsys.readouterr().out
    torch.manual_seed(3)
    reference = DataLoader(dataset, batch_size=4, shuffle=True, drop_last=True)
    torch.manual_seed(5)
    got = [batch[1].tolist() for batch in loader]
    torch.manual_seed(5)
    assert got == [batch[1].tolist() for batch in reference] and len(loader) == len(reference) == 2
    assert loader.dataloader.batch_size == 4 and is_emulated(habana_dataloader)
    with pytest.raises(AttributeError, match="'HabanaDataLoader' object has no attribute 'batch_size'"):
        loader.batch_size  # noqa: B018 -- Habana's wrapper forwards nothing: a Gaudi raises here too
    assert not hasattr(loader, "fallback_activated")
    monkeypatch.setenv("DATALOADER_FALLBACK_EN", "")
    with pytest.raises(RuntimeError, match="DATALOADER_FALLBACK_EN is empty"):
        habana_dataloader.HabanaDataLoader(dataset, batch_size=4)


def test_set_deterministic_keeps_habanas_own_flag_with_its_deprecation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Habana's DeepSpeed 1.18 calls hpu.setDeterministic(True) when its accelerator is made (at `import deepspeed`).
    Habana's flag is its own (HPUGlobalConfig), not torch's deterministic-algorithms switch; both calls warn."""
    import habana_frameworks.torch.hpu as hthpu

    monkeypatch.setattr(hthpu, "_deterministic", False)
    before = torch.are_deterministic_algorithms_enabled()
    with pytest.warns(UserWarning, match="torch.hpu.getDeterministic is deprecated"):
        assert hthpu.getDeterministic() is False
    with pytest.warns(UserWarning, match="torch.hpu.setDeterministic is deprecated.*use_deterministic_algorithms"):
        torch.hpu.setDeterministic(True)
    with pytest.warns(UserWarning):
        assert torch.hpu.getDeterministic() is True
    assert torch.are_deterministic_algorithms_enabled() == before


def test_too_few_visible_modules_is_habanas_assertion_word_for_word(monkeypatch: pytest.MonkeyPatch) -> None:
    """Habana's HCCL module asserts with this text (line breaks and indentation included); lightning-habana's
    multi-tenancy test looks for it in a failed tenant's error. hpu_nb's explanation follows it."""
    import habana_frameworks.torch.distributed.hccl as hccl

    monkeypatch.delenv("HLS_MODULE_ID", raising=False)
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "0,1")
    with pytest.raises(AssertionError) as raised:
        hccl.initialize_distributed_hpu(world_size=4, rank=2, local_rank=2)
    expected = """There is not enough devices
        available for training. Please verify if HABANA_VISIBLE_MODULES
        is set correctly."""
    assert str(raised.value).startswith(expected) and "local rank 2 but HABANA_VISIBLE_MODULES='0,1'" in str(
        raised.value)
