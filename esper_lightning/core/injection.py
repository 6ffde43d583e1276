"""Slot discovery and injection: where a model's seeds can grow.

A model either declares `SeedSlot` modules itself (the built-in hosts do) or names submodules by
path (``"net.3"``, as in ``model.named_modules()``) after which a slot is injected. An injected
slot is registered as a child of one `nn.ModuleDict` on the model (`INJECTED_SLOTS_ATTR`), so it
follows ``.to()``, dtype and ``state_dict`` while the host's own parameter names stay unchanged,
and a forward hook on the named submodule passes that submodule's output through the slot: a
tensor, or the first element of a tuple (the rest passes unchanged).

A `core.depth.DepthGrowth` adds *growth slots*: after blocks of a stack of same-shape blocks,
where a seed is new blocks of the stack's own class. Their hook also hands the slot how the
block was called (`blueprints.growth.BlockCall`: attention masks, position embeddings), which
the new blocks are called with, and checks the block on its first activation
(`core.depth.check_first_activation`). A growth slot's id is the block's path and its place in
the chain after it: ``blocks.0+1``, ``blocks.0+2``.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from torch import Tensor, nn

from esper_lightning.blueprints.growth import BlockCall, hidden_of
from esper_lightning.blueprints.growth.seed import SLOT_HOOK_MARK
from esper_lightning.core.depth import (
    GROWN_STACK_ATTR,
    DepthGrowth,
    check_first_activation,
    check_place_free,
    find_stack,
    growth_slot_id,
    model_init,
    places,
    present_blocks,
    site_of,
)
from esper_lightning.core.slots import SeedSlot, find_slots, set_slot_hook

#: Name of the `nn.ModuleDict` that holds injected slots on the model.
INJECTED_SLOTS_ATTR = "esper_slots"
#: Suffix under which ``nn.Module.get_extra_state`` is saved (a slot's manifest).
_EXTRA_STATE = "._extra_state"
#: The topology of growth slots: a stack's hidden state ``[B, T, D]``.
GROWTH_TOPOLOGY = "transformer"


class SlotHook:
    """Forward hook that passes a module's output (or its first element) through its slot; a
    growth slot also gets the module's call."""

    def __init__(self, slot: SeedSlot, path: str, keyword: str | None = None) -> None:
        self.slot, self.path, self.keyword = slot, path, keyword
        setattr(self, SLOT_HOOK_MARK, True)  # a copy of the module leaves it behind

    def __call__(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                 output: Any) -> Any:
        try:
            hidden = hidden_of(output)
        except TypeError:
            raise TypeError(f"slot after {self.path!r} needs a tensor output (or a tuple whose "
                            f"first element is one), got {type(output).__name__}") from None
        call = None
        if self.slot.growth is not None:
            call = BlockCall.of(args, kwargs, self.keyword)
            call.check(hidden)
            if self.slot.identity_mode is None and not hidden.is_meta:
                before = args[0] if args else kwargs[self.keyword]
                self.slot.record_identity(check_first_activation(self.slot, module, before,
                                                                 hidden, call))
        new = self.slot(hidden, call=call)
        if isinstance(output, Tensor):
            return new
        return type(output)([new, *output[1:]])


def resolve_slots(
    model: nn.Module, requested: Sequence[str] | str | None, topology: str | None,
    growth: DepthGrowth | None = None,
) -> dict[str, SeedSlot]:
    """The slots ``requested`` names (a `SeedSlot` id or a module path, one name or a list),
    injecting a slot of ``topology`` (None: inferred from its first activation) after each
    module path, then the growth slots of ``growth``; ``requested=None`` without ``growth``:
    every `SeedSlot` the model declares."""
    existing = find_slots(model)
    if requested is None and growth is None:
        if not existing:
            raise ValueError(
                f"no SeedSlot modules found in {type(model).__name__}; pass slots=[...] with "
                "module paths to inject slots after them, or growth=DepthGrowth(...)"
            )
        return existing
    if isinstance(requested, str):
        requested = [requested]  # one name, not its characters
    modules = dict(model.named_modules())
    resolved: dict[str, SeedSlot] = {}
    for name in requested or ():
        if name in resolved:
            raise ValueError(f"slot {name!r} listed twice")
        target = modules.get(name)
        if name and target is not None and not isinstance(target, SeedSlot):
            resolved[name] = _inject(model, name, target, SeedSlot(name, topology=topology))
        elif name in existing:
            resolved[name] = existing[name]
        else:
            raise ValueError(_unknown_slot_message(model, name, existing, modules))
    if growth is not None:
        for slot_id, slot in inject_growth(model, growth).items():
            if slot_id in resolved:
                raise ValueError(f"slot {slot_id!r} listed twice")
            resolved[slot_id] = slot
    return resolved


def inject_growth(model: nn.Module, growth: DepthGrowth) -> dict[str, SeedSlot]:
    """Inject the growth slots of ``growth`` into ``model`` (module docstring), in order: by
    place, then along each place's chain."""
    path, container, named = find_stack(model, growth.stack)
    check_place_free(path, container)
    init = model_init(model, path, growth.init)
    slots = {}
    for index in places(growth, len(container), named):
        for order, blocks in enumerate(growth.events, 1):
            block_path = f"{path}.{index}"
            site = site_of(growth, blocks, partial(_stack_before, model, path, index, order,
                                                   growth.from_own_block), init)
            slot = SeedSlot(growth_slot_id(block_path, order), topology=GROWTH_TOPOLOGY,
                            growth=site, growth_place={"stack": path, "after": index,
                                                       "order": order})
            slots[slot.slot_id] = _inject(model, block_path, container[index], slot)
    setattr(container, GROWN_STACK_ATTR, True)  # materialize of a submodule can tell
    return slots


