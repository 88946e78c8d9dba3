"""MemoryMonitor's arguments: a bad value is an error naming the argument and what it accepts, at construction."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hpu_nb.notebook.memory_monitor import MemoryMonitor


@pytest.mark.parametrize("value", [None, "0.5", "600", [0.5], True, 1j])
def test_an_update_interval_that_is_not_a_number_is_a_type_error_naming_it(value):
    with pytest.raises(TypeError, match=r"update_interval=.*number of seconds .*got"):
        MemoryMonitor(update_interval=value, auto_display=False)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -0.5, np.float32("nan")])
def test_an_update_interval_that_is_not_finite_and_non_negative_is_a_value_error_naming_it(value):
    with pytest.raises(ValueError, match=r"update_interval=.*finite number of seconds >= 0"):
        MemoryMonitor(update_interval=value, auto_display=False)


@pytest.mark.parametrize("value", [None, "600", math.nan, 600.0, True])
def test_max_points_that_is_not_an_integer_is_a_type_error_naming_it(value):
    with pytest.raises(TypeError, match=r"max_points=.*integer >= 4.*got"):
        MemoryMonitor(max_points=value, auto_display=False)


def test_max_points_below_four_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="max_points must be at least 4, got 3"):
        MemoryMonitor(max_points=3, auto_display=False)


def test_good_values_of_any_real_or_integral_type_are_kept_as_float_and_int():
    monitor = MemoryMonitor(update_interval=np.float64(0.5), max_points=np.int64(64), auto_display=False)
    assert monitor.update_interval == 0.5 and type(monitor.update_interval) is float
    assert monitor.history.max_points == 64 and type(monitor.history.max_points) is int
    assert MemoryMonitor(update_interval=0, auto_display=False).update_interval == 0.0
