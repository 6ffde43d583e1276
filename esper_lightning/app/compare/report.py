"""The report of a comparison: every metric summarised per controller and paired against a
reference, written as Markdown and JSON.

What is summarised, paired, and how it is shown comes from `records.METRICS`; the statistics
(intervals, the paired test, the verdict) from `app.compare.stats`. The functions are pure: they
take `EpisodeRecord` rows (or their `app.compare.table`: each section is a group-by over it) and
return summaries, paired comparisons, a Markdown report and a
JSON-ready dict.

Example::

    records = read_records_csv("compare/episodes.csv")
    summaries = summarize(records)
    comparisons = paired_differences(records, reference="static")
    print(markdown_table(summaries, comparisons))

When the evaluation episodes have more than one budget (``--budget_scales``), `per_budget` gives
the judged metric's tables again on each budget's episodes (`table.by_budget` groups
them): every controller's mean with its interval and its paired difference to the reference.
Their comparisons, over every budget, are one family of the Holm correction, so a verdict in
a budget's table means the same as one in the main table.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from esper_lightning.app.compare.records import BUDGET, METRICS, OUTCOME, Metric
from esper_lightning.app.compare.stats import (
    ALPHA,
    CONFIDENCE,
    POWER,
    Estimate,
    estimate,
    holm,
    min_detectable_effect,
    verdict,
    wilcoxon_p,
)
from esper_lightning.app.compare.table import (
    Records,
    by_budget,
    by_controller,
    episode_table,
    pair_episodes,
    records_by_controller,
    shared,
)


@dataclass(frozen=True)
class ControllerSummary:
    """Per-controller means and intervals of every summarised metric.

    Attributes:
        controller: controller name.
        n_episodes: episodes played.
        metrics: by metric name, its mean (and interval, for a ``summary="ci"`` metric); None
            when the controller's episodes lack it (an optional metric).
        confidence: level of every interval.
    """

    controller: str
    n_episodes: int
    metrics: dict[str, Estimate | None]
    confidence: float = CONFIDENCE


@dataclass(frozen=True)
class PairedComparison:
    """``controller`` minus ``reference``, episode by episode.

    Attributes:
        controller, reference: the two controllers.
        n_pairs: episode indices both played.
        episode_indices: those indices, ascending.
        differences: by paired metric name, the mean paired difference and its interval; None
            when an episode lacks the metric.
        outcome: the metric the test and the verdict judge.
        p_value: two-sided Wilcoxon signed-rank p-value of its differences (`stats.wilcoxon_p`).
        p_holm: ``p_value`` Holm-adjusted over every comparison of the table (`stats.holm`).
        mde: minimum detectable effect of the outcome at this many pairs and this spread of
            differences (`stats.min_detectable_effect`); None below two pairs.
        verdict: ``"better"``, ``"worse"`` or ``"no detectable difference at N episodes"``
            (`stats.verdict`: the interval excludes zero and ``p_holm`` < `stats.ALPHA`; the
            reason in brackets when only one of the two holds).
        confidence: level of the intervals.
    """

    controller: str
    reference: str
    n_pairs: int
    episode_indices: tuple[int, ...]
    differences: dict[str, Estimate | None]
    outcome: str
    p_value: float
    p_holm: float
    mde: float | None
    verdict: str
    confidence: float = CONFIDENCE


@dataclass(frozen=True)
class Scope:
    """What applies to one comparison: which metrics of `METRICS` its report and plots show
    (`Metric.shown`), and what the task's loss is per. The default shows everything.

    Attributes:
        budgeted: the episodes ran under a compute budget.
        flops_differ: the controllers' training FLOPs differ in some episode.
        bits: the task's loss is read in bits (text: bits per byte, the field's unit).
        example: what the loss is per (``"byte"``, ``"image"``), in the metrics' descriptions.

    Example::

        scope = Scope.of(records, bits=False, example="image")  # a CIFAR-10 run
        markdown_table(summaries, comparisons, scope=scope)
    """

    budgeted: bool = True
    flops_differ: bool = True
    bits: bool = True
    example: str = "example"

    @classmethod
    def of(cls, records: Records, *, bits: bool, example: str) -> Scope:
        """The scope of ``records``: budgeted when an episode had a budget, FLOPs differing
        when two controllers' training FLOPs differ on one episode index."""
        table = episode_table(records)
        flops = table.groupby("episode_index")["train_flops"].nunique(dropna=False)
        return cls(budgeted=bool(table[BUDGET].notna().any()),
                   flops_differ=bool((flops > 1).any()), bits=bits, example=example)

    def shows(self, metric: Metric) -> bool:
        """Whether a report of this comparison shows ``metric``."""
        return {"always": True, "budget": self.budgeted,
                "compute": self.budgeted or self.flops_differ, "bits": self.bits}[metric.shown]


