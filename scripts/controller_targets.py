"""The learned-controller study's targets, read off its pre-registered final tables.

    python scripts/controller_targets.py results/controller --docs docs/results.md
    python scripts/controller_targets.py results/controller --replay runs/reproduce/final-budgets

One row per target of the study (results/controller/final-plan.md, "What is decided"): the
timing policies (group ``timing``, three PPO training seeds) against the tuned lookup on the
unseen budgets, text and host, with `compare`'s own verdict (its crossed random-effects
interval over seeds and episodes, Holm-adjusted p); their regret to the per-budget oracle
against half the lookup's; the nine-blueprint policies (group ``all``) against the timing ones;
then, not tested, each setting per budget and per training seed (each group against the
lookup, and ``all`` − ``timing``), when the lookup and each seed grew there
(`app.compare.growth`: a growth is a growth blueprint's germination; a failed target's measured
reason), what each nine-blueprint seed germinated by blueprint, whether
final-oracle replays final-budgets' episodes bit for bit, what each arm cost to make and what
each stage took to play. A stage not played yet is a row that says so. Nothing is recomputed
that ``compare`` decided: the verdicts are its ``summary.json``'s; the per-budget rows group
its ``episodes.csv`` with the same function (`report.group_differences`) on each budget's
episodes. ``--docs`` writes the tables between a document's
``<!-- controller:targets:begin -->`` and ``<!-- controller:targets:end -->`` markers.
``--replay FOLDER`` instead checks that a rerun of a stage's command from the shipped policies
(``bash scripts/controller_study.sh reproduce STAGE N``) gave that stage's committed rows, bit
for bit (exit 1 where any differs).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from esper_lightning.app.compare.growth import GrowthRow, germinated_blueprints, growth_rows
from esper_lightning.app.compare.lookup import comparison_config
from esper_lightning.app.compare.records import EpisodeRecord, read_records_csv
from esper_lightning.app.compare.report import cost_markdown, group_differences
from esper_lightning.app.compare.table import by_budget, records_by_controller
from esper_lightning.app.frontier.report import replace_section
from esper_lightning.app.task import budget_flops
from esper_lightning.blueprints.growth.registry import operator_of

#: The stages that test the policies against the lookup, and what each holds unseen.
VERSUS_LOOKUP = {"final-budgets": "budgets 0.35–2.8×", "final-text": "text (Python stdlib)",
                 "final-host": "host (width 64)"}
ORACLE_STAGE = "final-oracle"
#: The groups the plan names: the timing policies and the nine-blueprint ones.
TIMING, ALL = "timing", "all"
#: What the replay check compares, and its words for them: the verdict's metric and the
#: validation loss beside it.
REPLAYED = {"test_bits": "test bits", "final_bits": "validation bits"}


def _summary(folder: Path) -> dict[str, Any] | None:
    file = folder / "summary.json"
    return json.loads(file.read_text()) if file.is_file() else None


def _group(summary: dict[str, Any], group: str, against: str | None = None
           ) -> dict[str, Any] | None:
    """The summary's row of ``group`` (against the reference, or the paired group)."""
    for row in summary.get("groups", []):
        if row["group"] == group and (against is None) != row["paired"] and (
                against is None or row["reference"] == against):
            return row
    return None


def _reference(folder: Path) -> str:
    """The stage's reference as the table names it: "lookup" for the tuned lookup."""
    label = comparison_config(folder).reference
    return "lookup" if label.startswith("lookup:") else label


def _interval(ci: Sequence[float] | None) -> str:
    return "—" if ci is None else f"[{ci[0]:+.4f}, {ci[1]:+.4f}]"


def _cells(row: dict[str, Any], met: str) -> str:
    """A group row's measured cells, through its verdict and whether the target is met."""
    seeds = ", ".join(f"{v:+.4f}" for v in row["member_means"].values())
    return (f"{row['difference']:+.4f} | {_interval(row['seed_ci'])} | {_interval(row['ci'])} "
            f"| {row['n_pairs']} | {seeds} (SD {row['spread']:.4f}) | {row['verdict']}: {met} |")


