"""Habana's GPU Migration Toolkit on the emulated Gaudi: CUDA-written code runs on `hpu` after one import.

What is modelled, from the toolkit's behaviour (habana_frameworks/torch/gpu_migration/): torch.cuda answered by
torch.hpu, `device="cuda"` / `.to("cuda")` / `.cuda()` landing on hpu, `torch.autocast("cuda")` running Habana's bf16
autocast, torch.cuda.amp.GradScaler disabled, NCCL run as HCCL, the refusals (DataParallel, the allocator calls), the
log GPU_MIGRATION_LOG_LEVEL asks for, and PT_HPU_GPU_MIGRATION read where the bridge reads it. The toolkit changes its
process for good, so every test that turns it on runs a script in a fresh interpreter; the fast test reads the log
and device-argument helpers as files, without importing (and so turning on) the package.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hpu_nb/emulator/habana/habana_frameworks/torch/gpu_migration"

# What a small CUDA-written training script does (nothing in it names hpu or Habana but the first line).
TRAIN_SCRIPT = '''\
import json

import habana_frameworks.torch.gpu_migration  # noqa: F401  (the one line Habana's guide adds)
import torch
import torch.nn as nn

torch.manual_seed(0)
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.deterministic = False
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
head = nn.Linear(1, 1).cuda()
optimizer = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=1e-2)
scaler = torch.cuda.amp.GradScaler()
x = torch.randn(256, 16, device=device)
w = torch.randn(16, 1).to(torch.device("cuda"))
y = x @ w
torch.cuda.reset_peak_memory_stats()
losses, dtypes = [], set()
for step in range(60):
    optimizer.zero_grad()
    amp = torch.cuda.amp.autocast(dtype=torch.float16) if step % 2 else torch.autocast("cuda", dtype=torch.bfloat16)
    with amp:
        out = head(model(x))
        dtypes.add(str(out.dtype))
        loss = nn.functional.mse_loss(out.float(), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    losses.append(loss.item())
torch.cuda.synchronize()
print(json.dumps({
    "device": device, "count": torch.cuda.device_count(), "current": torch.cuda.current_device(),
    "name": torch.cuda.get_device_name(0),
    "params": sorted({str(p.device) for p in [*model.parameters(), *head.parameters()]}),
    "grads": sorted({str(p.grad.device) for p in model.parameters()}),
    "data": [str(x.device), str(w.device), str(y.device)], "is_cuda": x.is_cuda,
    "dtypes": sorted(dtypes), "first": losses[0], "last": losses[-1], "scaler_enabled": scaler.is_enabled(),
    "max_allocated": torch.cuda.max_memory_allocated(), "allocated": torch.cuda.memory_allocated(),
    "hpu_max": torch.hpu.max_memory_allocated(), "hpu_allocated": torch.hpu.memory_allocated(),
}))
'''

RECORD = re.compile(
    r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] (?P<file>\S+):(?P<line>\d+)\n"
    r"    \[context\]: (?P<context>.*)\n"
    r"    \[(?P<type>hpu_match|hpu_modified|hpu_mismatch)\]: (?P<call>.*) --> (?P<new>.*)\n\n")

# torch's own objects, as a process that never asked for the toolkit has them.
UNTOUCHED = '''
import json, sys
import torch, torch.distributed as dist
report = {
    "cuda": [getattr(torch.cuda, name).__module__ for name in
             ("is_available", "device_count", "current_device", "set_device", "synchronize", "max_memory_allocated",
              "manual_seed_all", "empty_cache")],
    "grad_scaler": torch.cuda.amp.GradScaler.__module__,
    "to": torch.Tensor.to is torch._C.TensorBase.to, "cuda_method": torch.Tensor.cuda is torch._C.TensorBase.cuda,
    "is_cuda": torch.Tensor.is_cuda is torch._C.TensorBase.is_cuda,
    "randn": type(torch.randn).__name__, "autocast": torch.autocast.__init__.__module__,
    "init_process_group": dist.init_process_group.__module__, "data_parallel": torch.nn.DataParallel.__module__,
    "compile": torch.compile.__module__, "cuda_version": torch.version.cuda, "jit": torch.jit._state._enabled.enabled,
    "migration_loaded": "habana_frameworks.torch.gpu_migration" in sys.modules,
    "cuda_available": torch.cuda.is_available(), "cuda_count": torch.cuda.device_count(),
    "hpu": str(torch.ones(2, device="hpu").device),
}
print(json.dumps(report))
'''


def _run(code: str, cwd: Path, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter of this environment, in `cwd`, with no migration variable but those given."""
    base = {key: value for key, value in os.environ.items()
            if not key.startswith(("PT_HPU_GPU_MIGRATION", "GPU_MIGRATION", "HABANA_LOGS"))}
    script = cwd / "script.py"
    script.write_text(code)
    result = subprocess.run([sys.executable, str(script)], cwd=cwd, env={**base, **(env or {})}, capture_output=True,
                            text=True, timeout=240, check=False)
    if check:
        assert result.returncode == 0, result.stderr[-4000:]
    return result


