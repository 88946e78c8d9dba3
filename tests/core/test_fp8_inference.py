"""fp8 inference: measure -> files in the Habana format -> fresh process -> quantize; errors; INC on a Gaudi (fake).

Run as a script (`python tests/core/test_fp8_inference.py quantize DIR`) it is the fresh process of the round trip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[2]


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))
        self.head = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.net(x))

    def predict_step(self, batch, batch_idx):
        return self(batch[0])


def make_model() -> Regressor:
    torch.manual_seed(0)
    return Regressor()


def data() -> DataLoader:
    x = torch.randn(256, 64, generator=torch.Generator().manual_seed(1))
    return DataLoader(TensorDataset(x), batch_size=64)


def predict(model: L.LightningModule, plugin=None) -> torch.Tensor:
    import hpu_nb  # noqa: F401  (registers "hpu" with Lightning)

    kwargs = dict(enable_progress_bar=False, enable_model_summary=False, logger=False)
    trainer = L.Trainer(accelerator="hpu", devices=1, plugins=[plugin] if plugin else None, **kwargs)
    return torch.cat(trainer.predict(model, data())).float()


def quantize_in_this_process(directory: Path, fp8_dir: Path | None = None, default: bool = False) -> dict:
    """The fresh process: load the weights, quantize from the measurements, predict, compare with fp32.
    `default`: pass no fp8_data_path (HABANA_LOGS or the default directory)."""
    from hpu_nb.core.precision import HPUPrecisionPlugin
    from hpu_nb.emulator.fp8.engine import Fp8QuantLinear

    model = make_model()
    model.load_state_dict(torch.load(directory / "model.pt"))
    plugin = HPUPrecisionPlugin("fp8")
    path = None if default else str(fp8_dir or directory / "fp8")
    plugin.convert_modules(model, inference=True, quant=True, fp8_data_path=path)
    out = predict(model, plugin)
    ref = torch.load(directory / "fp32.pt")
    return {
        "relative_error": ((out - ref).norm() / ref.norm()).item(),
        "quantized": sorted(n for n, m in model.named_modules() if isinstance(m, Fp8QuantLinear)),
    }


def run_fresh(directory: Path, *extra_env: tuple[str, str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HPU_NB_BACKEND="emulated", **dict(extra_env))
    return subprocess.run([sys.executable, __file__, "quantize", str(directory)], capture_output=True, text=True,
                          env=env, timeout=180)


@pytest.fixture
def fresh_fp8_process(monkeypatch):
    """The emulated fp8 state as in a process that has not measured (restored afterwards)."""
    from hpu_nb.core.fp8 import inference

    return inference


@pytest.fixture
def measured(tmp_path, fresh_fp8_process) -> Path:
    """A model measured with Trainer.predict in this process; its weights and fp32 predictions saved."""
    from hpu_nb.core.precision import HPUPrecisionPlugin

    model = make_model()
    torch.save(model.state_dict(), tmp_path / "model.pt")
    torch.save(predict(model), tmp_path / "fp32.pt")
    plugin = HPUPrecisionPlugin("fp8")
    plugin.convert_modules(model, inference=True, quant=False, fp8_data_path=str(tmp_path / "fp8"))
    predict(model, plugin)  # teardown writes the measurements
    return tmp_path


def test_measurement_writes_habana_format_files(measured) -> None:
    fp8_dir = measured / "fp8"
    measure_cfg = json.loads((fp8_dir / "maxabs_measure.json").read_text())
    quant_cfg = json.loads((fp8_dir / "maxabs_quant.json").read_text())
    for cfg, mode in ((measure_cfg, "MEASURE"), (quant_cfg, "QUANTIZE")):
        assert cfg["mode"] == mode and cfg["observer"] == "maxabs"
        assert cfg["allowlist"] == {"types": [], "names": []} and cfg["blocklist"] == {"types": [], "names": []}
        assert cfg["dump_stats_path"] == str(fp8_dir / "inc_output" / "measure")  # lightning-habana's layout
    assert quant_cfg["scale_method"] == "maxabs_hw"
    stats = json.loads((fp8_dir / "inc_output" / "measure_hooks_maxabs.json").read_text())
    assert stats["Mode"] == "DynamicRange" and set(stats["Nodes"]) == {"net.0", "net.2", "head"}
    model = make_model()
    x = next(iter(data()))[0]
    first = stats["Nodes"]["net.0"]
    assert first["calls"] == 4 and first["shape"] == [128, 64]
    assert first["params"]["weight"] == pytest.approx(model.net[0].weight.abs().max().item())
    all_x = torch.cat([b[0] for b in data()])
    assert first["inputs"][0] == pytest.approx(all_x.abs().max().item())
    assert stats["Nodes"]["head"]["outputs"][0] > 0 and x.shape == (64, 64)
    # INC's other two files of one measurement: the module list and the NumPy archive (INC loads it so)
    assert sorted(p.name for p in (fp8_dir / "inc_output").iterdir()) == [
        "measure_hooks_maxabs.json", "measure_hooks_maxabs.npz", "measure_hooks_maxabs_mod_list.json"]
    assert json.loads((fp8_dir / "inc_output" / "measure_hooks_maxabs_mod_list.json").read_text()) == [
        "net.0", "net.2", "head"]  # the modules prepared for measuring, in the model's order (INC's gmod_list)
    import numpy as np

    archived = np.load(fp8_dir / "inc_output" / "measure_hooks_maxabs.npz", allow_pickle=True)["arr_0"].item()
    assert archived["Mode"] == "DynamicRange" and archived["Nodes"]["net.0"]["inputs"][0] == pytest.approx(
        first["inputs"][0])


def test_round_trip_quantizes_in_a_fresh_process_within_a_few_percent(measured) -> None:
    done = run_fresh(measured)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["quantized"] == ["head", "net.0", "net.2"]
    # e4m3 keeps 3 mantissa bits: each rounded operand is off by ~3.6% RMS, so ~5% on a 3-layer output is fp8 itself
    assert 1e-3 < result["relative_error"] < 0.06, result


def test_measure_then_quantize_in_one_process_as_the_plugins_mnist_example(tmp_path) -> None:
    """lightning-habana's tests and mnist_trainer.py measure, then convert a fresh model for quantize in the same
    process (it works on a Gaudi); it was refused. The result equals the fresh-process round trip's quality."""
    from hpu_nb.core.precision import HPUPrecisionPlugin
    from hpu_nb.emulator.fp8.engine import Fp8QuantLinear

    fp8_dir = str(tmp_path / "fp8")
    measured = make_model()
    weights = {k: v.clone() for k, v in measured.state_dict().items()}
    expected = predict(measured)
    plugin = HPUPrecisionPlugin("fp8")
    plugin.convert_modules(measured, inference=True, quant=False, fp8_data_path=fp8_dir)
    predict(measured, plugin)  # the measurement is written when predict ends

    quantized = make_model()
    quantized.load_state_dict(weights)
    plugin = HPUPrecisionPlugin("fp8")
    plugin.convert_modules(quantized, inference=True, quant=True, fp8_data_path=fp8_dir)
    assert sorted(n for n, m in quantized.named_modules() if isinstance(m, Fp8QuantLinear)) == ["head", "net.0",
                                                                                                "net.2"]
    got = predict(quantized, plugin)
    error = ((got.float() - expected.float()).norm() / expected.float().norm()).item()
    assert 1e-3 < error < 0.06, error


