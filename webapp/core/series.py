"""Downsampling a long metric series for a chart, keeping its extremes."""

from __future__ import annotations

import logging
import math

import numpy as np

log = logging.getLogger(__name__)


def downsample_minmax(values: np.ndarray, max_points: int) -> list[int]:
    """Indices of at most `max_points` points that keep a series' shape: the first and the last
    point, and each bucket's minimum and maximum (so spikes survive, unlike plain striding).
    Non-finite values are skipped in the choice and never picked."""
    n = len(values)
    if n <= max_points:
        return list(range(n))
    buckets = max(1, (max_points - 2) // 2)
    inner = values[1:-1]
    size = math.ceil(len(inner) / buckets)
    padded = np.full(buckets * size, np.nan)  # (B*S,)
    padded[: len(inner)] = np.where(np.isfinite(inner), inner, np.nan)
    grid = padded.reshape(buckets, size)  # (B, S)
    has = ~np.all(np.isnan(grid), axis=1)  # (B,)
    lo = np.nanargmin(np.where(has[:, None], grid, 0.0), axis=1)  # (B,)
    hi = np.nanargmax(np.where(has[:, None], grid, 0.0), axis=1)  # (B,)
    base = np.arange(buckets) * size + 1  # (B,) index of each bucket's first point in `values`
    picked = np.concatenate([(base + lo)[has], (base + hi)[has]])
    return sorted({0, n - 1, *picked.tolist()})