def _report(result: subprocess.CompletedProcess) -> dict:
    return json.loads(result.stdout.strip().splitlines()[-1])


def _logs(base: Path) -> list[Path]:
    return sorted(base.glob("gpu_migration_logs/*/*/gpu_migration_*.log"))


@pytest.mark.torch_builds  # the CUDA builds too: there torch itself asks CUDA when is_available() says yes
@pytest.mark.timeout(300)
def test_a_cuda_written_script_trains_on_hpu_after_the_one_import(tmp_path: Path) -> None:
    logs = tmp_path / "habana_logs"
    result = _run(TRAIN_SCRIPT, tmp_path, {"GPU_MIGRATION_LOG_LEVEL": "3", "HABANA_LOGS": str(logs)})
    report = _report(result)
    # The script's own choice: torch.cuda.is_available() said yes, so it kept "cuda" ...
    assert report["device"] == "cuda"
    # ... and everything it put on "cuda" (.to(device), .cuda(), device=, .to(torch.device("cuda"))) is on the card.
    assert report["params"] == ["hpu:0"] and report["grads"] == ["hpu:0"]
    assert report["data"] == ["hpu:0"] * 3 and report["is_cuda"] is True
    # torch.cuda answers for the emulated Gaudi: its cards, its name, its memory counters (the device's own).
    assert (report["count"], report["current"], report["name"]) == (8, 0, "GAUDI2")
    assert report["max_allocated"] == report["hpu_max"] > report["allocated"] == report["hpu_allocated"] > 0
    # Both autocast spellings run Habana's bf16 autocast (fp16 asked for becomes bf16); the scaler is disabled.
    assert report["dtypes"] == ["torch.bfloat16"] and report["scaler_enabled"] is False
    assert report["last"] < report["first"] / 10
    # As Habana's toolkit, at import where NVIDIA's apex is absent (its apex stand-ins are not modelled here).
    assert "apex not installed, gpu_migration will not swap api for this package." in result.stderr

    # The log: where Habana's toolkit writes it, said on stdout, one record per migrated call at the user's line.
    [log] = _logs(logs)
    pid = log.name.removeprefix("gpu_migration_").removesuffix(".log")
    assert pid.isdigit() and f"gpu migration log will be saved to {log}" in result.stdout
    text = log.read_text()
    records = [match.groupdict() for match in RECORD.finditer(text)]
    assert "".join(match.group(0) for match in RECORD.finditer(text)) == text  # nothing but records
    script = str(tmp_path / "script.py")
    assert {record["file"] for record in records} == {script}  # level 3: torch's own calls are left out
    first = records[0]
    assert first == {"file": script, "line": "10", "context": 'device = "cuda" if torch.cuda.is_available() else "cpu"',
                     "type": "hpu_match", "call": "torch.cuda.is_available()", "new": "torch.hpu.is_available()"}
    calls = {(record["type"], record["call"].split("(")[0]) for record in records}
    assert {("hpu_match", "torch.cuda.amp.GradScaler.__init__"), ("hpu_match", "torch.randn"),
            ("hpu_match", "torch.Tensor.to"), ("hpu_match", "torch.autocast.__init__"),
            ("hpu_match", "torch.cuda.synchronize"), ("hpu_match", "torch.cuda.max_memory_allocated"),
            ("hpu_modified", "torch.cuda.device_count")} <= calls
    # A call made 60 times from one line is written once.
    assert sum(record["call"].startswith("torch.autocast.__init__") for record in records) == 1


