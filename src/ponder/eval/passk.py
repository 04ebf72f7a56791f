"""pass@k with the unbiased estimator (Chen et al., 2021) and confidence intervals.

For one task with n samples of which c are correct, the probability that at least one
of k samples drawn without replacement is correct is 1 - C(n-c, k) / C(n, k). Averaged
over tasks this is unbiased for the policy's pass@k, unlike 1 - (1 - c/n)^k.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k), computed as a product so large n does not overflow.

    n: samples drawn for the task; c: how many were correct (0 <= c <= n); k <= n.
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def pass_at_k_with_ci(
    samples: Sequence[int], correct: Sequence[int], k: int, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> dict[str, float]:
    """Mean pass@k over tasks with a percentile bootstrap interval over tasks.

    samples[i], correct[i]: n and c of task i. Tasks with fewer than k samples are left
    out. Returns {"pass@k", "se", "low", "high", "tasks"}; the bootstrap draws tasks
    with replacement (`resamples` times, seeded), so the interval covers task sampling.
    """
    if len(samples) != len(correct):
        raise ValueError(f"{len(samples)} sample counts but {len(correct)} correct counts")
    values = np.array([pass_at_k(n, c, k) for n, c in zip(samples, correct) if n >= k], dtype=np.float64)
    if values.size == 0:
        nan = float("nan")
        return {"pass@k": nan, "se": nan, "low": nan, "high": nan, "tasks": 0.0}
    se = float(values.std(ddof=1) / math.sqrt(values.size)) if values.size > 1 else float("nan")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(resamples, values.size))].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return {"pass@k": float(values.mean()), "se": se, "low": float(low), "high": float(high), "tasks": float(values.size)}


def wilson_interval(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion (sensible at 0 and 1, unlike the normal one)."""
    if trials <= 0:
        return float("nan"), float("nan")
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    p = successes / trials
    denominator = 1.0 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)
