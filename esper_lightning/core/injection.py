"""Slot discovery and injection: where a model's seeds can grow.

A model either declares `SeedSlot` modules itself (the built-in hosts do) or names submodules by
path (``"net.3"``, as in ``model.named_modules()``) after which a slot is injected. An injected
slot is registered as a child of one `nn.ModuleDict` on the model (`INJECTED_SLOTS_ATTR`), so it
follows ``.to()``, dtype and ``state_dict`` while the host's own parameter names stay unchanged,
and a forward hook on the named submodule passes that submodule's output through the slot.
A slot injected after a transformer `Block` follows that block: a ``block_*`` seed there builds
on it (`SeedSlot.preceding`), stacking the slot's ``growth_depth`` blocks (``growth_depth=3``
after the only block of a one-block model grows it to four in one germination).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from torch import Tensor, nn

from esper_lightning.blueprints.block import Block, last_block
from esper_lightning.core.slots import SeedSlot, check_growth_depth, find_slots

#: Name of the `nn.ModuleDict` that holds injected slots on the model.
INJECTED_SLOTS_ATTR = "esper_slots"
#: Suffix under which ``nn.Module.get_extra_state`` is saved (a slot's manifest).
_EXTRA_STATE = "._extra_state"


class SlotHook:
    """Forward hook that passes a module's output through its slot."""

    def __init__(self, slot: SeedSlot, path: str) -> None:
        self.slot, self.path = slot, path

    def __call__(self, module: nn.Module, args: Any, output: Any) -> Tensor:
        if not isinstance(output, Tensor):
            raise TypeError(
                f"slot after {self.path!r} needs a tensor output, got {type(output).__name__}"
            )
        return self.slot(output)


def resolve_slots(
    model: nn.Module, requested: Sequence[str] | str | None, topology: str | None,
    growth_depth: int | None = None,
) -> dict[str, SeedSlot]:
    """The slots ``requested`` names (a `SeedSlot` id or a module path, one name or a list),
    injecting a slot of ``topology`` (None: inferred from its first activation) after each
    module path; None: every `SeedSlot` the model declares.

    ``growth_depth`` is the blocks a block seed stacks in an injected slot (None: 1). A slot
    the model declares keeps its own, so a different one given for it is refused in one line.
    """
    if growth_depth is not None:
        check_growth_depth(growth_depth)
    existing = find_slots(model)
    if requested is None:
        if not existing:
            raise ValueError(
                f"no SeedSlot modules found in {type(model).__name__}; pass slots=[...] with "
                "module paths to inject slots after them"
            )
        return existing
    if isinstance(requested, str):
        requested = [requested]  # one name, not its characters
    modules = dict(model.named_modules())
    resolved: dict[str, SeedSlot] = {}
    for name in requested:
        if name in resolved:
            raise ValueError(f"slot {name!r} listed twice")
        target = modules.get(name)
        if name and target is not None and not isinstance(target, SeedSlot):
            resolved[name] = _inject(model, name, target, topology, growth_depth or 1)
        elif name in existing:
            resolved[name] = _declared(existing[name], growth_depth)
        else:
            raise ValueError(_unknown_slot_message(model, name, existing, modules))
    return resolved


def _unknown_slot_message(
    model: nn.Module, name: str, existing: Mapping[str, SeedSlot], modules: Mapping[str, Any]
) -> str:
    paths = [p for p, m in modules.items() if p and not isinstance(m, SeedSlot)]
    sample = ", ".join(paths[:8]) + (", ..." if len(paths) > 8 else "")
    ids = ", ".join(existing) or "none"
    return (
        f"unknown slot {name!r}; accepted: SeedSlot ids in {type(model).__name__} ({ids}) "
        f"or module paths ({sample})"
    )


def _declared(slot: SeedSlot, growth_depth: int | None) -> SeedSlot:
    """``slot``, a slot the model declares, once its own growth depth is the one given."""
    if growth_depth is not None and growth_depth != slot.growth_depth:
        raise ValueError(f"slot {slot.slot_id!r} is declared by the model with growth_depth "
                         f"{slot.growth_depth}; growth_depth={growth_depth} applies to slots "
                         "injected after a module path: leave it None for declared slots")
    return slot