@pytest.mark.torch_builds  # the CUDA builds too: there torch itself asks CUDA when is_available() says yes
@pytest.mark.timeout(300)
def test_nccl_typed_tensors_compile_and_what_habana_refuses(tmp_path: Path) -> None:
    code = textwrap.dedent('''
        import json, os, warnings
        import habana_frameworks.torch.gpu_migration  # noqa: F401
        import torch
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29531")
        dist.init_process_group("nccl", rank=0, world_size=1)
        t = torch.ones(4, device="cuda") * 3
        dist.all_reduce(t)
        dist.barrier(device_ids=[0])
        report = {"backend": dist.get_backend(), "sum": t.tolist(), "device": str(t.device),
                  "nccl_available": dist.is_nccl_available()}
        dist.destroy_process_group()
        try:
            torch.nn.DataParallel(torch.nn.Linear(2, 2))
        except NotImplementedError as error:
            report["data_parallel"] = str(error)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.empty_cache()
            report["pinned"] = str(torch.zeros(2, pin_memory=True).device)
            report["scaler_state"] = torch.cuda.amp.GradScaler().state_dict()
        report["warnings"] = sorted({str(w.message) for w in caught if w.category is UserWarning})
        report["capability"] = torch.cuda.get_device_capability()
        properties = torch.cuda.get_device_properties(0)
        report["properties"] = [properties.name, properties.total_memory == torch.hpu.memory_stats()["Limit"],
                                torch.cuda.get_device_name(3)]  # a rank's own GPU: Habana's name ignores the index
        torch.cuda.manual_seed(1); a = torch.randn(3, device="cuda")
        torch.cuda.manual_seed(1); b = torch.randn(3, device="cuda")
        report["seeded"] = torch.equal(a.cpu(), b.cpu())
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(); end.record(); torch.cuda.synchronize()
        report["elapsed"] = start.elapsed_time(end) >= 0
        torch.cuda.nvtx.range_push("step"); torch.cuda.nvtx.range_pop()
        typed = torch.cuda.FloatTensor([1.0, 2.0])
        report["typed"] = [str(typed.device), str(typed.dtype), typed.type(),
                           str(torch.ones(2).type("torch.cuda.LongTensor").dtype)]
        report["cuda_version"] = torch.version.cuda
        report["jit_off"] = torch.jit.script(len) is len
        compiled = torch.compile(torch.nn.Linear(2, 1).cuda())  # inductor, the default, is hpu_backend here
        report["compiled"] = str(compiled(torch.ones(1, 2, device="cuda")).device)
        print(json.dumps(report))
    ''')
    result = _run(code, tmp_path, {"GPU_MIGRATION_LOG_LEVEL": "1"})
    report = _report(result)
    # init_process_group("nccl") ran HCCL (the emulated one, over gloo); CUDA code asking the backend hears "nccl".
    assert (report["backend"], report["sum"], report["device"]) == ("nccl", [3.0] * 4, "hpu:0")
    assert report["nccl_available"] is True
    assert report["data_parallel"] == ("DataParallel is currently not supported on HPU. Please use"
                                       " torch.nn.DistributedDataParallel instead.")
    assert report["pinned"] == "cpu"
    assert report["scaler_state"] == {"scale": 1.0, "growth_factor": None, "backoff_factor": None,
                                      "growth_interval": None, "_growth_tracker": 0}
    assert report["warnings"] == [
        "GradScaler is not applicable to HPU. If this instance if disabled, the states of the scaler are values in"
        " disable mode.",
        "No need to call empty_cache on HPU. It manages the memory internally in an efficient way.",
        "habana allocator doesn't support pinned memory",
    ]
    assert report["capability"] == [9, 0] and report["properties"] == ["GAUDI2", True, "GAUDI2"]
    assert report["seeded"] and report["elapsed"]
    assert report["typed"] == ["hpu:0", "torch.float32", "torch.cuda.FloatTensor", "torch.int64"]
    # As Habana's: torch.version.cuda names a CUDA (on a build without one), TorchScript is off, torch.compile's
    # default backend is hpu_backend.
    assert report["cuda_version"] == (torch.version.cuda or "11.8") and report["jit_off"] is True
    assert report["compiled"] == "hpu:0"
    # Level 1 echoes every record on stdout and records torch's own calls too (Module.cuda calling Tensor.cuda).
    [log] = _logs(tmp_path)
    text = log.read_text()
    records = [match.groupdict() for match in RECORD.finditer(text)]
    assert ("hpu_match", "torch.distributed.init_process_group(backend=nccl, rank=0, world_size=1, )",
            "change backend to hccl") in {(r["type"], r["call"], r["new"]) for r in records}
    assert ("hpu_mismatch", "torch.nn.DataParallel.__init__()") in {(r["type"], r["call"]) for r in records}
    assert ("hpu_match", "torch.compile(backend=inductor, )", "backend=hpu_backend") in {
        (r["type"], r["call"], r["new"]) for r in records}
    inside_torch = [r for r in records if r["file"].startswith(str(Path(torch.__file__).parent))]
    assert any(r["call"].startswith("torch.Tensor.cuda(") for r in inside_torch)
    assert "[hpu_mismatch]: torch.cuda.empty_cache() --> Dummy" in result.stdout