def test_quantizing_first_writes_the_measurement_of_this_process(tmp_path) -> None:
    """A measuring model of this process whose measurement is not written yet (no predict end) is written first."""
    from hpu_nb.core.fp8 import inference
    from hpu_nb.core.precision import HPUPrecisionPlugin

    fp8_dir = tmp_path / "fp8"
    measuring = make_model()
    HPUPrecisionPlugin("fp8").convert_modules(measuring, inference=True, quant=False, fp8_data_path=str(fp8_dir))
    with torch.no_grad():
        measuring.to("hpu")(next(iter(data()))[0].to("hpu"))
    assert inference.state_of(measuring).written is None
    HPUPrecisionPlugin("fp8").convert_modules(make_model(), inference=True, quant=True, fp8_data_path=str(fp8_dir))
    assert inference.state_of(measuring).written == fp8_dir / "inc_output" / "measure_hooks_maxabs.json"


def test_the_measured_model_itself_is_quantized_as_the_plugins_example_does(tmp_path) -> None:
    """lightning-habana's mnist_trainer.py converts the model it measured (INC's prepare / convert flow)."""
    from hpu_nb.core.fp8 import Fp8InferenceError, inference
    from hpu_nb.core.precision import HPUPrecisionPlugin
    from hpu_nb.emulator.fp8.engine import Fp8QuantLinear

    model = make_model()
    expected = predict(model)
    fp8_dir = str(tmp_path / "fp8")
    plugin = HPUPrecisionPlugin("fp8")
    plugin.convert_modules(model, inference=True, quant=False, fp8_data_path=fp8_dir)
    predict(model, plugin)
    plugin.convert_modules(model, inference=True, quant=True, fp8_data_path=fp8_dir)
    assert inference.state_of(model).mode == "quantize"
    assert sum(isinstance(m, Fp8QuantLinear) for m in model.modules()) == 3
    error = ((predict(model, plugin) - expected).norm() / expected.norm()).item()
    assert 1e-3 < error < 0.06, error

    never_ran = make_model()
    plugin.convert_modules(never_ran, inference=True, quant=False, fp8_data_path=str(tmp_path / "other"))
    with pytest.raises(Fp8InferenceError, match="No fp8 measurements were recorded"):
        plugin.convert_modules(never_ran, inference=True, quant=True, fp8_data_path=str(tmp_path / "other"))


def test_quantize_without_measurements_names_the_missing_file(tmp_path, fresh_fp8_process) -> None:
    from hpu_nb.core.precision import HPUPrecisionPlugin

    with pytest.raises(FileNotFoundError, match=r"maxabs_quant\.json does not exist. Measure first"):
        HPUPrecisionPlugin("fp8").convert_modules(make_model(), inference=True, quant=True, fp8_data_path=str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"measure_hooks_maxabs\.json do not exist\. Measure first"):
        HPUPrecisionPlugin("fp8").convert_modules(make_model(), inference=True, quant={"mode": "QUANTIZE"},
                                                  fp8_data_path=str(tmp_path))


