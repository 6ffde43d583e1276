"""Depth growth in any model: its stack of blocks, its growth slots, and the grown model handed
back.

A model grows deeper where it has a **stack**: a ``ModuleList`` or ``Sequential`` of blocks of
one class and one shape (a nanoGPT ``blocks``, Hugging Face GPT-2's ``transformer.h``, Llama's
``model.layers``, a timm ViT's ``blocks``). `DepthGrowth` says where its **growth slots** go:
after the last block (``at="top"``), after every block (``"interleave"``: each block followed
by copies of itself) or after block ``i``; and how many blocks each growth event adds
(``blocks=3``: one to four in one event; ``blocks=(1, 2)``: one to two, then to four, each
event its own slot, chained). A growth slot is a `SeedSlot` whose seed is new blocks of the
stack's own class, built by a growth operator (`blueprints.growth`: ``copy``, ``identity``,
``random``, or one of your own), and lives through the lifecycle like any seed: germinated,
blended, fossilized or pruned, rolled back by the governor, saved and resumed.

The first activation through a growth slot checks, in one line each, that its block maps the
hidden state to one of the same shape and how ``identity`` makes a copy return its input there
(zeroed residual projections, verified on that activation, or a gate); the result is saved in
the slot's manifest. `grow` is the functional form, with no lifecycle: new blocks go straight
into the stack (and the optimizer). `materialize` hands a grown model back: every fossilized
growth seed's blocks move into the stack, the slots go, and a Hugging Face config says the new
depth (with ``layer_idx`` renumbered), so ``save_pretrained`` / ``from_pretrained`` give a plain
model of the grown depth with the same logits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from esper_lightning.blueprints.growth import GatedBlock, GrownBlocks, GrowthSite
from esper_lightning.blueprints.growth.identity import identity_block
from esper_lightning.blueprints.growth.layouts import find_projections, layout_names
from esper_lightning.blueprints.growth.site import MOMENTS, BlockCall, hidden_of
from esper_lightning.core.lifecycle import ACTIVE_STAGES, SeedStage
from esper_lightning.core.slots import remove_slot_hook

__all__ = ["PLACES", "DepthGrowth", "find_stack", "grow", "growth_slot_id", "materialize"]

#: Set on a stack while growth slots wait after its blocks (`core.injection.inject_growth`):
#: `materialize` of a module inside the one holding the slots finds the stack, not the slots.
GROWN_STACK_ATTR = "_esper_growth_slots"

#: Where growth slots go in a stack (besides a block index).
PLACES = ("top", "interleave")


@dataclass(frozen=True)
class DepthGrowth:
    """Where and how a model grows deeper (module docstring).

    Args:
        stack: Module path of the stack (``"blocks"``, ``"model.transformer.h"``) or of one of
            its blocks (growth after that block); None: the model's one stack of same-shape
            blocks, found (refused in one line when there are several or none).
        blocks: Blocks one growth event adds: an int (one growth slot per place), or one int
            per event (chained slots per place: ``(1, 2)`` grows one block, then two more).
        at: ``"top"`` (after the last block), ``"interleave"`` (after every block, each
            growing copies of its own block) or an int ``i`` (after block ``i``); with
            ``stack`` naming one block, the default (that block is the place).
        projections: Names inside a block of its residual branches' output projections, which
            the ``identity`` operator zeroes; None: the common layouts', else found by running
            the block (the last layer of each residual branch).
        gate: Let ``identity`` fall back to a zero-initialised gate on the block's residual
            update where zeroed projections do not make a copy return its input; False
            refuses such a block at fit start instead.
        init: How the model initialises a block, for the ``random`` operator (``block ->
            None``); None: the model's ``_init_weights`` (Hugging Face, nanoGPT) applied to
            each submodule if it has one, else each submodule's ``reset_parameters``.
        moments: ``"fresh"`` or ``"copy"``: whether a block copied from another starts from
            that block's optimizer moments (AdamW's ``exp_avg``, ``exp_avg_sq``, ``step``).

    Example:
        >>> DepthGrowth("blocks", blocks=(1, 2)).events
        (1, 2)
    """

    stack: str | None = None
    blocks: int | tuple[int, ...] = 1
    at: str | int = "top"
    projections: tuple[str, ...] | None = None
    gate: bool = True
    init: Callable[[nn.Module], None] | None = None
    moments: str = "fresh"

    def __post_init__(self) -> None:
        if self.stack is not None and (not isinstance(self.stack, str) or not self.stack):
            raise ValueError(f"DepthGrowth stack must be a module path (e.g. 'blocks') or None, "
                             f"got {self.stack!r}")
        blocks = self.blocks
        iterable = isinstance(blocks, list | tuple)
        events = tuple(blocks) if iterable else (blocks,)
        if not events or any(isinstance(n, bool) or not isinstance(n, int) or n < 1
                             for n in events):
            raise ValueError(f"DepthGrowth blocks must be an int >= 1 or a list of them, got "
                             f"{self.blocks!r}")
        at_ok = self.at in PLACES or (isinstance(self.at, int) and not isinstance(self.at, bool)
                                      and self.at >= 0)
        if not at_ok:
            raise ValueError(f"DepthGrowth at must be one of {', '.join(PLACES)} or a block "
                             f"index >= 0, got {self.at!r}")
        if not isinstance(self.gate, bool):  # a string such as "no" would read as True
            raise ValueError(f"DepthGrowth gate must be True or False, got {self.gate!r}")
        if self.moments not in MOMENTS:
            raise ValueError(f"DepthGrowth moments must be one of {', '.join(MOMENTS)}, got "
                             f"{self.moments!r}")
        if isinstance(self.projections, str):
            raise ValueError(f"DepthGrowth projections must be a list of names, got the string "
                             f"{self.projections!r}")
        if self.projections is not None:
            object.__setattr__(self, "projections", tuple(self.projections))

    @property
    def from_own_block(self) -> bool:
        """Whether each place grows from its own block alone (interleaved growth), not from
        the blocks before it."""
        return self.at == "interleave"

    @property
    def events(self) -> tuple[int, ...]:
        """Blocks added per growth event, in order."""
        return (self.blocks,) if isinstance(self.blocks, int) else tuple(self.blocks)


def growth_slot_id(block_path: str, order: int) -> str:
    """The id of the ``order``-th growth slot (1-based) after the block at ``block_path``.

    Example:
        >>> growth_slot_id("transformer.h.0", 2)
        'transformer.h.0+2'
    """
    return f"{block_path}+{order}"


def _is_stack(module: nn.Module) -> bool:
    """A ``ModuleList`` or ``Sequential`` of blocks of one class and one parameter shape."""
    return isinstance(module, nn.ModuleList | nn.Sequential) and _unlike_blocks(module) is None


def _unlike_blocks(container: nn.Module) -> str | None:
    """Why the blocks of ``container`` (a ``ModuleList`` or ``Sequential``) are no stack: the
    first block that differs from block 0 (its class, a parameter it lacks or adds, or a
    parameter's shape), or None when they are one.

    Example:
        >>> _unlike_blocks(nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 8)]))
        "block 1's weight is (8, 4), block 0's (4, 4)"
    """
    if len(container) == 0:
        return "it holds no block"
    blocks = list(container)
    first = dict(blocks[0].named_parameters())
    if not first:
        return f"block 0 ({type(blocks[0]).__name__}) has no parameters"
    for index, block in enumerate(blocks[1:], start=1):
        if type(block) is not type(blocks[0]):
            return (f"block {index} is a {type(block).__name__}, block 0 a "
                    f"{type(blocks[0]).__name__}")
        params = dict(block.named_parameters())
        for name, p in first.items():
            if name not in params:
                return f"block {index} has no parameter {name!r}, which block 0 has"
            if params[name].shape != p.shape:
                return (f"block {index}'s {name} is {tuple(params[name].shape)}, block 0's "
                        f"{tuple(p.shape)}")
        extra = [name for name in params if name not in first]
        if extra:
            return f"block {index} has a parameter {extra[0]!r}, which block 0 has not"
    return None


def find_stack(model: nn.Module, path: str | None) -> tuple[str, nn.Module, int | None]:
    """The stack ``path`` names in ``model``: ``(its path, the container, the index of the named
    block or None)``; None finds the model's one stack.

    Raises:
        ValueError: One line naming what was found instead and what is accepted.
    """
    modules = dict(model.named_modules())
    accepted = ("accepted: a ModuleList or Sequential of blocks of one class and shape (e.g. "
                "blocks, transformer.h, model.layers), or one block of it")
    if path is None:
        found = [p for p, m in modules.items() if p and _is_stack(m)]
        outer = [p for p in found if not any(p.startswith(q + ".") for q in found if q != p)]
        if len(outer) != 1:
            what = f"stacks {', '.join(outer)}" if outer else "no stack of same-shape blocks"
            raise ValueError(f"DepthGrowth(stack=None) finds {what} in {type(model).__name__}; "
                             f"name one: {accepted}")
        return outer[0], modules[outer[0]], None
    if path not in modules or not path:
        raise ValueError(f"DepthGrowth: {type(model).__name__} has no module {path!r}; "
                         f"{accepted}")
    if _is_stack(modules[path]):
        return path, modules[path], None
    parent, _, index = path.rpartition(".")
    if index.isdigit() and parent in modules and _is_stack(modules[parent]):
        return parent, modules[parent], int(index)
    # A container of blocks that are not alike (or a block of one): say which block differs,
    # and how, rather than what the container is.
    for name in (parent if index.isdigit() else None, path):
        container = modules.get(name) if name is not None else None
        if isinstance(container, nn.ModuleList | nn.Sequential):
            raise ValueError(f"DepthGrowth: {name!r} is a {type(container).__name__} but not a "
                             f"stack of same-shape blocks: {_unlike_blocks(container)}; "
                             f"{accepted}")
    raise ValueError(f"DepthGrowth: {path!r} is a {type(modules[path]).__name__}, not a stack "
                     f"of blocks or one of its blocks; {accepted}")


def check_place_free(path: str, container: nn.Module) -> None:
    """Refuse blocks that compute by their place in the stack: a new block made from one of
    them would compute as its source does, the natively deeper model as its own place says
    (GPT-2's ``scale_attn_by_inverse_layer_idx`` divides attention by ``layer_idx + 1``).

    Raises:
        ValueError: One line naming the module and the setting.
    """
    for name, module in container[0].named_modules():
        if getattr(module, "scale_attn_by_inverse_layer_idx", False) is True:
            raise ValueError(f"DepthGrowth: {path}.0{'.' + name if name else ''} scales its "
                             "attention by 1/(layer_idx + 1) (scale_attn_by_inverse_layer_idx"
                             "=True), so a grown block cannot compute as both its source and "
                             "the natively deeper model; accepted: "
                             "scale_attn_by_inverse_layer_idx=False")


def places(growth: DepthGrowth, size: int, named: int | None) -> list[int]:
    """The indices of the blocks growth slots follow."""
    if named is not None:
        if growth.at != "top":  # the default: a named block is the place
            raise ValueError(f"DepthGrowth stack names block {named} and at={growth.at!r} "
                             f"another place; accepted: the stack's path with at=, or one of "
                             f"its blocks with the default at='top'")
        return [named]
    if growth.at == "top":
        return [size - 1]
    if growth.at == "interleave":
        return list(range(size))
    if int(growth.at) >= size:
        raise ValueError(f"DepthGrowth at={growth.at} is past the stack's {size} block(s); "
                         f"accepted: 0..{size - 1}, top or interleave")
    return [int(growth.at)]


def model_init(model: nn.Module, container_path: str,
               given: Callable[[nn.Module], None] | None) -> Callable[[nn.Module], None] | None:
    """How ``model`` initialises a block: ``given``, else the ``_init_weights`` of the nearest
    module on the way to the stack that has one (Hugging Face, nanoGPT), else None."""
    if given is not None:
        return given
    modules = dict(model.named_modules())
    parts = container_path.split(".")
    for depth in range(len(parts) - 1, -1, -1):
        owner = modules.get(".".join(parts[:depth]))
        init = getattr(owner, "_init_weights", None)
        if callable(init):
            return _applied(init)
    return None


def _applied(init: Callable[[nn.Module], None]) -> Callable[[nn.Module], None]:
    def apply(block: nn.Module) -> None:
        for p in block.parameters():  # Hugging Face skips tensors it marked initialised
            if getattr(p, "_is_hf_initialized", False):
                p._is_hf_initialized = False
        block.apply(init)
    return apply


def site_of(growth: DepthGrowth, blocks: int, stack: Callable[[], list[nn.Module]],
            init: Callable[[nn.Module], None] | None) -> GrowthSite:
    return GrowthSite(blocks, stack, init=init, projections=growth.projections,
                      gate=growth.gate, moments=growth.moments)


def present_blocks(slot: Any) -> list[nn.Module]:
    """The blocks a growth slot's seed adds to the forward now (none while it is empty,
    pruned or not yet blending, and none for a seed that is not grown blocks: a LoRA in a
    growth slot adapts the activation and is no block a later growth seed copies)."""
    if slot.seed is None or slot.stage not in ACTIVE_STAGES:
        return []
    return list(slot.seed) if isinstance(slot.seed, GrownBlocks) else []


# --- the first activation: shapes and identity ---------------------------------------------
def check_first_activation(slot: Any, block: nn.Module, before: Tensor, after: Tensor,
                           call: BlockCall | None) -> str:
    """Check a growth slot on its first activation: its block keeps the hidden state's shape,
    and how ``identity`` makes a copy return its input here. Returns the identity mode.

    The projections the user named, or the block's layout's, are zeroed in a copy and must make
    it return its input; without a name (or with a layout's that do not), they are found by
    running the block on this activation (`blueprints.growth.layouts.find_projections`) and
    kept in the slot's site for the seeds built there. Where no layers do it, the copy is gated
    (``gate=True``) or the slot refused.

    Raises:
        ValueError: One line naming the block and what is accepted.
    """
    name = type(block).__name__
    if before.shape != after.shape:
        raise ValueError(f"growth slot {slot.slot_id!r}: {name} maps a hidden state "
                         f"{tuple(before.shape)} to {tuple(after.shape)}; a stack that grows "
                         "needs blocks that keep its shape")
    site = slot.growth

    def run(trial: nn.Module) -> Tensor:
        return call.run(trial, after) if call is not None else hidden_of(trial(after))

    names = site.projections or layout_names(block)
    if names is not None:
        trial = identity_block(block, dataclasses.replace(site, projections=names,
                                                          identity="projections"))
        with torch.no_grad():
            if torch.equal(run(trial), after):
                slot.refine_growth(dataclasses.replace(site, projections=names))
                return "projections"
    found = None if site.projections is not None else find_projections(block, run, after)
    if found is not None:
        slot.refine_growth(dataclasses.replace(site, projections=found))
        return "projections"
    if site.gate:
        return "gate"
    if site.projections is not None:
        raise ValueError(f"growth slot {slot.slot_id!r}: {name} with its residual projections "
                         f"{', '.join(site.projections)} at zero does not return its input and "
                         "gate=False; accepted: gate=True, or DepthGrowth(projections=[...]) "
                         "naming the right ones")
    raise ValueError(f"growth slot {slot.slot_id!r}: {name} with its residual projections at "
                     "zero does not return its input: no set of its layers at zero does (a "
                     "post-norm block?), and gate=False; accepted: gate=True, or "
                     "DepthGrowth(projections=[...]) naming the right ones")


# --- the functional form ---------------------------------------------------------------------
def grow(model: nn.Module, growth: DepthGrowth, operator: str,
         optimizer: torch.optim.Optimizer | None = None) -> list[nn.Module]:
    """Grow ``model`` at once by the first event of ``growth`` (``growth.blocks``, or its first
    entry) with ``operator``, no lifecycle: the new blocks go into the stack right after the
    block each place names (all of them at once for ``at="interleave"``), made from the blocks
    before them as a growth slot's seed would be. Each new parameter joins ``optimizer`` in the
    param group of the parameter it was made from (the user's own weight-decay grouping; the
    groups' LR schedulers need no change), starting from that parameter's optimizer state when
    ``growth.moments`` is ``"copy"`` and the operator copies weights. A Hugging Face config takes
    the new depth. Returns the new blocks, in the stack's order.

    Example:
        >>> stack = nn.Module()
        >>> stack.blocks = nn.ModuleList([nn.Linear(4, 4)])
        >>> [type(b).__name__ for b in grow(stack, DepthGrowth("blocks", blocks=2), "copy")]
        ['Linear', 'Linear']
        >>> len(stack.blocks)
        3
    """
    from esper_lightning.blueprints.growth import get_operator
    from esper_lightning.core.optim import copy_moments

    build = get_operator(operator)
    path, container, named = find_stack(model, growth.stack)
    check_place_free(path, container)
    init = model_init(model, path, growth.init)
    before = len(container)
    placed: list[tuple[int, list[nn.Module], list[nn.Module]]] = []
    for index in places(growth, before, named):
        first = index if growth.from_own_block else 0
        site = site_of(growth, growth.events[0],
                       lambda i=index, j=first: list(container)[j:i + 1], init)
        sources = site.sources()
        placed.append((index, sources, [build.build(source, site) for source in sources]))
    new_order: list[nn.Module] = []
    for index, block in enumerate(container):
        new_order.append(block)
        for at, _, blocks in placed:
            if at == index:
                new_order.extend(blocks)
    _refill(container, new_order)
    _hand_config(model, container, before)
    if optimizer is not None:
        for _, sources, blocks in placed:
            mapping = _join_optimizer(optimizer, sources, blocks)
            if growth.moments == "copy" and build.copies_weights:
                copy_moments(optimizer, [p for b in blocks for p in b.parameters()], mapping)
    return [b for _, _, blocks in placed for b in blocks]


def _join_optimizer(optimizer: torch.optim.Optimizer, sources: list[nn.Module],
                    blocks: list[nn.Module]) -> dict[int, nn.Parameter]:
    """Each new block's parameters into the group of their source's; returns new -> source."""
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    mapping: dict[int, nn.Parameter] = {}
    for source, block in zip(sources, blocks, strict=True):
        inner = block.block if isinstance(block, GatedBlock) else block
        by_name = dict(source.named_parameters())
        for name, p in inner.named_parameters():
            src = by_name.get(name)
            group = group_of.get(id(src)) if src is not None else None
            if group is None:  # a gate, or a source outside the optimizer: the first group
                group = optimizer.param_groups[0]
            else:
                mapping[id(p)] = src
            group["params"].append(p)
        if isinstance(block, GatedBlock):
            optimizer.param_groups[0]["params"].append(block.gate)
    return mapping


# --- handing the grown model back ------------------------------------------------------------
def materialize(model: nn.Module) -> list[str]:
    """Move the blocks of every fossilized growth seed of ``model`` (the module the slots were
    injected into: your LightningModule) into its stack, after the block and the earlier growth
    they followed, and remove every growth slot (an empty one too). A Hugging Face config takes
    the stack's new depth and every ``layer_idx`` follows its block's place. The model is then
    a plain model of the grown depth that computes what the grown one computed.

    Returns:
        The ids of the slots whose blocks moved.

    Raises:
        ValueError: A growth seed is still live (blending or holding): fossilize or prune it
            first (one line naming it); or ``model`` holds a stack whose growth slots were
            injected into an enclosing module (``materialize(lm.model)`` for ``lm``).
        TypeError: ``model`` is not a module.
    """
    from esper_lightning.core.slots import find_slots  # the slots import this module

    if not isinstance(model, nn.Module):
        raise TypeError(f"materialize takes the grown module (your LightningModule), got "
                        f"{type(model).__name__}")
    modules = dict(model.named_modules())
    slots = [s for s in find_slots(model).values() if s.growth_place is not None]
    if not slots:
        _check_no_slots_elsewhere(model)
    live = [s.slot_id for s in slots
            if s.seed is not None and s.stage not in (SeedStage.DORMANT, SeedStage.FOSSILIZED)]
    if live:
        raise ValueError(f"growth slot {live[0]!r} holds a live seed; fossilize or prune it "
                         "before handing the model back")
    # A fossilized seed that is not grown blocks (a LoRA after a block) has no place in a plain
    # stack: removing its slot would silently change what the model computes.
    kept = [s for s in slots if s.seed is not None and s.stage == SeedStage.FOSSILIZED
            and not isinstance(s.seed, GrownBlocks)]
    if kept:
        raise ValueError(f"growth slot {kept[0].slot_id!r} holds a fossilized "
                         f"{kept[0].state.blueprint} seed, not blocks; only growth seeds go "
                         "into the stack (keep the slots to use the model as it is)")
    moved = []
    for path in dict.fromkeys(s.growth_place["stack"] for s in slots):
        container = modules[path]
        before = len(container)
        group = sorted((s for s in slots if s.growth_place["stack"] == path),
                       key=lambda s: (s.growth_place["after"], s.growth_place["order"]))
        new: list[nn.Module] = []
        for index, block in enumerate(container):
            new.append(block)
            for slot in (s for s in group if s.growth_place["after"] == index):
                blocks = present_blocks(slot)
                new.extend(blocks)
                moved += [slot.slot_id] if blocks else []
        _refill(container, new)
        _hand_config(model, container, before)
        setattr(container, GROWN_STACK_ATTR, False)
    for slot in slots:
        _remove(model, slot)
    return moved


def _check_no_slots_elsewhere(model: nn.Module) -> None:
    """Refuse a module without growth slots whose stack grew: its slots hang off an enclosing
    module, and handing this one back as grown would silently hand back the ungrown model."""
    grown = next((name for name, m in model.named_modules()
                  if getattr(m, GROWN_STACK_ATTR, False)), None)
    if grown is not None:
        stack = f"its stack {grown!r}" if grown else "this stack"
        raise ValueError(f"materialize found no growth slot in {type(model).__name__}: the "
                         f"growth slots of {stack} are in the module that holds it; pass that "
                         "module (your LightningModule: materialize(lm), not "
                         "materialize(lm.model))")


def _refill(container: nn.Module, blocks: list[nn.Module]) -> None:
    """``container`` (a ``ModuleList`` or ``Sequential``) holds ``blocks``, in order."""
    for key in list(container._modules):
        del container._modules[key]
    for index, block in enumerate(blocks):
        container.add_module(str(index), block)


def _remove(model: nn.Module, slot: Any) -> None:
    """Take ``slot`` out of ``model``: its hook and its place among its parent's children."""
    remove_slot_hook(slot)
    for module in model.modules():
        for name, child in list(module._modules.items()):
            if child is slot:
                del module._modules[name]


def _hand_config(model: nn.Module, container: nn.Module, before: int) -> None:
    """A Hugging Face model's config says the stack's new depth; ``layer_idx`` follow the
    blocks' places."""
    for index, block in enumerate(container):
        for module in block.modules():
            if isinstance(getattr(module, "layer_idx", None), int):
                module.layer_idx = index
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "num_hidden_layers", None) != before:
            continue
        types = getattr(config, "layer_types", None)
        if isinstance(types, list) and len(types) == before:
            if len(set(map(str, types))) > 1:
                raise ValueError(f"the model's layers have different types "
                                 f"{sorted(set(map(str, types)))}; a hand-back cannot say which "
                                 "type each grown layer has")
            config.layer_types = [types[0]] * len(container)
        config.num_hidden_layers = len(container)
