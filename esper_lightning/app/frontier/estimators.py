"""A growing arm's speed-up by several estimators, against one width's frontier or several
widths', and as the growth literature measures it, from studies' rows alone (NumPy, SciPy).

**Four estimators** of the speed-up at budget ``C`` against the frontier of the fixed sizes:

* *pooled power law* (the headline): each fixed size's episode-mean curve (its mean loss at
  each budget over the episodes) fitted by `fit.PowerLaw`, the frontier the lower envelope of
  the fits, the arm's episode-mean loss read against it (`fit.speedup`). Its interval is a
  jackknife t over episodes (`fit.jackknife_t` of the log speed-up, each episode left out in
  turn): the estimate is a smooth function of episode means, whose variance the jackknife
  estimates. A per-episode refit and a t over its values would estimate another quantity (the
  mean of per-episode speed-ups, each against its own episode's minimum over sizes, with
  three parameters fitted to four to six noisy points of one episode).
* *pooled piecewise*: the same with the mean curves linear in ``log C`` between budgets
  (`fit.Curve`), jackknifed alike.
* *per-episode power law* and *per-episode piecewise* (the latter is `report.speedups`, the
  study's own table): each episode's frontier and the arm's loss in that episode, the geometric
  mean over episodes with its bootstrap and t intervals (`fit.geometric_summary`).

**Two biases** part them (`Estimate.chord`, `minimum_bias`). A chord linear in ``log C`` lies
above a convex curve, so between budgets a piecewise frontier is too high and a speed-up read
against it too large: the *chord* effect is the speed-up against the chords through a fitted
law's own points at the measured budgets over the speed-up against the law itself (pooled).
An episode's frontier is the minimum over sizes of that episode's losses, each with its noise,
so it sits below the envelope of the means where sizes are close: the *minimum* effect is, per
budget, the mean of the episodes' minima minus the envelope of the means (bits), and it makes a
per-episode speed-up too small.

**Across widths** (`Pool` over several studies, each of its own episodes: no pairing between
them) the frontier is the envelope of every fixed size of every width, in absolute FLOPs; the
jackknife leaves out one episode of one study at a time and its degrees of freedom are
Welch-Satterthwaite's.

**As the literature measures** (`literature`): against the arm's own final size alone, both
fully decayed at each budget (the final size's compute to reach the arm's loss, over the
arm's), and the arm's time to the final size's loss at ``C`` (``C`` over the arm's compute to
reach it, on the arm's own fitted curve), beside the frontier's; and where the speed-up
against the final size comes from: ``s = 1 - τ + v (c - 1 + τ)`` with ``c`` the token ceiling
(`fit.token_ceiling`; ``c - 1 + τ = τ r`` for one growth, ``r`` the final size's FLOPs per token
over the first size's), ``v`` what a token seen before the last growth is worth in tokens of the
final size (`fit.token_value`). The rows hold each run's loss at the end of its budget only, so
the literature's other readings (the grown model against the same size read mid-run on one
long schedule, or in a WSD run's stable phase) cannot be computed from them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from esper_lightning.app.frontier.arms import parse_arm
from esper_lightning.app.frontier.fit import (
    Curve,
    PowerLaw,
    Speedup,
    Summary,
    curves_by_episode,
    frontier,
    geometric_summary,
    jackknife_t,
    speedup,
    time_to_target,
    token_ceiling,
    token_value,
)

__all__ = ["CHORD", "PIECEWISE", "POWER", "Estimate", "Literature", "Pool", "Pooled",
           "complete_episodes", "cross_envelope", "estimates", "literature", "minimum_bias",
           "sizes_of", "stage_size"]

#: How a curve is read between its budgets: a fitted power law, chords linear in log C through
#: the measured points, or chords through the fitted law's own points (the chord effect alone).
POWER, PIECEWISE, CHORD = "power law", "piecewise", "chords of the power law"

#: The kept episodes of each study of a pool (one frozen set per study).
Keep = tuple[frozenset[int], ...]


#: A fixed size's name: ``S<depth>``, with ``w<width>`` where it names its width.
_SIZE = re.compile(r"S(?P<depth>\d+)(?:w(?P<width>\d+))?")


def sizes_of(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The fixed sizes among the rows' arms (``S<k>``, ``S<k>w<width>``), by width (the
    plan's first) and depth."""
    def order(name: str) -> tuple[int, int]:
        size = _SIZE.fullmatch(name)
        return (int(size["width"] or 0), int(size["depth"])) if size else (-1, 0)

    return sorted({r["arm"] for r in rows if r["arm"].startswith("S")}, key=order)


