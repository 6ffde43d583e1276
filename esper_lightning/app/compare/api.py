"""`compare`: a paired comparison from Python, exactly as ``esper-lightning compare`` runs it.

The command line and this function build one `CompareConfig` the same way (defaults, a preset,
then the settings given: `app.config.load_config`), play the same episodes into the same
folder (`Comparison`: resumable, refusing a folder of other settings) and write the same
report. What comes back is the folder's table, ready for analysis::

    from esper_lightning.app.compare.api import compare

    result = compare(["static", "heuristic"], preset="smoke", seeds=2, out="cmp",
                     data_dir="../shared/data/cifar10-subset")
    result.table.groupby("controller")["test_outcome"].mean()
    result.summary["comparisons"][0]["verdict"]

It is part of the lab (``pip install 'esper-lightning[lab]'``); without the extra it raises
`ImportError` naming the install line before anything is read or played.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from esper_lightning.app.config import CompareConfig, load_config
from esper_lightning.app.console import require_lab

if TYPE_CHECKING:
    import pandas as pd

    from esper_lightning.app.compare.arms import EpisodePlan
    from esper_lightning.app.compare.records import EpisodeRecord
    from esper_lightning.controllers import Controller
    from esper_lightning.envs import EnvPool

__all__ = ["CompareResult", "compare"]


@dataclass(frozen=True)
class CompareResult:
    """What a comparison left in its folder.

    Attributes:
        config: the settings it was played with.
        out: its folder (``episodes.csv``, ``summary.md``, ``summary.json``, the figures).
        records: every episode of the folder, as ``episodes.csv`` keeps them.
        summary: ``summary.json``: summaries, paired comparisons and their verdicts, and the
            per-budget, regret, speed-up, growth and group sections.
    """

    config: CompareConfig
    out: Path
    records: tuple[EpisodeRecord, ...]
    summary: dict[str, Any]

    @property
    def table(self) -> pd.DataFrame:
        """The records as one DataFrame (`app.compare.table.episode_table`)."""
        from esper_lightning.app.compare.table import episode_table

        return episode_table(self.records)

    @property
    def report(self) -> str:
        """``summary.md``: the report the command line prints."""
        return (self.out / "summary.md").read_text(encoding="utf-8")


def compare(
    controllers: Sequence[str],
    *,
    preset: str | None = None,
    custom: Mapping[str, Callable[[EpisodePlan], Controller]] | None = None,
    pool: EnvPool | None = None,
    **settings: Any,
) -> CompareResult:
    """Play ``controllers`` on the same episodes and report them (``esper-lightning compare``).

    Args:
        controllers: what ``--controllers`` takes (``static``, ``heuristic``,
            ``policy:PATH``, ``stack:4@0.5:identity``, an installed package's kinds, or a
            name of ``custom``).
        preset: a preset's values (``--preset``) under ``settings``.
        custom: your own controllers by name: a factory called once per episode with its
            `EpisodePlan` (seed anything random with ``plan.rng_seed``).
        pool: the env pool to play on; by default one is built from the settings.
        **settings: any other `CompareConfig` field (``seeds``, ``out``, ``data_dir``,
            ``reference``, ``budget_steps``, ...), checked as the command line checks it.

    Returns:
        The folder's records and summary (`CompareResult`).

    Raises:
        ConfigError: a bad setting or controller (one line naming it and what is accepted).
        DataError: the data is not where ``data_dir`` says (one line naming the path).
        ImportError: the lab's dependencies are not installed (naming the install line).
    """
    require_lab("compare()")
    names = (controllers,) if isinstance(controllers, str) else tuple(controllers)
    config = load_config(preset, overrides={**settings, "controllers": names}, cls=CompareConfig)
    from esper_lightning.app.compare.runner import Comparison  # torch: once the config is good

    comparison = Comparison(config, custom=custom, pool=pool)
    records = comparison.run()
    summary = json.loads((comparison.out / "summary.json").read_text(encoding="utf-8"))
    return CompareResult(config, comparison.out, tuple(records), summary)