#: Shows every metric (a report built without knowing its task).
EVERYTHING = Scope()


def coinciding(records: Records) -> list[tuple[str, ...]]:
    """Groups of controllers (two or more, in table order) that played the same episodes
    identically: every value and curve of every episode equal, wall time aside. A controller
    that never acted (a heuristic that germinated nothing) coincides with ``static``; a report
    says so rather than leave a reader to compare identical rows.

    Example::

        coinciding(records)  # [("static", "heuristic")]
    """
    def played(episodes: list[Any]) -> dict[int, dict[str, Any]]:
        return {r.episode_index: {k: v for k, v in r.values.items() if k != "wall_seconds"}
                for r in episodes}

    groups: list[tuple[str, dict[int, dict[str, Any]]]] = []
    members: dict[str, list[str]] = {}
    for controller, episodes in records_by_controller(records).items():
        table = played(episodes)
        twin = next((first for first, other in groups if other == table), None)
        if twin is None:
            groups.append((controller, table))
            members[controller] = [controller]
        else:
            members[twin].append(controller)
    return [tuple(m) for m in members.values() if len(m) > 1]


def summarized() -> list[Metric]:
    """The metrics summarised per controller, in table order."""
    return [m for m in METRICS.values() if m.summary]


def paired() -> list[Metric]:
    """The metrics with paired differences, in table order."""
    return [m for m in METRICS.values() if m.paired]


def _known(metric: Metric, values: list[Any], what: str) -> list[Any] | None:
    """``values`` when all are known, None when none is (an optional metric)."""
    missing = sum(v is None for v in values)
    if missing and missing != len(values):
        raise ValueError(f"{what} has {metric.name} in {len(values) - missing} of {len(values)} "
                         f"episodes; it must be known in every episode or in none")
    return None if missing else values


def summarize(records: Records, *, confidence: float = CONFIDENCE) -> list[ControllerSummary]:
    """Per controller: episodes, and the mean (and interval) of every summarised metric.

    Raises:
        ValueError: no records, a duplicated episode index, or a controller whose optional
            metric is known in some episodes only.

    Example::

        for s in summarize(records):
            print(s.controller, s.metrics["outcome"].mean, s.metrics["outcome"].ci)
    """
    summaries = []
    for name, episodes in by_controller(records).items():
        estimates: dict[str, Estimate | None] = {}
        for m in summarized():
            values = _known(m, episodes[m.name].tolist(), f"controller {name!r}")
            estimates[m.name] = None if values is None else estimate(
                values, interval=m.summary == "ci", confidence=confidence)
        summaries.append(ControllerSummary(name, len(episodes), estimates, confidence))
    return summaries


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


def _differences(metric: Metric, pairs: pd.DataFrame) -> np.ndarray | None:
    """Per-pair ``controller - reference`` of one metric (``pairs`` as `table.pair_episodes` joins
    them); None when an episode lacks it.

    The one place a paired value is formed: a metric of two episodes at once (one read from
    both controllers' curves) would be computed here.
    """
    mine = _known(metric, pairs[metric.name].tolist(),
                  f"controller {pairs['controller'].iloc[0]!r}")
    theirs = _known(metric, pairs[f"{metric.name}_ref"].tolist(),
                    f"controller {pairs['controller_ref'].iloc[0]!r}")
    if mine is None or theirs is None:
        return None
    return np.array([m - t for m, t in zip(mine, theirs, strict=True)], dtype=np.float64)


