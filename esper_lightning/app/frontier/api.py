"""`frontier`: a frontier study from Python, exactly as ``esper-lightning frontier run`` and
``frontier report`` play and report it.

A study is a folder holding its ``plan.json`` (`plan`); this function trains the units whose
rows are missing (`study.run_study`: resumable, one thread a worker, refusing rows of another
text), writes the study's ``report.md`` and figures (`report.write_report`, as ``frontier
report`` does once the study has rows) and hands back its rows, ready for analysis::

    from esper_lightning.app.frontier.api import frontier

    result = frontier("results/frontier/w32-width-moments",
                      text="../shared/data/shakespeare/shakespeare.txt")
    result.table.groupby("arm")["validation_nats"].mean()
    result.report.read_text()

It is part of the lab (``pip install 'esper-lightning[lab]'``); without the extra it raises
`ImportError` naming the install line before anything is read or trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from esper_lightning.app.console import require_lab

if TYPE_CHECKING:
    import pandas as pd

    from esper_lightning.app.frontier.plan import Plan

__all__ = ["FrontierResult", "frontier"]


@dataclass(frozen=True)
class FrontierResult:
    """What a study left in its folder.

    Attributes:
        plan: the study's plan.
        folder: its folder.
        rows: one row per arm, rate, episode and budget (`train.ROW_FIELDS`), numbers as
            numbers.
        report: its ``report.md`` (written just now from every row).
    """

    plan: Plan
    folder: Path
    rows: list[dict[str, Any]]
    report: Path

    @property
    def table(self) -> pd.DataFrame:
        """The rows as one DataFrame (one row each, the columns `train.ROW_FIELDS`)."""
        import pandas as pd

        from esper_lightning.app.frontier.train import ROW_FIELDS

        return pd.DataFrame(self.rows, columns=list(ROW_FIELDS))


def frontier(folder: str | Path, text: str | Path, workers: int = 1, device: str = "cpu",
             progress: bool = False, docs: str | Path | None = None,
             also: Sequence[str | Path] = ()) -> FrontierResult:
    """Play the study in ``folder`` on ``text`` (its pending units; none when it is complete)
    and report it.

    Args:
        folder: The study's folder (its ``plan.json``; ``rows.csv`` is appended).
        text: The text file, or a folder holding one.
        workers: Worker processes, one thread each.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (all workers share it).
        progress: A progress bar over the units.
        docs: A Markdown document whose section marked with the study's name the report
            replaces (``frontier report --docs``); None: the folder's report alone.
        also: Studies of the same episodes whose rows join the report (``frontier report
            --with``): the fixed sizes a study of growing arms alone is read against.

    Raises:
        ImportError: The lab's extra is not installed (one line naming the install).
        ConfigError: A bad plan, rows of another text, a bad worker count or device, a
            ``docs`` that is not a file, a study in ``also`` of other episodes, or growing arms
            with no fixed size to read them against.
        DataError: No text file at ``text``, or one too short for the plan's blocks.
    """
    require_lab("frontier()")
    from esper_lightning.app.frontier.command import check_studies, join_rows
    from esper_lightning.app.frontier.plan import read_plan
    from esper_lightning.app.frontier.report import write_report
    from esper_lightning.app.frontier.study import PLAN_FILE, run_study

    folder = Path(folder)
    check_studies([folder, *also], docs)
    rows = run_study(folder, text, workers, progress, device)
    plan = read_plan(folder / PLAN_FILE)
    joined = list(rows)
    for other in also:
        joined += join_rows(plan, joined, other)
    report = write_report(folder, plan, joined, docs, also=[Path(o).name for o in also])
    return FrontierResult(plan, folder, rows, report)
