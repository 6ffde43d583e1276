"""Tuning a growth lookup from comparisons: ``esper-lightning lookup COMPARE_DIR... --out FILE``.

A comparison of one family of ``stack:K@TAU[,TAU...]:OPERATOR`` arms (the same ``K``, operator
and number of growth times; a grid over TAU) played at a few budgets (``--budget_scales``) on
**tuning** episodes holds what a practitioner tunes a per-budget schedule from; so do several
comparisons of one host and base budget, one per budget (a comparison draws each episode's
budget at random from its ``budget_scales``, so one per budget gives each budget the episodes
it is tuned on), whose episodes are pooled. `tune_lookup`
takes, at each budget, the arm with the best mean of the judged metric (the validation loss at
the budget, ``final_bits``, by default) over that budget's episodes, the ``static`` arm counting
as "never grow" when it played, and writes the choices as a `GrowthLookup` that ``lookup:FILE``
plays in later comparisons (`esper_lightning.controllers.lookup`, interpolated in log budget).

The file records its **tuning cost**: the episodes the family and ``static`` played in the
folder, their training FLOPs and wall time, so the lookup's cost per new setting can be set
against a learned controller's one-off training; and the **best single schedule**
(``best_single``), the arm with the best mean over every tuning episode whatever its budget:
the budget-blind rival tuned on the same episodes.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jsonargparse import ArgumentParser, Namespace

from esper_lightning.app.cli import own_parser, run_own
from esper_lightning.errors import ConfigError

if TYPE_CHECKING:  # the records and the lookup load torch: imported where they are used, so
    # the command refuses a bad folder before torch and Lightning load (`_check_paths`)
    import pandas as pd

    from esper_lightning.app.compare.records import EpisodeRecord
    from esper_lightning.controllers.lookup import GrowthLookup

__all__ = ["build_parser", "comparison_config", "families", "main", "tune_lookup"]


def families(labels: Iterable[str]) -> dict[str, dict[str, tuple[float, ...]]]:
    """The ``stack:`` arms among ``labels`` with a fixed growth time, grouped by depth, operator
    and number of growth times (keyed ``K:OPERATOR:N``), each label with its taus.

    Example:
        >>> families(["static", "stack:2@0.2:identity", "stack:2@0.4:identity", "stack:2@random"])
        {'2:identity:1': {'stack:2@0.2:identity': (0.2,), 'stack:2@0.4:identity': (0.4,)}}
    """
    from esper_lightning.app.compare.regret import stack_families

    return {f"{depth}:{operator}:{events}": arms
            for (depth, operator, events), arms in stack_families(labels).items()}


def tune_lookup(records: Sequence[EpisodeRecord], base_flops: float, judged: str = "final_bits",
                family: str | None = None, tuning: dict[str, Any] | None = None
                ) -> GrowthLookup:
    """The per-budget best growth times of one family of ``stack:`` arms (module docstring).

    Args:
        records: the comparison's episodes.
        base_flops: its base budget (each episode's budget over it is the tabled scale).
        judged: the metric chosen by (lower or higher is better, as `METRICS` says).
        family: ``K:OPERATOR:N`` (`families`); None: the only one there is.
        tuning: what to record besides the cost (the comparison's folder, root rng seed).

    Raises:
        ConfigError: no family or several without ``family``, one with a single TAU, episodes
            without a budget (one line each).
    """
    from esper_lightning.app.compare.regret import NEVER_ARM, best_arm, choose_oracle
    from esper_lightning.app.compare.table import by_budget
    from esper_lightning.controllers.lookup import GrowthLookup

    found = families(r.controller for r in records)
    if family is None and len(found) != 1:
        raise ConfigError(f"{'no' if not found else 'several'} stack:K@TAU families in the "
                          f"comparison ({', '.join(found) or 'none'}); accepted: exactly one, "
                          "or --family naming one")
    name = family or next(iter(found))
    if name not in found:
        raise ConfigError(f"family {name!r} is not in the comparison; accepted: "
                          f"{', '.join(found) or 'none'}")
    arms = dict(found[name])
    played = {r.controller for r in records}
    labels = [*([NEVER_ARM] if NEVER_ARM in played else []), *sorted(arms, key=arms.get)]
    if len(labels) < 2:
        raise ConfigError(f"family {name!r} has one arm ({labels[0]}); a lookup chooses among "
                          "two or more")
    mine = [r for r in records if r.controller in labels]
    groups = by_budget(mine)
    if None in groups:
        raise ConfigError("the comparison's episodes have no budget; accepted: a comparison "
                          "with budget_flops or budget_steps (and budget_scales)")
    _check_played(groups, labels, base_flops)
    oracle = choose_oracle(f"lookup of {name}", labels, mine, judged)
    points = tuple((round(budget / base_flops, 9), arms.get(label))  # static -> None: never
                   for budget, label in sorted(oracle.chosen.items()))  # type: ignore[arg-type]
    depth, operator, _ = name.split(":")
    cost = {"judged": judged, "base_flops": base_flops, "arms": labels, "episodes": len(mine),
            "episodes_per_budget": {f"{round(b / base_flops, 9):g}": len(
                set(group["episode_index"])) for b, group in groups.items()},
            "train_flops": sum(r["train_flops"] or 0.0 for r in mine),
            "wall_seconds": sum(r["wall_seconds"] for r in mine),
            "means": {f"{round(b / base_flops, 9):g}": m for b, m in oracle.means.items()},
            # The budget-blind rival: the best over every tuning episode, paired like the rest.
            "best_single": best_arm(f"lookup of {name}", labels, mine, judged)[0]}
    return GrowthLookup(operator, int(depth), points, {**(tuning or {}), **cost})


def _check_played(groups: dict[float | None, pd.DataFrame], labels: Sequence[str],
                  base_flops: float) -> None:
    """Refuse (one line) a tuning where an arm missed a budget, or played other episodes there
    than the rest (the choice would rest on fewer episodes than the file records)."""
    scales = {b: float(b) / base_flops for b in groups}  # type: ignore[arg-type]  # no None
    played_by = {budget: {label: set(group.loc[group["controller"] == label, "episode_index"])
                          for label in labels} for budget, group in groups.items()}
    for budget, played in played_by.items():
        absent = [label for label in labels if not played[label]]
        if absent:
            raise ConfigError(f"{absent[0]} played no episode at budget scale "
                              f"{scales[budget]:g}; a lookup compares every arm of its family "
                              "at every budget")
    for budget, played in played_by.items():
        every = set.union(*played.values())
        short = [label for label in labels if played[label] != every]
        if short:
            raise ConfigError(f"{short[0]} played {len(played[short[0]])} of the {len(every)} "
                              f"episodes at budget scale {scales[budget]:g}; a lookup compares "
                              "every arm on the same episodes (finish the comparison)")


def build_parser() -> ArgumentParser:
    """``esper-lightning lookup``'s parser (`cli.own_parser`: ``--config``, ``--print_config``)."""
    parser = own_parser("lookup", "a per-budget growth schedule tuned from a comparison of "
                        "stack:K@TAU arms (and static, never growing) on tuning episodes, "
                        "written as a lookup that lookup:FILE plays")
    parser.add_argument("comparison", nargs="+", type=str,
                        help="the comparison's folder (its episodes.csv); several: one per "
                        "budget, of the same host and base budget, their episodes pooled")
    parser.add_argument("--out", type=str, required=True,
                        help="the lookup file to write (JSON)")
    parser.add_argument("--family", type=str | None, default=None,
                        help="K:OPERATOR:N, the stack arms to choose among (null: the only "
                        "family)")
    parser.add_argument("--judged", type=str, default="final_bits",
                        help="the metric chosen by (final_bits: the validation loss at the "
                        "budget)")
    return parser


def main(argv: Sequence[str]) -> int:
    """``esper-lightning lookup``: 0 on success, 2 with one line on a bad input."""
    return run_own("lookup", build_parser(), argv, _tune)


def _tune(args: Namespace) -> int:
    """Tune the lookup ``args`` asks for, write it and say what it chose."""
    folders = [Path(f) for f in args.comparison]
    _check_paths(folders, args.out)
    _check_judged(args.judged)
    records, base, tuning = _pooled(folders)
    lookup = tune_lookup(records, base, args.judged, args.family, tuning)
    path = lookup.write(args.out)
    chosen = ", ".join(f"{s:g}: {'never' if t is None else ','.join(f'{x:g}' for x in t)}"
                       for s, t in lookup.points)
    print(f"{path}: growth times by budget scale {chosen} (from {lookup.tuning['episodes']} "
          f"tuning runs, arm by episode); the best single schedule: "
          f"{lookup.tuning['best_single']}")
    return 0


def _check_paths(folders: Sequence[Path], out: str) -> None:
    """The command's paths, checked before the records load torch and Lightning, so a mistake
    is one line at once: every folder a played, budgeted comparison's (`comparison_config`,
    `_episodes_file`; its content is read later), and ``--out`` a file path (its folder is
    made)."""
    for folder in folders:
        comparison_config(folder)
        _episodes_file(folder)
    target = Path(out)
    if target.is_dir():
        raise ConfigError(f"--out '{out}' is a folder; accepted: a file path such as "
                          f"{target / 'lookup.json'}")
    above = next((p for p in target.parents if p.exists()), None)  # where its folder is made
    if above is not None and not above.is_dir():
        raise ConfigError(f"--out '{out}': '{above}' is a file, so no folder can be made "
                          "there; accepted: a file path in a folder")


#: Episode indices of the k-th of several comparisons start at k times this: each keeps its own
#: pairs (every arm of one episode index), none shared with another folder's.
_FOLDER_STRIDE = 1_000_000


def _pooled(folders: Sequence[Path]) -> tuple[list[EpisodeRecord], float, dict[str, Any]]:
    """The episodes of one or several comparisons of the same host and base budget, their
    base budget and what the lookup records of where it was tuned (one-line `ConfigError`
    when they differ)."""
    from esper_lightning.app.task import budget_flops

    settings = []
    for folder in folders:
        config = comparison_config(folder)
        settings.append((folder, config, float(budget_flops(config) or 0.0)))
    first, config, base = settings[0]
    for folder, other, other_base in settings[1:]:
        if other.host_preset != config.host_preset or not math.isclose(other_base, base,
                                                                        rel_tol=1e-9):
            raise ConfigError(f"'{folder}' has host_preset={other.host_preset!r}, base budget "
                              f"{other_base:.6g} FLOPs; '{first}' has {config.host_preset!r}, "
                              f"{base:.6g}: a lookup pools comparisons of one host and base")
    records = [dataclasses.replace(r, episode_index=r.episode_index + k * _FOLDER_STRIDE)
               for k, (folder, other, _) in enumerate(settings)
               for r in _played(folder, other, base)]
    seeds = [c.rng_seed for _, c, _ in settings]
    names = [str(f) for f, _, _ in settings]
    return records, base, {"comparison": names[0] if len(names) == 1 else names,
                           "rng_seed": seeds[0] if len(seeds) == 1 else seeds,
                           "host_preset": config.host_preset}


def _check_judged(judged: str) -> None:
    """A lookup is chosen by a scalar metric with a direction, read on the validation split: a
    curve has no single value, and the test split is the final tables' alone."""
    from esper_lightning.app.compare.records import METRICS

    accepted = [m.name for m in METRICS.values()
                if m.better and m.kind == "scalar" and not m.name.startswith("test_")]
    if judged not in accepted:
        raise ConfigError(f"judged metric {judged!r} cannot choose a lookup; accepted: "
                          + ", ".join(accepted))


def _played(folder: Path, config: Any, base: float) -> list[EpisodeRecord]:
    """The folder's episodes, refused in one line when there are none or a budget of the
    comparison's ``budget_scales`` drew none (the table would silently lack that point)."""
    from esper_lightning.app.compare.records import BUDGET, read_records_csv

    records = read_records_csv(_episodes_file(folder))
    found = {round(r[BUDGET] / base, 9) for r in records if r[BUDGET] is not None}
    missing = [s for s in config.budget_scales or () if round(s, 9) not in found]
    if missing:
        raise ConfigError(f"no tuning episode drew budget scale {missing[0]:g}; accepted: a "
                          "comparison whose every budget scale played (more --seeds)")
    return records


def _episodes_file(folder: Path) -> Path:
    """The comparison's ``episodes.csv``; one-line `ConfigError` when it played none yet."""
    file = folder / "episodes.csv"
    if not file.is_file():
        raise ConfigError(f"'{folder}' has played no episode yet (no episodes.csv); run the "
                          "comparison first")
    return file


def comparison_config(folder: Path) -> Any:
    """The settings a budgeted comparison's episodes were played with (the folder's
    ``compare_config.json``), as a `CompareConfig`; one-line `ConfigError` when the folder
    holds no comparison or one without a budget."""
    from esper_lightning.app.config import CompareConfig, from_layers, saved_values

    if not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        raise ConfigError(f"comparison folder '{folder}' {what}; accepted: the folder a "
                          "comparison wrote (compare --out)")
    file = folder / "compare_config.json"
    if not file.is_file():
        raise ConfigError(f"'{folder}' holds no comparison (no compare_config.json)")
    config = from_layers([saved_values(json.loads(file.read_text()), CompareConfig)],
                         CompareConfig)
    if not config.budgeted:
        raise ConfigError(f"the comparison in '{folder}' has no budget; accepted: one played "
                          "with budget_flops or budget_steps (and budget_scales)")
    return config