@pytest.mark.timeout(300)
def test_nvml_queries_allocator_calls_and_cuda_memory_stat_names_answer_the_gaudi_way(tmp_path: Path) -> None:
    """Issue 35: utilization / temperature / power_draw / clock_rate sent the user to nvidia-ml-py; nccl.version,
    set_sync_debug_mode, can_device_access_peer, get_allocator_backend and memory._record_memory_history were
    AttributeErrors on torch._C._cuda_*; memory_stats() had no "allocated_bytes.all.current"."""
    code = textwrap.dedent('''
        import json, os, warnings
        import habana_frameworks.torch.gpu_migration  # noqa: F401
        import torch

        report = {}
        for name in ("utilization", "temperature", "power_draw", "clock_rate"):
            try:
                report[name] = getattr(torch.cuda, name)()
            except Exception as error:
                report[name] = [type(error).__name__, str(error)]
        report["nccl"] = torch.cuda.nccl.version()
        torch.cuda.set_sync_debug_mode("warn")
        report["sync"] = [torch.cuda.get_sync_debug_mode(), os.environ["PT_ENABLE_HABANA_STREAMASYNC"]]
        report["peer"] = [torch.cuda.can_device_access_peer(0, 1), torch.cuda.can_device_access_peer("cuda:2", 7)]
        try:
            torch.cuda.can_device_access_peer(0, 0)
        except AssertionError as error:
            report["peer_same"] = str(error)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report["backend"] = torch.cuda.get_allocator_backend()
            torch.cuda.memory._record_memory_history(max_entries=1000)
            torch.cuda.memory._dump_snapshot("snapshot.pickle")
        report["warnings"] = [str(w.message) for w in caught]
        report["snapshot_written"] = os.path.exists("snapshot.pickle")
        before = torch.cuda.memory_stats()["allocated_bytes.all.current"]
        x = torch.ones(1000, device="cuda")
        stats = torch.cuda.memory_stats()
        report["allocated"] = [stats["allocated_bytes.all.current"] - before, torch.cuda.memory_allocated() - before,
                               stats["allocated_bytes.all.peak"] == stats["MaxInUse"],
                               stats["reserved_bytes.all.current"] == torch.cuda.memory_reserved()]
        report["memory_usage"] = torch.cuda.memory_usage() == torch.hpu.memory_stats()["InUse"]
        print(json.dumps(report))
    ''')
    result = _run(code, tmp_path)
    report = _report(result)
    assert "nvidia-ml-py" not in result.stdout + result.stderr and "pynvml" not in result.stdout + result.stderr
    # utilization: the Habana answer (torch.hpu.utilization, hl-smi's library), which the emulated card cannot give.
    kind, message = report["utilization"]
    assert kind == "ModuleNotFoundError" and "torch.hpu.utilization()" in message and "pyhlml" in message
    assert "emulated Gaudi has no hl-smi" in message
    # No Gaudi equivalent: said plainly.
    for name in ("temperature", "power_draw", "clock_rate"):
        kind, message = report[name]
        assert kind == "NotImplementedError" and message.startswith(f"torch.cuda.{name}() has no Gaudi equivalent")
    assert report["nccl"] == [2, 16, 5]  # Habana's toolkit's fixed answer
    assert report["sync"] == [1, "1"]  # kept where Habana's torch.hpu.set_sync_debug_mode keeps it
    assert report["peer"] == [True, True] and report["peer_same"] == "Both the ids are same."
    assert report["backend"] is None and report["snapshot_written"] is False
    assert [w.split(" is not supported on HPU")[0] for w in report["warnings"]] == [
        "get_allocator_backend", "_record_memory_history", "_dump_snapshot"]
    # 1000 float32 on the card: 4000 bytes more in use, by CUDA's name and by memory_allocated alike.
    assert report["allocated"] == [4000, 4000, True, True] and report["memory_usage"] is True


