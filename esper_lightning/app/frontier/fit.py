"""The compute-optimal frontier and the speed-up of a growing arm against it (NumPy only).

**Per size**, each episode's final losses at the measured budgets make a curve, linear in
``log C`` between measured budgets (`Curve`; no extrapolation: outside the measured range a
curve says nothing). **The frontier** of an episode is the lower envelope of its fixed sizes'
curves (`frontier`): at every budget, the best loss any fixed size reaches there, each fully
decayed at that budget. It is evaluated on a fine logarithmic grid of budgets (and at every
measured one), so a crossing between sizes is found where it is.

**Speed-up** of a growing arm at budget ``C`` in one episode: the compute the frontier needs to
reach the arm's loss at ``C``, over ``C`` (`speedup`; > 1: the arm reaches with ``C`` what the
best fixed size needs more for). The frontier's compute is read off its curve at the first
budget where it is at or below the arm's loss. When it never gets there within the measured
budgets, the speed-up is only known to exceed ``C_max / C`` (*censored above*); when the
frontier is already below the arm's loss at its smallest budget, it is at most ``C_min / C``
(*censored below*). **Time to target**: the compute the arm itself needs to reach the
frontier's loss at ``C`` (its own curve over its budgets), over ``C``.

**Where a speed-up comes from** (`token_ceiling`, `token_value`): a growing arm sees more tokens
than its final size would with the same compute, since its smaller phases cost less per token.
If every token seen before its last growth were worth a token seen by the final size, its
speed-up against that size alone would be its *token ceiling*, ``T * c_final / C`` (``T`` its
tokens, ``c_final`` the final size's FLOPs per token): ``1 + Σ Δτ_k (c_final / c_k - 1)`` over
its smaller phases. The *token value* is how much of that a run realises: 1 when the early
tokens were worth the final size's, 0 when the run ends where the final size trained on its
last phase's compute alone would, below 0 when the early phase did harm.

Across episodes (paired: every arm plays episode ``e`` with the same rng seed, so it is compared
with the frontier of its own episode) a speed-up is summarised by its geometric mean, with a
95 % percentile bootstrap interval over episodes, and the Student t interval of the mean log
speed-up beside it (`geometric_summary`): at 10 episodes a percentile bootstrap covers about 90 %
where it claims 95 %, the t interval about 95 % (docs/evidence.md, "How to read the tables").

**A smooth curve** (`PowerLaw`): ``L = E + A (C / C_0)^-α`` fitted by least squares to a curve's
points (``C_0`` its smallest budget), and sampled back onto a fine log grid over the measured
budgets (`PowerLaw.curve`), so `frontier`, `speedup` and `time_to_target` read it as they read
a piecewise one: between measured budgets it follows the fitted curvature instead of a chord
(a chord linear in ``log C`` lies above a convex curve), and it still says nothing outside them.
**A jackknife t interval** (`jackknife_t`) for an estimate that is a smooth function of episode
means (a fit to the mean curves): each episode left out in turn, the spread of those estimates
scaled to the estimate's standard error, Student t with ``n - 1`` degrees of freedom; with
several independent groups of episodes (studies at two widths), the groups' variances add and
the degrees of freedom are Welch-Satterthwaite's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

from esper_lightning.errors import ConfigError

__all__ = ["POWER_POINTS", "Curve", "PowerLaw", "Speedup", "frontier", "geometric_summary",
           "jackknife_t", "mean_t", "reach_speedup", "speedup", "token_ceiling", "token_value"]

#: Points per factor of two of the grid the frontier is evaluated on.
GRID_PER_OCTAVE = 64
#: The fewest budgets a power law with an offset is fitted to (it has three parameters).
POWER_POINTS = 3
#: Bootstrap resamples of the episodes.
BOOTSTRAP = 10_000
#: The exponents a power law's fit searches first (then refines around the best of them).
EXPONENTS = np.exp(np.linspace(math.log(1e-3), math.log(5.0), 241))


@dataclass(frozen=True)
class Curve:
    """Loss against compute, linear in ``log C`` between the measured budgets (ascending)."""

    flops: np.ndarray
    loss: np.ndarray

    @classmethod
    def of(cls, points: Iterable[tuple[float, float]]) -> Curve:
        """A curve through ``(FLOPs, loss)`` points (any order; one point per budget)."""
        ordered = sorted(points)
        if not ordered:
            raise ValueError("a curve needs at least one point")
        flops = np.array([p[0] for p in ordered], dtype=float)
        if len(set(flops)) != len(flops):
            raise ValueError(f"a curve has one point per budget, got {flops.tolist()}")
        return cls(flops, np.array([p[1] for p in ordered], dtype=float))

    def at(self, flops: float) -> float:
        """The loss at ``flops``, NaN outside the measured budgets."""
        if not self.flops[0] <= flops <= self.flops[-1]:
            return math.nan
        return float(np.interp(math.log(flops), np.log(self.flops), self.loss))

    def flops_to_reach(self, target: float) -> float | None:
        """The least compute at which the curve is at or below ``target`` (None: never, within
        its budgets), by linear interpolation in ``log C`` between its points."""
        if self.loss[0] <= target:
            return float(self.flops[0])
        log = np.log(self.flops)
        for i in range(1, len(self.flops)):
            if self.loss[i] <= target:
                fraction = (self.loss[i - 1] - target) / (self.loss[i - 1] - self.loss[i])
                return float(math.exp(log[i - 1] + fraction * (log[i] - log[i - 1])))
        return None


@dataclass(frozen=True)
class PowerLaw:
    """``L = offset + scale (C / low)^-exponent`` between the budgets ``low`` and ``high`` it was
    fitted on (module docstring); ``scale`` 0 is a flat curve (its points never fell)."""

    offset: float
    scale: float
    exponent: float
    low: float
    high: float

    @classmethod
    def fit(cls, curve: Curve) -> PowerLaw:
        """The least-squares power law through ``curve``'s points (at least 3): for each
        exponent the offset and scale are a linear least-squares fit, so only the exponent is
        searched (on `EXPONENTS`, then refined); a scale below 0 (a rising curve) is refused in
        favour of the best falling one, and of a flat one when none falls.

        Raises:
            ValueError: Fewer than 3 points (one line).
        """
        if len(curve.flops) < POWER_POINTS:
            raise ValueError(f"a power law with an offset needs at least {POWER_POINTS} budgets, "
                             f"got {len(curve.flops)} ({curve.flops.tolist()})")
        x, loss = curve.flops / curve.flops[0], curve.loss

        def solve(exponents: float | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            # Each exponent's least squares of the loss on [1, x^-e], in closed form (a line
            # through centred points) and for the whole grid at once: a solver call per
            # exponent was most of a report's time.
            z = x[None, :] ** -np.atleast_1d(exponents)[:, None]  # (exponents, points)
            centred = z - z.mean(axis=1, keepdims=True)
            scale = centred @ (loss - loss.mean()) / (centred**2).sum(axis=1)
            offset = loss.mean() - scale * z.mean(axis=1)
            residual = ((offset[:, None] + scale[:, None] * z - loss) ** 2).sum(axis=1)
            return np.where(scale >= 0, residual, np.inf), offset, scale

        errors = solve(EXPONENTS)[0]
        best = int(np.argmin(errors))
        if not math.isfinite(errors[best]):
            return cls(float(curve.loss.mean()), 0.0, 1.0, float(curve.flops[0]),
                       float(curve.flops[-1]))
        low, high = EXPONENTS[max(best - 1, 0)], EXPONENTS[min(best + 1, len(EXPONENTS) - 1)]
        refined = optimize.minimize_scalar(lambda e: float(solve(e)[0][0]), bounds=(low, high),
                                           method="bounded", options={"xatol": 1e-6})
        exponent = float(refined.x) if refined.fun <= errors[best] else float(EXPONENTS[best])
        _, offset, scale = solve(exponent)
        return cls(float(offset[0]), float(scale[0]), exponent, float(curve.flops[0]),
                   float(curve.flops[-1]))

    def at(self, flops: float | np.ndarray) -> float | np.ndarray:
        """The fitted loss at ``flops`` (any budget: the caller keeps to the measured ones)."""
        return self.offset + self.scale * (np.asarray(flops) / self.low) ** -self.exponent

    def curve(self, budgets: Sequence[float] = ()) -> Curve:
        """The law on a fine log grid (`GRID_PER_OCTAVE`) from ``low`` to ``high``, and at
        ``budgets`` (the measured ones, so a frontier of such curves has its knots there)."""
        octaves = math.log2(self.high / self.low)
        inner = np.exp(np.linspace(math.log(self.low), math.log(self.high),
                                   max(2, int(octaves * GRID_PER_OCTAVE) + 1)))[1:-1]
        flops = np.unique(np.concatenate([[self.low, self.high], inner,  # the ends exact
                                          [b for b in budgets if self.low <= b <= self.high]]))
        return Curve(flops, np.asarray(self.at(flops), dtype=float))


def frontier(curves: Sequence[Curve]) -> Curve:
    """The lower envelope of ``curves`` on a fine log grid over their combined budgets (and at
    every measured budget): at each budget, the lowest loss a curve defined there reaches."""
    low = min(c.flops[0] for c in curves)
    high = max(c.flops[-1] for c in curves)
    octaves = math.log2(high / low)
    inner = np.exp(np.linspace(math.log(low), math.log(high),
                               max(2, int(octaves * GRID_PER_OCTAVE) + 1)))[1:-1]
    knots = np.unique(np.concatenate([inner, *(c.flops for c in curves)]))  # ends measured
    logs = np.log(knots)
    losses = np.full((len(curves), len(knots)), np.inf)
    for row, curve in zip(losses, curves, strict=True):  # each curve where it is defined
        inside = (knots >= curve.flops[0]) & (knots <= curve.flops[-1])
        row[inside] = np.interp(logs[inside], np.log(curve.flops), curve.loss)
    envelope = losses.min(axis=0)
    if np.isinf(envelope).any():
        gap = float(knots[np.isinf(envelope)][0])
        raise ConfigError(f"no curve is defined at {gap:.4g} FLOPs: the curves' budgets leave a "
                          "gap a frontier cannot cross")
    return Curve(knots, envelope)


@dataclass(frozen=True)
class Speedup:
    """One episode's speed-up of an arm at one budget: ``value`` is exact, or a bound when
    ``censored`` is ``"above"`` (at least ``value``) or ``"below"`` (at most ``value``)."""

    value: float
    censored: str | None = None


def speedup(arm_loss: float, budget: float, front: Curve) -> Speedup:
    """The frontier's compute to reach ``arm_loss`` over ``budget`` (module docstring)."""
    reach = front.flops_to_reach(arm_loss)
    if reach is None:
        return Speedup(float(front.flops[-1]) / budget, "above")
    if reach == front.flops[0] and front.loss[0] < arm_loss:
        return Speedup(float(front.flops[0]) / budget, "below")
    return Speedup(reach / budget)


