"""habana_frameworks.torch.hpu.metrics.exceptions, emulated: the exceptions of Habana's metrics package (bridge:
hpu/metrics/exceptions.py), re-exported by `habana_frameworks.torch.hpu.metrics` as on a Gaudi."""

__emulated__ = True
__all__ = ["InvalidMetricDumpFileFormat", "InvalidMetricDumpTrigger", "MetricNotFound"]


class MetricNotFound(Exception):
    """metric_localcontext(name) for a name this release does not have (metric_global returns None instead)."""


class InvalidMetricDumpFileFormat(Exception):
    pass


class InvalidMetricDumpTrigger(Exception):
    pass