def _better(row: dict[str, Any]) -> str:
    return "**met**" if row["verdict"] == "better" else "not met"


def versus_lookup_rows(root: Path) -> list[str]:
    """Target 1: ``timing`` − lookup < 0, the interval excluding 0, on each unseen setting."""
    lines = []
    for stage, unseen in VERSUS_LOOKUP.items():
        summary = _summary(root / stage)
        if summary is None:
            lines.append(f"| timing − lookup | {unseen} | not played yet | | | | | |")
            continue
        row = _group(summary, TIMING)
        if row is None:
            raise ValueError(f"{root / stage} has no group {TIMING!r}: not a stage of the plan")
        lines.append(f"| timing − {_reference(root / stage)} | {unseen} | "
                     + _cells(row, _better(row)))
    return lines


def regret_row(root: Path) -> list[str]:
    """Target 2: ``timing``'s regret to the per-budget oracle ≤ half the lookup's."""
    summary = _summary(root / ORACLE_STAGE)
    head = "| regret: timing ≤ ½ lookup | oracle, budgets 0.35–2.8× |"
    if summary is None:
        return [f"{head} not played yet | | | | | |"]
    (oracle,) = summary["regret"]  # the plan's one grid (none: the stage is not the plan's)
    rows = {r["controller"]: r for r in oracle["controllers"]}
    lookup = rows[comparison_config(root / ORACLE_STAGE).reference]
    timing = rows[TIMING]
    if lookup["regret_mean"] <= 0.0:
        met = "cannot be met: the lookup's regret is not above 0"
    else:
        met = ("**met**" if timing["regret_mean"] <= 0.5 * lookup["regret_mean"]
               else "not met")
    return [f"{head} timing {timing['regret_mean']:+.4f}, lookup {lookup['regret_mean']:+.4f} "
            f"| — | timing {_interval(timing['regret_ci'])}, lookup "
            f"{_interval(lookup['regret_ci'])} | {timing['n_episodes']} | — | {met} |"]


def curriculum_rows(root: Path) -> list[str]:
    """Target 3: ``all`` − ``timing`` (seed i against seed i) with an interval holding 0, and
    ``all`` − lookup as target 1 (plan item 5)."""
    summary = _summary(root / "final-budgets")
    pair = summary and _group(summary, ALL, against=TIMING)
    if not pair:
        why = ("final-budgets is not played yet" if summary is None
               else "the nine-blueprint policies have not joined final-budgets")
        return [f"| all − timing | budgets 0.35–2.8× | {why} | | | | | |"]
    low, high = pair["seed_ci"] or (None, None)
    within = "**met**" if low is not None and low <= 0.0 <= high else "not met"
    versus = _group(summary, ALL)
    return [f"| all − timing | budgets 0.35–2.8× | {_cells(pair, within)}",
            f"| all − {_reference(root / 'final-budgets')} | budgets 0.35–2.8× | "
            + _cells(versus, _better(versus))]  # type: ignore[arg-type]


def replay_lines(root: Path) -> list[str]:
    """The plan's reproducibility check (item 3): final-oracle plays the first 16 episodes of
    final-budgets again, so every arm both play (the lookup, the timing policies, static) must
    give there, bit for bit, the losses it gave in final-budgets. Reported, whatever it shows."""
    folders = [root / stage / "episodes.csv" for stage in ("final-budgets", ORACLE_STAGE)]
    if not all(file.is_file() for file in folders):
        return []
    budgets, oracle = (read_records_csv(file) for file in folders)
    line, _ = replay_sentence(ORACLE_STAGE, oracle, "final-budgets", budgets)
    return ["", f"Replay check: {line}."]