def time_to_target(arm: Curve, budget: float, front: Curve) -> Speedup:
    """``budget`` over the compute the arm needs to reach the frontier's loss at ``budget``."""
    return reach_speedup(arm, budget, front.at(budget))


def reach_speedup(arm: Curve, budget: float, target: float) -> Speedup:
    """``budget`` over the compute the arm's curve needs to reach ``target`` (at least
    ``budget`` over its first point's compute when that is already below it; at most ``budget``
    over its last's when it never gets there)."""
    reach = arm.flops_to_reach(target)
    if reach is None:
        return Speedup(budget / float(arm.flops[-1]), "below")
    if reach == arm.flops[0] and arm.loss[0] < target:
        return Speedup(budget / float(arm.flops[0]), "above")
    return Speedup(budget / reach)


def token_ceiling(tokens: float, final_cost: float, budget: float) -> float:
    """The speed-up against its final size alone that a growing arm would have if its every
    token were worth one of the final size's: the FLOPs the final size spends on ``tokens``
    (``final_cost`` FLOPs each), over ``budget``."""
    return tokens * final_cost / budget


def token_value(final_speedup: float, ceiling: float, last_tau: float) -> float:
    """The worth of a token seen before the last growth, in tokens of the final size.

    ``final_speedup``: the final size's compute to reach the arm's loss over the arm's budget;
    ``ceiling``: `token_ceiling`; ``last_tau``: the budget's share spent before the last
    growth. The final phase's tokens count one each, ``1 - last_tau`` of the budget.

    Example:
        >>> token_value(1.19, 1.19, 0.1), token_value(0.9, 1.19, 0.1)  # lossless, worthless
        (1.0, 0.0)
    """
    after = 1.0 - last_tau
    return (final_speedup - after) / (ceiling - after)