def stage_size(arm: str, stage: int) -> str:
    """The fixed size a growing arm is at stage ``stage`` (0: born; -1: final), by its name:
    ``G1-4@...`` is S1 then S4, ``G1w32-4w64@...`` S1w32 then S4w64.

    Example:
        >>> stage_size("G1-2-4@0.15,0.4:identity", -1), stage_size("G1w32-4w64@0.1:copy", 0)
        ('S4', 'S1w32')
    """
    return "S" + arm[1:].split("@")[0].split("-")[stage]


def complete_episodes(rows: Sequence[Mapping[str, Any]]) -> list[int]:
    """The episodes in which every fixed size has every one of its budgets (a frontier of an
    episode needs them all; an interrupted study's last episode may not have them yet)."""
    sizes = sizes_of(rows)
    wanted = {s: {r["budget"] for r in rows if r["arm"] == s} for s in sizes}
    episodes = sorted({int(r["episode"]) for r in rows})
    return [e for e in episodes if all(
        wanted[s] <= {r["budget"] for r in rows if r["arm"] == s and r["episode"] == e}
        for s in sizes)]


def smooth(curve: Curve, kind: str) -> Curve:
    """``curve`` read the ``kind`` way (`POWER`, `PIECEWISE` or `CHORD`)."""
    if kind == PIECEWISE:
        return curve
    law = PowerLaw.fit(curve)
    if kind == POWER:
        return law.curve(curve.flops)
    return Curve(curve.flops, np.asarray(law.at(curve.flops), dtype=float))


@dataclass(frozen=True)
class Pooled:
    """A pooled estimate: its value, its jackknife t interval (NaN where it has none: one
    episode, or a value some leave-one-out only bounds), whether it is a bound (``"above"``:
    at least; ``"below"``: at most) and the episodes it pools."""

    value: float
    low: float
    high: float
    censored: str | None
    n: int


class Pool:
    """The rows of one or several studies (each of its own episodes, at its chosen rates),
    averaged over kept episodes; frontiers are built once per set of kept episodes.

    Args:
        studies: Each study's rows (its fixed sizes, and any growing arms).
        loss: The loss column read.
        labels: A prefix per study for its sizes' names (e.g. ``w32 ``), so sizes of several
            studies stay apart.
    """

    def __init__(self, studies: Sequence[Sequence[Mapping[str, Any]]], loss: str,
                 labels: Sequence[str] = ("",)):
        if len(labels) != len(studies):
            raise ValueError(f"a pool of {len(studies)} studies needs as many labels, got "
                             f"{list(labels)}")
        self.loss = loss
        self.labels = tuple(labels)
        self.episodes = tuple(frozenset(complete_episodes(rows)) for rows in studies)
        self.rows = tuple([r for r in rows if r["episode"] in kept]
                          for rows, kept in zip(studies, self.episodes, strict=True))
        self._fronts: dict[tuple[str, Keep], Curve] = {}

    @property
    def everything(self) -> Keep:
        """Every complete episode of every study."""
        return self.episodes

    def left_out(self) -> list[list[Keep]]:
        """Per study, every episode left out in turn (the others' kept whole)."""
        return [[tuple(kept - {e} if g == group else other
                       for g, other in enumerate(self.episodes)) for e in sorted(kept)]
                for group, kept in enumerate(self.episodes)]

    def curve(self, study: int, arm: str, keep: Keep) -> Curve:
        """``arm``'s mean loss over the kept episodes of ``study``, at each of its budgets."""
        points: dict[float, list[float]] = {}
        for row in self.rows[study]:
            if row["arm"] == arm and row["episode"] in keep[study]:
                points.setdefault(float(row["budget_flops"]), []).append(float(row[self.loss]))
        return Curve.of((c, float(np.mean(v))) for c, v in points.items())

    def mean_loss(self, study: int, arm: str, budget: float, keep: Keep) -> float:
        """``arm``'s mean loss at ``budget`` (× base) over the kept episodes of ``study``."""
        return float(np.mean([r[self.loss] for r in self.rows[study] if r["arm"] == arm
                              and r["budget"] == budget and r["episode"] in keep[study]]))

    def sizes(self) -> list[tuple[int, str]]:
        """Every fixed size of every study, as ``(study, size)``."""
        return [(g, s) for g, rows in enumerate(self.rows) for s in sizes_of(rows)]

    def front(self, keep: Keep, kind: str = POWER) -> Curve:
        """The lower envelope of every study's sizes' mean curves, read the ``kind`` way."""
        key = (kind, keep)
        if key not in self._fronts:
            self._fronts[key] = frontier([smooth(self.curve(g, s, keep), kind)
                                          for g, s in self.sizes()])
        return self._fronts[key]

    def estimate(self, value: Callable[[Keep], Speedup | float], log: bool = True) -> Pooled:
        """``value`` on every episode, with its jackknife t interval (of its log when ``log``:
        a speed-up; a bound (`Speedup.censored`) anywhere leaves no interval)."""
        def read(keep: Keep) -> tuple[float, str | None]:
            got = value(keep)
            if isinstance(got, Speedup):
                return got.value, got.censored
            return float(got), None

        full, censored = read(self.everything)
        n = sum(len(kept) for kept in self.episodes)
        if min(len(kept) for kept in self.episodes) < 2:  # a study of one episode: no spread
            return Pooled(full, math.nan, math.nan, censored, n)
        loo = [[read(keep) for keep in group] for group in self.left_out()]
        if censored or any(c for group in loo for _, c in group):
            return Pooled(full, math.nan, math.nan, censored, n)
        scale = math.log if log else float
        low, high, _ = jackknife_t(scale(full), [[scale(v) for v, _ in g] for g in loo])
        back = math.exp if log else float
        return Pooled(full, back(low) if not math.isnan(low) else low,
                      back(high) if not math.isnan(high) else high, None, n)


