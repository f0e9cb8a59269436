"""Non-negative least squares with exponential forgetting, kept as sufficient statistics and solved on demand."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

# How it works.
#
# The model predicts y = θ·x with every coefficient θᵢ >= 0: each input is a cost that can only add time. It
# keeps the forgetting-weighted Gram matrix A = Σ λⁿ⁻ⁱ·xᵢ·xᵢᵀ and moment b = Σ λⁿ⁻ⁱ·xᵢ·yᵢ (a sample seen k
# updates ago weighs λᵏ), O(features²) per sample, and solves θ = argmin Σ λⁿ⁻ⁱ·(yᵢ − θ·xᵢ)² + ridge·|θ|²
# subject to θ >= 0 only when asked, and only once per batch of updates. With a handful of inputs the solve is
# exact by enumeration: the optimum is the unconstrained ridge solution on its own support, so every support
# is solved, those with a negative coefficient are dropped, and the feasible one of least objective wins. The
# last solve's support is tried first and kept when it meets the optimality (KKT) conditions, so a solve
# after a few more samples usually costs one small linear solve instead of 32.
# Constraining the signs is what makes the fit usable on a serving engine's steps: a batch keeps its shape
# for many steps, its inputs move together, and an unconstrained fit then explains the same times with large
# coefficients of opposite signs that predict nonsense one request away. `leverage(x)` = xᵀ·(A + ridge·I)⁻¹·x
# says how far x is from the samples (small inside their cloud, up to 1 / ridge where nothing was seen).
# `check()` states the invariants; tests hold the solve to SciPy's NNLS on the same weighted system.


class ForgettingNNLS:
    """A, b and the sample count of a non-negative linear fit over `num_features` inputs (see above)."""

    def __init__(self, num_features: int, ridge: float = 1e-3, forgetting: float = 1.0) -> None:
        if not (type(num_features) is int and 1 <= num_features <= 8):
            raise ValueError(f"num_features must be an int in [1, 8], got {num_features!r}")
        if not (math.isfinite(ridge) and ridge > 0):
            raise ValueError(f"ridge must be finite and > 0, got {ridge!r}")
        if not (0 < forgetting <= 1):
            raise ValueError(f"forgetting must be in (0, 1], got {forgetting!r}")
        self.num_features = num_features
        self.ridge = ridge
        self.forgetting = forgetting
        self.gram = [[0.0] * num_features for _ in range(num_features)]
        self.moment = [0.0] * num_features
        self.num_samples = 0
        self._theta: list[float] | None = None
        """The solve for the current statistics (None: not solved since the last update)."""
        self._support: tuple[int, ...] | None = None
        """The last solve's non-zero coefficients: tried first by the next solve (None: enumerate)."""

    def update(self, x: Sequence[float], y: float) -> None:
        """Fold one sample in (ValueError on a wrong length or a non-finite number; nothing changes then)."""
        self._check_x(x)
        if not math.isfinite(y):
            raise ValueError(f"fit target must be finite, got {y!r}")
        lam, n, gram = self.forgetting, self.num_features, self.gram
        for i in range(n):
            self.moment[i] = lam * self.moment[i] + x[i] * y
            for j in range(i, n):
                gram[i][j] = gram[j][i] = lam * gram[i][j] + x[i] * x[j]
        self.num_samples += 1
        self._theta = None

    @property
    def theta(self) -> list[float]:
        """The non-negative least-squares coefficients of the samples so far (solved once per update)."""
        if self._theta is None:
            self._theta = self._solve()
        return self._theta

    def predict(self, x: Sequence[float]) -> float:
        self._check_x(x)
        return sum(t * v for t, v in zip(self.theta, x, strict=True))

    def leverage(self, x: Sequence[float]) -> float:
        """xᵀ·(A + ridge·I)⁻¹·x: the prediction's variance at x over one sample's."""
        self._check_x(x)
        v = np.asarray(x, dtype=float)
        return float(v @ np.linalg.solve(self._regularised(), v))

    def _regularised(self) -> np.ndarray:
        return np.asarray(self.gram, dtype=float) + self.ridge * np.eye(self.num_features)

    def _solve(self) -> list[float]:
        a, b = self._regularised(), np.asarray(self.moment, dtype=float)
        if self._support is not None:
            theta = self._on_support(a, b, self._support)
            if theta is not None and _is_optimal(a, b, theta, self._support):
                return [float(t) for t in theta]
        best, best_value = np.zeros(self.num_features), 0.0
        best_support: tuple[int, ...] = ()
        for size in range(1, self.num_features + 1):
            for support in itertools.combinations(range(self.num_features), size):
                theta = self._on_support(a, b, support)
                if theta is None:
                    continue
                value = float(theta @ a @ theta - 2 * theta @ b)
                if value < best_value:
                    best, best_value, best_support = theta, value, support
        self._support = best_support
        return [float(t) for t in best]

    def _on_support(self, a: np.ndarray, b: np.ndarray, support: tuple[int, ...]) -> np.ndarray | None:
        """The ridge solution with every coefficient outside `support` at 0; None if one inside is negative."""
        theta = np.zeros(self.num_features)
        if support:
            idx = list(support)
            coef = np.linalg.solve(a[np.ix_(idx, idx)], b[idx])
            if (coef < 0).any():
                return None
            theta[idx] = coef
        return theta

    def _check_x(self, x: Sequence[float]) -> None:
        if len(x) != self.num_features or not all(math.isfinite(v) for v in x):
            raise ValueError(f"fit input must be {self.num_features} finite numbers, got {list(x)!r}")

    def check(self) -> None:
        """AssertionError unless A is symmetric and finite with a non-negative diagonal and no 2x2 minor of
        negative determinant (necessary for a sum of outer products), b finite, and θ non-negative."""
        n, a = self.num_features, self.gram
        assert len(a) == n and all(len(row) == n for row in a) and len(self.moment) == n
        assert all(math.isfinite(v) for v in self.moment), self.moment
        for i in range(n):
            assert math.isfinite(a[i][i]) and a[i][i] >= 0, f"A[{i}][{i}] = {a[i][i]}"
            for j in range(i + 1, n):
                assert a[i][j] == a[j][i], f"A is not symmetric at ({i}, {j})"
                assert a[i][i] * a[j][j] - a[i][j] ** 2 >= -1e-9 * (1 + a[i][i] * a[j][j]), (
                    f"A minor ({i}, {j})"
                )
        assert all(t >= 0 and math.isfinite(t) for t in self.theta), self.theta
        assert type(self.num_samples) is int and self.num_samples >= 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "gram": [list(r) for r in self.gram],
            "moment": list(self.moment),
            "num_samples": self.num_samples,
        }

    def parse_state(self, state: dict[str, Any]) -> ForgettingNNLS:
        """A fit of this size and settings holding a saved state; ValueError if it is malformed."""
        n = self.num_features
        gram, moment, num_samples = state["gram"], state["moment"], state["num_samples"]
        if not (
            isinstance(gram, list)
            and len(gram) == n
            and all(isinstance(r, list) and len(r) == n for r in gram)
        ):
            raise ValueError(f"fit gram must be a {n}x{n} matrix, got {gram!r}")
        if not (isinstance(moment, list) and len(moment) == n):
            raise ValueError(f"fit moment must be {n} numbers, got {moment!r}")
        if not all(_is_number(v) for v in (*moment, *(v for row in gram for v in row))):
            raise ValueError("fit state must hold finite numbers")
        if not (type(num_samples) is int and num_samples >= 0):
            raise ValueError(f"fit num_samples must be an int >= 0, got {num_samples!r}")
        fit = ForgettingNNLS(n, self.ridge, self.forgetting)
        fit.gram = [[float(v) for v in row] for row in gram]
        fit.moment = [float(v) for v in moment]
        fit.num_samples = num_samples
        try:
            fit.check()
        except AssertionError as exc:
            raise ValueError(f"fit state breaks an invariant: {exc}") from None
        return fit


def _is_optimal(a: np.ndarray, b: np.ndarray, theta: np.ndarray, support: tuple[int, ...]) -> bool:
    """The KKT conditions of min θᵀ·a·θ − 2·θᵀ·b over θ >= 0 (convex, so they suffice): θ >= 0, and the
    gradient 2·(a·θ − b) is zero on the support (solved there) and >= 0 off it."""
    gradient = a @ theta - b
    scale = 1e-12 * (1.0 + float(np.abs(b).max(initial=0.0)))
    off = [i for i in range(len(theta)) if i not in support]
    return bool((theta >= 0).all() and all(gradient[i] >= -scale for i in off))


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