def _stack_before(model: nn.Module, path: str, index: int, order: int,
                  own: bool = False) -> list[nn.Module]:
    """The blocks before growth slot ``order`` after block ``index`` of the stack at ``path``,
    in forward order: the stack's blocks and what earlier growth slots added; with ``own``
    (interleaved growth) only block ``index`` and what earlier slots after it added."""
    container = dict(model.named_modules())[path]
    injected = getattr(model, INJECTED_SLOTS_ATTR, {})
    blocks: list[nn.Module] = []
    for i in range(index if own else 0, index + 1):
        blocks.append(container[i])
        for k in range(1, order if i == index else _chain_length(injected, path, i) + 1):
            slot = injected[_key(growth_slot_id(f"{path}.{i}", k))]
            blocks.extend(present_blocks(slot))
    return blocks


def _chain_length(injected: Any, path: str, index: int) -> int:
    k = 0
    while _key(growth_slot_id(f"{path}.{index}", k + 1)) in injected:
        k += 1
    return k


def _key(slot_id: str) -> str:
    return slot_id.replace(".", "__")


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


def _inject(model: nn.Module, path: str, target: nn.Module, slot: SeedSlot) -> SeedSlot:
    """Register ``slot`` on ``model`` (once: a slot already there under its id is kept) and hook
    it after ``target``."""
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
    key = _key(slot.slot_id)
    if key in container:
        kept: SeedSlot = container[key]
        kept.adopt_growth(slot)
        slot = kept
    else:
        reference = next(iter(target.parameters()), None)
        if reference is None:
            reference = next(iter(model.parameters()), None)
        if reference is not None:
            slot.to(device=reference.device, dtype=reference.dtype)
        container[key] = slot
    hook = SlotHook(slot, path, _hidden_keyword(target) if slot.growth is not None else None)
    set_slot_hook(slot, target.register_forward_hook(hook, with_kwargs=True))
    return slot


def _hidden_keyword(block: nn.Module) -> str | None:
    """The name of the first parameter of ``block``'s forward (the hidden state's, when a
    container passes it by keyword)."""
    try:
        parameters = list(inspect.signature(block.forward).parameters.values())
    except (TypeError, ValueError):
        return None
    first = next((p for p in parameters if p.kind in (p.POSITIONAL_ONLY,
                                                      p.POSITIONAL_OR_KEYWORD)), None)
    return None if first is None else first.name


def restore_slots(model: nn.Module, state_dict: Mapping[str, Any],
                  growth: DepthGrowth | None = None) -> tuple[str, ...]:
    """Inject into ``model`` the slots that were injected when ``state_dict`` was saved.

    Each ``esper_slots.<key>._extra_state`` entry is an injected slot's manifest, which names
    its module path (``slot_id``) and topology, and for a growth slot its stack and place.
    After this, ``model.load_state_dict(state_dict)`` loads strictly and rebuilds every seed
    (stage, alpha, blend) with its weights. Slots already present are kept (their hook is
    re-attached), so calling it twice is harmless.

    Args:
        model: a freshly built model (e.g. a LightningModule) of the class that was trained.
        state_dict: the saved state dict (``checkpoint["state_dict"]`` for Lightning).
        growth: the run's `DepthGrowth` (its identity and init settings); None: the defaults,
            which rebuild any growth slot's blocks (the manifest says how ``identity`` made
            them).

    Returns:
        The ids of the injected slots, in state-dict order.

    Raises:
        ValueError: a manifest that does not match its key, or a path ``model`` lacks.

    Example:
        >>> class MyModule(L.LightningModule):  # doctest: +SKIP
        ...     def on_load_checkpoint(self, checkpoint):
        ...         restore_slots(self, checkpoint["state_dict"])
    """
    saved = _saved_slots(state_dict)
    plain = {sid: m["topology"] for sid, m in saved.items() if not m.get("growth")}
    for topology in dict.fromkeys(plain.values()):
        resolve_slots(model, [p for p, t in plain.items() if t == topology], topology)
    chains: dict[tuple[str, int], int] = {}  # (stack, block index) -> growth slots after it
    for manifest in saved.values():
        place = (manifest.get("growth") or {}).get("place")
        if place is not None:
            key = (place["stack"], place["after"])
            chains[key] = max(chains.get(key, 0), place["order"])
    settings = growth or DepthGrowth()
    for (stack, after), length in chains.items():
        events = tuple(saved[growth_slot_id(f"{stack}.{after}", k)]["growth"]["blocks"]
                       for k in range(1, length + 1))
        inject_growth(model, dataclasses.replace(settings, stack=f"{stack}.{after}",
                                                 blocks=events))
    return tuple(saved)


def _saved_slots(state_dict: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Injected slots in a state dict: slot id -> its manifest."""
    prefix = INJECTED_SLOTS_ATTR + "."
    saved: dict[str, Mapping[str, Any]] = {}
    for key, manifest in state_dict.items():
        if not (key.startswith(prefix) and key.endswith(_EXTRA_STATE)):
            continue
        name = key[len(prefix):-len(_EXTRA_STATE)]
        if "." in name:  # extra state of a module inside a slot, not a slot's manifest
            continue
        if not isinstance(manifest, Mapping) or not {"slot_id", "topology"} <= manifest.keys():
            raise ValueError(f"state dict entry {key!r} is not a slot manifest")
        slot_id = manifest["slot_id"]
        if not isinstance(slot_id, str) or _key(slot_id) != name:
            raise ValueError(f"state dict entry {key!r} holds the manifest of slot {slot_id!r}")
        saved[slot_id] = manifest
    return saved