def replay_sentence(again_name: str, again: Sequence[EpisodeRecord], first_name: str,
                    first: Sequence[EpisodeRecord]) -> tuple[str, bool]:
    """Whether the rows ``again`` played of the arms ``first`` has played equal those, bit for
    bit (episode seed, and `REPLAYED` exactly), on the same episodes: a sentence, and True when
    at least one row was compared and none differs. Rows of other arms are not compared; rows
    ``first`` has not played yet are counted apart."""
    by_episode = {(r.controller, r.episode_index): r for r in first}
    arms = {r.controller for r in first}
    replayed = [r for r in again if r.controller in arms]
    waiting = [r for r in replayed if (r.controller, r.episode_index) not in by_episode]
    differ = []
    for r in replayed:
        twin = by_episode.get((r.controller, r.episode_index))
        if twin is None:
            continue
        gaps = {m: _gap(twin[m], r[m]) for m in REPLAYED}
        if twin.episode_rng_seed != r.episode_rng_seed or any(gaps.values()):
            metric = max(gaps, key=lambda m: gaps[m])
            differ.append((gaps[metric], metric, r))
    done = len(replayed) - len(waiting)
    line = (f"{_possessive(again_name)} {done} rows of arms {first_name} has played "
            f"({len({r.controller for r in replayed})} arms) ")
    if not differ:
        line += (f"equal {_possessive(first_name)} on the same episodes (episode seed, test and "
                 "validation bits, exactly)")
    else:
        gap, metric, worst = max(differ, key=lambda x: x[0])
        line += (f"differ from {_possessive(first_name)} in {len(differ)} of {done} (largest "
                 f"|Δ {REPLAYED[metric]}| {gap:.3g}: {worst.controller}, episode "
                 f"{worst.episode_index})")
    if waiting:
        line += f"; {len(waiting)} more not played in {first_name} yet"
    return line, done > 0 and not differ


def _gap(a: float | None, b: float | None) -> float:
    """|a − b|; 0 where both are missing, inf where one is (records hold no NaN)."""
    if a is None or b is None:
        return 0.0 if a is None and b is None else math.inf
    return abs(a - b)


def _possessive(name: str) -> str:
    return f"{name}'" if name.endswith("s") else f"{name}'s"


def reproduce(root: Path, again: Path, episodes: int | None = None) -> int:
    """``--replay``: the rows a rerun of a stage's command wrote in ``again`` (a folder named
    as the stage, not the stage's own) against the committed ones in ``root``, on the first
    ``episodes`` episodes (None: up to the rerun's last); prints the sentence, 0 when equal,
    1 when any differs, nothing was compared or a committed row of those episodes is missing
    from the rerun, 2 when a folder is missing or is the stage's own."""
    stage = root / again.name
    files = [stage / "episodes.csv", again / "episodes.csv"]
    missing = [str(f) for f in files if not f.is_file()]
    if missing or stage.resolve() == again.resolve():
        what = f"no {' or '.join(missing)}" if missing else f"{again} is the stage's own folder"
        print(f"controller_targets: error: {what}; accepted: a folder named as a stage of the "
              "study, holding a rerun's episodes.csv", file=sys.stderr)
        return 2
    first, rerun = (read_records_csv(f) for f in files)
    line, equal = replay_sentence(str(again), rerun, again.name, first)
    arms = {r.controller for r in first}
    unheld = len([r for r in rerun if r.controller not in arms])
    if unheld == len(rerun):
        print(f"NOT reproduced: {again} holds no row of an arm {again.name} has played.")
        return 1
    if unheld:
        line += f"; {unheld} rows of arms {again.name} has not played, not compared"
    last = max(r.episode_index for r in rerun) + 1 if episodes is None else episodes
    played = {(r.controller, r.episode_index) for r in rerun}
    absent = [r for r in first if r.episode_index < last
              and (r.controller, r.episode_index) not in played]
    if absent:
        line += (f"; {len(absent)} of {again.name}'s rows of its first {last} episodes are not "
                 f"in the rerun (first: {absent[0].controller}, episode "
                 f"{absent[0].episode_index})")
        equal = False
    print(f"Reproduced: {line}." if equal else f"NOT reproduced: {line}.")
    return 0 if equal else 1


