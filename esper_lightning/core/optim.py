"""Keep an optimizer (and its LR schedulers) in step with the seeds of a growing model.

Each seed trains in its own param group named ``seed/<slot id>``. PyTorch has no way to remove a
param group, and LR schedulers keep per-group lists (``base_lrs``, ``lr_lambdas``, ...), so the
helpers here add and remove groups and extend or shrink those lists with them.

Seeds are decayed as the host is. A host that exempts its vectors from weight decay (a group
with ``weight_decay = 0`` holding 1-D parameters beside a decayed group of matrices, as
`GPTHost` and most transformer recipes do) gets a seed's vectors and scalars — norm gains,
biases, LayerScale ``gamma``, a gate — in a second group ``seed/<slot id>/no_decay`` with the
hyper-parameters of that host group, and its matrices in ``seed/<slot id>`` with those of the
decayed one: decaying a LayerScale ``gamma`` that starts at 1e-3 would pull the seed back to
the identity. A host that decays everything (one group, as `CifarCNNHost`) gets one group per
seed. A parameter of a growth seed (new blocks of the host's own class) goes where the
parameter it was made from is: the user's own grouping, whatever rule made it (an embedding
exempted, a norm decayed). `sync_seed_groups` is the one routine that keeps a slot's groups
right; `copy_moments` starts copied blocks from their sources' optimizer state.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.optim import Optimizer

SEED_GROUP_PREFIX = "seed/"
NO_DECAY_SUFFIX = "/no_decay"
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
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not math.isfinite(value) or value < 0):
                raise ValueError(f"seed {name} must be a finite number >= 0 or None, got "
                                 f"{value!r}")
        if self.momentum is not None and self.momentum >= 1:
            raise ValueError(f"seed momentum must be in [0, 1) or None, got {self.momentum!r}")

    def overrides(self) -> dict[str, float]:
        values = {"lr": self.lr, "momentum": self.momentum, "weight_decay": self.weight_decay}
        return {k: float(v) for k, v in values.items() if v is not None}


def seed_group_name(slot_id: str, no_decay: bool = False) -> str:
    """``seed/<slot_id>``, or ``seed/<slot_id>/no_decay`` for the seed's exempt parameters."""
    return SEED_GROUP_PREFIX + slot_id + (NO_DECAY_SUFFIX if no_decay else "")


def slot_of_group(name: str) -> str:
    """The slot id of a seed group's name."""
    return name.removeprefix(SEED_GROUP_PREFIX).removesuffix(NO_DECAY_SUFFIX)


def seed_group_names(optimizer: Optimizer) -> list[str]:
    """Names of the seed groups, in optimizer order."""
    return [g["name"] for g in optimizer.param_groups if _is_seed_group(g)]


def _is_seed_group(group: dict[str, Any]) -> bool:
    return str(group.get("name", "")).startswith(SEED_GROUP_PREFIX)


def _group_index(optimizer: Optimizer, name: str) -> int | None:
    return next((i for i, g in enumerate(optimizer.param_groups) if g.get("name") == name), None)


