"""``esper-lightning frontier``: run a study, report it.

    esper-lightning frontier run results/frontier/w32-tuning --text shakespeare.txt --workers 2
    esper-lightning frontier select results/frontier/w32-tuning
    esper-lightning frontier report results/frontier/w32-final --docs docs/evidence.md
    esper-lightning frontier report results/frontier/w32-final-growth \
        --with results/frontier/w32-final-sizes
    F=results/frontier
    esper-lightning frontier widths $F/w32-final-growth+$F/w32-final-sizes $F/w64-final \
        --tuning $F/w32-tuning --tuning $F/w64-tuning --docs docs/results.md

``run`` trains the pending units of the study in the folder (its ``plan.json``; `study`) and
can be stopped and started again at any time. ``select`` prints, for a tuning study, each arm's
best rate per budget on the validation split, as the ``lr`` maps a final plan takes (and its
``lr_phases`` maps, for a budget whose best is a phase rate). ``report``
writes ``report.md`` and the figures from the rows alone, and with ``--docs`` the study's marked
section of a document; ``--with`` adds the rows of another study of the same episodes (same
purpose, root rng seed, episodes, shape and budgets schedule; other arms, or other rates of an
arm), so arms and rates registered at different times (each before its own first episode) make
one table. ``widths`` puts the growing
arms' speed-ups of studies at several widths side by side (a table, and a figure beside the
document or in the first study's folder), each study written ``STUDY[+JOINED...]``, with the
frontier across the widths (every width's fixed sizes; ``--tuning``: the tuning studies whose
grids chose the rates, so each is said to be inside its grid or at an edge) and the speed-up
as the growth literature measures it beside the frontier's (`estimators`). Each subcommand
writes its arguments with ``--print_config`` and reads them back with ``--config``, as every
command does (`cli.run_own`); every bad input is one line and exit status 2.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jsonargparse import ArgumentParser, Namespace

from esper_lightning.app.cli import own_parser, own_subcommand, run_own
from esper_lightning.errors import ConfigError

__all__ = ["build_parser", "main"]

#: What the tables replace in ``--docs`` (report: one section; widths: three, and two figures).
_REPORT_DOCS = ("a document whose <!-- frontier:NAME:begin/end --> section the tables replace "
                "(and its NAME-literature section, if it marks one, the literature's table)")
_WIDTHS_DOCS = ("a document whose <!-- frontier:NAME:begin/end --> sections by-width, "
                "cross-width and literature the tables replace (the figures go to "
                "images/frontier-by-width.png and images/frontier-literature.png)")


def build_parser() -> ArgumentParser:
    """``esper-lightning frontier``'s parser: the subcommands ``run``, ``select``, ``report``
    and ``widths``, each with its ``--config``/``--print_config`` (`cli.own_subcommand`)."""
    parser = own_parser("frontier", "the compute-optimal frontier: fixed sizes and growing arms "
                        "at equal FLOPs", config=False)
    run = own_subcommand(parser, "run", "train the study's pending units (resumable)")
    run.add_argument("study", type=str,
                     help="the study folder (holds plan.json; rows.csv is appended)")
    run.add_argument("--text", type=str, required=True,
                     help="the text file (or a folder holding one)")
    run.add_argument("--workers", type=int, default=1, help="worker processes, one thread each")
    run.add_argument("--device", type=str, default="cpu", help="where every unit trains: cpu, "
                     "cuda or cuda:N (all workers share it)")
    run.add_argument("--progress", type=bool, default=True,
                     help="show a progress bar (--no-progress is --progress false)")
    select = own_subcommand(parser, "select", "each arm's best rate per budget (a tuning study)")
    select.add_argument("study", type=str, help="the tuning study's folder")
    report = own_subcommand(parser, "report", "tables and figures from the rows")
    report.add_argument("study", type=str, help="the study's folder")
    report.add_argument("--docs", type=str | None, default=None, help=_REPORT_DOCS)
    report.add_argument("--with", dest="with", action="append", default=[], metavar="STUDY",
                        help="another study of the same episodes whose arms join the table "
                        "(repeatable)")
    widths = own_subcommand(parser, "widths", "the growing arms' speed-ups at several widths")
    widths.add_argument("studies", nargs="+", type=str, metavar="STUDY[+JOINED...]",
                        help="a study's folder, with + the folders of studies joined to it")
    widths.add_argument("--docs", type=str | None, default=None, help=_WIDTHS_DOCS)
    widths.add_argument("--tuning", action="append", default=[], metavar="STUDY",
                        help="a tuning study whose grid chose a width's rates (repeatable, one "
                        "per width): each rate is then said to be inside its grid or at an edge")
    return parser


def main(argv: Sequence[str]) -> int:
    """``esper-lightning frontier``: 0 on success, 2 with one line on a bad input."""
    return run_own("frontier", build_parser(), argv, _act)


def _act(args: Namespace) -> int:
    """Run the subcommand ``args`` names on its arguments."""
    name = args.subcommand
    options = args[name]
    if name == "run":
        from esper_lightning.app.frontier.study import run_study

        rows = run_study(options.study, options.text, options.workers, options.progress,
                         options.device)
        print(f"{options.study}: {len(rows)} rows")
    elif name == "select":
        print(json.dumps(_selected(options.study), indent=2))
    elif name == "widths":
        print("\n".join(_widths(options.studies, options.docs, options.tuning)))
    else:
        print(_report(options.study, options.docs, options["with"]).read_text())
    return 0


def check_studies(folders: Sequence[str | Path], docs: str | Path | None = None) -> None:
    """Each study folder holds its plan and ``docs`` (when given) is a file, checked before the
    report's imports (scipy, matplotlib) and the rows' (torch) load, so a mistake is one line at
    once, and a report is never written for a document that is not there."""
    from esper_lightning.app.frontier.study import PLAN_FILE

    for folder in folders:
        plan = Path(folder) / PLAN_FILE
        if not plan.is_file():
            raise ConfigError(f"plan '{plan}' not found; accepted: a study folder holding its "
                              f"{PLAN_FILE}")
    if docs is not None and not Path(docs).is_file():
        raise ConfigError(f"--docs '{docs}' is not a file; accepted: a document holding the "
                          "study's <!-- frontier:NAME:begin/end --> sections")


def _loaded(folder: str) -> tuple[Any, list[dict[str, Any]]]:
    from esper_lightning.app.frontier.study import read_study

    return read_study(folder)


def _selected(folder: str) -> list[dict[str, Any]]:
    """The arms with their selected rates, as a final plan's ``arms`` list."""
    check_studies([folder])
    from esper_lightning.app.frontier.report import select_lrs

    plan, rows = _loaded(folder)
    if plan.purpose != "tuning":
        raise ConfigError(f"'{folder}' is a {plan.purpose} study; select reads a tuning one")
    arms = []
    for arm in dict.fromkeys(r["arm"] for r in rows):
        chosen = select_lrs(rows, arm)
        edges = [f"{b:g}" for b, (_, edge) in chosen.items() if edge]
        entry: dict[str, Any] = {"arm": arm}
        one = {f"{b:g}": rate for b, (rate, _) in chosen.items() if not isinstance(rate, tuple)}
        phased = {f"{b:g}": list(rate) for b, (rate, _) in chosen.items()
                  if isinstance(rate, tuple)}
        if one:
            entry["lr"] = one
        if phased:  # a budget whose best is a phase rate (plan's lr_phases)
            entry["lr_phases"] = phased
        if edges:
            entry["at_grid_edge"] = edges
        arms.append(entry)
    return arms