def _played(root: Path) -> Iterator[tuple[str, str, dict[str, Any], Any, float,
                                             list[EpisodeRecord]]]:
    """Each stage against the lookup that was played: its name, what it holds unseen, its
    summary, settings, base budget in FLOPs and episodes."""
    for stage, unseen in VERSUS_LOOKUP.items():
        folder = root / stage
        summary = _summary(folder)
        if summary is not None:
            config = comparison_config(folder)
            yield (stage, unseen, summary, config, float(budget_flops(config) or 0.0),
                   read_records_csv(folder / "episodes.csv"))


def per_budget_lines(root: Path) -> list[str]:
    """Each group against the lookup (``timing``; ``all`` where it played) and ``all`` −
    ``timing``, per budget and per training seed on each stage (reported, not tested: no Holm
    family, no verdict)."""
    lines = []
    for _, unseen, summary, config, base, played in _played(root):
        groups = {TIMING: config.groups()[TIMING]}
        if _joined(summary, config):
            groups[ALL] = config.groups()[ALL]
        pairs = [(a, b) for a, b in config.paired_groups() if a in groups and b in groups]
        for budget, records in by_budget(played).items():
            for row in group_differences(records, groups, config.reference, summary["judged"],
                                         pairs):
                against = row.reference if row.paired else "lookup"
                seeds = ", ".join(f"{v:+.4f}" for v in row.member_means.values())
                lines.append(f"| {unseen} | {budget / base:g} | {row.group} − {against} | "
                             f"{row.n_pairs} | {row.difference.mean:+.4f} | "
                             f"{_interval(row.seed_ci)} | {seeds} |")
    if not lines:
        return []
    return ["", "Per budget (not tested; the plan decides on the pooled rows above):", "",
            "| setting | budget (× base) | difference | episodes | bits | "
            "[95 % CI, seeds and episodes] | each seed |", "|---|---:|---|---:|---:|---:|---|",
            *lines]


def _when(row: GrowthRow) -> str:
    """``first, second (grew k of n)``: mean shares of the budget at each growth."""
    shares = ", ".join("—" if x is None else f"{x:.2f}" for x in (row.first, row.second))
    return f"{shares} ({row.episodes - row.grew[0]} of {row.episodes} grew)"


def _joined(summary: dict[str, Any], config: Any) -> list[str]:
    """The members of the group ``all`` where its stage's report holds it; none before (also
    while it plays: the settings name it from its first episode, the report from its last)."""
    return list(config.groups()[ALL]) if _group(summary, ALL) is not None else []


