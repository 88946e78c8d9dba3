"""habana_frameworks.torch.core.quantizer, emulated: Habana's quantizer for PT2E quantization.

`habana_quantizer()` (a PT2E `Quantizer`: `.set_global(config)`, `.annotate(graph_module)`) annotates the linear,
matmul, conv2d and max_pool2d partitions of an exported graph for per-tensor symmetric quantization, and
`habana_quant_config_symmetric(dtype)` gives its configuration: activations and weights observed by
`core.observer.AbsMaxObserver` (eps 2**-12, backoff margin 2 for activations and 1 for weights), ranges from
`QUANTIZER_MIN_MAX` (int8 -128..127; fp8 -240..240, Gaudi's float8 range), bias left in float. Names, arguments and
annotations are Habana's (gaudi-pytorch-bridge 1.19); torch's `prepare_pt2e` / `convert_pt2e` then run on the
emulated `hpu` as on the CPU.

PT2E quantization lives in torch (`torch.ao.quantization.quantizer`) up to the torch that moved it to torchao, then in
torchao (`torchao.quantization.pt2e`); the quantizer is built on whichever is installed. Where neither is, this module
still imports (its constants and the observers stay usable) and `habana_quantizer` / `habana_quant_config_symmetric`
raise an ImportError that names what to install.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import logging
from typing import Any

import torch
from habana_frameworks.torch.core import observer as _observer

__emulated__ = True

logger = logging.getLogger("habana_frameworks.torch.core.quantizer")  # Habana's: "PT_COMPILE"

QUANTIZER_MIN_MAX = {torch.int8: (-128, 127), torch.float8_e4m3fn: (-240, 240), torch.float8_e5m2: (-240, 240)}
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
    get_input_act_qspec, get_output_act_qspec = utils.get_input_act_qspec, utils.get_output_act_qspec
    get_weight_qspec, get_bias_qspec = utils.get_weight_qspec, utils.get_bias_qspec
    from torch.fx.passes.utils.source_matcher_utils import get_source_partitions  # noqa: PLC0415

    def mark_annotated(nodes: list[Any]) -> None:
        for node in nodes:
            if node is not None:
                node.meta.setdefault("quantization_annotation", QuantizationAnnotation())
                node.meta["quantization_annotation"]._annotated = True

    def is_annotated(nodes: list[Any]) -> bool:
        return any("quantization_annotation" in node.meta and node.meta["quantization_annotation"]._annotated
                   for node in nodes)

    def update_input(partition: Any, input_node: Any, qspec: Any) -> None:
        user = next((n for n in partition.nodes if n in input_node.users), None)
        if user is None:
            raise ValueError("Could not find a user within source partition.")
        annotate_input(user, input_node, qspec)

    def update_output(output_node: Any, qspec: Any) -> None:
        if not is_annotated([output_node]):
            annotate_output(output_node, qspec)

    class habana_quantizer(quantizer_mod.Quantizer):
        """Habana's PT2E quantizer: set a global QuantizationConfig, then annotate an exported graph."""

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
            found = get_source_partitions(gm.graph, [torch.nn.Conv2d, torch.nn.functional.conv2d])
            for partition in itertools.chain(*found.values()):
                if len(partition.output_nodes) > 1:
                    raise ValueError("conv partition has more than one output node")
                conv = partition.output_nodes[0]
                if conv.op != "call_function" or conv.target != torch.ops.aten.convolution.default:
                    raise ValueError(f"{conv} is not an aten conv2d operator")
                if is_annotated([conv]):
                    continue
                qspecs = {conv.args[0]: get_input_act_qspec(config), conv.args[1]: get_weight_qspec(config)}
                if isinstance(conv.args[2], torch.fx.Node):
                    qspecs[conv.args[2]] = get_bias_qspec(config)
                conv.meta["quantization_annotation"] = QuantizationAnnotation(
                    input_qspec_map=qspecs, output_qspec=get_output_act_qspec(config), _annotated=True)

        def _annotate_linear(self, gm: torch.fx.GraphModule, config: Any) -> None:
            found = get_source_partitions(gm.graph, [torch.nn.Linear, torch.nn.functional.linear])
            for partition in itertools.chain(*found.values()):
                act, weight, bias = partition.input_nodes[0], None, None
                linear = next((n for n in partition.nodes if n.target == torch.ops.aten.linear.default), None)
                if linear is not None:  # the operands by position: exported graphs of current torch keep the
                    act, weight = linear.args[:2]  # parameters' get_attr nodes out of the partition
                    bias = linear.args[2] if len(linear.args) > 2 else None
                else:  # Habana's way (graphs of torch's older pre-autograd capture): by the parameters' ranks
                    for node in partition.params:
                        value = functools.reduce(getattr, str(node.target).split("."), gm)
                        if value.ndim == 2:
                            weight = node
                        if value.ndim == 1:
                            bias = node
                if weight is None:
                    logger.warning("No weight found in Linear pattern")
                    continue
                update_input(partition, act, get_input_act_qspec(config))
                update_input(partition, weight, get_weight_qspec(config))
                if isinstance(bias, torch.fx.Node):
                    update_input(partition, bias, get_bias_qspec(config))
                update_output(partition.output_nodes[0], get_output_act_qspec(config))
                mark_annotated(list(partition.nodes))

        def _annotate_matmul(self, gm: torch.fx.GraphModule, config: Any) -> None:
            for partition in itertools.chain(*get_source_partitions(gm.graph, [torch.matmul]).values()):
                assert len(partition.input_nodes) == 2 and len(partition.output_nodes) == 1
                for node in partition.input_nodes:
                    update_input(partition, node, get_input_act_qspec(config))
                update_output(partition.output_nodes[0], get_output_act_qspec(config))
                mark_annotated(list(partition.nodes))

        def _annotate_maxpool2d(self, gm: torch.fx.GraphModule, config: Any) -> None:
            found = get_source_partitions(gm.graph, [torch.nn.MaxPool2d, torch.nn.functional.max_pool2d])
            for partition in itertools.chain(*found.values()):
                output = partition.output_nodes[0]
                pool = next((n for n in partition.nodes if n.target == torch.ops.aten.max_pool2d_with_indices.default),
                            None)
                if pool is None or is_annotated([output, pool]):
                    continue
                source = pool.args[0]
                pool.meta["quantization_annotation"] = QuantizationAnnotation(
                    input_qspec_map={source: get_input_act_qspec(config)}, _annotated=True)
                output.meta["quantization_annotation"] = QuantizationAnnotation(
                    output_qspec=SharedQuantizationSpec((source, pool)), _annotated=True)

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