def test_mismatched_model_and_files_are_clear_errors(measured, fresh_fp8_process) -> None:
    from hpu_nb.core.fp8 import Fp8InferenceError
    from hpu_nb.core.fp8.convert import convert_modules

    fp8_dir = str(measured / "fp8")
    stats_path = measured / "fp8" / "inc_output" / "measure_hooks_maxabs.json"
    stats = json.loads(stats_path.read_text())
    stats["hpu_nb"]["pid"] = -1  # as if written by another process
    stats_path.write_text(json.dumps(stats))

    wider = make_model()
    wider.head = torch.nn.Linear(32, 9)
    with pytest.raises(Fp8InferenceError, match=r"'head' has weight shape \[9, 32\], measured \[8, 32\]"):
        convert_modules(wider, inference=True, quant=True, fp8_data_path=fp8_dir)
    other = make_model()
    other.extra = torch.nn.Linear(8, 8)
    with pytest.raises(Fp8InferenceError, match="'extra' \\(Linear\\) has no measurements"):
        convert_modules(other, inference=True, quant=True, fp8_data_path=fp8_dir)
    retrained = make_model()
    with torch.no_grad():
        retrained.net[0].weight.mul_(2)
    with pytest.raises(Fp8InferenceError, match="'net.0' weights changed since measuring"):
        convert_modules(retrained, inference=True, quant=True, fp8_data_path=fp8_dir)
    stats_path.write_text("{not json")
    with pytest.raises(Fp8InferenceError, match="is not valid JSON"):
        convert_modules(make_model(), inference=True, quant=True, fp8_data_path=fp8_dir)
    stats_path.unlink()
    with pytest.raises(FileNotFoundError, match="measure_hooks_maxabs.json do not exist"):
        convert_modules(make_model(), inference=True, quant=True, fp8_data_path=fp8_dir)
    cfg = measured / "fp8" / "maxabs_measure.json"
    with pytest.raises(Fp8InferenceError, match="has mode 'MEASURE' .*, but this step needs mode 'QUANTIZE'"):
        os.environ["QUANT_CONFIG"] = str(cfg)
        try:
            convert_modules(make_model(), inference=True, quant=True, fp8_data_path=fp8_dir)
        finally:
            del os.environ["QUANT_CONFIG"]


def test_measuring_into_the_package_is_refused(fresh_fp8_process, monkeypatch) -> None:
    import hpu_nb
    from hpu_nb.core.fp8.convert import convert_modules

    inside = Path(hpu_nb.__file__).parent / "fp8_stats"
    with pytest.raises(ValueError, match="inside the installed hpu_nb package"):
        convert_modules(make_model(), inference=True, quant=False, fp8_data_path=str(inside))
    monkeypatch.setenv("HABANA_LOGS", str(inside))
    with pytest.raises(ValueError, match="inside the installed hpu_nb package"):
        convert_modules(make_model(), inference=True, quant=False)
    assert not inside.exists()


# -- no fp8_data_path: HABANA_LOGS, else <hpu_nb cache directory>/fp8 ------------------------------------------------
@pytest.fixture
def own_cache_dir(tmp_path, monkeypatch) -> Path:
    """HPU_NB_CACHE_DIR in tmp_path, holding links to the built emulated device (so nothing is rebuilt there)."""
    from hpu_nb.runtime import cache_dir

    cache = (tmp_path / "cache").resolve()  # as data_dir names it
    cache.mkdir()
    for library in cache_dir().glob("hpu_device-*.so"):
        (cache / library.name).symlink_to(library)
    monkeypatch.setenv("HPU_NB_CACHE_DIR", str(cache))
    return cache


def test_without_a_path_measurements_go_to_the_cache_directory_and_a_fresh_process_finds_them(
        tmp_path, own_cache_dir, fresh_fp8_process, caplog) -> None:
    from hpu_nb.core.fp8.inference import data_dir
    from hpu_nb.core.precision import HPUPrecisionPlugin

    model = make_model()
    torch.save(model.state_dict(), tmp_path / "model.pt")
    torch.save(predict(model), tmp_path / "fp32.pt")
    plugin = HPUPrecisionPlugin("fp8")
    with caplog.at_level("INFO"):
        plugin.convert_modules(model, inference=True, quant=False)  # lightning-habana's fp8 example passes no path
        assert data_dir(None) == own_cache_dir / "fp8"
    said = [r.getMessage() for r in caplog.records if "no fp8_data_path given" in r.getMessage()]
    assert said == [f"fp8 inference: no fp8_data_path given; measurements live in {own_cache_dir / 'fp8'} (hpu_nb's"
                    " default, <cache directory>/fp8; set HABANA_LOGS to change it)."]  # once, not on every call
    predict(model, plugin)
    fp8_dir = own_cache_dir / "fp8"
    assert (fp8_dir / "maxabs_measure.json").is_file() and (fp8_dir / "maxabs_quant.json").is_file()
    assert (fp8_dir / "inc_output" / "measure_hooks_maxabs.json").is_file()

    done = run_fresh_from(tmp_path, None, ("HPU_NB_CACHE_DIR", str(own_cache_dir)))  # no path there either
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["quantized"] == ["head", "net.0", "net.2"] and 1e-3 < result["relative_error"] < 0.06, result
    assert f"measurements live in {fp8_dir}" in done.stderr + done.stdout


