"""Fake habana_frameworks.torch.hpu.metrics.exceptions: Habana's metric exceptions (bridge:
hpu/metrics/exceptions.py)."""


class MetricNotFound(Exception):
    pass


class InvalidMetricDumpFileFormat(Exception):
    pass


class InvalidMetricDumpTrigger(Exception):
    pass