def _inject(model: nn.Module, path: str, target: nn.Module, topology: str | None,
            growth_depth: int = 1) -> SeedSlot:
    container = getattr(model, INJECTED_SLOTS_ATTR, None)
    if isinstance(model, nn.Sequential | nn.ModuleList | nn.ModuleDict):
        # Their forward (or use) iterates over children: an extra child would change the model.
        raise ValueError(
            f"cannot inject slots into a bare {type(model).__name__}; wrap it in a module "
            "(e.g. your LightningModule) and name the slots by path, such as 'net.3'"
        )
    if container is None:
        container = nn.ModuleDict()
        model.add_module(INJECTED_SLOTS_ATTR, container)
    key = path.replace(".", "__")
    if key not in container:
        slot = SeedSlot(path, topology=topology, growth_depth=growth_depth)
        reference = next(iter(target.parameters()), None)
        if reference is None:
            reference = next(iter(model.parameters()), None)
        if reference is not None:
            slot.to(device=reference.device, dtype=reference.dtype)
        container[key] = slot
    slot = container[key]
    previous = getattr(slot, "_hook_handle", None)
    if previous is not None:  # re-attached (e.g. a second fit): never run a slot twice
        previous.remove()
    slot._hook_handle = target.register_forward_hook(SlotHook(slot, path))
    slot.preceding = partial(_block_or_none, target)
    return slot


def _block_or_none(module: nn.Module) -> Block | None:
    """What a slot after ``module`` follows, for a block seed: the module if it is a `Block`,
    the last block of a `BlockStack`."""
    return last_block(module)


def restore_slots(model: nn.Module, state_dict: Mapping[str, Any]) -> tuple[str, ...]:
    """Inject into ``model`` the slots that were injected when ``state_dict`` was saved.

    Each ``esper_slots.<key>._extra_state`` entry is an injected slot's manifest, which names
    its module path (``slot_id``), topology and growth depth. After this,
    ``model.load_state_dict(state_dict)`` loads strictly and rebuilds every seed (stage, alpha,
    blend) with its weights. Slots already present are kept (their hook is re-attached), so
    calling it twice is harmless.

    Args:
        model: a freshly built model (e.g. a LightningModule) of the class that was trained.
        state_dict: the saved state dict (``checkpoint["state_dict"]`` for Lightning).

    Returns:
        The module paths of the injected slots, in state-dict order.

    Raises:
        ValueError: a manifest that does not match its key, or a path ``model`` lacks.

    Example:
        >>> class MyModule(L.LightningModule):  # doctest: +SKIP
        ...     def on_load_checkpoint(self, checkpoint):
        ...         restore_slots(self, checkpoint["state_dict"])
    """
    saved = _saved_slots(state_dict)
    for shape in dict.fromkeys(saved.values()):
        resolve_slots(model, [p for p, s in saved.items() if s == shape], *shape)
    return tuple(saved)


def _saved_slots(state_dict: Mapping[str, Any]) -> dict[str, tuple[str, int]]:
    """Injected slots in a state dict: module path -> (topology, growth depth), read from
    their manifests."""
    prefix = INJECTED_SLOTS_ATTR + "."
    saved: dict[str, tuple[str, int]] = {}
    for key, manifest in state_dict.items():
        if not (key.startswith(prefix) and key.endswith(_EXTRA_STATE)):
            continue
        name = key[len(prefix):-len(_EXTRA_STATE)]
        if "." in name:  # extra state of a module inside a slot, not a slot's manifest
            continue
        if not isinstance(manifest, Mapping) or not {"slot_id", "topology"} <= manifest.keys():
            raise ValueError(f"state dict entry {key!r} is not a slot manifest")
        path = manifest["slot_id"]
        if not isinstance(path, str) or path.replace(".", "__") != name:
            raise ValueError(f"state dict entry {key!r} holds the manifest of slot {path!r}")
        # Manifests from before block stacks have no growth depth: 1.
        saved[path] = (manifest["topology"], manifest.get("growth_depth", 1))
    return saved
