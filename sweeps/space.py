"""The values a study's search can sample, and the combinations of them checked before anything runs
(:func:`~ablate.sweeps.spec.corner_trials`): every choice, every value of a short range (at most
:data:`MAX_VALUES`), else its ends first and chosen values between (:func:`range_values`); every
combination up to :data:`MAX_POINTS` (a grid always), beyond that each value and pairs of values (:func:`points`)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

from ablate.lightning_modules.config.yamlio import Json

T = TypeVar("T")
N = TypeVar("N", int, float)

MAX_VALUES = 64
"""The most values of one range checked one by one; a longer range is checked at chosen values."""
INTERIOR = 9
"""Evenly spaced points checked inside a longer range or a continuous one (besides its ends)."""
MAX_POINTS = 512
"""The most combinations of searched values checked in full (a study with ranges); beyond, all pairs."""
PAIRED = 6
"""Beyond :data:`MAX_POINTS`, the values of each key paired with each other key's."""
MAX_INTEGERS = 16
"""A continuous range spanning at most this many integers is also checked at each of them, and halfway."""


def range_values(low: float, high: float, *, step: float | None, log: bool, is_int: bool) -> list[int] | list[float]:
    """The values of a numeric range that are checked, ends first (so that the first value refused is an end
    where an end is bad): an ``int`` range (or a ``float`` one with a ``step``) at every value it can sample, up
    to :data:`MAX_VALUES` of them, a longer one at its ends, the values next to them, evenly spaced values
    between and every power of two in it (where divisibility changes most); a continuous range at its ends,
    :data:`INTERIOR` evenly spaced points between (in log space for ``log``) and, where it spans at most
    :data:`MAX_INTEGERS` integers, each of them and halfway between. A study run again in the same store
    samples the same space (:func:`ablate.sweeps.search_changes.check_search_space`)."""
    if is_int:
        lo, stride = int(low), int(step or 1)
        count = (int(high) - lo) // stride + 1  # Optuna's suggest_int: high rounded down onto the steps
        return _ends_first(_on_grid(count, log, lambda i: lo + i * stride))
    if step is not None:
        count = int(math.floor((high - low) / step + 1e-9)) + 1
        return _ends_first(_on_grid(count, log, lambda i: _rounded(low + i * step, step)))
    if low == high:
        return [low]
    inside = [float(f"{_between(low, high, (i + 1) / (INTERIOR + 1), log):.12g}") for i in range(INTERIOR)]
    first, last = math.ceil(low), math.floor(high)
    integers = range(first, last + 1) if 0 < last - first + 1 <= MAX_INTEGERS else range(0)
    halves = [k + 0.5 for k in range(first - 1, last + 1) if low < k + 0.5 < high] if integers else []
    return _ends_first(sorted({*inside, *(float(k) for k in integers), *halves, low, high}))


def _on_grid(count: int, log: bool, value: Callable[[int], N]) -> list[N]:
    """Every value of a grid of ``count`` values, or (a longer one) the chosen ones, ascending."""
    if count <= MAX_VALUES:
        return [value(i) for i in range(count)]
    lo, hi = value(0), value(count - 1)
    stride = value(1) - lo
    inside = [_between(lo, hi, (i + 1) / (INTERIOR + 1), log) for i in range(INTERIOR)]
    spots = {0, 1, count - 2, count - 1} | {min(count - 1, round((x - lo) / stride)) for x in inside}
    values = {value(i) for i in spots}
    if isinstance(lo, int) and lo > 0:  # the powers of two on the grid (where divisibility changes most)
        power = 2 ** max(0, math.ceil(math.log2(lo)))
        while power <= hi:
            if (power - lo) % stride == 0:
                values.add(power)
            power *= 2
    return sorted(values)


def _between(low: float, high: float, fraction: float, log: bool) -> float:
    if log and low > 0:
        return float(math.exp(math.log(low) + fraction * (math.log(high) - math.log(low))))
    return low + fraction * (high - low)


def _rounded(value: float, step: float) -> float:
    """``value`` without the float noise of adding steps (0.1 + 2 * 0.1 = 0.30000000000000004)."""
    places = max(0, -math.floor(math.log10(step))) + 6 if step > 0 else 12
    return round(value, places)


def _ends_first(values: list[T]) -> list[T]:
    if len(values) <= 2:
        return values
    return [values[0], values[-1], *values[1:-1]]


def points(values: Mapping[str, Sequence[Json]], *, full: bool) -> Iterator[dict[str, Json]]:
    """The combinations checked: every one (``full``, or at most :data:`MAX_POINTS`), else the first
    values, each value of each key and pairs of values of two keys (the others at their first)."""
    keys = list(values)
    if full or math.prod(len(v) for v in values.values()) <= MAX_POINTS:
        for combination in itertools.product(*(values[k] for k in keys)):
            yield dict(zip(keys, combination, strict=True))
        return
    first = {k: values[k][0] for k in keys}
    yield first
    for key in keys:
        for value in values[key][1:]:
            yield first | {key: value}
    for a, b in itertools.combinations(keys, 2):
        for x, y in itertools.product(_few(values[a])[1:], _few(values[b])[1:]):
            yield first | {a: x, b: y}


def _few(values: Sequence[T]) -> Sequence[T]:
    """Of a key's checked values (ends first), at most :data:`PAIRED` to pair with another key's: its
    ends and evenly spaced ones between (each value is checked alone too)."""
    if len(values) <= PAIRED:
        return values
    inside = values[2:]
    step = len(inside) / (PAIRED - 2)
    return [*values[:2], *(inside[int(i * step)] for i in range(PAIRED - 2))]


def culprits(
    point: dict[str, Json], values: Mapping[str, Sequence[Json]], valid: Callable[[dict[str, Json]], bool]
) -> list[str]:
    """The keys of an invalid ``point`` whose value makes it invalid: those where another of their
    values makes the point valid (all of the point's keys where no single change does)."""
    found = []
    for key, value in point.items():
        others = [v for v in values.get(key, ()) if v != value][:8]
        if any(valid(point | {key: other}) for other in others):
            found.append(key)
    return found or list(point)