def paired_differences(
    records: Records,
    reference: str = "static",
    pairs: str | Sequence[tuple[str, str]] | None = None,
    *,
    outcome: str = OUTCOME,
    confidence: float = CONFIDENCE,
) -> list[PairedComparison]:
    """Paired comparisons of every paired metric, matched by episode index; the comparisons
    returned are one family: their outcome p-values are Holm-adjusted together.

    Args:
        records: the episode table.
        reference: the controller every other one is compared with (when ``pairs`` is None).
        pairs: None (each controller vs ``reference``), ``"all"`` (every pair; later-appearing
            controller minus earlier one) or explicit ``(controller, reference)`` pairs.
        outcome: the paired metric the test and the verdict judge, in its better direction.
        confidence: level of the intervals.

    Returns:
        One `PairedComparison` per pair; empty when only the reference played. Only episode
        indices both controllers played are used.

    Raises:
        ValueError: unknown controller or reference, no common episode index (naming the
            controller), or a paired index played with different rng seeds or hosts.

    Example::

        for c in paired_differences(records, reference="static"):
            print(c.controller, c.differences["outcome"], c.p_holm, c.verdict)
    """
    judged = METRICS[outcome]
    if not judged.paired or judged.better is None:
        raise ValueError(f"outcome {outcome!r} must be a paired metric with a better direction")
    groups = by_controller(records)
    resolved = _resolve_pairs(list(groups), reference, pairs)
    matched = [pair_episodes(groups[name], groups[ref]) for name, ref in resolved]
    diffs = [{m.name: _differences(m, pairs_) for m in paired()} for pairs_ in matched]
    for (name, ref), d in zip(resolved, diffs, strict=True):
        if d[outcome] is None:  # an optional judged metric must be known in every episode
            raise ValueError(f"{outcome} is missing in the episodes of {name!r} or {ref!r}; "
                             "it cannot judge them")
    p_values = [wilcoxon_p(d[outcome]) for d in diffs]  # type: ignore[arg-type]
    comparisons = []
    for (name, ref), pairs_, d, p, p_holm in zip(resolved, matched, diffs, p_values,
                                                 holm(p_values), strict=True):
        estimates = {key: None if v is None else estimate(v, confidence=confidence)
                     for key, v in d.items()}
        ci = estimates[outcome].ci  # type: ignore[union-attr]
        comparisons.append(PairedComparison(
            controller=name, reference=ref, n_pairs=len(pairs_),
            episode_indices=tuple(pairs_["episode_index"].tolist()),
            differences=estimates, outcome=outcome, p_value=p, p_holm=p_holm,
            mde=min_detectable_effect(d[outcome]),  # type: ignore[arg-type]
            verdict=verdict(ci, p_holm, len(pairs_), judged.better),  # type: ignore[arg-type]
            confidence=confidence,
        ))
    return comparisons


@dataclass(frozen=True)
class BudgetTable:
    """The judged metric on the evaluation episodes of one budget.

    Attributes:
        budget: the episodes' budget in training FLOPs.
        outcome: the judged metric.
        summaries: per controller, over this budget's episodes (`summarize`).
        comparisons: paired with the reference on them (`paired_differences`), Holm-adjusted
            with every other budget's comparisons.
    """

    budget: float
    outcome: str
    summaries: list[ControllerSummary]
    comparisons: list[PairedComparison]


def per_budget(
    records: Records,
    reference: str = "static",
    pairs: str | Sequence[tuple[str, str]] | None = None,
    *,
    outcome: str = OUTCOME,
    confidence: float = CONFIDENCE,
) -> list[BudgetTable]:
    """`summarize` and `paired_differences` (arguments as there) per episode budget, smallest
    budget first; empty when the episodes have one budget or none. The comparisons of every
    budget are one Holm family: their ``p_holm`` and verdicts are adjusted together.

    Example::

        for table in per_budget(records, "static", outcome="final_bits"):
            print(table.budget, [c.verdict for c in table.comparisons])
    """
    groups = by_budget(records)
    if len(groups) < 2:
        return []
    tables = [BudgetTable(budget, outcome,  # type: ignore[arg-type]
                          summarize(episodes, confidence=confidence),
                          paired_differences(episodes, reference, pairs, outcome=outcome,
                                             confidence=confidence))
              for budget, episodes in groups.items()]
    adjusted = iter(holm([c.p_value for t in tables for c in t.comparisons]))
    better = METRICS[outcome].better
    for table in tables:
        for k, c in enumerate(table.comparisons):
            p = next(adjusted)
            ci = c.differences[outcome].ci  # type: ignore[union-attr]
            table.comparisons[k] = dataclasses.replace(
                c, p_holm=p, verdict=verdict(ci, p, c.n_pairs, better))  # type: ignore[arg-type]
    return tables

