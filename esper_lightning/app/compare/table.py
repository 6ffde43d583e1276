"""The episode table: a comparison's records as one pandas DataFrame, and the group-bys that
every report section reads.

One row per `EpisodeRecord`: the identity columns (``controller``, ``episode_index``,
``episode_rng_seed``, ``host``), one column per metric of `METRICS` holding the record's value
as it is (object dtype: a missing value stays None, a float stays the float the CSV held, so a
report computed from the table is the one computed from the records), and ``record``, the
record itself, for the sections that read a whole episode (growth times, speed-ups, curves).

The report's sections are group-bys and joins over it: per controller (`by_controller`:
controllers in order of first appearance, episodes ascending), per episode budget
(`by_budget`), the episodes a set of arms all played side by side (`shared`), and a
controller's episodes joined with another's on the episode index (`pair_episodes`). Each refuses a
table it cannot group (a duplicated episode, a budget known in some rows only) in one line.

Example::

    table = episode_table(read_records_csv("compare/episodes.csv"))
    for name, episodes in by_controller(table).items():
        print(name, episodes["outcome"].tolist())
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pandas as pd

from esper_lightning.app.compare.records import BUDGET, IDENTITY, METRICS, EpisodeRecord

#: The column that holds each row's `EpisodeRecord`.
RECORD = "record"

#: What the sections take: the records, or their table (`episode_table`).
Records = Iterable[EpisodeRecord] | pd.DataFrame


def episode_table(records: Records) -> pd.DataFrame:
    """The table of ``records`` (a table is returned as it is), rows in the records' order.

    Example::

        episode_table([record]).loc[0, "outcome"]  # 61.4
    """
    if isinstance(records, pd.DataFrame):
        return records
    rows = [{"controller": r.controller, "episode_index": r.episode_index,
             "episode_rng_seed": r.episode_rng_seed, "host": r.host, **r.values, RECORD: r}
            for r in records]
    columns = [*IDENTITY, *METRICS, RECORD]
    table = pd.DataFrame(rows, columns=columns, dtype=object)
    # The identity columns are plain data (an index is an int, a name a str); values stay as read.
    return table.astype({"episode_index": "int64", "episode_rng_seed": "int64"})


def records_of(table: pd.DataFrame) -> list[EpisodeRecord]:
    """The records of ``table``'s rows, in its order."""
    return table[RECORD].tolist()


def by_controller(records: Records) -> dict[str, pd.DataFrame]:
    """Each controller's rows, controllers in order of first appearance, episodes ascending.

    Raises:
        ValueError: no records, or one controller with two rows of one episode index.
    """
    table = _checked(episode_table(records))
    order = {name: k for k, name in enumerate(table["controller"].unique())}
    ordered = table.sort_values(
        ["controller", "episode_index"], kind="stable",
        key=lambda column: column.map(order) if column.name == "controller" else column)
    return {str(name): group for name, group in ordered.groupby("controller", sort=False)}


def _checked(table: pd.DataFrame) -> pd.DataFrame:
    """``table``, refused when empty or when one controller has two rows of one episode."""
    if table.empty:
        raise ValueError("no episode records to compare")
    repeated = table[table.duplicated(["controller", "episode_index"])]
    if not repeated.empty:
        row = repeated.iloc[0]
        raise ValueError(f"controller {row['controller']!r} has two records of episode "
                         f"{row['episode_index']}; each episode index must appear once per "
                         "controller")
    return table


def records_by_controller(records: Records) -> dict[str, list[EpisodeRecord]]:
    """`by_controller` as lists of records (for the sections that read whole episodes)."""
    return {name: records_of(group) for name, group in by_controller(records).items()}


