"""fp8 inference: measure -> files in the Habana format -> fresh process -> quantize; errors; INC on a Gaudi (fake).

Run as a script (`python tests/test_fp8_inference.py quantize DIR`) it is the fresh process of the round trip.
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

ROOT = Path(__file__).resolve().parents[1]


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))
        self.head = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.net(x))

    def predict_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        return self(batch[0])


def make_model() -> Regressor:
    torch.manual_seed(0)
    return Regressor()


def data() -> DataLoader:
    x = torch.randn(256, 64, generator=torch.Generator().manual_seed(1))
    return DataLoader(TensorDataset(x), batch_size=64)


def predict(model: L.LightningModule, plugin=None) -> torch.Tensor:  # noqa: ANN001
    import hpu_nb  # noqa: F401  (registers "hpu" with Lightning)

    kwargs = dict(enable_progress_bar=False, enable_model_summary=False, logger=False)
    trainer = L.Trainer(accelerator="hpu", devices=1, plugins=[plugin] if plugin else None, **kwargs)
    return torch.cat(trainer.predict(model, data())).float()


def quantize_in_this_process(directory: Path) -> dict:
    """The fresh process: load the weights, quantize from the measurements, predict, compare with fp32."""
    from hpu_nb.core.fp8 import Fp8QuantLinear
    from hpu_nb.core.precision import HPUPrecisionPlugin

    model = make_model()
    model.load_state_dict(torch.load(directory / "model.pt"))
    plugin = HPUPrecisionPlugin("fp8")
    plugin.convert_modules(model, inference=True, quant=True, fp8_data_path=str(directory / "fp8"))
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
def fresh_fp8_process(monkeypatch):  # noqa: ANN201
    """The emulated fp8 state as in a process that has not measured (restored afterwards)."""
    from hpu_nb.core.fp8 import inference

    monkeypatch.setattr(inference, "_measured_in_this_process", False)
    return inference


@pytest.fixture
def measured(tmp_path, fresh_fp8_process) -> Path:  # noqa: ANN001
    """A model measured with Trainer.predict in this process; its weights and fp32 predictions saved."""
    from hpu_nb.core.precision import HPUPrecisionPlugin

    model = make_model()
    torch.save(model.state_dict(), tmp_path / "model.pt")
    torch.save(predict(model), tmp_path / "fp32.pt")
    plugin = HPUPrecisionPlugin("fp8")
    plugin.convert_modules(model, inference=True, quant=False, fp8_data_path=str(tmp_path / "fp8"))
    predict(model, plugin)  # teardown writes the measurements
    return tmp_path


def test_measurement_writes_habana_format_files(measured) -> None:  # noqa: ANN001
    fp8_dir = measured / "fp8"
    measure_cfg = json.loads((fp8_dir / "maxabs_measure.json").read_text())
    quant_cfg = json.loads((fp8_dir / "maxabs_quant.json").read_text())
    for cfg, mode in ((measure_cfg, "MEASURE"), (quant_cfg, "QUANTIZE")):
        assert cfg["mode"] == mode and cfg["observer"] == "maxabs" and cfg["scale_method"] == "maxabs_hw"
        assert cfg["allowlist"] == {"types": ["Linear"], "names": []} and cfg["blocklist"] == {"types": [], "names": []}
        assert cfg["dump_stats_path"] == str(fp8_dir / "measure")
    stats = json.loads((fp8_dir / "measure_hooks_maxabs.json").read_text())
    assert stats["Mode"] == "DynamicRange" and set(stats["Nodes"]) == {"net.0", "net.2", "head"}
    model = make_model()
    x = next(iter(data()))[0]
    first = stats["Nodes"]["net.0"]
    assert first["calls"] == 4 and first["shape"] == [128, 64]
    assert first["params"]["weight"] == pytest.approx(model.net[0].weight.abs().max().item())
    all_x = torch.cat([b[0] for b in data()])
    assert first["inputs"][0] == pytest.approx(all_x.abs().max().item())
    assert stats["Nodes"]["head"]["outputs"][0] > 0 and x.shape == (64, 64)


def test_round_trip_quantizes_in_a_fresh_process_within_a_few_percent(measured) -> None:  # noqa: ANN001
    done = run_fresh(measured)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["quantized"] == ["head", "net.0", "net.2"]
    # e4m3 keeps 3 mantissa bits: each rounded operand is off by ~3.6% RMS, so ~5% on a 3-layer output is fp8 itself
    assert 1e-3 < result["relative_error"] < 0.06, result


def test_quantize_in_the_measuring_process_is_refused(measured) -> None:  # noqa: ANN001
    from hpu_nb.core.fp8 import Fp8InferenceError
    from hpu_nb.core.precision import HPUPrecisionPlugin

    with pytest.raises(Fp8InferenceError, match="cannot run in one process"):
        HPUPrecisionPlugin("fp8").convert_modules(make_model(), inference=True, quant=True,
                                                  fp8_data_path=str(measured / "fp8"))


def test_quantize_without_measurements_names_the_missing_file(tmp_path, fresh_fp8_process) -> None:  # noqa: ANN001
    from hpu_nb.core.precision import HPUPrecisionPlugin

    with pytest.raises(FileNotFoundError, match=r"maxabs_quant\.json does not exist. Measure first"):
        HPUPrecisionPlugin("fp8").convert_modules(make_model(), inference=True, quant=True, fp8_data_path=str(tmp_path))


def test_mismatched_model_and_files_are_clear_errors(measured, fresh_fp8_process) -> None:  # noqa: ANN001
    from hpu_nb.core.fp8 import Fp8InferenceError
    from hpu_nb.core.fp8.convert import convert_modules

    fp8_dir = str(measured / "fp8")
    fresh_fp8_process._measured_in_this_process = False
    stats_path = measured / "fp8" / "measure_hooks_maxabs.json"
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
    with pytest.raises(Fp8InferenceError, match="has mode 'MEASURE', but this step needs mode 'QUANTIZE'"):
        os.environ["QUANT_CONFIG"] = str(cfg)
        try:
            convert_modules(make_model(), inference=True, quant=True, fp8_data_path=fp8_dir)
        finally:
            del os.environ["QUANT_CONFIG"]


def test_measuring_into_the_package_is_refused(fresh_fp8_process) -> None:  # noqa: ANN001
    import hpu_nb
    from hpu_nb.core.fp8.convert import convert_modules

    inside = Path(hpu_nb.__file__).parent / "fp8_stats"
    with pytest.raises(ValueError, match="inside the installed hpu_nb package"):
        convert_modules(make_model(), inference=True, quant=False, fp8_data_path=str(inside))
    assert not inside.exists()
    with pytest.raises(ValueError, match="fp8_data_path"):
        convert_modules(make_model(), inference=True, quant=False)


def test_first_generation_refuses_fp8_inference(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    from hpu_nb.core.fp8.convert import convert_modules
    from hpu_nb.core.precision import UnsupportedPrecisionError

    monkeypatch.setenv("HPU_NB_DEVICE", "gaudi")
    with pytest.raises(UnsupportedPrecisionError):
        convert_modules(make_model(), inference=True, quant=False, fp8_data_path=str(tmp_path))


def test_gaudi_measure_and_quantize_go_through_inc(make_fake_gaudi, tmp_path, fresh_fp8_process) -> None:  # noqa: ANN001, F811
    from hpu_nb.core.precision import HPUPrecisionPlugin
    from tests.fake_neural_compressor import install_fake_inc

    make_fake_gaudi()
    with install_fake_inc() as inc:
        plugin = HPUPrecisionPlugin("fp8")
        model = make_model()
        assert plugin.convert_modules(model, inference=True, quant=False, fp8_data_path=str(tmp_path)) is model
        (measure_cfg,) = inc.named("prepare")
        assert measure_cfg["mode"] == "MEASURE" and measure_cfg["dump_stats_path"] == str(tmp_path / "measure")
        assert measure_cfg["observer"] == "maxabs" and measure_cfg["allowlist"]["types"] == ["Linear"]
        plugin.teardown()
        assert inc.named("finalize_calibration") == [model]
        assert json.loads((tmp_path / "maxabs_quant.json").read_text())["mode"] == "QUANTIZE"

        fresh_fp8_process._measured_in_this_process = False  # as in the fresh process
        HPUPrecisionPlugin("fp8").convert_modules(make_model(), inference=True, quant=True, fp8_data_path=str(tmp_path))
        (quant_cfg,) = inc.named("convert")
        assert quant_cfg == {**measure_cfg, "mode": "QUANTIZE"}


from tests.fake_habana.fixture import make_fake_gaudi  # noqa: E402, F401


if __name__ == "__main__":
    if sys.argv[1:2] == ["quantize"]:
        print(json.dumps(quantize_in_this_process(Path(sys.argv[2]))))