# --- Markdown ---------------------------------------------------------------------------------
def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _row(cells: Iterable[object]) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def _fmt(value: Estimate | None, fmt: str) -> str:
    """``mean [low, high]`` (``mean`` without an interval), ``n/a`` when missing."""
    if value is None:
        return "n/a"
    if value.ci is None:
        return f"{value.mean:{fmt}}"
    return f"{value.mean:{fmt}} [{value.ci[0]:{fmt}}, {value.ci[1]:{fmt}}]"


def _fmt_p(p: float) -> str:
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def _header(metric: Metric, ci: str, difference: bool = False, mde: bool = False) -> str:
    """``label (unit) [95% CI]``; a difference is ``Δ label``, in points for a percentage; its
    minimum detectable effect ``MDE (unit)``."""
    unit = "pp" if (difference or mde) and metric.unit == "%" else metric.unit
    text = "MDE" if mde else f"Δ {metric.label}" if difference else metric.label
    text += f" ({unit})" if unit else ""
    return f"{text} {ci}" if not mde and (difference or metric.summary == "ci") else text


def _controller_rows(summaries: Sequence[ControllerSummary], metrics: Sequence[Metric],
                     with_episodes: bool) -> list[str]:
    """Per-controller table of ``metrics``; a controller that lacks them all is left out."""
    shown = [s for s in summaries if any(s.metrics[m.name] is not None for m in metrics)]
    if not shown:
        return []
    ci = f"[{shown[0].confidence:.0%} CI]"
    episodes = ["episodes"] if with_episodes else []
    head = ["controller", *episodes, *(_header(m, ci) for m in metrics)]
    rows = [_row(head), "|---|" + "---:|" * (len(head) - 1)]
    for s in shown:
        counts = [s.n_episodes] if with_episodes else []
        rows.append(_row([_cell(s.controller), *counts,
                          *(_fmt(s.metrics[m.name], m.fmt) for m in metrics)]))
    return rows


def _paired_rows(comparisons: Sequence[PairedComparison], metrics: Sequence[Metric],
                 with_test: bool) -> list[str]:
    """Paired table of ``metrics`` (after the outcome, ``with_test``: its p-values, verdict and
    minimum detectable effect); a comparison that lacks them all is left out."""
    shown = [c for c in comparisons if any(c.differences[m.name] is not None for m in metrics)]
    if not shown:
        return []
    ci = f"[{shown[0].confidence:.0%} CI]"
    head, align = ["controller", "reference", "pairs"], ["---", "---", "---:"]
    for m in metrics:
        head.append(_header(m, ci, difference=True))
        align.append("---:")
        if with_test and m.name == shown[0].outcome:
            head += ["p (Wilcoxon)", "p (Holm)", "verdict", _header(m, "", mde=True)]
            align += ["---:", "---:", "---", "---:"]
    rows = [_row(head), "|" + "|".join(align) + "|"]
    for c in shown:
        cells: list[object] = [_cell(c.controller), _cell(c.reference), c.n_pairs]
        for m in metrics:
            cells.append(_fmt(c.differences[m.name], "+" + m.fmt))
            if with_test and m.name == c.outcome:
                mde = "n/a" if c.mde is None else f"{c.mde:{m.fmt}}"
                cells += [_fmt_p(c.p_value), _fmt_p(c.p_holm), c.verdict, mde]
        rows.append(_row(cells))
    return rows


def _sentence(metric: Metric, scope: Scope) -> str:
    text = metric.describe(scope.example) if metric.description else metric.label
    better = f" ({metric.better} is better)" if metric.better else ""
    return f"{text[0].upper()}{text[1:]}{better}."