def test_habana_logs_wins_over_the_default_and_a_given_path_over_both(tmp_path, own_cache_dir, fresh_fp8_process,
                                                                      monkeypatch, caplog) -> None:
    from hpu_nb.core.fp8.inference import data_dir
    from hpu_nb.core.precision import HPUPrecisionPlugin

    logs = tmp_path.resolve() / "habana_logs"
    monkeypatch.setenv("HABANA_LOGS", str(logs))
    model = make_model()
    plugin = HPUPrecisionPlugin("fp8")
    with caplog.at_level("INFO"):
        plugin.convert_modules(model, inference=True, quant=False)
    assert any(f"measurements live in {logs} ($HABANA_LOGS)" in r.getMessage() for r in caplog.records)
    predict(model, plugin)
    assert (logs / "inc_output" / "measure_hooks_maxabs.json").is_file()
    assert not (own_cache_dir / "fp8").exists()
    assert data_dir(str(tmp_path / "given")) == tmp_path.resolve() / "given"


def test_first_generation_refuses_fp8_inference(tmp_path, monkeypatch) -> None:
    from hpu_nb.core.fp8.convert import convert_modules
    from hpu_nb.core.precision import UnsupportedPrecisionError

    monkeypatch.setenv("HPU_NB_DEVICE", "gaudi")
    with pytest.raises(UnsupportedPrecisionError):
        convert_modules(make_model(), inference=True, quant=False, fp8_data_path=str(tmp_path))


def test_gaudi_measure_and_quantize_go_through_inc_while_the_model_is_on_the_device(make_fake_gaudi, tmp_path,
                                                                                    fresh_fp8_process) -> None:
    from hpu_nb.core.precision import HPUPrecisionPlugin
    from tests.helpers.fake_neural_compressor import install_fake_inc

    fake = make_fake_gaudi(release="1.21.0")
    with install_fake_inc() as inc:
        plugin = HPUPrecisionPlugin("fp8")
        model = make_model()
        assert plugin.convert_modules(model, inference=True, quant=False, fp8_data_path=str(tmp_path)) is model
        (measure_cfg,) = inc.named("prepare")
        assert measure_cfg["mode"] == "MEASURE"
        assert measure_cfg["dump_stats_path"] == str(tmp_path / "inc_output" / "measure")
        assert measure_cfg["observer"] == "maxabs"
        # Habana's environment is set before INC's prepare, and the prepared model initialised for the graph compiler
        names = [c.short for c in fake.calls.all() if c.short in ("hpu_set_env", "hpu_initialize")]
        assert names == ["hpu_set_env", "hpu_initialize"]
        assert fake.calls.named("hpu_initialize")[0].kwargs == {"mark_only_scales_as_const": True}
        predict(model, plugin)
        assert inc.named("finalize_calibration") == [model]
        assert inc.devices_at_finalize == ["hpu:0"]  # written before Lightning's teardown moved the model to the CPU
        assert (tmp_path / "inc_output" / "measure_hooks_maxabs.json").is_file()  # INC named and wrote it
        assert json.loads((tmp_path / "maxabs_quant.json").read_text())["mode"] == "QUANTIZE"

        HPUPrecisionPlugin("fp8").convert_modules(make_model(), inference=True, quant=True, fp8_data_path=str(tmp_path))
        (quant_cfg,) = inc.named("convert")
        assert quant_cfg == {**measure_cfg, "mode": "QUANTIZE"} and quant_cfg["scale_method"] == "maxabs_hw"


# -- configs as Intel Neural Compressor reads them (the ones optimum-habana ships), and malformed ones ------------
# The fields of optimum-habana's examples/text-generation/quantization_config/maxabs_measure.json and maxabs_quant.json.
OPTIMUM_MEASURE = {"method": "HOOKS", "mode": "MEASURE", "observer": "maxabs",
                   "dump_stats_path": "./hqt_output/measure"}
OPTIMUM_QUANT = {"method": "HOOKS", "mode": "QUANTIZE", "observer": "maxabs", "scale_method": "maxabs_hw",
                 "dump_stats_path": "./hqt_output/measure"}


def test_optimum_habana_quant_configs_are_accepted_and_run(tmp_path, monkeypatch, fresh_fp8_process) -> None:
    from hpu_nb.core.precision import HPUPrecisionPlugin
    from hpu_nb.emulator.fp8.engine import Fp8QuantLinear

    (tmp_path / "measure.json").write_text(json.dumps(OPTIMUM_MEASURE))
    (tmp_path / "quant.json").write_text(json.dumps({**OPTIMUM_QUANT, "scale_method": "unit_scale",
                                                     "blocklist": {"types": [], "names": ["head"]}}))
    monkeypatch.setenv("QUANT_CONFIG", str(tmp_path / "measure.json"))
    model = make_model()
    plugin = HPUPrecisionPlugin("fp8")
    plugin.convert_modules(model, inference=True, quant=False, fp8_data_path=str(tmp_path / "fp8"))
    predict(model, plugin)
    # the config's relative dump_stats_path is replaced by fp8_data_path's, as lightning-habana did
    stats_path = tmp_path / "fp8" / "inc_output" / "measure_hooks_maxabs.json"
    assert not (tmp_path / "hqt_output").exists()
    stats = json.loads(stats_path.read_text())
    stats["hpu_nb"]["pid"] = -1  # as if written by another process
    stats_path.write_text(json.dumps(stats))
    monkeypatch.setenv("QUANT_CONFIG", str(tmp_path / "quant.json"))
    quantized = make_model()
    HPUPrecisionPlugin("fp8").convert_modules(quantized, inference=True, quant=True,
                                              fp8_data_path=str(tmp_path / "fp8"))
    layers = {n: m for n, m in quantized.named_modules() if isinstance(m, Fp8QuantLinear)}
    assert sorted(layers) == ["net.0", "net.2"] and {m.scale_method for m in layers.values()} == {"unit_scale"}
    assert float(layers["net.0"].input_scale) == 1.0  # unit scale