@dataclass(frozen=True)
class Summary:
    """A speed-up over episodes: geometric mean, its bootstrap interval and its t interval (of
    the mean log), how many episodes, and how many were censored above or below."""

    mean: float
    low: float
    high: float
    n: int
    above: int
    below: int
    t_low: float = math.nan
    t_high: float = math.nan


def geometric_summary(values: Sequence[Speedup], rng_seed: int = 0,
                      confidence: float = 0.95) -> Summary:
    """Geometric mean over episodes with a percentile bootstrap over episodes (a censored
    value counts as its bound: at least a lower bound of the mean when only ``above`` ones
    are censored)."""
    logs = np.log([v.value for v in values])
    rng = np.random.default_rng(rng_seed)
    draws = rng.integers(0, len(logs), size=(BOOTSTRAP, len(logs)))
    means = logs[draws].mean(axis=1)
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(means, [tail, 1.0 - tail])
    censored = [v.censored for v in values]
    half = (float(stats.t.ppf(1.0 - tail, len(logs) - 1) * logs.std(ddof=1)
                  / math.sqrt(len(logs))) if len(logs) > 1 else math.nan)
    return Summary(float(np.exp(logs.mean())), float(np.exp(low)), float(np.exp(high)),
                   len(values), censored.count("above"), censored.count("below"),
                   float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half)))


