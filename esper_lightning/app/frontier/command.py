"""``esper-lightning frontier``: run a study, report it.

    esper-lightning frontier run results/frontier/w32-tuning --text shakespeare.txt --workers 2
    esper-lightning frontier select results/frontier/w32-tuning
    esper-lightning frontier report results/frontier/w32-final --docs docs/evidence.md

``run`` trains the pending units of the study in the folder (its ``plan.json``; `study`) and
can be stopped and started again at any time. ``select`` prints, for a tuning study, each arm's
best rate per budget on the validation split, as the ``lr`` maps a final plan takes. ``report``
writes ``report.md`` and the figures from the rows alone, and with ``--docs`` the study's marked
section of a document. Every bad input is one line and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from esper_lightning.errors import ConfigError

__all__ = ["main"]

PROG = "esper-lightning frontier"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="the compute-optimal frontier: "
                                     "fixed sizes and growing arms at equal FLOPs",
                                     exit_on_error=False)
    sub = parser.add_subparsers(dest="action", required=True)
    run = sub.add_parser("run", help="train the study's pending units (resumable)",
                         exit_on_error=False)
    run.add_argument("study", help="the study folder (holds plan.json; rows.csv is appended)")
    run.add_argument("--text", required=True, help="the text file (or a folder holding one)")
    run.add_argument("--workers", type=int, default=1,
                     help="worker processes, one thread each (default 1)")
    run.add_argument("--no-progress", dest="progress", action="store_false",
                     help="no progress bar")
    select = sub.add_parser("select", help="each arm's best rate per budget (a tuning study)",
                            exit_on_error=False)
    select.add_argument("study", help="the tuning study's folder")
    report = sub.add_parser("report", help="tables and figures from the rows",
                            exit_on_error=False)
    report.add_argument("study", help="the study's folder")
    report.add_argument("--docs", default=None,
                        help="a document whose <!-- frontier:NAME:begin/end --> section the "
                        "tables replace")
    return parser


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv))
    except (argparse.ArgumentError, ConfigError) as err:
        return _fail(str(err))
    except SystemExit as done:  # --help, or argparse's own usage error
        return int(done.code or 0)
    from esper_lightning.data.files import DataError

    try:
        if args.action == "run":
            from esper_lightning.app.frontier.study import run_study

            rows = run_study(args.study, args.text, args.workers, args.progress)
            print(f"{args.study}: {len(rows)} rows")
        elif args.action == "select":
            print(json.dumps(_selected(args.study), indent=2))
        else:
            print(_report(args.study, args.docs).read_text())
        return 0
    except (ConfigError, DataError) as err:
        return _fail(str(err))


def _loaded(folder: str) -> tuple[Any, list[dict[str, Any]]]:
    from esper_lightning.app.frontier.plan import read_plan
    from esper_lightning.app.frontier.study import PLAN_FILE, read_rows

    plan, rows = read_plan(Path(folder) / PLAN_FILE), read_rows(folder)
    if not rows:
        raise ConfigError(f"'{folder}' has no rows yet; run it first")
    return plan, rows


def _selected(folder: str) -> list[dict[str, Any]]:
    """The arms with their selected rates, as a final plan's ``arms`` list."""
    from esper_lightning.app.frontier.report import select_lrs

    plan, rows = _loaded(folder)
    if plan.purpose != "tuning":
        raise ConfigError(f"'{folder}' is a {plan.purpose} study; select reads a tuning one")
    arms = []
    for arm in dict.fromkeys(r["arm"] for r in rows):
        chosen = select_lrs(rows, arm)
        edges = [f"{b:g}" for b, (_, edge) in chosen.items() if edge]
        entry: dict[str, Any] = {"arm": arm, "lr": {f"{b:g}": lr for b, (lr, _) in chosen.items()}}
        if edges:
            entry["at_grid_edge"] = edges
        arms.append(entry)
    return arms


def _report(folder: str, docs: str | None) -> Path:
    from esper_lightning.app.frontier.report import write_report

    plan, rows = _loaded(folder)
    try:
        return write_report(folder, plan, rows, docs)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _fail(message: str) -> int:
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)
    return 2
