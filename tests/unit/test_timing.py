"""tests/timing.py: the machine's measured slowness, its override, and pytest-timeout limits scaled by it."""

from __future__ import annotations

import pytest

from tests import timing


def test_the_factor_can_be_fixed_and_a_limit_scales_by_it(monkeypatch):
    monkeypatch.setenv(timing.ENV, "4")
    assert timing.slowness() == 4.0
    assert timing.scaled(0.5) == 2.0


@pytest.mark.parametrize("raw", ["fast", "0", "-2"])
def test_a_bad_fixed_factor_is_an_error_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv(timing.ENV, raw)
    with pytest.raises(ValueError, match=f"{timing.ENV}={raw!r}"):
        timing.slowness()


def test_a_negative_limit_is_an_error():
    with pytest.raises(ValueError, match="not negative"):
        timing.scaled(-1)


def test_the_measured_factor_is_never_below_one_nor_above_the_ceiling(monkeypatch):
    monkeypatch.delenv(timing.ENV, raising=False)
    monkeypatch.setattr(timing, "_measurements", [])
    monkeypatch.setattr(
        timing, "measure", lambda rounds=timing.ROUNDS: 0.2
    )  # a machine faster than the reference
    assert timing.slowness() == 1.0
    monkeypatch.setattr(timing, "_measurements", [])
    monkeypatch.setattr(timing, "measure", lambda rounds=timing.ROUNDS: 1e6)  # a machine stopped
    assert timing.slowness() == timing.MAX_SLOWNESS


def test_the_slowest_measurement_of_the_window_counts(monkeypatch):
    """A quiet moment after a busy one does not shorten the limits while the busy one is recent."""
    monkeypatch.delenv(timing.ENV, raising=False)
    clock = [1000.0]
    monkeypatch.setattr(timing.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(timing, "_measurements", [])
    readings = iter([5.0, 1.5, 1.2])
    monkeypatch.setattr(timing, "measure", lambda rounds=timing.ROUNDS: next(readings))
    assert timing.slowness() == 5.0
    clock[0] += timing.REMEASURE_S + 1
    assert timing.slowness() == 5.0  # 1.5 measured, 5 is still in the window
    clock[0] += timing.WINDOW_S
    assert timing.slowness() == 1.5  # 1.2 measured now, 1.5 is still in the window, the busy 5 has left it


def test_a_real_measurement_is_a_positive_ratio():
    assert timing.measure(rounds=1) > 0


@pytest.mark.timeout(7)
def test_pytest_timeout_reads_the_scaled_limit(request):
    """tests/conftest.py puts a scaled copy of the test's timeout marker in front of it: the one pytest-timeout reads."""
    markers = [m for m in request.node.iter_markers("timeout")]
    assert len(markers) == 2 and markers[1].args == (7,)
    assert markers[0] is request.node.get_closest_marker("timeout") and markers[0].args[0] >= 7