@pytest.mark.timeout(300)
@pytest.mark.parametrize("value", ["1", "TRUE"])
def test_pt_hpu_gpu_migration_turns_it_on_where_the_bridge_reads_it(tmp_path: Path, value: str) -> None:
    # The bridge reads the variable when habana_frameworks.torch is imported (its __init__), as Habana's tutorials do.
    code = ("import json, habana_frameworks.torch.core, torch\n"
            'print(json.dumps(str(torch.randn(2, device="cuda").device)))\n')
    assert _report(_run(code, tmp_path, {"PT_HPU_GPU_MIGRATION": value})) == "hpu:0"
    assert not _logs(tmp_path)  # no GPU_MIGRATION_LOG_LEVEL: no log


@pytest.mark.timeout(300)
def test_pt_hpu_gpu_migration_with_a_plain_import_torch(tmp_path: Path) -> None:
    # On a Gaudi (1.18+) torch's autoload imports habana_frameworks.torch, and with it the toolkit: so does hpu_nb's.
    code = 'import json, torch\nprint(json.dumps(str(torch.randn(2, device="cuda").device)))\n'
    assert _report(_run(code, tmp_path, {"PT_HPU_GPU_MIGRATION": "1"})) == "hpu:0"


@pytest.mark.torch_builds  # on a CUDA build with a GPU, torch.cuda must stay the GPU's
@pytest.mark.timeout(300)
@pytest.mark.parametrize("value", [None, "0", "false", ""])
def test_a_process_that_does_not_ask_keeps_torch_cuda_as_torch_made_it(tmp_path: Path, value: str | None) -> None:
    """Even with Habana's package imported and the card used. On a CUDA build with a GPU, torch.cuda still answers
    for the GPU (the values this test's own process sees)."""
    env = {} if value is None else {"PT_HPU_GPU_MIGRATION": value}
    report = _report(_run("import habana_frameworks.torch.core, hpu_nb\n" + UNTOUCHED, tmp_path, env))
    assert set(report["cuda"]) <= {"torch.cuda", "torch.cuda.memory", "torch.cuda.random"}
    assert report["grad_scaler"].startswith("torch.")
    assert report["to"] and report["cuda_method"] and report["is_cuda"]
    assert report["randn"] == "builtin_function_or_method"
    assert report["autocast"].startswith("torch.") and report["init_process_group"].startswith("torch.")
    assert report["data_parallel"].startswith("torch.") and report["migration_loaded"] is False
    assert report["compile"] == "torch" and report["cuda_version"] == torch.version.cuda and report["jit"] is True
    assert (report["cuda_available"], report["cuda_count"]) == (torch.cuda.is_available(), torch.cuda.device_count())
    assert report["hpu"] == "hpu:0"


@pytest.mark.timeout(300)
def test_a_value_the_bridge_cannot_read_stops_the_import(tmp_path: Path) -> None:
    result = _run("import habana_frameworks.torch.core\n", tmp_path, {"PT_HPU_GPU_MIGRATION": "yes"}, check=False)
    assert result.returncode != 0
    assert 'Environment variable "PT_HPU_GPU_MIGRATION"="yes" couldn\'t be converted properly' in result.stderr