def _section(title: str, summaries: Sequence[ControllerSummary],
             comparisons: Sequence[PairedComparison], judged: str, scope: Scope) -> list[str]:
    """A metric section of its own: per controller, then paired, of the metrics in ``scope``
    that some controller has (nothing when none has any). The judged metric is in the main
    tables instead."""
    metrics = [m for m in summarized() if m.section == title and m.name != judged
               and scope.shows(m) and any(s.metrics[m.name] is not None for s in summaries)]
    table = _controller_rows(summaries, metrics, with_episodes=False)
    if not table:
        return []
    lines = ["", f"## {title}", "", " ".join(_sentence(m, scope) for m in metrics), "", *table]
    differences = _paired_rows(comparisons, [m for m in metrics if m.paired], with_test=False)
    return lines + (["", *differences] if differences else [])


def markdown_table(
    summaries: Sequence[ControllerSummary], comparisons: Sequence[PairedComparison], *,
    scope: Scope = EVERYTHING, same: Sequence[Sequence[str]] = (),
) -> str:
    """A Markdown report: a per-controller table, then a table of paired differences with the
    judged metric's p-value and verdict (the comparisons' ``outcome``, first in both tables),
    then a section per metric ``section`` (e.g. the validation losses, when the episodes
    recorded them). Only the metrics ``scope`` shows are in it; each group of ``same``
    (`coinciding` controllers) is named under the first table.

    Values use their metric's format (differences signed), a difference of percentages is in
    percentage points, p-values have three decimals (scientific below 0.001); a value a
    controller lacks shows ``n/a``.

    Example::

        Path("compare/report.md").write_text(markdown_table(summaries, comparisons))
    """
    judged = comparisons[0].outcome if comparisons else OUTCOME
    # The judged metric leads the main tables, whatever its section.
    main = sorted((m for m in summarized()
                   if (not m.section and scope.shows(m)) or m.name == judged),
                  key=lambda m: m.name != judged)
    lines = ["## Controllers", ""]
    lines += _controller_rows(summaries, main, with_episodes=True) or ["No episodes."]
    for group in same:
        names = " and ".join(", ".join(group[1:]).rsplit(", ", 1))
        lines += ["", f"{names} played exactly as {group[0]} in every episode (every value and "
                      "curve equal, wall time aside): their rows, differences and curves "
                      "coincide."]
    lines += [
        "",
        "## Paired differences",
        "",
        "Controller minus reference on the same evaluation episodes (matched by episode index); "
        "intervals are Student t intervals of the mean difference. A verdict says better or "
        "worse only when the interval excludes zero and the Wilcoxon signed-rank p-value, "
        f"Holm-adjusted over this table's comparisons, is below {ALPHA:g}. MDE is the minimum "
        f"detectable effect: the mean difference a paired t test at {ALPHA:g} would detect with "
        f"probability {POWER:g} at this many pairs, (t(1 - {ALPHA:g}/2, n-1) + t({POWER:g}, n-1)) "
        "× sd of the differences / √n; a smaller real difference is likely to be reported as no "
        "detectable difference.",
        "",
    ]
    lines += _paired_rows(comparisons, [m for m in main if m.paired], with_test=True) or [
        "No paired comparison."]
    for title in dict.fromkeys(m.section for m in summarized() if m.section):
        lines += _section(title, summaries, comparisons, judged, scope)
    return "\n".join(lines) + "\n"


def budget_markdown(tables: Sequence[BudgetTable], scope: Scope = EVERYTHING) -> list[str]:
    """A Markdown section of `per_budget`'s tables (nothing when there are none): per budget,
    the judged metric per controller and its paired differences with their test."""
    if not tables:
        return []
    judged = METRICS[tables[0].outcome]
    lines = ["", "## Per budget", "",
             f"{_sentence(judged, scope)} The tables above again, on the evaluation episodes "
             "of each budget; p-values are Holm-adjusted over the comparisons of every budget's "
             "table."]
    for table in tables:
        lines += ["", f"### Budget {table.budget:.3g} FLOPs", ""]
        lines += _controller_rows(table.summaries, [judged], with_episodes=True)
        lines += ["", *(_paired_rows(table.comparisons, [judged], with_test=True)
                        or ["No paired comparison."])]
    return lines

# --- JSON -------------------------------------------------------------------------------------
def _flat(estimates: dict[str, Estimate | None], suffix: str) -> dict[str, Any]:
    """``<name><suffix>_mean`` and (for an interval) ``<name><suffix>_ci`` of each metric."""
    flat: dict[str, Any] = {}
    for name, value in estimates.items():
        flat[f"{name}{suffix}_mean"] = None if value is None else value.mean
        if suffix or METRICS[name].summary == "ci":
            flat[f"{name}{suffix}_ci"] = None if value is None or value.ci is None else list(
                value.ci)
    return flat


