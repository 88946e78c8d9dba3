"""habana_frameworks.torch.core.quantizer, emulated: Habana's quantizer for PT2E quantization.

`habana_quantizer()` (a PT2E `Quantizer`: `.set_global(config)`, `.annotate(graph_module)`) annotates an exported
graph for per-tensor symmetric quantization by Habana's rule: the source partitions (the module or function each node
came from, as torch records it) of nn.Linear / F.linear, torch.matmul, nn.Conv2d and nn.MaxPool2d. Measured on torch
2.13 with torch.export's default (non-strict) capture: the calls of Linear, Conv2d and MaxPool2d modules are recorded,
function calls (torch.matmul, `@`, F.linear) are not, so those stay float, on a Gaudi too; conv / pool are the one-node
aten.conv2d / aten.max_pool2d of today's export IR (taken too: Habana's 1.19 code expects torch 2.5's
aten.convolution / max_pool2d_with_indices). `habana_quant_config_symmetric(dtype)` gives its configuration:
activations and weights observed by `core.observer.AbsMaxObserver` (eps 2**-12, backoff margin 2 for activations and
1 for weights), ranges from `QUANTIZER_MIN_MAX` (int8 -128..127; fp8 -240..240, Gaudi's float8 range), bias left in
float. Names, arguments and
annotations are Habana's (gaudi-pytorch-bridge 1.19); torch's `prepare_pt2e` / `convert_pt2e` then run on the
emulated `hpu` as on the CPU.

PT2E quantization lives in torch (`torch.ao.quantization.quantizer`) up to the torch that moved it to torchao, then in
torchao (`torchao.quantization.pt2e`); the quantizer is built on whichever is installed. Where neither is, this module
still imports (its constants and the observers stay usable) and `habana_quantizer` / `habana_quant_config_symmetric`
raise an ImportError that names what to install.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

import torch
from habana_frameworks.torch.core import observer as _observer

from hpu_nb.runtime.generations import GENERATIONS

__emulated__ = True

logger = logging.getLogger("habana_frameworks.torch.core.quantizer")  # Habana's: "PT_COMPILE"

# The bridge's table: both fp8 formats clamp to Gaudi2's e4m3 range (240), as its quantizer.py has it.
_FP8_RANGE = int(GENERATIONS["gaudi2"].fp8_max("E4M3"))
QUANTIZER_MIN_MAX = {torch.int8: (-128, 127), torch.float8_e4m3fn: (-_FP8_RANGE, _FP8_RANGE),
                     torch.float8_e5m2: (-_FP8_RANGE, _FP8_RANGE)}
extra_args_act: dict[str, Any] = {"for_observer": {"eps": 2**-12, "backoff_margin": 2}}
extra_args_weight: dict[str, Any] = {"for_observer": {"eps": 2**-12, "backoff_margin": 1}}

_LAZY = ("habana_quantizer", "habana_quant_config_symmetric")
_built: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        if not _built:
            _built.update(_build())
        return _built[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _api() -> Any:
    api = _observer.pt2e_api()
    if api is None:
        raise ImportError(
            "habana_frameworks.torch.core.quantizer needs PT2E quantization, which this torch "
            f"({torch.__version__}) no longer ships (torch.ao.quantization.quantizer moved to torchao): "
            "pip install torchao, or use a torch that still has it."
        )
    quantizer = importlib.import_module(api[0])
    if api[0].startswith("torch."):  # torch's layout: the helpers in two submodules
        utils = importlib.import_module(api[0] + ".xnnpack_quantizer_utils")
        inductor = importlib.import_module(api[0] + ".x86_inductor_quantizer")
        return quantizer, utils, inductor, utils._annotate_input_qspec_map, utils._annotate_output_qspec
    return quantizer, quantizer, quantizer, quantizer.annotate_input_qspec_map, quantizer.annotate_output_qspec


def _build() -> dict[str, Any]:
    quantizer_mod, utils, configs, annotate_input, annotate_output = _api()
    placeholder = importlib.import_module(_observer.pt2e_api()[1]).PlaceholderObserver  # type: ignore[index]
    QuantizationAnnotation = quantizer_mod.QuantizationAnnotation
    QuantizationSpec = quantizer_mod.QuantizationSpec
    SharedQuantizationSpec = quantizer_mod.SharedQuantizationSpec
    QuantizationConfig = configs.QuantizationConfig
    from torch.fx.passes.utils.source_matcher_utils import get_source_partitions  # noqa: PLC0415 -- with PT2E only
    get_input_act_qspec, get_output_act_qspec = utils.get_input_act_qspec, utils.get_output_act_qspec
    get_weight_qspec, get_bias_qspec = utils.get_weight_qspec, utils.get_bias_qspec
    aten = torch.ops.aten
    conv_ops = (aten.convolution.default, aten.conv2d.default)  # torch <= 2.5's export IR / today's training IR
    pool_ops = (aten.max_pool2d_with_indices.default, aten.max_pool2d.default)

    def partitions(gm: torch.fx.GraphModule, sources: list[Any]) -> list[Any]:
        """The graph's source partitions of these modules / functions (torch records where each node came from)."""
        return [p for group in get_source_partitions(gm.graph, sources).values() for p in group]

    def mark_annotated(nodes: list[torch.fx.Node]) -> None:
        for node in nodes:
            node.meta.setdefault("quantization_annotation", QuantizationAnnotation())
            node.meta["quantization_annotation"]._annotated = True

    def is_annotated(nodes: list[torch.fx.Node]) -> bool:
        return any("quantization_annotation" in n.meta and n.meta["quantization_annotation"]._annotated for n in nodes)

    def annotate_operand(partition: Any, operand: torch.fx.Node, qspec: Any) -> None:
        """The spec of `operand` where the partition's first node reading it takes it in."""
        user = next((n for n in partition.nodes if n in operand.users), None)
        if user is None:
            raise ValueError("Could not find a user within source partition.")
        annotate_input(user, operand, qspec)

    class habana_quantizer(quantizer_mod.Quantizer):
        """Habana's PT2E quantizer: set a global QuantizationConfig, then annotate an exported graph.

        As Habana's, it finds what to quantize by source partition (the module or function each node came from):
        nn.Linear / F.linear, torch.matmul, nn.Conv2d / F.conv2d, nn.MaxPool2d / F.max_pool2d. A matmul written
        `x @ y`, or one torch's export does not record as torch.matmul (non-strict export, torch's default, records
        the module calls but not torch.matmul), is left in float, on a Gaudi as here."""

        def __init__(self) -> None:
            super().__init__()
            self.global_config: Any = None
            self.operator_type_config: dict[str, Any] = {}

        def set_global(self, quantization_config: Any) -> habana_quantizer:
            self.global_config = quantization_config
            return self

        def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
            self.annotate_symmetric_config(model, self.global_config)
            return model

        def annotate_symmetric_config(self, model: torch.fx.GraphModule, config: Any) -> torch.fx.GraphModule:
            self._annotate_linear(model, config)
            self._annotate_matmul(model, config)
            self._annotate_conv2d(model, config)
            self._annotate_maxpool2d(model, config)
            return model  # softmax: Habana has the annotator but leaves it off

        def _annotate_conv2d(self, gm: torch.fx.GraphModule, config: Any) -> None:
            for partition in partitions(gm, [torch.nn.Conv2d, torch.nn.functional.conv2d]):
                if len(partition.output_nodes) > 1:
                    raise ValueError("conv partition has more than one output node")
                conv = partition.output_nodes[0]
                if conv.op != "call_function" or conv.target not in conv_ops:
                    raise ValueError(f"{conv} is not an aten conv2d operator")
                if is_annotated([conv]):
                    continue
                qspecs = {conv.args[0]: get_input_act_qspec(config), conv.args[1]: get_weight_qspec(config)}
                if len(conv.args) > 2 and isinstance(conv.args[2], torch.fx.Node):
                    qspecs[conv.args[2]] = get_bias_qspec(config)
                conv.meta["quantization_annotation"] = QuantizationAnnotation(
                    input_qspec_map=qspecs, output_qspec=get_output_act_qspec(config), _annotated=True)

        def _annotate_linear(self, gm: torch.fx.GraphModule, config: Any) -> None:
            for partition in partitions(gm, [torch.nn.Linear, torch.nn.functional.linear]):
                weight = bias = None
                for param in partition.params:  # the module's parameters: the weight is 2-d, the bias 1-d
                    ndim = gm.get_parameter(param.target).ndim if param.op == "get_attr" else -1
                    weight, bias = (param, bias) if ndim == 2 else (weight, param if ndim == 1 else bias)
                if weight is None:
                    logger.warning("No weight found in Linear pattern (its parameters are not in its source partition,"
                                   " as torch.export's non-strict capture records it: this Linear stays float, on a"
                                   " Gaudi too)")
                    continue
                annotate_operand(partition, partition.input_nodes[0], get_input_act_qspec(config))
                annotate_operand(partition, weight, get_weight_qspec(config))
                if bias is not None:
                    annotate_operand(partition, bias, get_bias_qspec(config))
                if not is_annotated([partition.output_nodes[0]]):
                    annotate_output(partition.output_nodes[0], get_output_act_qspec(config))
                mark_annotated(list(partition.nodes))

        def _annotate_matmul(self, gm: torch.fx.GraphModule, config: Any) -> None:
            for partition in partitions(gm, [torch.matmul]):
                for operand in partition.input_nodes[:2]:
                    annotate_operand(partition, operand, get_input_act_qspec(config))
                if not is_annotated([partition.output_nodes[0]]):
                    annotate_output(partition.output_nodes[0], get_output_act_qspec(config))
                mark_annotated(list(partition.nodes))

        def _annotate_maxpool2d(self, gm: torch.fx.GraphModule, config: Any) -> None:
            for partition in partitions(gm, [torch.nn.MaxPool2d, torch.nn.functional.max_pool2d]):
                output = partition.output_nodes[0]
                pool = next((n for n in partition.nodes if n.target in pool_ops), None)
                if pool is None or is_annotated([output, pool]):
                    continue
                source = pool.args[0]
                shared = SharedQuantizationSpec((source, pool))  # the output keeps its input's parameters
                if output is pool:  # one node (aten.max_pool2d): it takes the input spec and gives the shared one
                    pool.meta["quantization_annotation"] = QuantizationAnnotation(
                        input_qspec_map={source: get_input_act_qspec(config)}, output_qspec=shared, _annotated=True)
                    continue
                pool.meta["quantization_annotation"] = QuantizationAnnotation(
                    input_qspec_map={source: get_input_act_qspec(config)}, _annotated=True)
                output.meta["quantization_annotation"] = QuantizationAnnotation(output_qspec=shared, _annotated=True)

        def validate(self, model: torch.fx.GraphModule) -> None:
            """Every annotated graph is accepted (as Habana's)."""

        @classmethod
        def get_supported_operators(cls) -> list[Any]:
            return []

    def habana_quant_config_symmetric(quant_dtype: torch.dtype) -> Any:
        """Habana's symmetric per-tensor config for `quant_dtype` (torch.int8, float8_e4m3fn or float8_e5m2)."""
        logger.debug("habana_quant_config_symmetric: quantizer dtype is %s", quant_dtype)
        quant_min, quant_max = QUANTIZER_MIN_MAX[quant_dtype]

        def spec(extra: dict[str, Any], **more: Any) -> Any:
            return QuantizationSpec(
                dtype=quant_dtype, quant_min=quant_min, quant_max=quant_max, qscheme=torch.per_tensor_symmetric,
                is_dynamic=False,
                observer_or_fake_quant_ctr=_observer.AbsMaxObserver.with_args(**extra["for_observer"].copy()), **more)

        bias = QuantizationSpec(dtype=torch.float, observer_or_fake_quant_ctr=placeholder)
        return QuantizationConfig(spec(extra_args_act), None, spec(extra_args_weight, ch_axis=0), bias)

    return {"habana_quantizer": habana_quantizer, "habana_quant_config_symmetric": habana_quant_config_symmetric}
