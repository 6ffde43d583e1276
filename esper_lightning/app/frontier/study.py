"""Running a frontier study: a plan's units on worker processes, resumably.

A study is a folder holding its plan (``plan.json``, see `plan`) and its rows (``rows.csv``, one
per arm, rate, episode and budget; `train.ROW_FIELDS`). Rows written before phase rates existed
lack the last column, ``lr_phases``; they are read as rows of one rate, and a study of them
keeps their columns until a row with phase rates joins it (the file is then rewritten whole with
the new column). `run_study` trains the units whose rows
are missing, a whole unit at a time on each of ``workers`` processes (one thread each; on the
CPU, or all on one CUDA device, which several processes keep busy where one run of these small
models waits on kernel launches), and appends a unit's rows as soon as it is done: an
interrupted study loses at most the units in flight and resumes where it stopped. A unit's rows
depend only on the unit (its arm, rate, episode rng seed and budgets), never on the worker, the
order or what ran before, so a study played in pieces equals one played at once. A progress bar
counts units and their FLOPs."""

from __future__ import annotations

import csv
import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from tqdm import tqdm

from esper_lightning.app.frontier.plan import Plan, Unit, rate_text, read_plan, row_rate
from esper_lightning.errors import ConfigError

__all__ = ["PLAN_FILE", "ROWS_FILE", "check_device", "pending_units", "read_rows", "run_study"]

PLAN_FILE = "plan.json"
ROWS_FILE = "rows.csv"


def read_rows(folder: str | Path) -> list[dict[str, Any]]:
    """The study's rows, numbers as numbers (an empty list before the first unit is done)."""
    from esper_lightning.app.frontier.train import ROW_FIELDS

    path = Path(folder) / ROWS_FILE
    if not path.is_file():
        return []
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or tuple(reader.fieldnames) not in (ROW_FIELDS,
                                                                         _old_fields()):
            raise ConfigError(f"'{path}' has columns {reader.fieldnames}; expected "
                              f"{', '.join(ROW_FIELDS)} (lr_phases may be missing)")
        return [{"lr_phases": None, **{k: _number(k, v) for k, v in row.items()}}
                for row in reader]


def _old_fields() -> tuple[str, ...]:
    """The columns of a study written before phase rates existed."""
    from esper_lightning.app.frontier.train import ROW_FIELDS

    return tuple(f for f in ROW_FIELDS if f != "lr_phases")


def _number(key: str, value: str) -> Any:
    from esper_lightning.app.frontier.train import PHASE_SEPARATOR

    if key in ("arm", "text_sha256"):
        return value
    if value == "":
        return None
    if key == "lr_phases":
        return tuple(float(v) for v in value.split(PHASE_SEPARATOR))
    return int(value) if key in ("episode", "rng_seed", "steps", "params", "final_depth",
                                 "tokens") else float(value)


def pending_units(plan: Plan, rows: list[dict[str, Any]]) -> list[Unit]:
    """The units of ``plan`` whose rows are not all in ``rows``."""
    done: dict[tuple[Any, ...], set[float]] = {}
    for row in rows:
        done.setdefault((row["arm"], row_rate(row), row["episode"]), set()).add(
            row["budget_flops"])
    return [u for u in plan.units() if not set(u.budgets) <= done.get(u.key, set())]


def run_study(folder: str | Path, text: str | Path, workers: int = 1,
              progress: bool = True, device: str = "cpu") -> list[dict[str, Any]]:
    """Train every pending unit of the study in ``folder`` on ``device`` and return all its
    rows. A row does not depend on the worker or the order; on a GPU it differs from the CPU's
    in the last bits (other kernels), so a study's episodes are best played on one device.

    Raises:
        ConfigError: A bad plan, rows from another text (their SHA-256 differs), ``workers``
            below 1, or a device this machine does not have.
    """
    folder = Path(folder)
    plan = read_plan(folder / PLAN_FILE)
    if workers < 1:
        raise ConfigError(f"workers must be an int >= 1, got {workers}")
    check_device(device)
    rows = read_rows(folder)
    todo = pending_units(plan, rows)
    if not todo:
        return rows
    from esper_lightning.app.frontier.train import load_corpus
    from esper_lightning.blueprints.growth import operators

    unknown = [a.spec for a in plan.arms if a.spec.operator not in (None, *operators())]
    if unknown:
        raise ConfigError(f"arm {unknown[0].name!r}: unknown growth operator "
                          f"{unknown[0].operator!r}; accepted: {', '.join(operators())}")
    sha = load_corpus(text, plan.shape, ()).sha256
    other = {r["text_sha256"] for r in rows} - {sha}
    if other:
        raise ConfigError(f"'{folder / ROWS_FILE}' was trained on another text (SHA-256 "
                          f"{sorted(other)[0][:12]}...); pass the text it was trained on")
    flops = sum(unit_flops(u, plan) for u in todo)
    bar = tqdm(total=flops / 1e12, unit="TFLOP", desc=plan.name, disable=not progress,
               bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} {unit} [{elapsed}<{remaining}]")
    for unit, new in _play(todo, plan, text, workers, device):
        _append(folder / ROWS_FILE, new)
        rows.extend(new)
        bar.update(unit_flops(unit, plan) / 1e12)
        bar.set_postfix_str(f"{unit.arm.name} lr {rate_text(unit.rate)} episode "
                            f"{unit.episode}")
    bar.close()
    return rows