@pytest.mark.parametrize(("config", "words"), [
    ([1, 2], "is a JSON array, not an object of fp8 settings"),
    ({"mode": "MEASURE", "allowlist": "Linear"}, "allowlist must be an object like"),
    ({"mode": "MEASURE", "blocklist": {"names": "head"}}, "blocklist.names must be a list of strings"),
    ({"mode": "MEASURE", "observer": "minmax"}, "observer 'minmax' is not one of Intel Neural Compressor's"),
    ({"mode": "CALIBRATE"}, "mode 'CALIBRATE' is not one of"),
    ({"mode": "MEASURE", "dump_stats_path": 3}, "dump_stats_path must be a string path"),
])
def test_malformed_configs_are_clear_errors(tmp_path, monkeypatch, fresh_fp8_process, config, words) -> None:
    from hpu_nb.core.fp8 import Fp8InferenceError
    from hpu_nb.core.fp8.convert import convert_modules

    (tmp_path / "cfg.json").write_text(json.dumps(config))
    monkeypatch.setenv("QUANT_CONFIG", str(tmp_path / "cfg.json"))
    with pytest.raises(Fp8InferenceError, match=words) as info:
        convert_modules(make_model(), inference=True, quant=False, fp8_data_path=str(tmp_path))
    assert "cfg.json" in str(info.value) or "array" in str(info.value)


def test_settings_inc_has_but_the_emulation_lacks_are_refused_by_name(tmp_path, fresh_fp8_process) -> None:
    from hpu_nb.core.fp8 import Fp8InferenceError
    from hpu_nb.core.fp8.convert import convert_modules

    config = {"mode": "MEASURE", "observer": "maxabs_per_channel", "allowlist": {"types": ["Conv2d"]}}
    with pytest.raises(Fp8InferenceError, match=r"accepts these settings on a Gaudi.*observer 'maxabs_per_channel'"
                                                 r".*allowlist types \['Conv2d'\]"):
        convert_modules(make_model(), inference=True, quant=config, fp8_data_path=str(tmp_path))
    quant = {**OPTIMUM_QUANT, "scale_method": "ACT_MAXABS_POW2_WEIGHTS_PCS_OPT_POW2"}
    with pytest.raises(Fp8InferenceError, match="scale_method 'act_maxabs_pow2_weights_pcs_opt_pow2'"):
        convert_modules(make_model(), inference=True, quant=quant, fp8_data_path=str(tmp_path))


# -- where the measurements are read from ----------------------------------------------------------------------------
def test_quantize_reads_the_given_folder_not_the_one_recorded_at_measure_time(measured, fresh_fp8_process) -> None:
    moved = measured / "moved"
    (measured / "fp8").rename(moved)
    done = run_fresh_from(measured, moved)
    assert done.returncode == 0, done.stderr[-3000:]  # the moved folder works
    # an old folder at the recorded place, with different stats, is not read: the given folder's are
    (measured / "fp8" / "inc_output").mkdir(parents=True)
    stale = json.loads((moved / "inc_output" / "measure_hooks_maxabs.json").read_text())
    for node in stale["Nodes"].values():
        node["inputs"] = [1e-6]
    (measured / "fp8" / "inc_output" / "measure_hooks_maxabs.json").write_text(json.dumps(stale))
    again = run_fresh_from(measured, moved)
    assert json.loads(again.stdout.strip().splitlines()[-1])["relative_error"] == pytest.approx(
        json.loads(done.stdout.strip().splitlines()[-1])["relative_error"])


@pytest.mark.parametrize("bad", [float("nan"), -1.0, "big", None])
def test_nan_or_negative_amax_in_measurements_is_refused(measured, fresh_fp8_process, bad) -> None:
    from hpu_nb.core.fp8 import Fp8InferenceError
    from hpu_nb.core.fp8.convert import convert_modules

    path = measured / "fp8" / "inc_output" / "measure_hooks_maxabs.json"
    stats = json.loads(path.read_text())
    stats["hpu_nb"]["pid"] = -1
    stats["Nodes"]["net.2"]["inputs"] = [bad]
    path.write_text(json.dumps(stats))
    with pytest.raises(Fp8InferenceError, match=r"node 'net.2' has inputs = .*not a finite max-abs >= 0"):
        convert_modules(make_model(), inference=True, quant=True, fp8_data_path=str(measured / "fp8"))
    path.write_text(json.dumps([stats]))
    with pytest.raises(Fp8InferenceError, match="is not a max-abs measurement file"):
        convert_modules(make_model(), inference=True, quant=True, fp8_data_path=str(measured / "fp8"))