@dataclass(frozen=True)
class Estimate:
    """A growing arm at one budget by the four estimators (module docstring), and the chord
    effect (the pooled speed-up against the fitted laws' chords over that against the laws,
    minus 1; NaN where either is a bound)."""

    arm: str
    budget: float
    power: Pooled
    piecewise: Pooled
    episode_power: Summary
    episode_piecewise: Summary
    chord: float


def growing_arms(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The growing arms among the rows' arms (every arm that is not a fixed size)."""
    rows = list(rows)
    return sorted({r["arm"] for r in rows} - set(sizes_of(rows)))


class Pools:
    """`Pool` of studies whose ``study``-th is kept to the episodes a growing arm played at a
    budget (a tuning arm may have played fewer episodes than the fixed sizes), one per set."""

    def __init__(self, studies: Sequence[Sequence[Mapping[str, Any]]], loss: str,
                 labels: Sequence[str] = ("",)):
        self.studies, self.loss, self.labels = studies, loss, labels
        self._pools: dict[tuple[int, frozenset[int]], Pool] = {}

    def of(self, study: int, arm: str, budget: float) -> Pool:
        """The pool in which ``study`` holds the episodes of ``arm`` at ``budget`` alone."""
        rows = self.studies[study]
        played = frozenset(r["episode"] for r in rows if r["arm"] == arm
                           and r["budget"] == budget)
        if (study, played) not in self._pools:
            kept = [r for r in rows if r["episode"] in played]
            self._pools[(study, played)] = Pool(
                [kept if g == study else other for g, other in enumerate(self.studies)],
                self.loss, self.labels)
        return self._pools[(study, played)]


def estimates(rows: Sequence[Mapping[str, Any]], loss: str) -> list[Estimate]:
    """Every growing arm of one study at every budget it trained, by the four estimators."""
    pools = Pools([rows], loss)
    per_episode = {kind: _per_episode(rows, loss, kind) for kind in (POWER, PIECEWISE)}
    results = []
    for arm in growing_arms(rows):
        for budget in sorted({r["budget"] for r in rows if r["arm"] == arm}):
            flops = budget * _base(rows)
            pool = pools.of(0, arm, budget)
            pooled = {kind: pool.estimate(_against_front(pool, 0, arm, budget, flops, kind))
                      for kind in (POWER, PIECEWISE)}
            chord = _against_front(pool, 0, arm, budget, flops, CHORD)(pool.everything)
            power = pooled[POWER]
            bounded = chord.censored or power.censored
            results.append(Estimate(
                arm, budget, power, pooled[PIECEWISE], per_episode[POWER][(arm, budget)],
                per_episode[PIECEWISE][(arm, budget)],
                math.nan if bounded else chord.value / power.value - 1.0))
    return results


def _base(rows: Sequence[Mapping[str, Any]]) -> float:
    """The study's base budget in FLOPs (a row's budget FLOPs over its multiple)."""
    return float(rows[0]["budget_flops"]) / float(rows[0]["budget"])


def _against_front(pool: Pool, study: int, arm: str, budget: float, flops: float, kind: str
                   ) -> Callable[[Keep], Speedup]:
    """The pooled speed-up of ``arm`` at ``budget`` against the pool's frontier, per keep."""
    return lambda keep: speedup(pool.mean_loss(study, arm, budget, keep), flops,
                                pool.front(keep, kind))


def _per_episode(rows: Sequence[Mapping[str, Any]], loss: str, kind: str
                 ) -> dict[tuple[str, float], Summary]:
    """Every growing arm's per-episode speed-ups against its episode's frontier read the
    ``kind`` way: geometric mean, bootstrap and t intervals (`fit.geometric_summary`)."""
    episodes = complete_episodes(rows)
    curves = {s: curves_by_episode(rows, s, loss) for s in sizes_of(rows)}
    fronts = {e: frontier([smooth(c[e], kind) for c in curves.values()]) for e in episodes}
    results = {}
    for arm in growing_arms(rows):
        mine = [r for r in rows if r["arm"] == arm and r["episode"] in fronts]
        for budget in sorted({r["budget"] for r in mine}):
            results[(arm, budget)] = geometric_summary([
                speedup(r[loss], r["budget_flops"], fronts[r["episode"]])
                for r in mine if r["budget"] == budget])
    return results


@dataclass(frozen=True)
class EnvelopePoint:
    """The frontier of one study at one measured budget two ways: the envelope of the sizes'
    mean losses (and the size holding it), and the mean over episodes of each episode's
    minimum over sizes (nats)."""

    budget: float
    flops: float
    envelope: float
    holder: str
    episodes: float


def minimum_bias(rows: Sequence[Mapping[str, Any]], loss: str) -> list[EnvelopePoint]:
    """The per-episode minimum's effect at every budget the fixed sizes measured."""
    pool = Pool([rows], loss)
    sizes = sizes_of(pool.rows[0])
    means = {s: pool.curve(0, s, pool.everything) for s in sizes}
    per_episode = {s: curves_by_episode(pool.rows[0], s, loss) for s in sizes}
    points = []
    for budget in sorted({r["budget"] for r in pool.rows[0] if r["arm"] in sizes}):
        flops = budget * _base(pool.rows[0])
        at = {s: means[s].at(flops) for s in sizes if not math.isnan(means[s].at(flops))}
        holder = min(at, key=at.__getitem__)
        minima = [min(v for v in (per_episode[s][e].at(flops) for s in sizes)
                      if not math.isnan(v)) for e in sorted(pool.episodes[0])]
        points.append(EnvelopePoint(budget, flops, at[holder], holder, float(np.mean(minima))))
    return points


@dataclass(frozen=True)
class CrossPoint:
    """The envelope of several widths' sizes at one budget (FLOPs): each size's mean loss
    there (piecewise, NaN outside its budgets), the envelope read piecewise and by the fitted
    laws, and which size holds each."""

    flops: float
    losses: dict[str, float]
    piecewise: float
    piecewise_holder: str
    power: float
    power_holder: str


def cross_envelope(pool: Pool) -> list[CrossPoint]:
    """The cross-width envelope at every budget any size of the pool measured."""
    keep = pool.everything
    names = [f"{pool.labels[g]}{s}" for g, s in pool.sizes()]
    means = [pool.curve(g, s, keep) for g, s in pool.sizes()]
    laws = [smooth(c, POWER) for c in means]
    points = []
    for flops in sorted({float(c) for curve in means for c in curve.flops}):
        losses = {n: c.at(flops) for n, c in zip(names, means, strict=True)}
        fitted = {n: c.at(flops) for n, c in zip(names, laws, strict=True)}
        piece = min((n for n in names if not math.isnan(losses[n])), key=losses.__getitem__)
        power = min((n for n in names if not math.isnan(fitted[n])), key=fitted.__getitem__)
        points.append(CrossPoint(flops, losses, losses[piece], piece, fitted[power], power))
    return points


@dataclass(frozen=True)
class Literature:
    """A growing arm of one study at one budget, measured the frontier's ways and the
    literature's (module docstring): against its width's frontier (pooled power law; and
    per-episode piecewise, the study's own table), against the frontier of every width's
    sizes, against its final size alone, its time to the final size's loss; and where the
    speed-up against its final size comes from (``ratio`` r, ``tau`` its last growth's share,
    ``ceiling`` c, the token value v pooled; and per episode piecewise, the study's own token
    table: the speed-up against the final size and v as a mean and t interval)."""

    arm: str
    width: int
    budget: float
    frontier: Pooled
    today: Summary
    cross: Pooled
    final: Pooled
    target: Pooled
    ratio: float
    tau: float
    ceiling: float
    value: Pooled
    today_final: Summary
    today_value: tuple[float, float, float]


def literature(studies: Sequence[tuple[int, Sequence[Mapping[str, Any]]]], loss: str
               ) -> list[Literature]:
    """Every growing arm of every study (``(width, rows)``, one study per width) measured
    every way (`Literature`)."""
    widths = [w for w, _ in studies]
    if len(set(widths)) != len(widths):
        raise ValueError(f"one study per width across widths, got widths {widths}")
    cross = Pools([rows for _, rows in studies], loss, [f"w{w} " for w in widths])
    results = []
    for g, (width, rows) in enumerate(studies):
        own = Pools([rows], loss)
        today = _per_episode(rows, loss, PIECEWISE)
        for arm in growing_arms(rows):
            for budget in sorted({r["budget"] for r in rows if r["arm"] == arm}):
                results.append(_measured(cross.of(g, arm, budget), own.of(0, arm, budget), g,
                                         width, arm, budget, today[(arm, budget)]))
    return results


def _measured(cross: Pool, own: Pool, study: int, width: int, arm: str, budget: float,
              today: Summary) -> Literature:
    """One arm at one budget of study ``study`` of the pool ``cross`` (`literature`)."""
    rows = own.rows[0]
    flops = budget * _base(rows)
    final = stage_size(arm, -1)
    tau = parse_arm(arm).taus[-1]
    ceiling = float(np.mean([token_ceiling(r["tokens"], _cost(rows, final), r["budget_flops"])
                             for r in rows if r["arm"] == arm and r["budget"] == budget]))

    def against_final(keep: Keep) -> Speedup:
        return speedup(own.mean_loss(0, arm, budget, keep), flops,
                       smooth(own.curve(0, final, keep), POWER))

    def to_target(keep: Keep) -> Speedup:
        return time_to_target(smooth(own.curve(0, arm, keep), POWER), flops,
                              smooth(own.curve(0, final, keep), POWER))

    def value(keep: Keep) -> Speedup:
        against = against_final(keep)
        return Speedup(token_value(against.value, ceiling, tau), against.censored)

    today_final, today_value = _episode_values(rows, own.loss, arm, budget, tau)
    return Literature(
        arm, width, budget, own.estimate(_against_front(own, 0, arm, budget, flops, POWER)),
        today, cross.estimate(_against_front(cross, study, arm, budget, flops, POWER)),
        own.estimate(against_final), own.estimate(to_target),
        _cost(rows, final) / _cost(rows, stage_size(arm, 0)), tau, ceiling,
        own.estimate(value, log=False), today_final, today_value)


def _cost(rows: Sequence[Mapping[str, Any]], size: str) -> float:
    """A fixed size's FLOPs per token (mean over its rows; the rows must hold it)."""
    mine = [r["spent_flops"] / r["tokens"] for r in rows if r["arm"] == size]
    if not mine:
        raise ValueError(f"the rows hold no fixed size {size}, which a growing arm's token "
                         "ceiling needs")
    return float(np.mean(mine))


def _episode_values(rows: Sequence[Mapping[str, Any]], loss: str, arm: str, budget: float,
                    tau: float) -> tuple[Summary, tuple[float, float, float]]:
    """The speed-up against the final size's piecewise curve of the same episode (geometric
    mean, `fit.geometric_summary`) and the token value with that episode's ceiling (mean and
    95 % t interval: the jackknife of a mean is its t interval): the study's own token table."""
    final = stage_size(arm, -1)
    curves, cost = curves_by_episode(rows, final, loss), _cost(rows, final)
    mine = [r for r in rows if r["arm"] == arm and r["budget"] == budget]
    ups = [speedup(r[loss], r["budget_flops"], curves[r["episode"]]) for r in mine]
    values = [token_value(up.value, token_ceiling(r["tokens"], cost, r["budget_flops"]), tau)
              for up, r in zip(ups, mine, strict=True)]
    mean = float(np.mean(values))
    if len(values) < 2:
        return geometric_summary(ups), (mean, math.nan, math.nan)
    low, high, _ = jackknife_t(mean, [[(sum(values) - v) / (len(values) - 1) for v in values]])
    return geometric_summary(ups), (mean, low, high)