def growth_lines(root: Path) -> list[str]:
    """When the lookup and each seed of the timing (and, where it played, the nine-blueprint)
    policies grew, per stage and budget (`growth_rows`: a growth is a growth blueprint's
    germination): whether a policy lost or won by growing earlier, later or not at all. A stage
    whose episodes predate the germination curve is a row that says so.

    Raises:
        ValueError: the stages' timing groups differ in size, or an arm has no episode at a
            budget the others played.
    """
    lines, sizes, counted = [], {}, set()  # counted: columns that count every germination
    unnamed: list[EpisodeRecord] = []
    joined = max((len(_joined(s, c)) for _, _, s, c, _, _ in _played(root)), default=0)
    for stage, unseen, summary, config, base, played in _played(root):
        timing, every = list(config.groups()[TIMING]), _joined(summary, config)
        arms = [config.reference, *timing, *every]
        sizes[stage] = len(timing)
        rows = growth_rows(played)
        if rows is None:
            lines.append(f"| {unseen} | — | not recorded ({stage}'s episodes predate "
                         "germinated_curve) |")
            continue
        unnamed += [r for r in played if r.controller in arms and r["germinated_seeds"] is None]
        for budget in sorted({r.budget for r in rows}):  # type: ignore[type-var]
            by_arm = {r.controller: r for r in rows if r.budget == budget}
            missing = [a for a in arms if a not in by_arm]
            if missing:
                raise ValueError(f"{stage}: {missing[0]} played no episode at budget "
                                 f"{budget:.3g} FLOPs")
            counted |= {i for i, a in enumerate(arms) if not by_arm[a].blueprints}
            absent = ["not played"] * (joined - len(every))
            lines.append(f"| {unseen} | {budget / base:g} | "  # type: ignore[operator]
                         + " | ".join([*(_when(by_arm[a]) for a in arms), *absent]) + " |")
    if not lines:
        return []
    if len(set(sizes.values())) > 1:
        raise ValueError(f"the stages' timing groups differ in size: {sizes}")
    members = next(iter(sizes.values()))
    names = ["lookup", *(f"timing seed {i + 1}" for i in range(members)),
             *(f"all seed {i + 1}" for i in range(joined))]
    names = [f"{n} †" if i in counted else n for i, n in enumerate(names)]
    note = (" † marks arms whose episodes were written before the blueprints germinated were "
            "recorded (`germinated_seeds`): there every germination counts"
            + (", and each is a growth: every seed these arms germinated is there at the end, "
               "a growth blueprint's (`final_seeds`)." if _all_growth(unnamed) else ".")
            if counted else "")
    return ["", "When they grew (mean share of the budget at the first and the second growth, "
            f"a growth being a growth blueprint's germination; not tested).{note}", "",
            "| setting | budget (× base) | " + " | ".join(names) + " |",
            "|---|---:|" + "---|" * len(names), *lines]


def _all_growth(records: Sequence[EpisodeRecord]) -> bool:
    """Whether every seed these episodes germinated is a growth blueprint's, as far as their
    seeds at the end tell: each was kept (as many as the curve counts) and is one."""
    return all(r["final_seeds"] is not None and r["germinated_curve"]
               and len(r["final_seeds"]) == round(r["germinated_curve"][-1])
               and all(operator_of(b) is not None for _, b in r["final_seeds"])
               for r in records)


def germination_lines(root: Path) -> list[str]:
    """What each nine-blueprint policy germinated in final-budgets, by blueprint (from the
    seeds its episodes named, `germinated_seeds`; those implanted before the first decision
    are none): whether it grew, or spent its germinations on other seeds. Nothing before the
    group ``all`` joins; a member whose episodes did not name their seeds raises."""
    folder = root / "final-budgets"
    summary = _summary(folder)
    members = [] if summary is None else _joined(summary, comparison_config(folder))
    if not members:
        return []
    played = records_by_controller(read_records_csv(folder / "episodes.csv"))
    lines = []
    for i, arm in enumerate(members):
        counts: Counter[str] = Counter()
        for record in played[arm]:
            blueprints = germinated_blueprints(record)
            if blueprints is None:
                raise ValueError(f"final-budgets: {arm} episode {record.episode_index} did not "
                                 "record germinated_seeds")
            counts.update(blueprints)
        total = sum(counts.values())
        growth = sum(n for b, n in counts.items() if operator_of(b) is not None)
        top = ", ".join(f"{b} {n}" for b, n in counts.most_common(3)) or "—"
        share = f"{growth / total:.0%}" if total else "—"
        lines.append(f"| all seed {i + 1} | {len(played[arm])} | {total} | {growth} | {share} "
                     f"| {top} |")
    return ["", "What the nine-blueprint policies germinated in final-budgets (every budget; "
            "not tested):", "", "| policy | episodes | germinations | growth | growth share | "
            "most germinated |", "|---|---:|---:|---:|---:|---|", *lines]