def _templates(optimizer: Optimizer) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The host groups a seed's matrices and its vectors copy: (decayed matrices, exempt
    vectors), the second None when the host exempts nothing (then group 0 serves all)."""
    host = [g for g in optimizer.param_groups if not _is_seed_group(g)] or optimizer.param_groups
    decayed = next((g for g in host if g.get("weight_decay", 0.0) > 0.0
                    and any(p.dim() >= 2 for p in g["params"])), None)
    exempt = next((g for g in host if g.get("weight_decay", 0.0) == 0.0
                   and any(p.dim() < 2 for p in g["params"])), None)
    if decayed is None or exempt is None:
        return host[0], None
    return decayed, exempt


def seed_groups(optimizer: Optimizer, slot_id: str, params: Sequence[nn.Parameter],
                sources: Mapping[int, nn.Parameter] | None = None
                ) -> dict[str, list[nn.Parameter]]:
    """The groups the parameters of the seed in ``slot_id`` belong in, by name (only non-empty
    ones): all in ``seed/<slot_id>``, or, when the host exempts its vectors from weight decay,
    matrices there and the rest in ``.../no_decay``. A parameter with a source
    (``sources[id(p)]``, a growth seed's) goes to the exempt group exactly when its source is
    in a group without weight decay."""
    _, exempt = _templates(optimizer)
    if exempt is None:
        return {seed_group_name(slot_id): list(params)} if params else {}
    decays = {id(p): g.get("weight_decay", 0.0) > 0.0 for g in optimizer.param_groups
              for p in g["params"]}
    source_of = sources or {}

    def exempted(p: nn.Parameter) -> bool:
        source = source_of.get(id(p))
        if source is not None and id(source) in decays:
            return not decays[id(source)]
        return p.dim() < 2

    groups = {seed_group_name(slot_id): [p for p in params if not exempted(p)],
              seed_group_name(slot_id, no_decay=True): [p for p in params if exempted(p)]}
    return {name: group for name, group in groups.items() if group}


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
    name: str,
    params: Sequence[nn.Parameter],
    config: SeedOptimConfig,
    schedulers: Sequence[Any] = (),
) -> None:
    """Append the seed group ``name`` (hyper-parameters copied from the host group it mirrors,
    `seed_groups`; then overridden by ``config``, except that an exempt group keeps no weight
    decay) and extend the schedulers' per-group lists."""
    if _group_index(optimizer, name) is not None:
        raise RuntimeError(f"optimizer already has a param group named {name!r}")
    decayed, exempt = _templates(optimizer)
    no_decay = name.endswith(NO_DECAY_SUFFIX)
    if no_decay and exempt is None:
        raise RuntimeError(f"{name!r}: the host exempts no parameter from weight decay")
    host = exempt if no_decay else decayed
    assert host is not None
    template = {k: copy.deepcopy(v) for k, v in host.items() if k != "params"}
    overrides = config.overrides()
    if no_decay:
        overrides.pop("weight_decay", None)
    template.update(overrides)
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


def remove_seed_group(optimizer: Optimizer, name: str, schedulers: Sequence[Any] = ()) -> None:
    """Remove the seed group ``name``, its optimizer state and its scheduler entries."""
    index = _group_index(optimizer, name)
    if index is None:
        raise RuntimeError(f"optimizer has no param group {name!r}")
    group = optimizer.param_groups.pop(index)
    for p in group["params"]:
        optimizer.state.pop(p, None)
    for scheduler in _flatten(schedulers):
        for attr in _PER_GROUP_LISTS:
            values = getattr(scheduler, attr, None)
            if isinstance(values, list) and len(values) == len(optimizer.param_groups) + 1:
                del values[index]


def set_group_params(optimizer: Optimizer, name: str, params: Sequence[nn.Parameter]) -> None:
    """Replace the params of the seed group ``name`` (a gate appeared or went); drop stale
    state."""
    index = _group_index(optimizer, name)
    if index is None:
        raise RuntimeError(f"optimizer has no param group {name!r}")
    group = optimizer.param_groups[index]
    keep = {id(p) for p in params}
    for p in group["params"]:
        if id(p) not in keep:
            optimizer.state.pop(p, None)
    group["params"] = list(params)


def sync_seed_groups(
    optimizer: Optimizer,
    slot_id: str,
    params: Sequence[nn.Parameter],
    config: SeedOptimConfig,
    schedulers: Sequence[Any] = (),
    sources: Mapping[int, nn.Parameter] | None = None,
) -> None:
    """Make the groups of ``slot_id`` hold exactly ``params`` (its seed's parameters now):
    add the missing groups, remove the ones left empty (with their state), refill changed ones.

    Example:
        >>> import torch
        >>> opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
        >>> seed = nn.Linear(2, 2)
        >>> sync_seed_groups(opt, "r0c1", list(seed.parameters()), SeedOptimConfig())
        >>> seed_group_names(opt)
        ['seed/r0c1']
        >>> sync_seed_groups(opt, "r0c1", [], SeedOptimConfig())
        >>> seed_group_names(opt)
        []
    """
    wanted = seed_groups(optimizer, slot_id, params, sources)
    present = {g["name"]: g for g in optimizer.param_groups
               if _is_seed_group(g) and slot_of_group(g["name"]) == slot_id}
    for name in present.keys() - wanted.keys():
        remove_seed_group(optimizer, name, schedulers)
    for name, group_params in wanted.items():
        if name not in present:
            add_seed_group(optimizer, name, group_params, config, schedulers)
        elif [id(p) for p in present[name]["params"]] != [id(p) for p in group_params]:
            set_group_params(optimizer, name, group_params)


def copy_moments(optimizer: Optimizer, params: Sequence[nn.Parameter],
                 sources: Mapping[int, nn.Parameter]) -> None:
    """Start each of ``params`` that has a source from a copy of its source's optimizer state
    (AdamW: ``exp_avg``, ``exp_avg_sq`` and ``step``, so bias correction goes on where the
    source's is); a source the optimizer has not stepped yet leaves it fresh."""
    for p in params:
        source = sources.get(id(p))
        if source is not None and optimizer.state.get(source):
            optimizer.state[p] = copy.deepcopy(optimizer.state[source])


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