def summary_json(
    summaries: Sequence[ControllerSummary], comparisons: Sequence[PairedComparison]
) -> dict[str, Any]:
    """The report as a plain dict (``json.dumps``-able): ``controllers`` (``<metric>_mean``,
    ``<metric>_ci``), ``comparisons`` (``<metric>_diff_mean``, ``<metric>_diff_ci``, the
    outcome's ``p_value``, ``p_holm``, ``verdict`` and minimum detectable effect ``mde``), and
    the ``alpha`` and ``power`` of the verdict and the MDE; intervals are ``[low, high]``
    lists, a missing value is null.

    Example::

        Path("compare/summary.json").write_text(json.dumps(summary_json(s, c), indent=2))
    """
    controllers = [{"controller": s.controller, "n_episodes": s.n_episodes,
                    **_flat(s.metrics, ""), "confidence": s.confidence} for s in summaries]
    pairs = [{"controller": c.controller, "reference": c.reference, "n_pairs": c.n_pairs,
              "episode_indices": list(c.episode_indices), **_flat(c.differences, "_diff"),
              "p_value": c.p_value, "p_holm": c.p_holm, "verdict": c.verdict, "mde": c.mde,
              "confidence": c.confidence}
             for c in comparisons]
    return {"controllers": controllers, "comparisons": pairs,
            "alpha": ALPHA, "power": POWER}


def budget_json(tables: Sequence[BudgetTable]) -> list[dict[str, Any]]:
    """`per_budget`'s tables as plain data (``summary.json``'s ``per_budget``): per budget,
    ``budget_flops`` and its ``controllers`` and ``comparisons`` as in `summary_json`."""
    return [{"budget_flops": t.budget, **summary_json(t.summaries, t.comparisons)}
            for t in tables]