def cost_lines(root: Path) -> list[str]:
    """What each arm cost to make and the settings a policy's training amortises over, as
    final-budgets' own report gives them (`report.cost_markdown`)."""
    summary = _summary(root / "final-budgets")
    return cost_markdown(summary["cost"]) if summary else []


def wall_lines(root: Path) -> list[str]:
    """What each finished stage took to play: its episodes' wall times summed (each episode's
    share of the batch it ran in, so the sum is the stage's time on its one thread)."""
    lines = []
    for stage in (*VERSUS_LOOKUP, ORACLE_STAGE):
        folder = root / stage
        if _summary(folder) is not None:
            played = read_records_csv(folder / "episodes.csv")
            hours = sum(r["wall_seconds"] for r in played) / 3600.0
            lines.append(f"| {stage} | {len(played)} | {hours:.2f} |")
    if not lines:
        return []
    return ["", "What each stage took to play (one thread each):", "",
            "| stage | episode rows | wall time (hours) |", "|---|---:|---:|", *lines]


def targets(root: Path) -> list[str]:
    """The targets table and the rows reported beside it, as markdown lines."""
    return ["Generated by `python scripts/controller_targets.py results/controller --docs "
            "docs/results.md` from the final tables' committed summaries and episodes.", "",
            "| target | unseen | measured (bits; lower is better) | [95 % CI, seeds and "
            "episodes] | [95 % CI, episodes] | episodes | each training seed | verdict: "
            "target |", "|---|---|---:|---:|---:|---:|---|---|",
            *versus_lookup_rows(root), *regret_row(root), *curriculum_rows(root),
            *_provisional(root), *replay_lines(root), *per_budget_lines(root),
            *growth_lines(root), *germination_lines(root), *cost_lines(root),
            *wall_lines(root)]


def _provisional(root: Path) -> list[str]:
    """Says so while final-budgets' Holm family lacks the nine-blueprint rows it will hold."""
    summary = _summary(root / "final-budgets")
    if summary is None or _group(summary, ALL) is not None:
        return []
    # It joins with as many members as the timing group (one per training seed).
    arms, joined = len(summary["comparisons"]), len(_group(summary, TIMING)["members"])
    per_budget = len(summary["per_budget"])
    return ["", "The nine-blueprint group `all` has not joined final-budgets: when it does, that "
            "stage's group family grows from one row to three (the verdicts above are "
            "recomputed; their intervals do not change), and so do its families of arms against "
            f"the lookup ({arms} to {arms + joined}) and per budget ({arms * per_budget} to "
            f"{(arms + joined) * per_budget})."]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="the study's folder (results/controller)")
    parser.add_argument("--docs", type=Path, help="a document with the targets' markers")
    parser.add_argument("--replay", type=Path, metavar="FOLDER",
                        help="instead: compare a rerun's rows (a folder named as the stage, "
                             "e.g. runs/reproduce/final-budgets) with the stage's, bit for bit")
    parser.add_argument("--episodes", type=int, metavar="N",
                        help="with --replay: the rerun played the stage's first N episodes, "
                             "so every committed row of those must be in it")
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        print(f"controller_targets: error: {args.root} is not a folder; accepted: the study's "
              "folder, e.g. results/controller", file=sys.stderr)
        return 2
    if args.replay is not None:
        if args.docs is not None:
            parser.error("--replay checks a rerun and writes no document: leave out --docs")
        if args.episodes is not None and args.episodes < 1:
            parser.error(f"--episodes {args.episodes}: accepted: 1 or more")
        return reproduce(args.root, args.replay, args.episodes)
    if args.episodes is not None:
        parser.error("--episodes goes with --replay (the episodes a rerun played)")
    try:
        lines = targets(args.root)
        if args.docs is not None:
            replace_section(args.docs, "targets", lines, owner="controller")
    except (OSError, ValueError) as error:  # a folder or document that is not the plan's
        print(f"controller_targets: error: {error}", file=sys.stderr)
        return 2
    if args.docs is None:
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
