"""Paired statistics of a controller comparison, over a table of per-episode records.

Every controller plays the same evaluation episodes: episode ``i`` has the same host
initialisation, data order and augmentation for every controller. Comparing two controllers
episode by episode (a paired design) removes the large between-episode variance of a small host,
so a real difference shows with far fewer episodes than two independent means would need.

The functions here are pure: they take `EpisodeRecord` rows (one finished episode of one
controller) and return summaries, paired comparisons, a Markdown report and a JSON-ready dict.
The CSV helpers let the runner append each episode as it finishes, so a crash loses nothing.

Statistical choices, in one place:

- Confidence intervals are percentile bootstraps of the mean (`scipy.stats.bootstrap`,
  ``method="percentile"``), seeded, so a report is reproducible. A constant sample (one value,
  or all values equal) has the interval ``(x, x)``: every resample has the same mean.
- The paired test is the two-sided Wilcoxon signed-rank test (`scipy.stats.wilcoxon`, zero
  differences dropped, exact null distribution for small samples). When every difference is zero
  the p-value is 1.0: the data hold no evidence at all against "no difference".
- The verdict follows the interval of the mean difference: ``"better"`` or ``"worse"`` only when
  it excludes zero *and* at least `MIN_PAIRS_FOR_VERDICT` pairs were played; otherwise
  ``"no detectable difference at N seeds"``. Below six pairs no paired test can reach p < 0.05
  (the exact two-sided Wilcoxon p is at least 2 / 2**n), while a percentile bootstrap of
  three all-positive differences always excludes zero; the floor stops such a verdict.

Example::

    records = read_records_csv("compare/episodes.csv")
    summaries = summarize(records)
    comparisons = paired_differences(records, reference="static")
    print(markdown_table(summaries, comparisons))
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from esper_lightning.core.outcome import OUTCOME_EPOCHS, accuracy_outcome

#: Fewest pairs for a "better"/"worse" verdict: the smallest n whose exact two-sided Wilcoxon
#: p-value can fall below 0.05 (2 / 2**6 = 0.031).
MIN_PAIRS_FOR_VERDICT = 6


def outcome_of(curve: Sequence[float], last: int = OUTCOME_EPOCHS) -> float:
    """Mean validation accuracy of the last ``last`` epochs (`core.outcome.accuracy_outcome`)."""
    return accuracy_outcome(curve, last)


def loss_outcome(record: EpisodeRecord, last: int = OUTCOME_EPOCHS) -> float | None:
    """Mean validation loss of the episode's last ``last`` epochs (the loss twin of the
    outcome); None for a record without losses.

    Example::

        loss_outcome(record)  # 1.93: mean per-token loss of the last 3 epochs
    """
    tail = record.loss_curve[-last:]
    return math.fsum(tail) / len(tail) if tail else None


_INT_FIELDS = (
    "episode_index",
    "episode_rng_seed",
    "seed_params",
    "total_params",
    "seeds_germinated",
    "seeds_fossilized",
    "seeds_pruned",
)
_FLOAT_FIELDS = ("outcome", "final_accuracy", "wall_seconds")
# Integer fields that count something, so cannot be negative (an RNG seed may be).
_COUNT_FIELDS = tuple(name for name in _INT_FIELDS if name != "episode_rng_seed")


@dataclass(frozen=True)
class EpisodeRecord:
    """One finished evaluation episode of one controller.

    Attributes:
        controller: controller name (``static``, ``heuristic``, a policy checkpoint's label, ...).
        episode_index: the i-th evaluation episode. The same index means the same host
            initialisation, data order and augmentation for every controller: it pairs them.
        episode_rng_seed: the RNG seed the episode was played with (equal across controllers for
            one index).
        host: host preset name.
        outcome: mean validation accuracy (percent) of the last epochs, see `outcome_of`.
        final_accuracy: validation accuracy (percent) of the last epoch.
        seed_params: parameters of the seeds present at the end (fossilized or still growing).
        total_params: host parameters plus ``seed_params``.
        episode_return: the RL return when the controller's reward is known, else None.
        accuracy_curve: validation accuracy (percent) per epoch.
        seeds_germinated, seeds_fossilized, seeds_pruned: lifecycle counts over the episode.
        wall_seconds: wall-clock time of the episode.
        loss_curve: validation loss per epoch (mean per sample, per token for a language
            model); empty in tables written before losses were recorded.

    Example::

        curve = (40.0, 55.0, 61.0, 63.0)
        record = EpisodeRecord("static", 0, 1234, "baseline", outcome_of(curve), curve[-1],
                               0, 120_000, None, curve, 0, 0, 0, 12.5)
        assert EpisodeRecord.from_row(record.to_row()) == record
    """

    controller: str
    episode_index: int
    episode_rng_seed: int
    host: str
    outcome: float
    final_accuracy: float
    seed_params: int
    total_params: int
    episode_return: float | None
    accuracy_curve: tuple[float, ...]
    seeds_germinated: int
    seeds_fossilized: int
    seeds_pruned: int
    wall_seconds: float
    loss_curve: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        # A list curve would make the record unhashable and compare unequal to its CSV twin.
        object.__setattr__(self, "accuracy_curve", tuple(float(v) for v in self.accuracy_curve))
        object.__setattr__(self, "loss_curve", tuple(float(v) for v in self.loss_curve))
        for name in ("controller", "host"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty string, got {getattr(self, name)!r}")
        for name in _COUNT_FIELDS:
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.accuracy_curve:
            raise ValueError("accuracy_curve must have at least one epoch, got an empty curve")
        if self.seed_params > self.total_params:
            raise ValueError(
                f"seed_params ({self.seed_params}) exceeds total_params ({self.total_params})"
            )
        if self.loss_curve and len(self.loss_curve) != len(self.accuracy_curve):
            raise ValueError(f"loss_curve has {len(self.loss_curve)} epochs, accuracy_curve "
                             f"{len(self.accuracy_curve)}; they must be equally long")
        finite = [self.outcome, self.final_accuracy, self.wall_seconds, *self.accuracy_curve,
                  *self.loss_curve]
        if self.episode_return is not None:
            finite.append(self.episode_return)
        if not all(math.isfinite(v) for v in finite):
            raise ValueError(f"non-finite value in the record of {self.controller!r}")

    def to_row(self) -> dict[str, str]:
        """A flat CSV row: floats in round-trip precision, the curve space-separated, a missing
        return as the empty string."""
        row = {name: str(getattr(self, name)) for name in ("controller", "host", *_INT_FIELDS)}
        row.update({name: repr(float(getattr(self, name))) for name in _FLOAT_FIELDS})
        row["episode_return"] = (
            "" if self.episode_return is None else repr(float(self.episode_return))
        )
        row["accuracy_curve"] = " ".join(repr(v) for v in self.accuracy_curve)
        row["loss_curve"] = " ".join(repr(v) for v in self.loss_curve)
        return {name: row[name] for name in FIELDNAMES}

    @classmethod
    def from_row(cls, row: Mapping[str | None, Any]) -> EpisodeRecord:
        """The record of a CSV row written by `to_row` (or of a table without losses, written
        before they were recorded: `LEGACY_FIELDNAMES`).

        Raises:
            ValueError: a missing or extra field, or a value that does not parse.
        """
        names = FIELDNAMES if "loss_curve" in row else LEGACY_FIELDNAMES
        if None in row or any(row.get(name) is None for name in names):
            missing = [name for name in names if row.get(name) is None]
            raise ValueError(
                f"row has the wrong number of fields (missing: {', '.join(missing) or 'none'})"
            )
        values: dict[str, Any] = {"controller": row["controller"], "host": row["host"]}
        for name in names:
            text = row[name]
            try:
                if name in _INT_FIELDS:
                    values[name] = int(text)
                elif name in _FLOAT_FIELDS:
                    values[name] = float(text)
                elif name == "episode_return":
                    values[name] = None if text == "" else float(text)
                elif name in ("accuracy_curve", "loss_curve"):
                    values[name] = tuple(float(v) for v in text.split())
            except ValueError:
                raise ValueError(f"bad {name} {text!r}") from None
        return cls(**values)


#: CSV columns, in `EpisodeRecord` field order.
FIELDNAMES = tuple(f.name for f in fields(EpisodeRecord))
#: The columns of tables written before validation losses were recorded: still read, and
#: appended to in their own format, so an earlier comparison resumes where it stopped.
LEGACY_FIELDNAMES = tuple(name for name in FIELDNAMES if name != "loss_curve")


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    *,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    rng_seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean.

    Resamples with `scipy.stats.bootstrap` (``method="percentile"``) from
    ``np.random.default_rng(rng_seed)``: the same inputs give the same interval. A constant
    sample (a single value, or all values equal) returns ``(x, x)`` directly: every resample has
    that mean, and it avoids scipy's refusal of one-element samples.

    Args:
        values: the sample (1-D, finite, non-empty).
        n_resamples: bootstrap resamples.
        confidence: two-sided confidence level in (0, 1).
        rng_seed: seed of the resampling generator.

    Returns:
        ``(low, high)`` as Python floats.

    Raises:
        ValueError: an empty, non-1-D or non-finite sample, or a bad ``n_resamples`` /
            ``confidence``.

    Example::

        low, high = bootstrap_ci([1.0, 2.0, 3.0, 4.0, 5.0])  # about (1.8, 4.2)
    """
    sample = np.asarray(values, dtype=np.float64)
    if sample.ndim != 1 or sample.size == 0:
        raise ValueError(f"bootstrap_ci needs a non-empty 1-D sample, got shape {sample.shape}")
    if not np.all(np.isfinite(sample)):
        raise ValueError("bootstrap_ci needs finite values, got NaN or inf")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    if np.all(sample == sample[0]):
        return float(sample[0]), float(sample[0])
    result = scipy_stats.bootstrap(
        (sample,),
        np.mean,
        n_resamples=n_resamples,
        confidence_level=confidence,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(rng_seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def wilcoxon_p(differences: Sequence[float] | np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p-value of paired differences.

    Zero differences are dropped (scipy's ``zero_method="wilcox"``); scipy uses the exact null
    distribution up to 50 differences without ties or zeros, an exact permutation distribution
    up to 13 with them, and the normal approximation beyond. All differences zero (no pair
    differs) gives 1.0. A single pair gives 1.0 too; below six pairs the p-value is always at
    least 2 / 2**n >= 0.0625, so it can never be significant at 5%.

    Example::

        wilcoxon_p([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])  # 0.03125 = 2 / 2**6
    """
    d = np.asarray(differences, dtype=np.float64)
    if d.ndim != 1 or d.size == 0:
        raise ValueError(f"wilcoxon_p needs a non-empty 1-D sample, got shape {d.shape}")
    if not np.any(d != 0.0):
        return 1.0
    result = scipy_stats.wilcoxon(d, zero_method="wilcox", alternative="two-sided")
    return float(result.pvalue)


def verdict(ci: tuple[float, float], n_pairs: int) -> str:
    """``"better"`` / ``"worse"`` when the interval of the mean difference excludes zero and at
    least `MIN_PAIRS_FOR_VERDICT` pairs were played, else ``"no detectable difference at N
    seeds"`` (N = ``n_pairs``; here "seeds" are episode RNG seeds).

    Example::

        verdict((0.8, 2.1), 10)  # "better"
    """
    if n_pairs >= MIN_PAIRS_FOR_VERDICT:
        if ci[0] > 0.0:
            return "better"
        if ci[1] < 0.0:
            return "worse"
    return f"no detectable difference at {n_pairs} seeds"


def group_by_controller(records: Iterable[EpisodeRecord]) -> dict[str, list[EpisodeRecord]]:
    """Records per controller, controllers in order of first appearance, episodes sorted by
    index.

    Raises:
        ValueError: no records, or one controller has two records of the same episode index.
    """
    groups: dict[str, dict[int, EpisodeRecord]] = {}
    for record in records:
        episodes = groups.setdefault(record.controller, {})
        if record.episode_index in episodes:
            raise ValueError(
                f"controller {record.controller!r} has two records of episode "
                f"{record.episode_index}; each episode index must appear once per controller"
            )
        episodes[record.episode_index] = record
    if not groups:
        raise ValueError("no episode records to compare")
    return {name: [eps[i] for i in sorted(eps)] for name, eps in groups.items()}


@dataclass(frozen=True)
class ControllerSummary:
    """Per-controller means and bootstrap intervals.

    Attributes:
        controller: controller name.
        n_episodes: episodes played.
        outcome_mean, outcome_ci: mean outcome (percent) and its interval.
        final_accuracy_mean: mean last-epoch accuracy (percent).
        total_params_mean, total_params_ci: mean total parameters and interval.
        seed_params_mean, seed_params_ci: mean seed parameters and interval.
        return_mean, return_ci: mean RL return and interval; None when the controller has none.
        confidence: level of every interval.
        val_loss_mean, val_loss_ci: mean validation loss of the last epochs (`loss_outcome`)
            and its interval; None when an episode has no losses.
    """

    controller: str
    n_episodes: int
    outcome_mean: float
    outcome_ci: tuple[float, float]
    final_accuracy_mean: float
    total_params_mean: float
    total_params_ci: tuple[float, float]
    seed_params_mean: float
    seed_params_ci: tuple[float, float]
    return_mean: float | None
    return_ci: tuple[float, float] | None
    confidence: float = 0.95
    val_loss_mean: float | None = None
    val_loss_ci: tuple[float, float] | None = None


def _mean_ci(values: Sequence[float], **bootstrap: Any) -> tuple[float, tuple[float, float]]:
    return float(np.mean(np.asarray(values, dtype=np.float64))), bootstrap_ci(values, **bootstrap)


def _summarize_one(
    name: str, episodes: list[EpisodeRecord], **bootstrap: Any
) -> ControllerSummary:
    returns = [r.episode_return for r in episodes if r.episode_return is not None]
    if returns and len(returns) != len(episodes):
        raise ValueError(
            f"controller {name!r} has a return in {len(returns)} of {len(episodes)} episodes; "
            "a controller's return must be known in every episode or in none"
        )
    outcome_mean, outcome_ci = _mean_ci([r.outcome for r in episodes], **bootstrap)
    total_mean, total_ci = _mean_ci([r.total_params for r in episodes], **bootstrap)
    seed_mean, seed_ci = _mean_ci([r.seed_params for r in episodes], **bootstrap)
    return_mean, return_ci = _mean_ci(returns, **bootstrap) if returns else (None, None)
    losses = [loss_outcome(r) for r in episodes]
    loss_mean, loss_ci = (None, None) if None in losses else _mean_ci(losses, **bootstrap)
    return ControllerSummary(
        controller=name,
        n_episodes=len(episodes),
        outcome_mean=outcome_mean,
        outcome_ci=outcome_ci,
        final_accuracy_mean=float(np.mean([r.final_accuracy for r in episodes])),
        total_params_mean=total_mean,
        total_params_ci=total_ci,
        seed_params_mean=seed_mean,
        seed_params_ci=seed_ci,
        return_mean=return_mean,
        return_ci=return_ci,
        confidence=bootstrap["confidence"],
        val_loss_mean=loss_mean,
        val_loss_ci=loss_ci,
    )


def summarize(
    records: Iterable[EpisodeRecord],
    *,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    rng_seed: int = 0,
) -> list[ControllerSummary]:
    """Per-controller summary: episodes, mean and interval of outcome, parameters and return.

    Every interval is `bootstrap_ci` with a fresh generator from ``rng_seed``, so a summary does
    not depend on which other controllers are in the table.

    Raises:
        ValueError: no records, a duplicated episode index, or a controller whose return is
            known in some episodes only.

    Example::

        for s in summarize(records):
            print(s.controller, s.outcome_mean, s.outcome_ci)
    """
    bootstrap = {"n_resamples": n_resamples, "confidence": confidence, "rng_seed": rng_seed}
    groups = group_by_controller(records)
    return [_summarize_one(name, episodes, **bootstrap) for name, episodes in groups.items()]


@dataclass(frozen=True)
class PairedComparison:
    """``controller`` minus ``reference``, episode by episode.

    Attributes:
        controller, reference: the two controllers.
        n_pairs: episode indices both played.
        episode_indices: those indices, ascending.
        outcome_diff_mean, outcome_diff_ci: mean paired outcome difference (percentage points)
            and its bootstrap interval.
        p_value: two-sided Wilcoxon signed-rank p-value of the differences (see `wilcoxon_p`).
        verdict: ``"better"``, ``"worse"`` or ``"no detectable difference at N seeds"``.
        total_params_diff_mean, total_params_diff_ci: mean paired difference of total
            parameters and its interval.
        confidence: level of the intervals.
        val_loss_diff_mean, val_loss_diff_ci: mean paired difference of the validation loss
            of the last epochs (`loss_outcome`; negative: the controller's loss is lower) and
            its interval; None when an episode has no losses.
    """

    controller: str
    reference: str
    n_pairs: int
    episode_indices: tuple[int, ...]
    outcome_diff_mean: float
    outcome_diff_ci: tuple[float, float]
    p_value: float
    verdict: str
    total_params_diff_mean: float
    total_params_diff_ci: tuple[float, float]
    confidence: float = 0.95
    val_loss_diff_mean: float | None = None
    val_loss_diff_ci: tuple[float, float] | None = None


def _resolve_pairs(
    names: Sequence[str], reference: str, pairs: str | Sequence[tuple[str, str]] | None
) -> list[tuple[str, str]]:
    """(controller, reference) pairs to compare; names must all have played."""
    if pairs is None:
        if reference not in names:
            raise ValueError(
                f"reference controller {reference!r} has no episodes; played: {', '.join(names)}"
            )
        return [(name, reference) for name in names if name != reference]
    if isinstance(pairs, str):
        if pairs != "all":
            raise ValueError(f"unknown pairs {pairs!r}; accepted: None, 'all' or (a, b) pairs")
        # Later controllers minus earlier ones: with the reference played first, every row
        # reads the same way as the default comparison.
        return [(later, earlier) for earlier, later in itertools.combinations(names, 2)]
    resolved = [tuple(pair) for pair in pairs]
    for pair in resolved:
        if len(pair) != 2 or pair[0] == pair[1]:
            raise ValueError(f"bad pair {pair!r}; accepted: (controller, reference), distinct")
        unknown = [name for name in pair if name not in names]
        if unknown:
            played = ", ".join(names)
            raise ValueError(f"controller {unknown[0]!r} has no episodes; played: {played}")
    return resolved  # type: ignore[return-value]


def _paired_arrays(
    controller: list[EpisodeRecord], reference: list[EpisodeRecord]
) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Common episode indices and the outcome / total-parameter differences on them."""
    ref_by_index = {r.episode_index: r for r in reference}
    pairs = [(r, ref_by_index[r.episode_index]) for r in controller
             if r.episode_index in ref_by_index]
    if not pairs:
        raise ValueError(
            f"controller {controller[0].controller!r} shares no episode index with "
            f"{reference[0].controller!r}; pairing needs the same evaluation episodes"
        )
    for mine, theirs in pairs:
        # The same index must mean the same episode, or the pairing compares unlike with unlike.
        if (mine.episode_rng_seed, mine.host) != (theirs.episode_rng_seed, theirs.host):
            raise ValueError(
                f"episode {mine.episode_index} differs between {mine.controller!r} "
                f"(rng seed {mine.episode_rng_seed}, host {mine.host!r}) and "
                f"{theirs.controller!r} (rng seed {theirs.episode_rng_seed}, host {theirs.host!r})"
            )
    outcome = np.array([m.outcome - t.outcome for m, t in pairs], dtype=np.float64)
    params = np.array([m.total_params - t.total_params for m, t in pairs], dtype=np.float64)
    return [m.episode_index for m, _ in pairs], outcome, params


def _paired_losses(
    controller: list[EpisodeRecord], reference: list[EpisodeRecord], indices: Sequence[int],
    **bootstrap: Any,
) -> tuple[float | None, tuple[float, float] | None]:
    """Mean and interval of the paired validation-loss differences (None without losses)."""
    mine = {r.episode_index: loss_outcome(r) for r in controller}
    theirs = {r.episode_index: loss_outcome(r) for r in reference}
    pairs = [(mine[i], theirs[i]) for i in indices]
    if any(m is None or t is None for m, t in pairs):
        return None, None
    diffs = np.array([m - t for m, t in pairs], dtype=np.float64)  # type: ignore[operator]
    return float(np.mean(diffs)), bootstrap_ci(diffs, **bootstrap)


def paired_differences(
    records: Iterable[EpisodeRecord],
    reference: str = "static",
    pairs: str | Sequence[tuple[str, str]] | None = None,
    *,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    rng_seed: int = 0,
) -> list[PairedComparison]:
    """Paired comparisons, matched by episode index.

    Args:
        records: the episode table.
        reference: the controller every other one is compared with (when ``pairs`` is None).
        pairs: None (each controller vs ``reference``), ``"all"`` (every pair; later-appearing
            controller minus earlier one) or explicit ``(controller, reference)`` pairs.
        n_resamples, confidence, rng_seed: of the bootstrap intervals.

    Returns:
        One `PairedComparison` per pair; empty when only the reference played. Only episode
        indices both controllers played are used.

    Raises:
        ValueError: unknown controller or reference, no common episode index (naming the
            controller), or a paired index played with different rng seeds or hosts.

    Example::

        for c in paired_differences(records, reference="static"):
            print(c.controller, c.outcome_diff_mean, c.outcome_diff_ci, c.p_value, c.verdict)
    """
    bootstrap = {"n_resamples": n_resamples, "confidence": confidence, "rng_seed": rng_seed}
    groups = group_by_controller(records)
    comparisons = []
    for name, ref in _resolve_pairs(list(groups), reference, pairs):
        indices, outcome_d, params_d = _paired_arrays(groups[name], groups[ref])
        ci = bootstrap_ci(outcome_d, **bootstrap)
        loss_mean, loss_ci = _paired_losses(groups[name], groups[ref], indices, **bootstrap)
        comparisons.append(
            PairedComparison(
                controller=name,
                reference=ref,
                n_pairs=len(indices),
                episode_indices=tuple(indices),
                outcome_diff_mean=float(np.mean(outcome_d)),
                outcome_diff_ci=ci,
                p_value=wilcoxon_p(outcome_d),
                verdict=verdict(ci, len(indices)),
                total_params_diff_mean=float(np.mean(params_d)),
                total_params_diff_ci=bootstrap_ci(params_d, **bootstrap),
                confidence=confidence,
                val_loss_diff_mean=loss_mean,
                val_loss_diff_ci=loss_ci,
            )
        )
    return comparisons


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _row(cells: Iterable[object]) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def _fmt_ci(mean: float, ci: tuple[float, float], fmt: str) -> str:
    return f"{mean:{fmt}} [{ci[0]:{fmt}}, {ci[1]:{fmt}}]"


def _fmt_p(p: float) -> str:
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def _controller_rows(summaries: Sequence[ControllerSummary]) -> list[str]:
    ci = f"[{summaries[0].confidence:.0%} CI]"
    rows = [
        _row(["controller", "episodes", f"outcome (%) {ci}", "final acc. (%)",
              f"total params {ci}", f"seed params {ci}", f"return {ci}"]),
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        ret = "n/a" if s.return_ci is None else _fmt_ci(s.return_mean, s.return_ci, ".2f")
        rows.append(_row([
            _cell(s.controller),
            s.n_episodes,
            _fmt_ci(s.outcome_mean, s.outcome_ci, ".2f"),
            f"{s.final_accuracy_mean:.2f}",
            _fmt_ci(s.total_params_mean, s.total_params_ci, ",.0f"),
            _fmt_ci(s.seed_params_mean, s.seed_params_ci, ",.0f"),
            ret,
        ]))
    return rows


def _comparison_rows(comparisons: Sequence[PairedComparison]) -> list[str]:
    ci = f"[{comparisons[0].confidence:.0%} CI]"
    rows = [
        _row(["controller", "reference", "pairs", f"Δ outcome (pp) {ci}", "p (Wilcoxon)",
              "verdict", f"Δ total params {ci}"]),
        "|---|---|---:|---:|---:|---|---:|",
    ]
    for c in comparisons:
        rows.append(_row([
            _cell(c.controller),
            _cell(c.reference),
            c.n_pairs,
            _fmt_ci(c.outcome_diff_mean, c.outcome_diff_ci, "+.2f"),
            _fmt_p(c.p_value),
            c.verdict,
            _fmt_ci(c.total_params_diff_mean, c.total_params_diff_ci, "+,.0f"),
        ]))
    return rows


def _loss_rows(
    summaries: Sequence[ControllerSummary], comparisons: Sequence[PairedComparison]
) -> list[str]:
    """The validation-loss section: per controller, and paired against the reference."""
    known = [s for s in summaries if s.val_loss_mean is not None]
    if not known:
        return []
    ci = f"[{known[0].confidence:.0%} CI]"
    lines = ["", "## Validation loss", "",
             f"Mean validation loss of the last {OUTCOME_EPOCHS} epochs (per token for a "
             "language model; lower is better).", "",
             _row(["controller", f"val loss {ci}"]), "|---|---:|"]
    lines += [_row([_cell(s.controller), _fmt_ci(s.val_loss_mean, s.val_loss_ci, ".4f")])
              for s in known]  # type: ignore[arg-type]
    paired = [c for c in comparisons if c.val_loss_diff_mean is not None]
    if paired:
        lines += ["", _row(["controller", "reference", "pairs", f"Δ val loss {ci}"]),
                  "|---|---|---:|---:|"]
        lines += [_row([_cell(c.controller), _cell(c.reference), c.n_pairs,
                        _fmt_ci(c.val_loss_diff_mean, c.val_loss_diff_ci, "+.4f")])
                  for c in paired]  # type: ignore[arg-type]
    return lines


def markdown_table(
    summaries: Sequence[ControllerSummary], comparisons: Sequence[PairedComparison]
) -> str:
    """A Markdown report: a per-controller table, then a table of paired differences, then
    (when the episodes recorded them) the validation losses.

    Outcomes and differences are in percent / percentage points with two decimals, parameters
    are whole numbers with thousands separators, p-values have three decimals (scientific below
    0.001). Controllers without a return show ``n/a``.

    Example::

        Path("compare/report.md").write_text(markdown_table(summaries, comparisons))
    """
    lines = ["## Controllers", ""]
    lines += _controller_rows(summaries) if summaries else ["No episodes."]
    lines.append("")
    lines += [
        "## Paired differences",
        "",
        "Controller minus reference on the same evaluation episodes (matched by episode index). "
        f"A verdict needs an interval that excludes zero and at least {MIN_PAIRS_FOR_VERDICT} "
        "pairs.",
        "",
    ]
    lines += _comparison_rows(comparisons) if comparisons else ["No paired comparison."]
    lines += _loss_rows(summaries, comparisons)
    return "\n".join(lines) + "\n"


def _plain(value: Any) -> Any:
    """JSON-ready copy: tuples to lists, numpy scalars to Python numbers."""
    if isinstance(value, dict):
        return {key: _plain(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def summary_json(
    summaries: Sequence[ControllerSummary], comparisons: Sequence[PairedComparison]
) -> dict[str, Any]:
    """The report as a plain dict (``json.dumps``-able): ``controllers``, ``comparisons`` and
    ``min_pairs_for_verdict``; intervals are ``[low, high]`` lists, a missing return is null.

    Example::

        Path("compare/summary.json").write_text(json.dumps(summary_json(s, c), indent=2))
    """
    return {
        "controllers": [_plain(dataclasses.asdict(s)) for s in summaries],
        "comparisons": [_plain(dataclasses.asdict(c)) for c in comparisons],
        "min_pairs_for_verdict": MIN_PAIRS_FOR_VERDICT,
    }


def write_records_csv(path: str | os.PathLike[str], records: Iterable[EpisodeRecord]) -> None:
    """Write the whole table atomically: a temporary file next to ``path``, then a rename, so a
    crash mid-write never leaves a truncated table.

    Example::

        write_records_csv("compare/episodes.csv", records)
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDNAMES, lineterminator="\n")
            writer.writeheader()
            writer.writerows(record.to_row() for record in records)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _check_header(path: Path, header: Sequence[str] | None) -> tuple[str, ...]:
    """The file's columns: `FIELDNAMES`, or `LEGACY_FIELDNAMES` for an older table."""
    if header is None or tuple(header) not in (FIELDNAMES, LEGACY_FIELDNAMES):
        raise ValueError(
            f"malformed records file {path}: header {list(header or [])} is not the episode "
            f"record header ({', '.join(FIELDNAMES)})"
        )
    return tuple(header)


def append_record_csv(path: str | os.PathLike[str], record: EpisodeRecord) -> None:
    """Append one record (header first when the file is new or empty), flushed to disk so the
    episodes finished before a crash are kept. A table written before losses were recorded
    keeps its columns (the record's losses are left out).

    Raises:
        ValueError: the existing file has another header.

    Example::

        append_record_csv("compare/episodes.csv", record)
    """
    path = Path(path)
    new = not path.exists() or path.stat().st_size == 0
    columns = FIELDNAMES
    if not new:
        with path.open(newline="", encoding="utf-8") as f:
            columns = _check_header(path, next(csv.reader(f), None))
    with path.open("a", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n",
                                extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerow(record.to_row())
        f.flush()
        os.fsync(f.fileno())


def read_records_csv(path: str | os.PathLike[str]) -> list[EpisodeRecord]:
    """Read a table written by `write_records_csv` / `append_record_csv`.

    Raises:
        ValueError: one line naming the file (and the line) when the header or a row is
            malformed.

    Example::

        records = read_records_csv("compare/episodes.csv")
    """
    path = Path(path)
    records = []
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        try:
            _check_header(path, reader.fieldnames)
            for row in reader:
                try:
                    records.append(EpisodeRecord.from_row(row))
                except ValueError as err:
                    raise ValueError(
                        f"malformed records file {path}: line {reader.line_num}: {err}"
                    ) from None
        except csv.Error as err:
            raise ValueError(f"malformed records file {path}: {err}") from None
    return records
