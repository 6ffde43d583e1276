"""Keep an optimizer (and its LR schedulers) in step with the seeds of a growing model.

Each seed trains in its own param group named ``seed/<slot id>``. PyTorch has no way to remove a
param group, and LR schedulers keep per-group lists (``base_lrs``, ``lr_lambdas``, ...), so the
helpers here add and remove groups and extend or shrink those lists with them.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.optim import Optimizer

SEED_GROUP_PREFIX = "seed/"
#: Scheduler attributes holding one entry per param group.
_PER_GROUP_LISTS = (
    "base_lrs", "_last_lr", "lr_lambdas", "min_lrs", "max_lrs", "base_momentums", "max_momentums",
)


@dataclass(frozen=True)
class SeedOptimConfig:
    """Hyper-parameters of seed param groups; None copies the value from the host's first group."""

    lr: float | None = None
    momentum: float | None = None
    weight_decay: float | None = None

    def __post_init__(self) -> None:
        for name in ("lr", "momentum", "weight_decay"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int | float) or value < 0):
                raise ValueError(f"seed {name} must be a number >= 0 or None, got {value!r}")

    def overrides(self) -> dict[str, float]:
        values = {"lr": self.lr, "momentum": self.momentum, "weight_decay": self.weight_decay}
        return {k: float(v) for k, v in values.items() if v is not None}


def seed_group_name(slot_id: str) -> str:
    return SEED_GROUP_PREFIX + slot_id


def seed_group_names(optimizer: Optimizer) -> list[str]:
    """Names of the seed groups, in optimizer order."""
    return [g["name"] for g in optimizer.param_groups if _is_seed_group(g)]


def _is_seed_group(group: dict[str, Any]) -> bool:
    return str(group.get("name", "")).startswith(SEED_GROUP_PREFIX)


def _group_index(optimizer: Optimizer, name: str) -> int | None:
    return next((i for i, g in enumerate(optimizer.param_groups) if g.get("name") == name), None)


def name_host_groups(optimizer: Optimizer) -> None:
    """Name the host's unnamed param groups (``"host"``, or ``"host/pg<i>"`` when there are
    several; names the user gave stay), so loggers that tag groups by name, such as
    Lightning's LearningRateMonitor, keep the host's tag when seed groups appear.

    Example:
        >>> import torch
        >>> opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
        >>> name_host_groups(opt)
        >>> opt.param_groups[0]["name"]
        'host'
    """
    unnamed = [g for g in optimizer.param_groups if "name" not in g]
    taken = {g["name"] for g in optimizer.param_groups if "name" in g}
    for i, group in enumerate(optimizer.param_groups):
        if "name" in group:
            continue
        name = "host" if len(unnamed) == 1 else f"host/pg{i + 1}"
        while name in taken:  # never collide with a name the user chose
            name += "_"
        group["name"] = name
        taken.add(name)


def strip_params(optimizer: Optimizer, params: Iterable[nn.Parameter]) -> None:
    """Remove ``params`` from every non-seed group (a host optimizer built over
    ``model.parameters()`` after seeds were rebuilt from a checkpoint would hold them)."""
    ids = {id(p) for p in params}
    for group in optimizer.param_groups:
        if not _is_seed_group(group):
            group["params"] = [p for p in group["params"] if id(p) not in ids]


def add_seed_group(
    optimizer: Optimizer,
    slot_id: str,
    params: Sequence[nn.Parameter],
    config: SeedOptimConfig,
    schedulers: Sequence[Any] = (),
) -> None:
    """Append the group ``seed/<slot_id>`` (hyper-parameters copied from group 0, then
    overridden by ``config``) and extend the schedulers' per-group lists."""
    name = seed_group_name(slot_id)
    if _group_index(optimizer, name) is not None:
        raise RuntimeError(f"optimizer already has a param group named {name!r}")
    host = optimizer.param_groups[0]
    template = {k: copy.deepcopy(v) for k, v in host.items() if k != "params"}
    template.update(config.overrides())
    template["name"] = name
    # The seed starts from its own initial lr scaled by where the host's schedule is now, so
    # schedulers that compute from the initial lr (LambdaLR) and chainable ones agree.
    host_initial = host.get("initial_lr", host["lr"])
    initial = config.lr if config.lr is not None else host_initial
    template["initial_lr"] = initial
    template["lr"] = initial * (host["lr"] / host_initial if host_initial else 1.0)
    n_before = len(optimizer.param_groups)
    optimizer.add_param_group({**template, "params": list(params)})
    for scheduler in _flatten(schedulers):
        _extend_scheduler(scheduler, optimizer.param_groups[-1], n_before)


def remove_seed_group(optimizer: Optimizer, slot_id: str, schedulers: Sequence[Any] = ()) -> None:
    """Remove the group ``seed/<slot_id>``, its optimizer state and its scheduler entries."""
    index = _group_index(optimizer, seed_group_name(slot_id))
    if index is None:
        raise RuntimeError(f"optimizer has no param group {seed_group_name(slot_id)!r}")
    group = optimizer.param_groups.pop(index)
    for p in group["params"]:
        optimizer.state.pop(p, None)
    for scheduler in _flatten(schedulers):
        for attr in _PER_GROUP_LISTS:
            values = getattr(scheduler, attr, None)
            if isinstance(values, list) and len(values) == len(optimizer.param_groups) + 1:
                del values[index]


def set_group_params(optimizer: Optimizer, slot_id: str, params: Sequence[nn.Parameter]) -> None:
    """Replace the params of a seed group (its gate appeared or went); drop stale state."""
    index = _group_index(optimizer, seed_group_name(slot_id))
    if index is None:
        raise RuntimeError(f"optimizer has no param group {seed_group_name(slot_id)!r}")
    group = optimizer.param_groups[index]
    keep = {id(p) for p in params}
    for p in group["params"]:
        if id(p) not in keep:
            optimizer.state.pop(p, None)
    group["params"] = list(params)


def _flatten(schedulers: Sequence[Any]) -> list[Any]:
    """Schedulers and the ones nested in SequentialLR / ChainedScheduler."""
    flat: list[Any] = []
    for scheduler in schedulers:
        flat.append(scheduler)
        flat.extend(_flatten(getattr(scheduler, "_schedulers", [])))
    return flat


def _extend_scheduler(scheduler: Any, group: dict[str, Any], n_before: int) -> None:
    for attr in _PER_GROUP_LISTS:
        values = getattr(scheduler, attr, None)
        if not isinstance(values, list) or len(values) != n_before:
            continue
        if attr in ("base_lrs", "_last_lr"):
            values.append(group["initial_lr"] if attr == "base_lrs" else group["lr"])
        else:  # a per-group function or floor: the new group follows group 0's rule
            values.append(values[0])