def cost_markdown(costs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What making each arm cost before the comparison (`ArmKind.cost`: a policy's training, a
    lookup's tuning), and, for a policy beside a lookup, how many new settings (each needing
    the lookup's tuning again, the policy none) its one-off training amortises over; nothing
    when no arm has a known cost."""
    if not costs:
        return []
    lines = ["", "## What each arm cost to make", "",
             "Episodes played, their training FLOPs and wall time before this comparison: a "
             "policy's training (once, for every setting it plays), a lookup's tuning (again "
             "for each new budget range, host or text it is tuned for).", "",
             "| arm | made by | episodes | training FLOPs | wall time (s) |",
             "|---|---|---:|---:|---:|"]
    for arm, cost in costs.items():
        lines.append(f"| {_cell(arm)} | {cost['made_by']} | {cost.get('episodes', 0):,.0f} | "
                     f"{cost.get('train_flops', 0.0):.3g} | {cost.get('wall_seconds', 0.0):,.0f} |")
    tuned = {a: c for a, c in costs.items() if c["made_by"] == "tuning" and c.get("train_flops")}
    trained = {a: c for a, c in costs.items()  # a cost unrecorded (0) amortises nothing
               if c["made_by"] != "tuning" and c.get("train_flops")}
    for policy, p in trained.items():
        for lookup, t in tuned.items():
            lines.append(f"\n{_cell(policy)}'s training costs as much compute as tuning "
                         f"{_cell(lookup)} for {p.get('train_flops', 0.0) / t['train_flops']:.1f} "
                         "settings: past that many new settings, the policy is the cheaper.")
    return lines


@dataclass(frozen=True)
class GroupComparison:
    """A group of arms (several training seeds of one method) minus the reference: per
    episode, the mean of the members' judged metric minus the reference's; or, for a pair of
    groups (``paired``), member i minus member i of the other group, averaged.

    Attributes:
        group, members, reference: the group's name, its arms, and the reference arm (or, for
            a pair, the other group's name).
        n_pairs: episodes every member and the reference (or every member of both) played.
        difference: the mean paired difference and its interval.
        p_value, p_holm: Wilcoxon signed-rank p of the differences, Holm-adjusted over the
            groups of the table.
        verdict: as `PairedComparison.verdict`, read off ``seed_ci``: "better" holds for the
            method, not only for these training seeds.
        member_means: each member's own mean difference on those episodes (keyed by the
            member, or ``"A_i − B_i"`` for a pair).
        spread: the standard deviation of ``member_means``: how much the method's result
            depends on which training seed one gets.
        seed_ci: the interval of the mean difference over training seeds *and* episodes (a
            t interval of crossed random effects, `seed_and_episode_interval`); ``difference.ci``
            holds the members fixed.
        paired: a pair of groups (`CompareConfig.group_pairs`), not a group against the
            reference.
    """

    group: str
    members: tuple[str, ...]
    reference: str
    n_pairs: int
    difference: Estimate
    p_value: float
    p_holm: float
    verdict: str
    member_means: dict[str, float]
    spread: float
    seed_ci: tuple[float, float] | None = None
    paired: bool = False


def group_differences(records: Records, groups: Mapping[str, Sequence[str]],
                      reference: str, outcome: str, pairs: Sequence[tuple[str, str]] = (),
                      confidence: float = CONFIDENCE) -> list[GroupComparison]:
    """Every group of arms against ``reference`` on ``outcome``, paired by episode (the
    episodes every member and the reference played), then each of ``pairs`` ``(A, B)`` of
    groups: member i of A minus member i of B (the curriculum's seed i against the seed it
    started from), on the episodes all of them played; empty without groups. One Holm family.

    Raises:
        ValueError: a member or the reference without episodes, or no episode all played.
    """
    table = episode_table(records)
    better = METRICS[outcome].better
    contrasts = [(name, members, reference, [(m, reference) for m in members])
                 for name, members in groups.items()]
    contrasts += [(a, groups[a], b, list(zip(groups[a], groups[b], strict=True)))
                  for a, b in pairs]
    rows = []
    for name, members, against, couples in contrasts:
        arms = list(dict.fromkeys(arm for couple in couples for arm in couple))
        values = shared(table, arms, name, outcome)
        column = {arm: np.array(values[arm].tolist(), dtype=np.float64) for arm in arms}
        own = {(m if r == against else f"{m} − {r}"): column[m] - column[r] for m, r in couples}
        rows.append((name, tuple(members), against, np.mean(list(own.values()), axis=0),
                     {k: float(d.mean()) for k, d in own.items()},
                     seed_and_episode_interval(np.stack(list(own.values())), confidence)))
    p_values = [wilcoxon_p(pooled) for _, _, _, pooled, _, _ in rows]
    out = []
    for (name, members, against, pooled, means, seed_ci), p, p_holm in zip(
            rows, p_values, holm(p_values), strict=True):
        out.append(GroupComparison(
            name, members, against, len(pooled), estimate(pooled, confidence=confidence), p,
            p_holm, verdict(seed_ci, p_holm, len(pooled), better),  # type: ignore[arg-type]
            means, float(np.std(list(means.values()), ddof=1)), seed_ci,
            paired=against != reference))
    return out


def seed_and_episode_interval(differences: np.ndarray, confidence: float = CONFIDENCE
                              ) -> tuple[float, float] | None:
    """The t interval of the mean of ``differences`` ``[members, episodes]`` as a method's: the
    members (training seeds) and the episodes both random, crossed (every member played every
    episode). None for fewer than two of either.

    The two-way random-effects decomposition ``d[s, e] = mu + a[s] + b[e] + eps`` gives the
    variance of the grand mean from the mean squares of members, episodes and residual
    (``(MS_a + MS_b - MS_eps) / (S E)``), its between-member part floored at 0 (so the interval
    is never narrower than the episodes-only one) and ``MS_b`` at ``MS_eps`` (its expectation's
    least), and Satterthwaite's degrees of freedom held within ``[min(S, E) - 1, E - 1]``: with
    three members that disagree they fall towards 2 (t 4.3), with members that agree exactly
    they are the episodes' ``E - 1``. A percentile bootstrap over members covered far less than its
    level with three (a draw of one member thrice is 1 in 27, past a 2.5 % tail): simulating
    3 seeds x 40 episodes (`scripts/interval_coverage.py`, 1,000 samples a cell), it covered
    78-81 % at seed spreads of 0.005-0.01 bits, this interval 92-95 % at every spread.

    Example:
        >>> d = np.array([[-0.02, -0.021, -0.019], [0.0, 0.001, -0.001]])
        >>> low, high = seed_and_episode_interval(d)
        >>> bool(low < -0.02 and high > 0.0)
        True
    """
    n_members, n_episodes = differences.shape
    if n_members < 2 or n_episodes < 2:
        return None
    d = np.asarray(differences, dtype=np.float64)
    grand = float(d.mean())
    if np.ptp(d) == 0.0:  # every difference the same: no spread to speak of
        return grand, grand
    s, e = n_members, n_episodes
    member_effects = d.mean(axis=1) - grand
    episode_effects = d.mean(axis=0) - grand
    residual = d - grand - member_effects[:, None] - episode_effects[None, :]
    ms_member = e * float(np.sum(member_effects**2)) / (s - 1)
    ms_residual = float(np.sum(residual**2)) / ((s - 1) * (e - 1))
    # E[MS_b] = var(eps) + S var(b) >= E[MS_eps]: an episodes' mean square below the
    # residual's is noise, and would make a varying sample look exact.
    ms_episode = max(s * float(np.sum(episode_effects**2)) / (e - 1), ms_residual)
    between = max(ms_member - ms_residual, 0.0)  # E[MS_a - MS_eps] = E * var(a) >= 0
    numerator = ms_episode + between
    # Satterthwaite over the three mean squares (coefficients 1, 1, -1), kept continuous where
    # the floor starts, and held between the members' S - 1 (the least a t interval of S seed
    # means would have) and the episodes' E - 1 (so it is never narrower than theirs).
    dof = numerator**2 / (ms_member**2 / (s - 1) + ms_episode**2 / (e - 1)
                          + ms_residual**2 / ((s - 1) * (e - 1)))
    dof = min(max(dof, float(min(s, e) - 1)), float(e - 1))
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2.0, dof)) * float(
        np.sqrt(numerator / (s * e)))
    return grand - half, grand + half


def group_markdown(rows: Sequence[GroupComparison], outcome: str) -> list[str]:
    """The groups' section of ``summary.md`` (nothing without groups)."""
    if not rows:
        return []
    metric = METRICS[outcome]
    unit = f" ({metric.unit})" if metric.unit else ""
    lines = ["", "## Groups of arms", "",
             "Each group is one method trained several times (e.g. PPO training seeds): per "
             "episode, the mean of its members' "
             f"{metric.label} minus the reference's (or, for a pair of groups A − B, member i "
             "of A minus member i of B), with its interval over episodes (these members) and "
             "over training seeds and episodes (the method: a t interval of crossed random "
             "effects, which the verdict reads); the spread is the standard deviation of the "
             "members' own mean differences.", "",
             f"| group − against | members | pairs | Δ {metric.label}{unit} [95% CI, episodes] | "
             "[95% CI, seeds and episodes] | p (Holm) | verdict | spread between members |",
             "|---|---|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        members = ", ".join(f"{_cell(a)} {m:+{metric.fmt}}" for a, m in r.member_means.items())
        seed_ci = ("—" if r.seed_ci is None else
                   f"[{r.seed_ci[0]:+{metric.fmt}}, {r.seed_ci[1]:+{metric.fmt}}]")
        lines.append(f"| {_cell(r.group)} − {_cell(r.reference)} | {members} | {r.n_pairs} | "
                     f"{_fmt(r.difference, metric.fmt)} | {seed_ci} | {_fmt_p(r.p_holm)} | "
                     f"{r.verdict} | {r.spread:{metric.fmt}} |")
    return lines


def group_json(rows: Sequence[GroupComparison]) -> list[dict[str, Any]]:
    """The groups as plain data (``summary.json``'s ``groups``)."""
    return [{"group": g.group, "members": list(g.members), "reference": g.reference,
             "n_pairs": g.n_pairs, "difference": g.difference.mean,
             "ci": None if g.difference.ci is None else list(g.difference.ci),
             "p_value": g.p_value, "p_holm": g.p_holm, "verdict": g.verdict,
             "seed_ci": None if g.seed_ci is None else list(g.seed_ci),
             "member_means": g.member_means, "spread": g.spread, "paired": g.paired}
            for g in rows]
