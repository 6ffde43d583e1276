"""Snapshots: what a governor rollback restores, written back in place.

`take_snapshot` captures CPU copies of the host and fossilized-seed weights, the slot manifests,
the optimizer state keyed by parameter name and the grad scaler; `restore_snapshot` writes them
back into the same Parameter objects, so everything holding them (the optimizer, Lightning,
Fabric, a compiled graph) stays valid. Live seeds are never captured: a rollback prunes them.

Memory: a snapshot costs one CPU copy of the host and fossilized-seed weights and buffers, plus one
CPU copy of their optimizer state (SGD with momentum: 1× the weights again; Adam: 2×). Taking a
snapshot replaces the previous one, so the caller holds at most two during the swap.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor, nn

from esper_lightning.core.lifecycle import LIVE_STAGES, SeedStage
from esper_lightning.core.slots import SeedSlot, find_slots

# torch stores a module's get_extra_state() under "<module path>._extra_state".
_EXTRA_STATE_SUFFIX = "_extra_state"


class SnapshotMismatchError(RuntimeError):
    """The model no longer has the structure a snapshot was taken from."""


@dataclass(frozen=True)
class Snapshot:
    """An in-memory, CPU-resident last-known-good state (see `take_snapshot`).

    Attributes:
        tensors: state_dict key → CPU copy, host and fossilized seeds only.
        extra_states: state_dict key → copy of the extra state of non-slot modules.
        manifests: slot id → `SeedSlot.manifest()` at snapshot time (for the engine and logs;
            `restore_snapshot` only uses them to check fossils are still there).
        excluded_prefixes: state_dict key prefixes left out (live seeds, plus ``exclude``).
        optimizer_state: parameter name → optimizer state with tensors on the CPU; None when
            no optimizer was given.
        cpu_state_keys: (parameter name, state key) of state tensors that lived on the CPU while
            their parameter did not (Adam's ``step``), restored to the CPU rather than moved.
        param_groups: group ``"name"`` → hyperparameters (every key but ``"params"``).
        scaler_state: ``scaler.state_dict()``, or None when no scaler was given.
    """

    tensors: dict[str, Tensor]
    extra_states: dict[str, Any]
    manifests: dict[str, dict[str, Any]]
    excluded_prefixes: frozenset[str]
    optimizer_state: dict[str, dict[str, Any]] | None = None
    cpu_state_keys: frozenset[tuple[str, str]] = field(default_factory=frozenset)
    param_groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    scaler_state: dict[str, Any] | None = None


def live_seed_prefixes(model: nn.Module) -> set[str]:
    """State_dict key prefixes of seeds a rollback prunes (stage in `LIVE_STAGES`).

    Example:
        >>> model = nn.Sequential(nn.Conv2d(3, 8, 1), SeedSlot("a", channels=8))
        >>> _ = model[1].germinate("conv_light")
        >>> sorted(live_seed_prefixes(model))
        ['1.gate.', '1.seed.']
    """
    prefixes: set[str] = set()
    # remove_duplicate=False: a module reachable under two paths appears in state_dict twice.
    for name, module in model.named_modules(remove_duplicate=False):
        if isinstance(module, SeedSlot) and module.stage in LIVE_STAGES:
            prefixes.update(_seed_prefixes(name))
    return prefixes


def take_snapshot(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scaler: Any | None = None,
    exclude: Iterable[str] | None = None,
) -> Snapshot:
    """Capture CPU copies of everything a rollback restores; live seeds are left out.

    Args:
        model: the host, containing `SeedSlot` modules (or none).
        optimizer: its state is captured per parameter *name*, because the engine adds and
            removes seed param groups, which shifts the index-based keys of
            ``optimizer.state_dict()``. Every optimized parameter must belong to ``model``.
        scaler: anything with ``state_dict()`` / ``load_state_dict()`` (``torch.amp.GradScaler``).
        exclude: extra state_dict key prefixes to leave out (e.g. ``["head."]``).

    Example:
        >>> model = nn.Sequential(nn.Linear(2, 2))
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        >>> snap = take_snapshot(model, opt)
        >>> sorted(snap.tensors), snap.tensors["0.weight"].device.type
        (['0.bias', '0.weight'], 'cpu')
    """
    if isinstance(exclude, str):
        raise TypeError(f"exclude must be a collection of key prefixes, got the string {exclude!r}")
    excluded = frozenset(live_seed_prefixes(model) | set(exclude or ()))
    owners = _extra_state_owners(model)
    tensors: dict[str, Tensor] = {}
    extra_states: dict[str, Any] = {}
    with torch.no_grad():
        for key, value in model.state_dict().items():
            if _under(key, excluded):
                continue
            owner = owners.get(key)
            if owner is None:
                tensors[key] = _cpu_copy(value)
            elif not isinstance(owner, SeedSlot):  # slot extra state = manifest, kept below
                extra_states[key] = _cpu_copy(value)
    manifests = {sid: copy.deepcopy(slot.manifest()) for sid, slot in find_slots(model).items()}
    snapshot = Snapshot(tensors, extra_states, manifests, excluded)
    if optimizer is not None:
        state, cpu_keys, groups = _capture_optimizer(model, optimizer, excluded)
        snapshot = replace(snapshot, optimizer_state=state, cpu_state_keys=cpu_keys,
                            param_groups=groups)
    if scaler is not None:
        snapshot = replace(snapshot, scaler_state=copy.deepcopy(scaler.state_dict()))
    return snapshot


def restore_snapshot(
    snapshot: Snapshot,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scaler: Any | None = None,
    *,
    restore_hyperparameters: bool = False,
) -> None:
    """Write ``snapshot`` back into ``model`` (and optimizer, scaler) in place.

    Call it after the engine pruned every live seed (that is lifecycle bookkeeping, with its
    events and embargo; slot manifests are not loaded back, which would resurrect them). Every
    captured key is copied into the existing Parameter or buffer, so parameter identity is kept.
    The optimizer state becomes exactly the snapshot's (every other parameter's state is cleared,
    which also drops momentum that would push the weights straight back towards the divergence).
    The snapshot is not consumed and can be restored again.

    Args:
        snapshot: from `take_snapshot`.
        model: the same model, live seeds pruned.
        optimizer: restores the captured optimizer state (the snapshot must hold one).
        scaler: restores the captured grad-scaler state (the snapshot must hold one).
        restore_hyperparameters: also write back the hyperparameters (lr, momentum, ...) of
            named param groups. Off by default: LR schedulers are not part of the snapshot and
            keep their own step count, so rewinding their learning rates would shift the schedule.

    Raises:
        SnapshotMismatchError: a captured key is missing from the model (for example a
            fossilized seed disappeared), a shape changed, the model has state the snapshot
            neither captured nor excluded, a captured parameter is no longer optimized, or a
            newer fossil (kept as it is) is not finite. Nothing is modified when raised.
        ValueError: an optimizer or scaler is given but the snapshot did not capture one.

    Example:
        >>> model = nn.Sequential(nn.Linear(2, 2))
        >>> snap = take_snapshot(model)
        >>> weight = model[0].weight
        >>> with torch.no_grad():
        ...     _ = weight.add_(1.0)
        >>> restore_snapshot(snap, model)
        >>> model[0].weight is weight and torch.equal(weight, snap.tensors["0.weight"])
        True
    """
    if optimizer is not None and snapshot.optimizer_state is None:
        raise ValueError("restore_snapshot got an optimizer but the snapshot holds no optimizer "
                         "state; pass the optimizer to take_snapshot")
    if scaler is not None and snapshot.scaler_state is None:
        raise ValueError("restore_snapshot got a scaler but the snapshot holds no scaler state; "
                         "pass the scaler to take_snapshot")
    current = model.state_dict(keep_vars=True)
    # Validate everything before touching anything, so a mismatch leaves the run intact.
    _check_model(snapshot, model, current)
    targets = None if optimizer is None else _check_optimizer(snapshot, model, optimizer)
    _restore_model(snapshot, model, current)
    if optimizer is not None and targets is not None:
        _restore_optimizer(snapshot, optimizer, targets)
        if restore_hyperparameters:
            _restore_hyperparameters(snapshot, optimizer)
    if scaler is not None:
        scaler.load_state_dict(copy.deepcopy(snapshot.scaler_state))


# --- snapshot internals ------------------------------------------------------------------------
def _seed_prefixes(slot_path: str) -> tuple[str, str]:
    base = f"{slot_path}." if slot_path else ""
    return f"{base}seed.", f"{base}gate."


def _under(key: str, prefixes: Iterable[str]) -> bool:
    return any(key.startswith(prefix) for prefix in prefixes)


def _extra_state_owners(model: nn.Module) -> dict[str, nn.Module]:
    """state_dict key → module, for every module that defines its own extra state."""
    owners: dict[str, nn.Module] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        if type(module).get_extra_state is not nn.Module.get_extra_state:
            owners[f"{name}.{_EXTRA_STATE_SUFFIX}" if name else _EXTRA_STATE_SUFFIX] = module
    return owners


def _cpu_copy(value: Any) -> Any:
    """A CPU copy that shares no storage with ``value`` (tensors nested in containers too)."""
    if isinstance(value, Tensor):
        # to(copy=True) copies straight to the CPU; clone().cpu() would first clone on the GPU.
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _cpu_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu_copy(v) for v in value)
    return copy.deepcopy(value)


def _capture_optimizer(
    model: nn.Module, optimizer: torch.optim.Optimizer, excluded: frozenset[str]
) -> tuple[dict[str, dict[str, Any]], frozenset[tuple[str, str]], dict[str, dict[str, Any]]]:
    names = {param: name for name, param in model.named_parameters()}
    state: dict[str, dict[str, Any]] = {}
    cpu_keys: set[tuple[str, str]] = set()
    groups: dict[str, dict[str, Any]] = {}
    for group in optimizer.param_groups:
        kept = 0
        for param in group["params"]:
            name = names.get(param)
            if name is None:
                raise ValueError(f"optimizer parameter of shape {tuple(param.shape)} is not a "
                                 "parameter of the model; the governor snapshots model parameters "
                                 "only")
            if _under(name, excluded):
                continue
            kept += 1
            entry = optimizer.state.get(param)
            if entry:
                state[name] = _cpu_copy(dict(entry))
                cpu_keys.update((name, k) for k, v in entry.items() if _stays_on_cpu(v, param))
        if "name" in group and (kept or not group["params"]):
            if group["name"] in groups:
                raise ValueError(f"two optimizer param groups are named {group['name']!r}; "
                                 "group names must be unique")
            groups[group["name"]] = {k: _cpu_copy(v) for k, v in group.items() if k != "params"}
    return state, frozenset(cpu_keys), groups


def _stays_on_cpu(value: Any, param: Tensor) -> bool:
    # Optimizers keep some scalars (Adam's non-capturable ``step``) on the CPU on purpose.
    return isinstance(value, Tensor) and value.device.type == "cpu" and param.device.type != "cpu"


def _check_model(snapshot: Snapshot, model: nn.Module, current: dict[str, Any]) -> None:
    captured = snapshot.tensors.keys() | snapshot.extra_states.keys()
    missing = sorted(k for k in captured if k not in current)
    if missing:
        raise SnapshotMismatchError(
            f"{len(missing)} captured key(s) missing from the model, e.g. {missing[:3]}: a host "
            "module or fossilized seed present at snapshot time is gone"
        )
    for key, saved in snapshot.tensors.items():
        if current[key].shape != saved.shape:
            raise SnapshotMismatchError(f"{key!r} has shape {tuple(current[key].shape)}, "
                                        f"snapshot has {tuple(saved.shape)}")
    _check_unexpected(snapshot, model, current, captured)
    _check_fossils(snapshot, model)
    _check_newer_fossils(snapshot, model)


def _check_unexpected(
    snapshot: Snapshot, model: nn.Module, current: dict[str, Any], captured: Iterable[str]
) -> None:
    # Allowed outside the snapshot: excluded prefixes and any seed (a fossil newer than the
    # snapshot keeps its current weights); slot extra state is the manifest, not restored.
    allowed = set(snapshot.excluded_prefixes)
    slot_extra: set[str] = set()
    for name, module in model.named_modules(remove_duplicate=False):
        if isinstance(module, SeedSlot):
            allowed.update(_seed_prefixes(name))
            slot_extra.add(f"{name}.{_EXTRA_STATE_SUFFIX}" if name else _EXTRA_STATE_SUFFIX)
    captured = set(captured)
    unexpected = sorted(k for k in current
                        if k not in captured and k not in slot_extra and not _under(k, allowed))
    if unexpected:
        raise SnapshotMismatchError(
            f"{len(unexpected)} model key(s) not in the snapshot, e.g. {unexpected[:3]}: the "
            "model gained state outside its seeds since the snapshot"
        )


def _check_fossils(snapshot: Snapshot, model: nn.Module) -> None:
    slots = find_slots(model)
    for slot_id, manifest in snapshot.manifests.items():
        state = manifest["state"]
        if state is None or state["stage"] != int(SeedStage.FOSSILIZED):
            continue
        slot = slots.get(slot_id)
        now = None if slot is None else slot.state
        if now is None or now.stage != SeedStage.FOSSILIZED or now.seed_id != state["seed_id"]:
            found = "no slot" if slot is None else f"stage {slot.stage.name}"
            raise SnapshotMismatchError(
                f"slot {slot_id!r}: fossilized seed {state['seed_id']!r} of the snapshot is gone "
                f"({found}); fossils are permanent and must survive until restore"
            )


def _check_newer_fossils(snapshot: Snapshot, model: nn.Module) -> None:
    """A fossil newer than the snapshot keeps its current weights through a restore (no snapshot
    holds older ones); if they are not finite, the restore would hand back a broken model."""
    for name, module in model.named_modules():
        if not isinstance(module, SeedSlot) or module.stage != SeedStage.FOSSILIZED:
            continue
        saved = (snapshot.manifests.get(module.slot_id) or {}).get("state")
        if saved is not None and saved["stage"] == int(SeedStage.FOSSILIZED):
            continue  # the snapshot holds this fossil's weights
        assert module.seed is not None  # a fossil holds its seed
        if not all(torch.isfinite(t).all() for t in module.seed.state_dict().values()
                   if isinstance(t, Tensor) and t.is_floating_point()):
            raise SnapshotMismatchError(
                f"slot {module.slot_id!r} ({name}): its seed fossilized after the snapshot and "
                "now holds non-finite weights, which no snapshot can restore; snapshot after "
                "every fossilization (GovernorCallback does, before the next optimizer step)")


def _check_optimizer(
    snapshot: Snapshot, model: nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, nn.Parameter]:
    params = dict(model.named_parameters())
    optimized = {p for group in optimizer.param_groups for p in group["params"]}
    targets: dict[str, nn.Parameter] = {}
    for name in snapshot.optimizer_state or {}:
        param = params.get(name)
        if param is None or param not in optimized:
            where = "is not in the model" if param is None else "is in no optimizer param group"
            raise SnapshotMismatchError(f"optimizer state of parameter {name!r} was captured but "
                                        f"the parameter {where}")
        targets[name] = param
    return targets


def _restore_model(snapshot: Snapshot, model: nn.Module, current: dict[str, Any]) -> None:
    with torch.no_grad():
        for key, saved in snapshot.tensors.items():
            current[key].copy_(saved)  # in place: the Parameter object stays the same
    owners = _extra_state_owners(model)
    for key, saved in snapshot.extra_states.items():
        owners[key].set_extra_state(copy.deepcopy(saved))


def _restore_optimizer(
    snapshot: Snapshot, optimizer: torch.optim.Optimizer, targets: dict[str, nn.Parameter]
) -> None:
    # Mutate optimizer.state in place: wrappers (LightningOptimizer) share this very object.
    optimizer.state.clear()
    for name, entry in (snapshot.optimizer_state or {}).items():
        param = targets[name]
        optimizer.state[param] = {
            key: _to_param_device(value, param, (name, key) in snapshot.cpu_state_keys)
            for key, value in entry.items()
        }


def _to_param_device(value: Any, param: Tensor, stay_on_cpu: bool) -> Any:
    if not isinstance(value, Tensor):
        return copy.deepcopy(value)
    device = torch.device("cpu") if stay_on_cpu else param.device
    return value.to(device, copy=True)  # a copy, so the snapshot can be restored again


def _restore_hyperparameters(snapshot: Snapshot, optimizer: torch.optim.Optimizer) -> None:
    for group in optimizer.param_groups:
        saved = snapshot.param_groups.get(group.get("name"))
        if saved is None:
            continue
        for key, value in saved.items():
            if isinstance(group.get(key), Tensor) and isinstance(value, Tensor):
                group[key].copy_(value)  # tensor lr (capturable/fused): keep the object
            else:
                group[key] = copy.deepcopy(value)