def mean_t(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and its t interval over ``values`` (the mean three times for one value, which has
    no spread).

    Example:
        >>> [round(x, 3) for x in mean_t([1.0, 2.0, 3.0])]  # t(0.975, 2) = 4.303, s/sqrt(3) = 0.577
        [2.0, -0.484, 4.484]
    """
    mean = float(np.mean(values))
    if len(values) < 2:
        return mean, mean, mean
    half = float(stats.t.ppf(1.0 - (1.0 - confidence) / 2, len(values) - 1)
                 * np.std(values, ddof=1) / math.sqrt(len(values)))
    return mean, mean - half, mean + half


def curves_by_episode(rows: Iterable[Mapping[str, object]], arm: str, loss: str,
                      x: str = "budget_flops") -> dict[int, Curve]:
    """Each episode's curve of ``arm``: its rows' ``loss`` against ``x`` (the budget's FLOPs,
    or ``wall_s`` for wall-clock)."""
    points: dict[int, list[tuple[float, float]]] = {}
    for row in rows:
        if row["arm"] == arm and row[loss] is not None:
            points.setdefault(int(row["episode"]), []).append((float(row[x]),  # type: ignore
                                                               float(row[loss])))  # type: ignore
    return {episode: Curve.of(p) for episode, p in points.items()}


def jackknife_t(full: float, left_out: Sequence[Sequence[float]], confidence: float = 0.95
                ) -> tuple[float, float, float]:
    """A jackknife t interval around ``full`` (module docstring).

    Args:
        full: The estimate from every episode.
        left_out: For each independent group of episodes, the estimates with each of its
            episodes left out in turn (a group of one episode cannot say how it varies: the
            interval is then NaN).
        confidence: The interval's nominal coverage.

    Returns:
        ``(low, high, degrees of freedom)``; for one group the variance is
        ``(n - 1) / n Σ (θ_i - θ̄)²`` (for a mean, exactly the squared standard error of the
        mean, so the interval is the t interval of the mean).

    Example:
        >>> low, high, df = jackknife_t(2.0, [[2.5, 2.0, 1.5]])  # the mean of 1, 2, 3
        >>> round(low, 3), round(high, 3), df
        (-0.484, 4.484, 2.0)
    """
    if not left_out or any(len(group) < 2 for group in left_out):
        return math.nan, math.nan, math.nan
    variances = [(len(g) - 1) / len(g) * float(((np.asarray(g) - np.mean(g)) ** 2).sum())
                 for g in left_out]
    total = sum(variances)
    if total == 0.0:
        return full, full, float(sum(len(g) for g in left_out) - len(left_out))
    df = total ** 2 / sum(v ** 2 / (len(g) - 1) for v, g in zip(variances, left_out, strict=True))
    half = float(stats.t.ppf(1.0 - (1.0 - confidence) / 2, df)) * math.sqrt(total)
    return full - half, full + half, df
