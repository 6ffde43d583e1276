"""Regret to the oracle growth time: what each controller loses, episode by episode, to the
``stack:K@TAU[:OPERATOR]`` arm whose TAU was grid-searched per budget on the evaluation episodes.

A comparison that plays two or more ``stack:`` arms differing only in TAU (the same ``K``,
``OPERATOR`` and number of growth times; `tau_families`) holds a grid search over the growth
time (or times: ``stack:4@0.2,0.5`` grows twice, ``stack:4@0.3,1`` once), with ``static`` as its
"never" when it played. Its oracle (`choose_oracle`) takes, for each episode budget
(`table.by_budget`; episodes without one are a single group), the arm with the best
mean judged metric over that budget's evaluation episodes (ties: never, then the smaller TAU).
The regret of a controller in episode ``i`` is its judged metric minus the oracle arm's in the
same episode (paired: same host initialisation, data order and budget), signed so that a
positive regret is worse than the oracle (for ``final_bits``, lower is better, it is the
controller's bits minus the oracle's). `regrets` reports the mean regret of every
controller with its t interval (`stats.estimate`), over all episodes and per budget; the oracle
arm's own regret on a budget it is chosen for is 0.

The oracle chose with hindsight, on the very episodes its regret is measured on: it is the best
a scripted growth time of this grid could have done, which no controller can be expected to
match, and it is reported as a yardstick, never as a competitor in the verdict table.

Example::

    oracles, rows = regrets(records, judged="final_bits")
    print("\\n".join(markdown(oracles, rows)))
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from esper_lightning.app.compare.records import BUDGET, METRICS
from esper_lightning.app.compare.stack_arms import parse_stack
from esper_lightning.app.compare.stats import CONFIDENCE, Estimate, estimate
from esper_lightning.app.compare.table import (
    Records,
    by_budget,
    by_controller,
    episode_table,
    shared,
    side_by_side,
)
from esper_lightning.errors import ConfigError

#: The controller kind whose arms form a grid over TAU.
STACK = "stack:"
#: The arm that never grows: the never point of every grid (as `app.compare.lookup` counts it).
NEVER_ARM = "static"


@dataclass(frozen=True)
class Oracle:
    """The oracle of one family of ``stack:`` arms that differ only in TAU.

    Attributes:
        name: ``stack:K@τ*:OPERATOR`` (``stack:K@τ*,τ*:OPERATOR`` for two growth times).
        arms: the family's controller labels: ``static`` first when it played, then TAU
            ascending.
        chosen: by budget (None: episodes without one), the arm with the best mean judged
            metric over that budget's evaluation episodes.
        means: by budget, each arm's mean judged metric over the episodes every arm played.
    """

    name: str
    arms: tuple[str, ...]
    chosen: dict[float | None, str]
    means: dict[float | None, dict[str, float]]


@dataclass(frozen=True)
class Regret:
    """One controller's regret to one oracle.

    Attributes:
        controller, oracle: the controller and the oracle's name.
        overall: mean regret and its interval over every episode paired with the oracle.
        n_episodes: those episodes.
        per_budget: by budget, ``(episodes, mean regret and interval)`` on that budget's.
        confidence: level of the intervals.
    """

    controller: str
    oracle: str
    overall: Estimate
    n_episodes: int
    per_budget: dict[float | None, tuple[int, Estimate]]
    confidence: float = CONFIDENCE


def stack_families(labels: Iterable[str], *, strict: bool = True
                   ) -> dict[tuple[int, str, int], dict[str, tuple[float, ...]]]:
    """The ``stack:`` arms among ``labels`` with fixed growth times, grouped by ``(K,
    OPERATOR, number of growth times)``, each label with its taus (random timing is a
    baseline, not a point of a grid). ``strict``: a ``stack:`` label that does not parse is
    refused (`ConfigError`); else it is taken for a custom controller's name and left out.

    Example:
        >>> stack_families(["static", "stack:2@0.2:identity", "stack:2@0.1,0.4", "stack:2@random"])
        ... # doctest: +NORMALIZE_WHITESPACE
        {(2, 'identity', 1): {'stack:2@0.2:identity': (0.2,)},
         (2, 'copy', 2): {'stack:2@0.1,0.4': (0.1, 0.4)}}
    """
    groups: dict[tuple[int, str, int], dict[str, tuple[float, ...]]] = {}
    for label in dict.fromkeys(labels):
        if not label.startswith(STACK):
            continue
        try:
            depth, taus, operator = parse_stack(label[len(STACK):])
        except ConfigError:
            if strict:
                raise
            continue
        if taus is not None:
            groups.setdefault((depth, operator, len(taus)), {})[label] = taus
    return groups


def tau_families(controllers: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """The `stack_families` of ``controllers`` that are grids (two or more distinct TAU), TAU
    ascending (several times: as tuples), each after ``static`` when it played: "never grow"
    is a point of every grid, as the tuned lookup counts it (`NEVER_ARM`, first, so it wins a
    tie there too), and no ``stack:`` arm can say it. A one-time family is keyed
    ``stack:K@τ*:OPERATOR``, a two-time one (a grid over both growth events, a later time of 1
    meaning never) ``stack:K@τ*,τ*:OPERATOR``. A label that is not of the
    ``stack:K@TAU[:OPERATOR]`` form belongs to no family.

    Example::

        tau_families(["static", "stack:4@0.25", "stack:4@0.5:copy", "stack:4@0.2,0.5:copy",
                      "stack:4@0.2,1:copy"])
        # {"stack:4@τ*:copy": ("static", "stack:4@0.25", "stack:4@0.5:copy"),
        #  "stack:4@τ*,τ*:copy": ("static", "stack:4@0.2,0.5:copy", "stack:4@0.2,1:copy")}
    """
    labels = list(dict.fromkeys(controllers))
    never = (NEVER_ARM,) if NEVER_ARM in labels else ()
    return {f"{STACK}{depth}@{','.join(['τ*'] * events)}:{init}":
            (*never, *sorted(arms, key=lambda label: (arms[label], label)))
            for (depth, init, events), arms in stack_families(labels, strict=False).items()
            if len(set(arms.values())) > 1}


def _sign(judged: str) -> float:
    """+1 when lower is better, -1 when higher is: a positive regret is always worse."""
    better = METRICS[judged].better
    if better is None:
        raise ValueError(f"{judged!r} has no better direction; no oracle can be chosen by it")
    return 1.0 if better == "lower" else -1.0


def choose_oracle(name: str, arms: Sequence[str], records: Records, judged: str) -> Oracle:
    """Per budget, the arm of ``arms`` with the best mean ``judged`` over the evaluation
    episodes of that budget every arm played (ties: the earlier arm).

    Raises:
        ValueError: the arms share no episode of a budget, or one lacks the judged metric.
    """
    chosen: dict[float | None, str] = {}
    means: dict[float | None, dict[str, float]] = {}
    for budget, episodes in by_budget(records).items():
        chosen[budget], means[budget] = best_arm(f"{name} at budget {budget!r}", arms,
                                                 episodes, judged)
    return Oracle(name, tuple(arms), chosen, means)


def best_arm(name: str, arms: Sequence[str], records: Records,
             judged: str) -> tuple[str, dict[str, float]]:
    """The arm of ``arms`` with the best mean ``judged`` over the episodes of ``records`` every
    arm played (ties: the earlier arm), and each arm's mean there.

    Raises:
        ValueError: the arms share no episode, or one lacks the judged metric.
    """
    sign = _sign(judged)
    values = side_by_side(records, arms, judged)
    if values is None:
        raise ValueError(f"the arms of {name} share no episode")
    if values.isna().any().any():
        raise ValueError(f"{judged} is missing in an episode of the arms of {name}")
    means = {arm: float(np.mean(values[arm].tolist())) for arm in arms}
    return min(arms, key=lambda arm: (sign * means[arm], arms.index(arm))), means


def _regret(controller: pd.DataFrame, oracle: Oracle, table: pd.DataFrame,
            budgets: Sequence[float | None], judged: str, confidence: float) -> Regret:
    """One controller's regret: each of its episodes joined with the oracle arm's of its
    budget (``budgets``: the table's, smallest first)."""
    name = str(controller["controller"].iloc[0])
    budget = [None if pd.isna(b) else float(b) for b in controller[BUDGET]]
    mine = controller.assign(arm=[oracle.chosen[b] for b in budget], budget=budget)
    theirs = table[["controller", "episode_index", "episode_rng_seed", "host", judged]]
    joined = mine.merge(theirs, left_on=["arm", "episode_index"],
                        right_on=["controller", "episode_index"], suffixes=("", "_oracle"))
    unlike = joined[(joined["episode_rng_seed"] != joined["episode_rng_seed_oracle"])
                    | (joined["host"] != joined["host_oracle"])]
    if not unlike.empty:
        row = unlike.iloc[0]
        raise ValueError(f"episode {row['episode_index']} differs between {name!r} and "
                         f"{row['arm']!r} (rng seed or host)")
    untested = joined[joined[judged].isna()]
    if not untested.empty:
        raise ValueError(f"{judged} is missing in episode {untested['episode_index'].iloc[0]} "
                         f"of {name!r}")
    if joined.empty:
        raise ValueError(f"controller {name!r} shares no episode with the oracle {oracle.name}")
    sign = _sign(judged)
    values: dict[float | None, list[float]] = {}
    for b, mine_value, theirs_value in zip(joined["budget"], joined[judged],
                                           joined[f"{judged}_oracle"], strict=True):
        values.setdefault(None if pd.isna(b) else b, []).append(
            sign * (mine_value - theirs_value))
    every = [v for budget_values in values.values() for v in budget_values]
    per_budget = {b: (len(values[b]), estimate(values[b], confidence=confidence))
                  for b in budgets if b in values}
    return Regret(name, oracle.name, estimate(every, confidence=confidence), len(every),
                  per_budget, confidence)


def regrets(records: Records, judged: str, *,
            groups: Mapping[str, Sequence[str]] | None = None,
            confidence: float = CONFIDENCE) -> tuple[list[Oracle], list[Regret]]:
    """Every TAU family's oracle and every controller's regret to it (controllers in order of
    first appearance, then each of ``groups``: a group's episode is its members' mean, on the
    episodes every member played, per oracle); both empty when no family has two TAU.

    Raises:
        ValueError: see `choose_oracle` and `table.by_budget`; a controller that shares no
            episode with an oracle arm, or lacks the judged metric.

    Example::

        oracles, rows = regrets(records, "final_bits")
        rows[0].overall.mean  # bits per byte lost to the oracle, averaged over episodes
    """
    table = episode_table(records)
    budgets = list(by_budget(table))
    controllers = by_controller(table)
    oracles = [choose_oracle(name, arms, table, judged)
               for name, arms in tau_families(controllers).items()]
    for name, members in (groups or {}).items() if oracles else ():
        controllers[name] = _group_episodes(name, members, table, judged)
    rows = [_regret(episodes, oracle, table, budgets, judged, confidence)
            for oracle in oracles for episodes in controllers.values()]
    return oracles, rows


def _group_episodes(name: str, members: Sequence[str], table: pd.DataFrame, judged: str
                    ) -> pd.DataFrame:
    """A group's episodes as rows of its own: on each episode every member played, the first
    member's row with the members' mean ``judged`` (the only value it is read for)."""
    values = shared(table, members, name, judged)
    first = table[(table["controller"] == members[0])
                  & table["episode_index"].isin(values.index)].sort_values("episode_index")
    means = [float(np.mean(row)) for row in values[list(members)].itertuples(index=False)]
    return first.assign(controller=name, **{judged: means})


def _fmt(value: Estimate, fmt: str) -> str:
    text = f"{value.mean:+{fmt}}"
    return text if value.ci is None else f"{text} [{value.ci[0]:+{fmt}}, {value.ci[1]:+{fmt}}]"


def markdown(oracles: Sequence[Oracle], rows: Sequence[Regret], judged: str) -> list[str]:
    """A Markdown section per oracle (nothing when there is none): the arm it chose per budget,
    then each controller's mean regret, over all episodes and, with two or more budgets, per
    budget."""
    metric = METRICS[judged]
    lines: list[str] = []
    for oracle in oracles:
        budgets = list(oracle.chosen)
        level = f"{rows[0].confidence:.0%}" if rows else ""
        unit = f" ({metric.unit})" if metric.unit else ""
        head = [f"regret{unit} [{level} CI]"]
        if len(budgets) > 1:
            head += [f"at {b:.3g} FLOPs" for b in budgets]  # type: ignore[str-format]
        choice = "; ".join(arm if b is None else f"{arm} at {b:.3g} FLOPs"
                           for b, arm in oracle.chosen.items())
        lines += ["", f"## Regret to {oracle.name}", "",
                  f"The oracle plays, at each budget, the arm of {', '.join(oracle.arms)} with "
                  f"the best mean {metric.label} over that budget's evaluation episodes: "
                  f"{choice}. It chose with hindsight on these episodes, so it is a yardstick, "
                  f"not a competitor. Regret: {metric.label} minus the oracle arm's in the same "
                  "episode, signed so that positive is worse; mean and t interval over episodes.",
                  "", "| controller | episodes | " + " | ".join(head) + " |",
                  "|---|---:|" + "---:|" * len(head)]
        for row in (r for r in rows if r.oracle == oracle.name):
            cells = [row.controller, str(row.n_episodes), _fmt(row.overall, metric.fmt)]
            if len(budgets) > 1:
                cells += [_fmt(row.per_budget[b][1], metric.fmt) if b in row.per_budget
                          else "n/a" for b in budgets]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _estimate_json(value: Estimate) -> dict[str, Any]:
    return {"regret_mean": value.mean, "regret_ci": None if value.ci is None else list(value.ci)}


def as_json(oracles: Sequence[Oracle], rows: Sequence[Regret]) -> list[dict[str, Any]]:
    """The oracles and regrets as plain data (``summary.json``'s ``regret``): per oracle, its
    ``arms``, per budget the ``chosen`` arm and every arm's ``means``, and per controller the
    regret over all episodes and ``per_budget``."""
    return [{"oracle": o.name, "arms": list(o.arms),
             "budgets": [{"budget_flops": b, "chosen": arm, "means": o.means[b]}
                         for b, arm in o.chosen.items()],
             "controllers": [{"controller": r.controller, "n_episodes": r.n_episodes,
                              **_estimate_json(r.overall), "confidence": r.confidence,
                              "per_budget": [{"budget_flops": b, "n_episodes": n,
                                              **_estimate_json(e)}
                                             for b, (n, e) in r.per_budget.items()]}
                             for r in rows if r.oracle == o.name]}
            for o in oracles]


__all__ = ["NEVER_ARM", "Oracle", "Regret", "as_json", "choose_oracle", "markdown", "regrets",
           "stack_families", "tau_families"]