def _report(folder: str, docs: str | None, others: Sequence[str] = ()) -> Path:
    check_studies([folder, *others], docs)
    from esper_lightning.app.frontier.report import write_report

    plan, rows = _loaded(folder)
    for other in others:
        rows = rows + join_rows(plan, rows, other)
    return write_report(folder, plan, rows, docs, also=[Path(o).name for o in others])


def _widths(groups: Sequence[str], docs: str | None, tuning: Sequence[str] = ()) -> list[str]:
    check_studies([f for group in groups for f in group.split("+")] + list(tuning), docs)
    from esper_lightning.app.frontier.report import write_widths

    studies = []
    for group in groups:
        first, *others = group.split("+")
        plan, rows = _loaded(first)
        for other in others:
            rows = rows + join_rows(plan, rows, other)
        studies.append((plan, rows))
    grids = [_loaded(folder) for folder in tuning]
    for folder, (plan, _) in zip(tuning, grids, strict=True):
        if plan.purpose != "tuning":
            raise ConfigError(f"--tuning {folder}: a {plan.purpose} study; --tuning takes the "
                              "tuning study that chose a width's rates")
    figure = (Path(docs).parent / "images" if docs else Path(groups[0].split("+")[0]))
    figure.mkdir(parents=True, exist_ok=True)
    return write_widths(studies, figure / "frontier-by-width.png", docs, grids)


#: What two studies must share for their rows to be one table: the same episodes, scored alike.
_SHARED = ("purpose", "rng_seed", "episodes", "first_episode", "shape", "base_flops",
           "warmup_flops", "decay_fraction", "min_lr_ratio")


def join_rows(plan: Any, rows: list[dict[str, Any]], folder: str | Path) -> list[dict[str, Any]]:
    """The rows of the study in ``folder``, checked to be of ``plan``'s episodes."""
    from esper_lightning.app.frontier.plan import rate_order, rate_text, row_rate

    other, more = _loaded(folder)
    for key in _SHARED:
        if getattr(other, key) != getattr(plan, key):
            raise ConfigError(f"--with {folder}: its {key} is {getattr(other, key)!r}, this "
                              f"study's {getattr(plan, key)!r}; only studies of the same "
                              "episodes join")
    texts = {r["text_sha256"] for r in more} - {r["text_sha256"] for r in rows}
    if texts:
        raise ConfigError(f"--with {folder}: its rows were trained on another text (SHA-256 "
                          f"{sorted(texts)[0][:12]}...); only studies of the same text join")
    # An arm may come from two studies at different rates (a later study trying new rates of
    # it, e.g. phase rates) or schedules (a long run beside the WSD rows of its budget); one
    # rate of an arm at one budget on one schedule comes from one study.
    both = ({(r["arm"], row_rate(r), r["budget"], r["schedule"]) for r in rows}
            & {(r["arm"], row_rate(r), r["budget"], r["schedule"]) for r in more})
    if both:
        arm, rate, budget, schedule = sorted(both, key=lambda k: (
            k[0], rate_order(k[1]), k[2], k[3] or ""))[0]
        on = f" on its long {schedule} schedule" if schedule else ""
        raise ConfigError(f"--with {folder}: arm {arm!r} at lr {rate_text(rate)} and budget "
                          f"{budget:g}{on} is in both studies; each arm's rate at a budget "
                          "on a schedule comes from one")
    return more
