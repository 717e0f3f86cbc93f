"""How fast this machine is right now, and time limits that follow it: `scaled(seconds)` for every limit a test sets
against a hang.

The suite runs on whatever machine the change was made on, often beside other work. A limit that guards against a
hang (a thread join, a polling deadline, a client's socket timeout that is not the behaviour under test, a
`pytest.mark.timeout`) was chosen on an idle 2-core Xeon; on a loaded or slower machine the same work takes longer
and the limit fires although nothing hung. `scaled(s)` is `s` times `slowness()`: how many times longer a short, fixed
piece of pure-Python work takes here, now, than it took on that idle machine (`REFERENCE_S`), never below 1.

A limit that IS the behaviour under test (a client that must give up during a network cut, a lease that must expire)
stays as it is; nothing else in that test may then depend on the machine being idle.

`SR1_TEST_SLOWNESS=<factor>` fixes the factor (say 1 to see the limits as written, or 20 on a machine known to be
very slow); otherwise it is measured when first asked for and again when the last measurement is older than
`REMEASURE_S`, and the factor is the slowest of the measurements of the last `WINDOW_S` (the load comes and goes; a
limit set in a quiet moment must survive the next busy one).
"""

from __future__ import annotations

import os
import time

# Wall seconds one round of `_work()` takes on the reference machine, idle ("Intel(R) Xeon(R) Processor", 2 cores):
# the fastest of 300 rounds was 10.57 ms on 2026-11-28, with
# `.venv/bin/python -c "import tests.timing as t; t.calibrate(300)"`.
REFERENCE_S = 0.0105
ROUNDS = 3  # one measurement: ~30 ms at reference speed, long enough to span several scheduler slices
REMEASURE_S = 20.0  # a measurement costs ~30 ms times the slowness: at most a few percent of the time
WINDOW_S = 60.0
# past this a real hang would take too long to be reported; a machine slower still sets SR1_TEST_SLOWNESS
MAX_SLOWNESS = 30.0
ENV = "SR1_TEST_SLOWNESS"

_measurements: list[tuple[float, float]] = []  # (time.monotonic() when taken, slowness)


def _work() -> int:
    """A fixed piece of interpreter work (~10 ms at reference speed): arithmetic, a dict and a list, as tests do."""
    table: dict[int, int] = {}
    acc = 0
    for i in range(150_000):
        acc = (acc * 31 + i) % 1_000_003
        table[i & 255] = acc
    return acc + len(sorted(table.values()))


def measure(rounds: int = ROUNDS) -> float:
    """How many times slower than the idle reference machine `rounds` rounds of work run now (wall time, so time
    spent waiting for a core counts)."""
    start = time.perf_counter()
    for _ in range(rounds):
        _work()
    return (time.perf_counter() - start) / (rounds * REFERENCE_S)


def _fixed() -> float | None:
    raw = os.environ.get(ENV)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(
            f"{ENV}={raw!r}: expected a number (how many times slower than the reference)"
        ) from None
    if not value > 0:
        raise ValueError(f"{ENV}={raw!r}: expected a factor above 0")
    return value


def slowness() -> float:
    """How many times longer than on the idle reference machine work takes here now: at least 1, at most
    `MAX_SLOWNESS` (unless fixed by `SR1_TEST_SLOWNESS`)."""
    fixed = _fixed()
    if fixed is not None:
        return fixed
    now = time.monotonic()
    if not _measurements or now - _measurements[-1][0] > REMEASURE_S:
        _measurements.append((now, measure()))
    _measurements[:] = [m for m in _measurements if now - m[0] <= WINDOW_S]  # the newest is always kept
    return min(MAX_SLOWNESS, max([1.0] + [value for _, value in _measurements]))


def scaled(seconds: float) -> float:
    """`seconds`, a limit against a hang chosen on the idle reference machine, as long as it must be here now."""
    if seconds < 0:
        raise ValueError(f"scaled({seconds!r}): a time limit is not negative")
    return seconds * slowness()


def calibrate(rounds: int = 200) -> float:
    """The fastest single round of `_work()` here (for `REFERENCE_S`, on an idle machine)."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        _work()
        best = min(best, time.perf_counter() - start)
    print(f"fastest of {rounds} rounds: {best * 1000:.2f} ms (REFERENCE_S = {REFERENCE_S * 1000:.2f} ms)")
    return best