def unit_flops(unit: Unit, plan: Plan) -> float:
    """The training FLOPs a unit spends (what the progress bar counts): a branching unit trains
    its largest budget and the decay of each smaller one, any other every budget in full."""
    if not unit.arm.branches:
        return sum(unit.budgets)
    return max(unit.budgets) + plan.decay_fraction * (sum(unit.budgets) - max(unit.budgets))


def check_device(device: str) -> None:
    """Refuse, in one line, a device name that is not ``cpu``, ``cuda`` or ``cuda:N``, or a
    CUDA device this machine does not have."""
    from esper_lightning.app.config.task import check_devices

    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda") or (index and (kind == "cpu" or not index.isdigit())):
        raise ConfigError(f"device {device!r} is not accepted; accepted: cpu, cuda, cuda:N")
    check_devices((device,))


def _play(todo: list[Unit], plan: Plan, text: str | Path, workers: int,
          device: str) -> Iterator[tuple[Unit, list[dict[str, Any]]]]:
    """Each unit with its rows, as units finish (in order with one worker)."""
    if workers == 1:
        _init_worker(plan, text, device)
        for unit in todo:
            yield unit, _train(unit)
        return
    context = multiprocessing.get_context("spawn")  # no forked torch state
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init_worker,
                             initargs=(plan, text, device)) as pool:
        queue = list(todo)
        running: dict[Future[list[dict[str, Any]]], Unit] = {}
        while queue or running:
            while queue and len(running) < workers:
                unit = queue.pop(0)
                running[pool.submit(_train, unit)] = unit
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                yield running.pop(future), future.result()


_WORKER: dict[str, Any] = {}


def _init_worker(plan: Plan, text: str | Path, device: str) -> None:
    """One thread per worker (a second intra-op thread buys nothing at these sizes and slows a
    shared machine), the corpus read once onto ``device``."""
    import torch

    from esper_lightning.app.frontier.train import load_corpus
    from esper_lightning.core.flops import FlopMeter

    torch.set_num_threads(1)
    _WORKER.update(plan=plan, corpus=load_corpus(text, plan.shape, plan.splits, device),
                   meter=FlopMeter())


def _train(unit: Unit) -> list[dict[str, Any]]:
    from esper_lightning.app.frontier.train import train_unit

    return train_unit(unit, _WORKER["plan"], _WORKER["corpus"], _WORKER["meter"])


def _append(path: Path, rows: list[dict[str, Any]]) -> None:
    """Append ``rows`` (with the header for a new file) and flush them to disk. A file of the
    old columns (no ``lr_phases``) keeps them while the new rows have no phase rates, and is
    rewritten whole with the new column (atomically) when one does."""
    from esper_lightning.app.frontier.train import PHASE_SEPARATOR, ROW_FIELDS

    rows = [{**row, "lr_phases": PHASE_SEPARATOR.join(map(str, row["lr_phases"]))
             if row.get("lr_phases") else None} for row in rows]
    new = not path.is_file()
    fields = ROW_FIELDS
    if not new:
        with path.open(newline="") as handle:
            header = tuple(next(csv.reader(handle), ()))
        if header == _old_fields():
            if any(row["lr_phases"] for row in rows):
                _upgrade(path)
            else:
                fields = header
    with path.open("a", newline="") as handle:
        # The old columns drop only lr_phases, empty in every row written under them.
        writer = csv.DictWriter(handle, fieldnames=fields,
                                extrasaction="raise" if fields == ROW_FIELDS else "ignore")
        if new:
            writer.writeheader()
        writer.writerows(rows)
        handle.flush()
        os.fsync(handle.fileno())


def _upgrade(path: Path) -> None:
    """Rewrite a rows file of the old columns with the ``lr_phases`` column (empty: every old
    row trained at one rate), through a temporary file so an interruption loses nothing."""
    from esper_lightning.app.frontier.train import ROW_FIELDS

    with path.open(newline="") as handle:
        old = list(csv.DictReader(handle))
    temporary = path.with_suffix(".csv.tmp")
    with temporary.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=ROW_FIELDS)
        writer.writeheader()
        writer.writerows(old)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