def by_budget(records: Records) -> dict[float | None, pd.DataFrame]:
    """The rows of each episode budget (``budget_flops``), smallest budget first, rows in the
    table's order; episodes without a budget (a table written before budgets were recorded,
    or a comparison without one) are one group under None. The budget belongs to the episode
    (drawn from its rng seed), so every controller's row of one episode index is in one group.

    Raises:
        ValueError: no records, a budget known in some rows only, or one episode index
            recorded with two budgets.

    Example::

        for budget, episodes in by_budget(table).items():
            print(budget, len(episodes))
    """
    table = episode_table(records)
    if table.empty:
        raise ValueError("no episode records to compare")
    known = int(table[BUDGET].notna().sum())
    if known not in (0, len(table)):
        raise ValueError(f"{BUDGET} is known in {known} of {len(table)} records; it must be "
                         "known in every record or in none")
    if not known:
        return {None: table}
    budgets = table.groupby("episode_index", sort=False)[BUDGET].unique()
    split = budgets[budgets.map(len) > 1]
    if not split.empty:
        index, (first, second) = split.index[0], split.iloc[0][:2]
        raise ValueError(f"episode {index} has two budgets: {first!r} and {second!r} "
                         f"({_controller_of(table, index, second)!r})")
    return {float(budget): group
            for budget, group in table.groupby(table[BUDGET].astype(float), sort=True)}


def _controller_of(table: pd.DataFrame, index: int, budget: float) -> str:
    """The first controller whose row of episode ``index`` has ``budget``."""
    rows = table[(table["episode_index"] == index) & (table[BUDGET] == budget)]
    return str(rows["controller"].iloc[0])


def shared(records: Records, arms: Sequence[str], group: str, column: str) -> pd.DataFrame:
    """``column`` of each of ``arms`` on the episodes every one of them played: one row per
    episode index (ascending), one column per arm (in ``arms``' order), values as recorded.

    Raises:
        ValueError: naming ``group``: an arm without episodes, or no episode in common.

    Example::

        shared(table, ["a", "b"], "mine", "test_bits")["a"].tolist()
    """
    table = _checked(episode_table(records))
    played = set(table["controller"])
    missing = [arm for arm in arms if arm not in played]
    if missing:
        raise ValueError(f"group {group!r}: {missing[0]!r} has no episodes")
    wide = side_by_side(table, arms, column)
    if wide is None:
        raise ValueError(f"group {group!r}: no episode that every one of {', '.join(arms)} "
                         "played")
    return wide


def side_by_side(records: Records, arms: Sequence[str], column: str) -> pd.DataFrame | None:
    """`shared`'s table, or None where ``arms`` share no episode (an arm without any
    included).

    Raises:
        ValueError: one controller with two rows of one episode.
    """
    table = _checked(episode_table(records))
    mine = table[table["controller"].isin(arms)]
    counts = mine.groupby("episode_index")["controller"].nunique()
    common = counts.index[counts == len(set(arms))]
    if common.empty:
        return None
    wide = mine[mine["episode_index"].isin(common)].pivot(
        index="episode_index", columns="controller", values=column)
    return wide.reindex(columns=list(dict.fromkeys(arms))).sort_index()


def pair_episodes(controller: pd.DataFrame, reference: pd.DataFrame) -> pd.DataFrame:
    """``controller``'s rows joined with ``reference``'s of the same episode index (an inner
    join in ``controller``'s order); the reference's columns carry the suffix ``_ref``.

    Raises:
        ValueError: no episode index in common (naming both), or a shared index played with
            other rng seeds or hosts (the pairing would compare unlike with unlike).
    """
    joined = controller.merge(reference, on="episode_index", how="inner",
                              suffixes=("", "_ref"), sort=False)
    if joined.empty:
        raise ValueError(
            f"controller {controller['controller'].iloc[0]!r} shares no episode index with "
            f"{reference['controller'].iloc[0]!r}; pairing needs the same evaluation episodes")
    unlike = joined[(joined["episode_rng_seed"] != joined["episode_rng_seed_ref"])
                    | (joined["host"] != joined["host_ref"])]
    if not unlike.empty:
        row = unlike.iloc[0]
        raise ValueError(
            f"episode {row['episode_index']} differs between {row['controller']!r} "
            f"(rng seed {row['episode_rng_seed']}, host {row['host']!r}) and "
            f"{row['controller_ref']!r} (rng seed {row['episode_rng_seed_ref']}, host "
            f"{row['host_ref']!r})")
    return joined


__all__ = ["RECORD", "Records", "by_budget", "by_controller", "episode_table", "pair_episodes",
           "records_by_controller", "records_of", "shared", "side_by_side"]
