"""The emulated HCCL's gathers and scatters take every tensor layout Habana's HCCL takes (issue 27).

Habana's ProcessGroupHCCL (`_allgather_base`, `_reduce_scatter_base`) checks the dtype and the element count only and
moves flat buffers, so `all_gather_into_tensor` fills a flat output ([world * numel], what accelerate's `gather` sends
for every backend but gloo), a concatenated one ([world * N, ...]) or a stacked one ([world, N, ...]) alike, and
`reduce_scatter_tensor` reads its input in any of those layouts. gloo underneath checks shapes: the emulation hands it
flat views. Run on 2 real ranks over the emulated hccl, with hpu tensors.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORLD = 2

RANK_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    import torch.distributed as dist
    import habana_frameworks.torch.distributed.hccl  # registers "hccl", as on a Gaudi

    rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    WORLD = 2
    dist.init_process_group("hccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    got = {}

    def attempt(name, fn):
        try:
            got[name] = fn()
        except Exception as error:  # recorded: the test names which layout failed and why
            got[name] = {"error": f"{type(error).__name__}: {error}"}

    def gather(shape, out_shape, dtype=torch.float32):
        numel = torch.Size(shape).numel()
        x = (torch.arange(numel).reshape(shape) + 100 * rank).to(dtype).to("hpu")
        output = torch.empty(out_shape, dtype=dtype, device="hpu")
        dist.all_gather_into_tensor(output, x)
        return {"shape": list(output.shape), "values": output.cpu().tolist()}

    for shape in ([3], [3, 2]):
        numel = torch.Size(shape).numel()
        layouts = {"flat": [WORLD * numel], "concatenated": [WORLD * shape[0], *shape[1:]], "stacked": [WORLD, *shape]}
        for layout, out_shape in layouts.items():
            attempt(f"gather {len(shape)}-D {layout}", lambda: gather(shape, out_shape))
    attempt("gather 2-D stacked bf16", lambda: gather([2, 2], [WORLD, 2, 2], torch.bfloat16))
    attempt("gather 2-D flat int64", lambda: gather([2, 3], [WORLD * 6], torch.int64))

    def scatter(in_shape, out_shape):
        x = ((torch.arange(torch.Size(in_shape).numel()) + 1) * (rank + 1)).float().reshape(in_shape).to("hpu")
        output = torch.empty(out_shape, device="hpu")
        dist.reduce_scatter_tensor(output, x)
        return {"shape": list(output.shape), "values": output.cpu().tolist()}

    for shape in ([4], [4, 2]):
        numel = torch.Size(shape).numel()
        layouts = {"flat": [WORLD * numel], "concatenated": [WORLD * shape[0], *shape[1:]], "stacked": [WORLD, *shape]}
        for layout, in_shape in layouts.items():
            attempt(f"scatter {len(shape)}-D {layout}", lambda: scatter(in_shape, shape))

    def refused(fn):
        try:
            fn()
        except RuntimeError as error:
            return str(error)
        return "accepted"

    got["gather wrong size"] = refused(lambda: dist.all_gather_into_tensor(
        torch.empty(5, device="hpu"), torch.ones(3, device="hpu")))
    got["gather wrong dtype"] = refused(lambda: dist.all_gather_into_tensor(
        torch.empty(6, device="hpu"), torch.ones(3, dtype=torch.float64, device="hpu")))
    got["scatter wrong size"] = refused(lambda: dist.reduce_scatter_tensor(
        torch.empty(3, device="hpu"), torch.ones(5, device="hpu")))

    def list_gather_without_options():  # torch 2.7's all_gather passes no options (AllgatherOptions is not exported)
        outputs = [torch.empty(2, 2, device="hpu") for _ in range(WORLD)]
        dist.group.WORLD.allgather([outputs], [torch.full((2, 2), float(rank), device="hpu")]).wait()
        return [o.cpu().tolist() for o in outputs]

    def list_gather_uneven():  # HCCL gathers outputs of different sizes by one broadcast per rank
        outputs = [torch.empty(r + 1, 2, device="hpu") for r in range(WORLD)]
        dist.all_gather(outputs, torch.full((rank + 1, 2), float(rank + 5), device="hpu"))
        return [o.cpu().tolist() for o in outputs]

    attempt("list gather without options", list_gather_without_options)
    attempt("list gather uneven", list_gather_uneven)
    dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(got, f)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("hccl_layouts")
    script = out / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HPU_NB_", "PT_HPU_", "HABANA_", "HLS_")) and k not in ("RANK", "WORLD_SIZE",
                                                                                         "LOCAL_RANK", "MASTER_PORT")}
    env["PYTHONPATH"] = str(ROOT)
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, str(script), str(rank), str(port), str(out / f"rank{rank}.json")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for rank in range(WORLD)]
    try:
        logs = [proc.communicate(timeout=150)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, log[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(WORLD)]


def _rank_values(shape: list[int], rank: int) -> list[float]:
    numel = 1
    for size in shape:
        numel *= size
    return [float(i + 100 * rank) for i in range(numel)]


def _flatten(values: object) -> list[float]:
    if isinstance(values, list):
        return [x for v in values for x in _flatten(v)]
    return [float(values)]  # type: ignore[arg-type]


@pytest.mark.parametrize("shape", [[3], [3, 2]], ids=["1-D", "2-D"])
@pytest.mark.parametrize("layout", ["flat", "concatenated", "stacked"])
def test_all_gather_into_tensor_fills_every_output_layout(ranks, shape, layout):
    numel = len(_rank_values(shape, 0))
    out_shape = {"flat": [WORLD * numel], "concatenated": [WORLD * shape[0], *shape[1:]],
                 "stacked": [WORLD, *shape]}[layout]
    expected = [x for rank in range(WORLD) for x in _rank_values(shape, rank)]  # rank 0's block, then rank 1's
    for got in ranks:
        result = got[f"gather {len(shape)}-D {layout}"]
        assert "error" not in result, result
        assert result["shape"] == out_shape
        assert _flatten(result["values"]) == expected


def test_all_gather_into_tensor_in_other_dtypes(ranks):
    for got in ranks:
        stacked = got["gather 2-D stacked bf16"]
        assert stacked["values"] == [[[0.0, 1.0], [2.0, 3.0]], [[100.0, 101.0], [102.0, 103.0]]]
        flat = got["gather 2-D flat int64"]
        assert flat["values"] == [0, 1, 2, 3, 4, 5, 100, 101, 102, 103, 104, 105]


@pytest.mark.parametrize("shape", [[4], [4, 2]], ids=["1-D", "2-D"])
@pytest.mark.parametrize("layout", ["flat", "concatenated", "stacked"])
def test_reduce_scatter_tensor_reads_every_input_layout(ranks, shape, layout):
    numel = len(_rank_values(shape, 0))
    total = [float((i + 1) * (1 + 2)) for i in range(WORLD * numel)]  # rank r sent (i + 1) * (r + 1): summed
    for rank, got in enumerate(ranks):
        result = got[f"scatter {len(shape)}-D {layout}"]
        assert "error" not in result, result
        assert result["shape"] == shape
        assert _flatten(result["values"]) == total[rank * numel:(rank + 1) * numel]  # this rank's block


def test_sizes_are_checked_with_habanas_messages(ranks):
    for got in ranks:
        assert got["gather wrong size"] == "output tensor size must be equal to world_size times input tensor size"
        assert got["gather wrong dtype"] == "output tensor must have the same type as input tensor"
        assert got["scatter wrong size"] == "input tensor must be the same size as output size times world size"


def test_list_all_gather_without_options_and_with_uneven_sizes(ranks):
    for got in ranks:
        assert got["list gather without options"] == [[[0.0, 0.0], [0.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]]]
        assert got["list gather uneven"] == [[[5.0, 5.0]], [[6.0, 6.0], [6.0, 6.0]]]
