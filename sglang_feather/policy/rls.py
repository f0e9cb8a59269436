"""Recursive least squares with exponential forgetting: a linear model refitted in O(features²) per sample."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

# How it works.
#
# The model predicts y = θ·x. It keeps θ and P, the inverse of the (forgetting-weighted) regularised Gram
# matrix: P₀ = I / ridge says every coefficient starts at 0 with a prior of weight `ridge`. Each sample
# (x, y) updates them by the Sherman-Morrison identity: gain k = P·x / (λ + xᵀ·P·x), θ += k·(y − θ·x),
# P = (P − k·xᵀ·P) / λ. With forgetting λ = 1 this is exactly ridge regression on every sample seen; with
# λ < 1 a sample seen n updates ago weighs λⁿ, so the fit follows a machine whose costs drift. When the
# samples stop exciting a direction (a batch that keeps the same shape for minutes), dividing by λ < 1 would
# grow P without bound in that direction ("covariance wind-up") and make the next sample swing θ wildly;
# P's trace is therefore capped at its starting trace (P rescaled, which keeps it symmetric positive
# definite). `check()` states the invariants; tests hold the updates to a batch weighted ridge fit.


class RecursiveLeastSquares:
    """θ and P of a linear model over `num_features` inputs (see "how it works")."""

    def __init__(self, num_features: int, ridge: float = 1e-3, forgetting: float = 1.0) -> None:
        if not (type(num_features) is int and num_features >= 1):
            raise ValueError(f"num_features must be an int >= 1, got {num_features!r}")
        if not (math.isfinite(ridge) and ridge > 0):
            raise ValueError(f"ridge must be finite and > 0, got {ridge!r}")
        if not (0 < forgetting <= 1):
            raise ValueError(f"forgetting must be in (0, 1], got {forgetting!r}")
        self.num_features = num_features
        self.ridge = ridge
        self.forgetting = forgetting
        self.theta = [0.0] * num_features
        self.p = [[(1.0 / ridge if i == j else 0.0) for j in range(num_features)] for i in range(num_features)]
        self.num_samples = 0

    @property
    def max_trace(self) -> float:
        """The starting trace of P, which the wind-up cap keeps it under."""
        return self.num_features / self.ridge

    def predict(self, x: Sequence[float]) -> float:
        self._check_x(x)
        return sum(t * v for t, v in zip(self.theta, x, strict=True))

    def update(self, x: Sequence[float], y: float) -> None:
        """Fold one sample in (ValueError on a wrong length or a non-finite number; nothing changes then)."""
        self._check_x(x)
        if not math.isfinite(y):
            raise ValueError(f"RLS target must be finite, got {y!r}")
        n, lam, p = self.num_features, self.forgetting, self.p
        px = [sum(p[i][j] * x[j] for j in range(n)) for i in range(n)]
        denom = lam + sum(x[i] * px[i] for i in range(n))
        gain = [v / denom for v in px]
        error = y - self.predict(x)
        self.theta = [t + g * error for t, g in zip(self.theta, gain, strict=True)]
        # P is symmetric, so xᵀ·P = (P·x)ᵀ; update the upper triangle and mirror it (symmetric to the last bit).
        for i in range(n):
            for j in range(i, n):
                value = (p[i][j] - gain[i] * px[j]) / lam
                p[i][j] = p[j][i] = value
        trace = sum(p[i][i] for i in range(n))
        if trace > self.max_trace:
            scale = self.max_trace / trace
            for row in p:
                for j in range(n):
                    row[j] *= scale
        self.num_samples += 1

    def _check_x(self, x: Sequence[float]) -> None:
        if len(x) != self.num_features or not all(math.isfinite(v) for v in x):
            raise ValueError(f"RLS input must be {self.num_features} finite numbers, got {list(x)!r}")

    def check(self) -> None:
        """AssertionError unless θ is finite and P symmetric with a positive diagonal, every 2x2 minor's
        determinant positive (a necessary condition of positive definiteness) and its trace under the cap."""
        n, p = self.num_features, self.p
        assert len(self.theta) == n and all(math.isfinite(t) for t in self.theta), self.theta
        assert len(p) == n and all(len(row) == n for row in p)
        for i in range(n):
            assert math.isfinite(p[i][i]) and p[i][i] > 0, f"P[{i}][{i}] = {p[i][i]}"
            for j in range(i + 1, n):
                assert p[i][j] == p[j][i], f"P is not symmetric at ({i}, {j})"
                assert p[i][i] * p[j][j] - p[i][j] ** 2 > -1e-9 * p[i][i] * p[j][j], f"P minor ({i}, {j})"
        assert sum(p[i][i] for i in range(n)) <= self.max_trace * (1 + 1e-9)
        assert type(self.num_samples) is int and self.num_samples >= 0

    def state_dict(self) -> dict[str, Any]:
        return {"theta": list(self.theta), "p": [list(row) for row in self.p], "num_samples": self.num_samples}

    def parse_state(self, state: dict[str, Any]) -> tuple[list[float], list[list[float]], int]:
        """θ, P and the sample count of a saved state of a model of this size; ValueError if malformed."""
        n = self.num_features
        theta, p, num_samples = state["theta"], state["p"], state["num_samples"]
        if not (isinstance(theta, list) and len(theta) == n and all(_is_number(v) for v in theta)):
            raise ValueError(f"RLS theta must be {n} finite numbers, got {theta!r}")
        if not (isinstance(p, list) and len(p) == n and all(isinstance(r, list) and len(r) == n for r in p)):
            raise ValueError(f"RLS p must be a {n}x{n} matrix, got {p!r}")
        if not all(_is_number(v) for row in p for v in row):
            raise ValueError("RLS p must hold finite numbers")
        if not (type(num_samples) is int and num_samples >= 0):
            raise ValueError(f"RLS num_samples must be an int >= 0, got {num_samples!r}")
        trial = RecursiveLeastSquares(n, self.ridge, self.forgetting)
        trial.theta, trial.p = [float(v) for v in theta], [[float(v) for v in row] for row in p]
        trial.num_samples = num_samples
        try:
            trial.check()
        except AssertionError as exc:
            raise ValueError(f"RLS state breaks an invariant: {exc}") from None
        return trial.theta, trial.p, num_samples

    def install(self, parsed: tuple[list[float], list[list[float]], int]) -> None:
        self.theta, self.p, self.num_samples = parsed


def _is_number(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]