def _load(name: str) -> ModuleType:
    """One of the package's helper modules, read as a file: importing the package would turn the toolkit on here."""
    spec = importlib.util.spec_from_file_location(f"gpu_migration_{name}", PACKAGE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_device_arguments_and_log_levels_as_the_toolkit_reads_them(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    devices = _load("_devices")
    assert [devices.to_hpu(d) for d in ("cuda", "cuda:0", torch.device("cuda", 1), 0, "2", None, "cpu", "hpu")] == [
        "hpu", "hpu:0", "hpu:1", "hpu:0", "hpu:2", None, "cpu", "hpu"]
    assert [devices.migrates(d) for d in ("cuda:1", torch.device("cuda"), 1, True, "cpu", torch.device("hpu"))] == [
        True, True, True, False, False, False]
    log_module = _load("_log")
    assert log_module.format_args({"device": 0, "enabled": True}) == "device=0, enabled=True, "

    off = log_module.MigrationLog()
    off.configure({})
    off.record("hpu_match", "torch.cuda.is_available", None, "torch.hpu.is_available()")
    assert off.path is None and not (tmp_path / "gpu_migration_logs").exists()

    # Any value opens the file; only 1, 2 and 3 write records (here "0": an empty log, as Habana's).
    quiet = log_module.MigrationLog()
    quiet.configure({"GPU_MIGRATION_LOG_LEVEL": "0", "HABANA_LOGS": str(tmp_path)})
    quiet.record("hpu_match", "torch.cuda.is_available", None, "torch.hpu.is_available()")
    assert quiet.path is not None and quiet.path.parent.parent.parent == tmp_path / "gpu_migration_logs"
    assert quiet.path.read_text() == ""

    loud = log_module.MigrationLog()
    loud.configure({"GPU_MIGRATION_LOG_LEVEL": "2", "HABANA_LOGS": str(tmp_path / "two")})
    for _ in range(3):
        loud.record("hpu_modified", "torch.cuda.device_count", None, "count")  # this line: written once
    assert [m.group("call") for m in RECORD.finditer(loud.path.read_text())] == ["torch.cuda.device_count()"]
    assert "[hpu_modified]" not in capsys.readouterr().out  # level 2 does not echo


@pytest.mark.timeout(300)
def test_torch_amp_grad_scaler_for_cuda_is_disabled_and_lightning_auto_is_one_hpu(tmp_path: Path) -> None:
    """torch.amp.GradScaler("cuda") (torch's spelling since 2.3; torch.cuda.amp.GradScaler is its alias) is disabled
    as the toolkit disables the scaler, so CUDA's fp16 recipe steps on the card; Lightning's accelerator="auto" is the
    HPU with HPUAccelerator's devices="auto" (one emulated card), not CUDAAccelerator over torch.cuda.device_count()."""
    code = textwrap.dedent('''
        import json, warnings
        import habana_frameworks.torch.gpu_migration  # noqa: F401
        import torch
        import lightning as L

        def train(make_scaler):
            torch.manual_seed(0)
            model = torch.nn.Linear(8, 1).to("cuda")
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            x, y = torch.randn(32, 8, device="cuda"), torch.randn(32, 1, device="cuda")
            scaler = make_scaler()
            for _ in range(3):
                optimizer.zero_grad()
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = torch.nn.functional.mse_loss(model(x).float(), y)
                if scaler is None:
                    loss.backward()
                    optimizer.step()
                else:
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()
            return scaler, model.weight.detach().cpu()

        _, plain = train(lambda: None)
        scaler, scaled = train(lambda: torch.amp.GradScaler("cuda"))
        default, _ = train(lambda: torch.amp.GradScaler())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            state = scaler.state_dict()
        report = {"enabled": [scaler.is_enabled(), default.is_enabled(), torch.amp.GradScaler("hpu").is_enabled(),
                              torch.amp.GradScaler("cuda", enabled=False).is_enabled()],
                  "same_weights": torch.equal(plain, scaled), "state": state,
                  "warned": any("GradScaler is not applicable to HPU" in str(w.message) for w in caught)}
        trainer = L.Trainer(accelerator="auto", devices="auto", logger=False, enable_checkpointing=False)
        fabric = L.Fabric(accelerator="auto", devices="auto")
        report["trainer"] = [type(trainer.accelerator).__name__, trainer.num_devices, str(trainer.strategy.root_device)]
        report["fabric"] = [type(fabric.accelerator).__name__, str(fabric.device)]
        report["cuda_count"] = torch.cuda.device_count()
        print(json.dumps(report))
    ''')
    logs = tmp_path / "habana_logs"
    result = _run(code, tmp_path, {"GPU_MIGRATION_LOG_LEVEL": "3", "HABANA_LOGS": str(logs)})
    report = _report(result)
    # Disabled where it scales CUDA's gradients (the default device is cuda); a scaler for hpu is torch's own.
    assert report["enabled"] == [False, False, True, False]
    # Disabled means scale() returns the loss and step() is the optimizer's: the same weights as no scaler at all.
    assert report["same_weights"] is True
    assert report["state"] == {"scale": 1.0, "growth_factor": None, "backoff_factor": None, "growth_interval": None,
                               "_growth_tracker": 0} and report["warned"] is True
    # torch.cuda reports the emulated machine's cards; Lightning's auto trains on HPUAccelerator's auto count (one).
    assert report["cuda_count"] == 8
    assert report["trainer"] == ["HPUAccelerator", 1, "hpu:0"] and report["fabric"] == ["HPUAccelerator", "hpu:0"]
    [log] = _logs(logs)
    records = {(m.group("type"), m.group("call")) for m in RECORD.finditer(log.read_text())}
    assert ("hpu_match", "torch.amp.GradScaler.__init__(device=cuda, init_scale=65536.0, growth_factor=2.0,"
            " backoff_factor=0.5, growth_interval=2000, enabled=True, )") in records


def test_lightning_auto_means_hpu_where_the_migration_toolkit_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process: the rule reads only whether the toolkit module is loaded (a stand-in here: importing the real one
    would migrate this test process for good)."""
    import lightning as L

    from hpu_nb.core import registration

    registration.register_all()
    before = L.Trainer(accelerator="auto", devices="auto", logger=False, enable_checkpointing=False)
    monkeypatch.setitem(sys.modules, registration.GPU_MIGRATION_MODULE, ModuleType(registration.GPU_MIGRATION_MODULE))
    after = L.Trainer(accelerator="auto", devices="auto", logger=False, enable_checkpointing=False)
    assert type(before.accelerator).__name__ != "HPUAccelerator"
    assert (type(after.accelerator).__name__, after.num_devices, after.strategy.root_device.type) == (
        "HPUAccelerator", 1, "hpu")


@pytest.mark.timeout(300)
def test_log_lines_are_those_habana_ships_in_model_references(tmp_path: Path) -> None:
    """The records as the toolkit writes them in the logs Habana ships with Model-References' GPU-migration examples
    (gpu_migration_logs/*.log): the GradScaler is an hpu_match "set enabled to Flase" (the toolkit's spelling), a
    typed tensor is `torch.cuda.__new__`, Tensor.type records its `kwargs={}`, and DistributedDataParallel's
    device_ids / output_device are set to None, as the ranks' logs show."""
    code = textwrap.dedent('''
        import json, os
        import habana_frameworks.torch.gpu_migration  # noqa: F401
        import torch
        import torch.distributed as dist

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
        dist.init_process_group("nccl", rank=0, world_size=1)
        scaler = torch.cuda.amp.GradScaler()
        typed = torch.cuda.FloatTensor([1.5])
        name = torch.ones(2, device="cuda").type()
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2).cuda(), device_ids=[0])
        model(torch.ones(1, 2, device="cuda")).sum().backward()
        print(json.dumps({"ids": model.device_ids, "output": model.output_device, "name": name,
                          "grad": str(model.module.weight.grad.device), "scaler": scaler.is_enabled()}))
        dist.destroy_process_group()
    ''')
    result = _run(code, tmp_path, {"GPU_MIGRATION_LOG_LEVEL": "3", "HABANA_LOGS": str(tmp_path / "logs")})
    report = _report(result)
    assert (report["ids"], report["output"], report["grad"], report["scaler"]) == (None, None, "hpu:0", False)
    assert report["name"] == "torch.cuda.FloatTensor"
    [log] = _logs(tmp_path / "logs")
    records = {(m.group("type"), m.group("call"), m.group("new")) for m in RECORD.finditer(log.read_text())}
    assert ("hpu_match", "torch.cuda.amp.GradScaler.__init__(init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5,"
            " growth_interval=2000, enabled=True, )", "set enabled to Flase") in records
    assert ("hpu_modified", "torch.cuda.__new__(args=([1.5],), kwargs={}, )",
            "torch.FloatTensor(args=([1.5],), kwargs={}).to(hpu)") in records
    assert ("hpu_match", "torch.Tensor.type(dtype=None, non_blocking=False, kwargs={}, )",
            "change output value from torch.hpu.FloatTensor to torch.cuda.FloatTensor") in records
    [ddp] = [r for r in records if r[1].startswith("torch.nn.parallel.DistributedDataParallel.__init__(")]
    assert ddp[0] == "hpu_match" and ddp[2] == "change device_ids and output_device to None"
    # every argument of this torch's DistributedDataParallel, as bound (Habana's torch 2.0 log has fewer)
    assert ddp[1].startswith("torch.nn.parallel.DistributedDataParallel.__init__(module=module, device_ids=[0],"
                             " output_device=None, dim=0, broadcast_buffers=")
    assert "process_group=None, " in ddp[1] and "find_unused_parameters=False, " in ddp[1]