def test_measurements_of_several_cards_are_named_and_found_by_rank(measured, fresh_fp8_process, monkeypatch) -> None:
    from hpu_nb.core.fp8.convert import convert_modules
    from hpu_nb.emulator.fp8.engine import Fp8QuantLinear

    inc_dir = measured / "fp8" / "inc_output"
    single = inc_dir / "measure_hooks_maxabs.json"
    stats = json.loads(single.read_text())
    stats["hpu_nb"]["pid"] = -1
    for rank in (0, 1):
        (inc_dir / f"measure_hooks_maxabs_{rank}_2.json").write_text(json.dumps(stats))
    single.unlink()
    with pytest.raises(FileNotFoundError, match=r"measure_hooks_maxabs\.json do not exist\. Found instead: "
                                                r"measure_hooks_maxabs_0_2\.json, measure_hooks_maxabs_1_2\.json"):
        convert_modules(make_model(), inference=True, quant=True, fp8_data_path=str(measured / "fp8"))
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    model = convert_modules(make_model(), inference=True, quant=True, fp8_data_path=str(measured / "fp8"))
    assert sum(isinstance(m, Fp8QuantLinear) for m in model.modules()) == 3


@pytest.mark.timeout(400)
def test_two_card_measurement_files_are_found_by_a_two_card_quantize(tmp_path) -> None:
    """Measure on 2 cards (Lightning's script launcher), then quantize on 2 cards in new processes."""
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "WORLD_SIZE", "RANK", "MASTER_PORT")}
    env.update(PYTHONPATH=str(ROOT), HPU_NB_BACKEND="emulated", HPU_NB_DEVICE_COUNT="2")
    script = ROOT / "tests" / "dist_scripts" / "fp8_predict.py"
    for step in ("measure", "quantize"):
        done = subprocess.run([sys.executable, str(script), step, str(tmp_path)], env=env, capture_output=True,
                              text=True, timeout=300, cwd=str(tmp_path))
        assert done.returncode == 0, done.stderr[-3000:]
    files = sorted(p.name for p in (tmp_path / "fp8" / "inc_output").glob("measure_hooks_maxabs*.json"))
    # as Intel Neural Compressor names them: rank 0 converts before Lightning starts the other rank (no rank known
    # yet), rank 1 converts knowing it is rank 1 of 2
    assert files == ["measure_hooks_maxabs.json", "measure_hooks_maxabs_1_2.json",
                     "measure_hooks_maxabs_1_2_mod_list.json", "measure_hooks_maxabs_mod_list.json"]
    reports = [json.loads((tmp_path / f"quantized{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["quantized"] for r in reports] == [["head", "net.0", "net.2"]] * 2
    assert all(1e-3 < r["relative_error"] < 0.06 for r in reports)


def test_fp8_layers_take_a_batch_of_no_rows(measured, fresh_fp8_process) -> None:
    from hpu_nb.core.fp8 import DelayedScaling
    from hpu_nb.emulator.fp8.engine import Fp8QuantLinear
    from hpu_nb.emulator.fp8.training import Fp8Linear, emulated_fp8_autocast

    layer = Fp8QuantLinear(torch.nn.Linear(64, 8), input_amax=3.0, scale_method="maxabs_hw")
    out = layer(torch.zeros(0, 64))
    assert out.shape == (0, 8) and out.dtype == torch.bfloat16
    assert torch.nn.Linear(64, 8)(torch.zeros(0, 64)).shape == (0, 8)  # as a plain Linear does
    training = Fp8Linear(torch.nn.Linear(64, 8), DelayedScaling())
    with emulated_fp8_autocast(enabled=True):
        x = torch.zeros(0, 64, requires_grad=True)
        y = training(x)
        y.sum().backward()
    assert y.shape == (0, 8) and x.grad.shape == (0, 64)


# -- a measure step that would measure nothing, named files that are not files, a failed conversion --------------
def test_measuring_with_a_trainer_not_given_an_fp8_plugin_fails_naming_the_plugin(tmp_path, fresh_fp8_process) -> None:
    """It exited 0 with no measurement written and no word; the quantize process found out. Now predict fails there,
    naming the plugin to add; any fp8 plugin then writes it (lightning-habana's strategies finalize the Trainer's
    model whenever its precision is fp8)."""
    from hpu_nb.core.fp8 import Fp8InferenceError
    from hpu_nb.core.precision import HPUPrecisionPlugin

    fp8_dir = tmp_path / "fp8"
    model = HPUPrecisionPlugin("fp8").convert_modules(make_model(), inference=True, quant=False,
                                                      fp8_data_path=str(fp8_dir))
    with pytest.raises(Fp8InferenceError, match=r"fp8 measurements of Regressor were not written.*precision plugin is"
                                                r" HPUPrecisionPlugin\(precision='32-true'\).*plugins=\[plugin\]"):
        predict(model)
    stats = fp8_dir / "inc_output" / "measure_hooks_maxabs.json"
    assert not stats.exists()
    predict(model, HPUPrecisionPlugin("fp8"))  # not the plugin that converted it: an fp8 one is enough
    assert set(json.loads(stats.read_text())["Nodes"]) == {"net.0", "net.2", "head"}


def test_quant_config_asking_to_measure_with_nothing_set_up_warns_at_the_end_of_predict(
        tmp_path, monkeypatch, fresh_fp8_process) -> None:
    (tmp_path / "measure.json").write_text(json.dumps(OPTIMUM_MEASURE))
    monkeypatch.setenv("QUANT_CONFIG", str(tmp_path / "measure.json"))
    with pytest.warns(UserWarning, match=r"QUANT_CONFIG=.*measure\.json asks for an fp8 measurement \(mode 'MEASURE'\),"
                                         r" but trainer\.predict\(\) measured nothing.*convert_modules\(model,"
                                         r" inference=True, quant=False\)"):
        predict(make_model())
    (tmp_path / "quant.json").write_text(json.dumps(OPTIMUM_QUANT))
    monkeypatch.setenv("QUANT_CONFIG", str(tmp_path / "quant.json"))  # a quantize config: nothing to say
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        predict(make_model())
    assert not [w for w in caught if "QUANT_CONFIG" in str(w.message)]


@pytest.fixture(params=["/dev/zero", "fifo", "folder"])
def not_a_file(request, tmp_path) -> tuple[Path, str]:
    """A path that exists but is no regular file, and the reader's words for it."""
    if request.param == "/dev/zero":
        return Path("/dev/zero"), "is not a regular file .*a character device"
    path = tmp_path / f"a_{request.param}.json"
    if request.param == "fifo":
        os.mkfifo(path)
        return path, "is not a regular file .*a FIFO"
    path.mkdir()
    return path, "is a directory: name a file"


@pytest.mark.timeout(60)  # a FIFO opened for reading without a writer would block forever
def test_named_fp8_files_that_are_not_regular_files_are_refused_for_what_they_are(
        tmp_path, monkeypatch, not_a_file, fresh_fp8_process) -> None:
    """They were called "does not exist. Measure first"; now each goes through the one bounded reader."""
    from hpu_nb.core.fp8 import Fp8InferenceError
    from hpu_nb.core.fp8.convert import convert_modules

    path, words = not_a_file
    monkeypatch.setenv("QUANT_CONFIG", str(path))
    with pytest.raises(Fp8InferenceError, match=f"QUANT_CONFIG file '{path}' {words}"):
        convert_modules(make_model(), inference=True, quant=False, fp8_data_path=str(tmp_path / "fp8"))
    monkeypatch.delenv("QUANT_CONFIG")
    with pytest.raises(Fp8InferenceError, match=f"quant= config file '{path}' {words}"):
        convert_modules(make_model(), inference=True, quant=str(path), fp8_data_path=str(tmp_path / "fp8"))
    missing = tmp_path / "missing.json"
    monkeypatch.setenv("QUANT_CONFIG", str(missing))
    with pytest.raises(FileNotFoundError, match=f"QUANT_CONFIG file {missing} does not exist\\.$"):
        convert_modules(make_model(), inference=True, quant=False, fp8_data_path=str(tmp_path / "fp8"))


@pytest.mark.timeout(60)
def test_measure_step_files_that_are_not_regular_files_are_refused_for_what_they_are(measured,
                                                                                     fresh_fp8_process) -> None:
    from hpu_nb.core.fp8 import Fp8InferenceError
    from hpu_nb.core.fp8.convert import convert_modules

    fp8_dir = measured / "fp8"
    stats = fp8_dir / "inc_output" / "measure_hooks_maxabs.json"
    stats.unlink()
    os.mkfifo(stats)
    with pytest.raises(Fp8InferenceError, match="fp8 measurement file .*measure_hooks_maxabs.json' is not a regular"
                                                " file .*a FIFO"):
        convert_modules(make_model(), inference=True, quant=True, fp8_data_path=str(fp8_dir))
    stats.unlink()
    stats.mkdir()
    with pytest.raises(Fp8InferenceError, match="measure_hooks_maxabs.json' is a directory"):
        convert_modules(make_model(), inference=True, quant=True, fp8_data_path=str(fp8_dir))
    quant = fp8_dir / "maxabs_quant.json"
    quant.unlink()
    os.mkfifo(quant)
    with pytest.raises(Fp8InferenceError, match="maxabs_quant.json' is not a regular file .*a FIFO"):
        convert_modules(make_model(), inference=True, quant=True, fp8_data_path=str(fp8_dir))


def test_a_failed_measure_conversion_writes_nothing_and_keeps_an_earlier_measurement(measured,
                                                                                     fresh_fp8_process) -> None:
    """It left its maxabs_*.json behind (over a good measurement's); now the configs are written only if the
    conversion succeeds."""
    from hpu_nb.core.fp8 import Fp8InferenceError
    from hpu_nb.core.fp8.convert import convert_modules

    fp8_dir = measured / "fp8"
    before = {p.name: p.read_bytes() for p in fp8_dir.glob("*.json")}
    assert sorted(before) == ["maxabs_measure.json", "maxabs_quant.json"]
    selects_nothing = {"mode": "MEASURE", "allowlist": {"names": ["no_such_layer"]}}
    for folder in (fp8_dir, measured / "new"):
        with pytest.raises(Fp8InferenceError, match="No module of Regressor is selected"):
            convert_modules(make_model(), inference=True, quant=selects_nothing, fp8_data_path=str(folder))
    assert {p.name: p.read_bytes() for p in fp8_dir.glob("*.json")} == before
    assert not list(fp8_dir.glob(".*")) and not list((measured / "new").glob("*"))
    done = run_fresh_from(measured, fp8_dir)  # the earlier measurement still quantizes
    assert done.returncode == 0, done.stderr[-3000:]


def run_fresh_from(directory: Path, fp8_dir: Path | None, *extra_env: tuple[str, str]) -> subprocess.CompletedProcess:
    """The fresh process, quantizing from `fp8_dir` (None: no fp8_data_path, the default directory)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HPU_NB_BACKEND="emulated", **dict(extra_env))
    where = NO_PATH if fp8_dir is None else str(fp8_dir)
    return subprocess.run([sys.executable, __file__, "quantize", str(directory), where], capture_output=True,
                          text=True, env=env, timeout=180)


NO_PATH = "--no-fp8-data-path"



if __name__ == "__main__":
    if sys.argv[1:2] == ["quantize"]:
        fp8_dir = sys.argv[3] if len(sys.argv) > 3 else None
        print(json.dumps(quantize_in_this_process(Path(sys.argv[2]), None if fp8_dir is None else Path(fp8_dir),
                                                  default=fp8_dir == NO_PATH)))


# -- lightning-habana's contract: what its users' tests look for --------------------------------------------------
def test_the_measurement_path_is_written_back_into_the_users_file_or_dict(tmp_path, fresh_fp8_process) -> None:
    """As lightning-habana did: the step's `<fp8_data_path>/inc_output/measure` is patched into the config the user
    passed, a JSON file (its other entries kept) or a dict."""
    from hpu_nb.core.precision import HPUPrecisionPlugin

    config = tmp_path / "my_measure.json"
    config.write_text(json.dumps({"mode": "MEASURE", "observer": "maxabs", "dump_stats_path": "/old/place"}))
    plugin = HPUPrecisionPlugin("fp8")
    plugin.convert_modules(make_model(), inference=True, quant=str(config), fp8_data_path=str(tmp_path / "a"))
    written = json.loads(config.read_text())
    assert written == {"mode": "MEASURE", "observer": "maxabs",
                       "dump_stats_path": str((tmp_path / "a").resolve() / "inc_output" / "measure")}
    settings = {"mode": "MEASURE", "allowlist": {"types": [], "names": []}}
    plugin.convert_modules(make_model(), inference=True, quant=settings, fp8_data_path=str(tmp_path / "b"))
    assert settings["dump_stats_path"] == str((tmp_path / "b").resolve() / "inc_output" / "measure")


def test_the_plugins_errors_keep_its_types_and_first_words(tmp_path, fresh_fp8_process) -> None:
    from hpu_nb.core.fp8.plugin import Fp8PrecisionRequired
    from hpu_nb.core.precision import HPUPrecisionPlugin

    for kind in (AssertionError, ValueError):  # the plugin's assert, and hpu_nb's bad-argument type
        with pytest.raises(kind, match=r"^HPUPrecisionPlugin\.convert_modules\(\) should only be used with "
                                       r"precision=`fp8`\. This plugin's precision is 'bf16-mixed'"):
            HPUPrecisionPlugin("bf16-mixed").convert_modules(make_model(), inference=False)
    assert issubclass(Fp8PrecisionRequired, AssertionError) and issubclass(Fp8PrecisionRequired, ValueError)
    with pytest.raises(TypeError, match=r"^`quant` must be either a bool, file path or a dictionary\. Got <class "
                                        r"'NoneType'>"):
        HPUPrecisionPlugin("fp8").convert_modules(make_model(), inference=True, quant=None, fp8_data_path=str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"^Failed to load file .*maxabs_quant\.json: "):
        HPUPrecisionPlugin("fp8").convert_modules(make_model(), inference=True, quant=True, fp8_data_path=str(tmp_path))


def test_measure_and_quantize_log_where_inc_logs_on_a_gaudi(tmp_path, monkeypatch, fresh_fp8_process) -> None:
    """INC keeps `$HABANA_LOGS[/<HLS_ID>][/<ID>]/inc_log.txt`, appended at each step with its configuration and module
    count (lightning-habana's test looks for the file); the emulated lines say they are the emulation's."""
    from hpu_nb.core.fp8.convert import convert_modules
    from hpu_nb.emulator.fp8 import inc_log

    monkeypatch.delenv("LOG_LEVEL_INC")
    monkeypatch.setenv("HABANA_LOGS", str(tmp_path / "logs"))
    monkeypatch.setenv("ID", "1")  # a rank's own folder, as INC's rule
    convert_modules(make_model(), inference=True, quant=False, fp8_data_path=str(tmp_path / "fp8"))
    log = tmp_path / "logs" / "1" / "inc_log.txt"
    first = log.read_text()
    assert "[INC][INFO] hpu_nb emulated Gaudi (INC-style fp8, not Intel Neural Compressor): measure" in first
    assert "neural_compressor_pt Configuration = {" in first and "Total modules : 3" in first  # its 3 Linear layers
    convert_modules(make_model(), inference=True, quant=False, fp8_data_path=str(tmp_path / "fp8"))
    assert log.read_text().startswith(first) and log.stat().st_size > len(first.encode())  # appended

    inc_log.reset()
    monkeypatch.setenv("LOG_LEVEL_INC", "6")  # INC's "off"
    monkeypatch.setenv("HABANA_LOGS", str(tmp_path / "quiet"))
    convert_modules(make_model(), inference=True, quant=False, fp8_data_path=str(tmp_path / "fp8"))
    assert not (tmp_path / "quiet").exists()
    inc_log.reset()
    monkeypatch.setenv("LOG_LEVEL_INC", "verbose")
    with pytest.raises(ValueError, match="Wrong Log Level value: 'verbose'. Must be an integer 0-6"):
        convert_modules(make_model(), inference=True, quant=False, fp8_data_path=str(tmp_path / "fp8"))
