"""Ship a grown model: fold every fossilized seed into a plain, esper-free `nn.Module`.

`export` copies the model, replaces each `SeedSlot` by what it computes in eval mode (the
fossilized seed blended at its final alpha, or nothing at all for an empty or removed seed),
rewires injected slots' forward hooks to those replacements, and traces the copy with
`torch.export`. The result is an unlifted `torch.fx.GraphModule` built from torch classes only:
it runs and re-exports where `esper_lightning` is not installed, and ``export(..., path=...)``
also writes the traced program as a ``.pt2`` file that ``torch.export.load`` reads back there,
batch size still dynamic.

Live seeds (TRAINING, BLENDING, HOLDING) are refused: their output still changes with training
and alpha, so what would be shipped is not a finished model. Fossilize or prune them first, or
pass ``live="drop"`` to leave them out (the export then computes the host without them).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.export import Dim

from esper_lightning.blueprints.growth import BlockCall, hidden_of
from esper_lightning.core.alpha import AlphaAlgorithm
from esper_lightning.core.injection import SlotHook
from esper_lightning.core.lifecycle import SeedStage
from esper_lightning.core.slots import SeedSlot

__all__ = ["BATCH", "LIVE_POLICIES", "FossilBlend", "export"]

#: What `export` does with a live seed: refuse, or leave it out.
LIVE_POLICIES = ("error", "drop")
#: Default ``dynamic_shapes`` of `export`: dim 0 of every tensor input may vary.
BATCH = "batch"
#: Stages whose seed still trains or blends, so its output would change after export.
_REFUSED = frozenset({SeedStage.TRAINING, SeedStage.BLENDING, SeedStage.HOLDING})


class FossilBlend(nn.Module):
    """A fossilized seed as plain torch: its slot's blend at a fixed alpha, lifecycle gone.

    ADD at alpha 1 is the seed's output alone, as in the slot; every other case repeats
    `SeedSlot`'s blend formula operation for operation, so it is bitwise equal to the slot's
    output. A growth seed's blocks get the call of the block their slot follows (``call``).

    Args:
        seed: the seed module (from the slot).
        gate: the slot's gate network, needed by the GATE blend only.
        algorithm: the slot's blend algorithm.
        alpha: the slot's alpha (1.0 for a fossil).

    Example:
        >>> fossil = FossilBlend(nn.Identity(), None, AlphaAlgorithm.MULTIPLY, 1.0)
        >>> fossil(torch.ones(1, 2, 1, 1)).flatten().tolist()
        [1.0, 1.0]
    """

    def __init__(
        self, seed: nn.Module, gate: nn.Module | None, algorithm: AlphaAlgorithm, alpha: float
    ) -> None:
        super().__init__()
        if algorithm == AlphaAlgorithm.GATE and gate is None:
            raise ValueError("the GATE blend needs the slot's gate module, got None")
        self.seed = seed
        self.gate = gate if algorithm == AlphaAlgorithm.GATE else None
        self.algorithm = AlphaAlgorithm(algorithm)
        self.alpha = float(alpha)

    def forward(self, h: Tensor, call: BlockCall | None = None) -> Tensor:
        s = (self.seed(h) if call is None else self.seed(h, call)).to(h.dtype)
        if self.algorithm == AlphaAlgorithm.ADD and self.alpha == 1.0:
            return s
        # Same dtype and construction as SeedSlot._alpha_tensor, so the blend rounds alike.
        a = torch.full((), self.alpha, device=h.device, dtype=h.dtype)
        if self.algorithm == AlphaAlgorithm.ADD:
            return h + a * (s - h)
        if self.algorithm == AlphaAlgorithm.MULTIPLY:
            return h * (1 + a * torch.tanh(s - h))
        assert self.gate is not None
        a_eff = (a * self.gate(h).to(h.dtype)).clamp(0.0, 1.0)
        return h + a_eff * (s - h)

    def extra_repr(self) -> str:
        return f"{self.algorithm.name}, alpha={self.alpha}"


class _PlainHook:
    """Forward hook that passes a module's output (or its first element) through a slot's
    replacement; a growth slot's replacement gets the module's call."""

    def __init__(self, replacement: nn.Module, keyword: str | None, growth: bool) -> None:
        self.replacement, self.keyword, self.growth = replacement, keyword, growth

    def __call__(self, module: nn.Module, args: Any, kwargs: dict[str, Any], output: Any) -> Any:
        hidden = hidden_of(output)
        if self.growth and isinstance(self.replacement, FossilBlend):
            new = self.replacement(hidden, BlockCall.of(args, kwargs, self.keyword))
        else:
            new = self.replacement(hidden)
        return new if isinstance(output, Tensor) else type(output)([new, *output[1:]])


def export(
    model: nn.Module,
    example_input: Tensor | tuple[Any, ...],
    *,
    live: str = "error",
    dynamic_shapes: Any = BATCH,
    path: str | os.PathLike[str] | None = None,
) -> nn.Module:
    """A plain-torch copy of ``model`` in eval mode with every fossilized seed folded in.

    Fossilized seeds become part of the network (`FossilBlend`); empty, GERMINATED, PRUNED,
    EMBARGOED and RESETTING slots, which are identities, disappear. The copy is traced with
    `torch.export.export` and the unlifted `torch.fx.GraphModule` is returned: it holds no
    `esper_lightning` class or hook and can be traced by `torch.export` again (without
    ``dynamic_shapes``, such a trace fixes the batch size). ``model`` itself is left unchanged.
    The result is frozen in eval mode: its ``train()`` and ``eval()`` raise
    `NotImplementedError` (as for any ``ExportedProgram.module()``).

    Args:
        model: a host with `SeedSlot` modules and/or injected slots (e.g. a LightningModule).
        example_input: one input tensor, or a tuple of positional arguments, for the trace.
        live: ``"error"`` (default) refuses a TRAINING, BLENDING or HOLDING seed; ``"drop"``
            leaves such seeds out, so the export computes the host without them.
        dynamic_shapes: ``"batch"`` (default): dim 0 of every tensor input is dynamic (the
            example needs at least 2 rows); None: every shape fixed to the example's; anything
            else is passed to `torch.export.export` as is.
        path: also save the traced program here (``torch.export.save``, atomically), dynamic
            shapes and all: ``torch.export.load(path).module()`` runs any batch size where
            `esper_lightning` is not installed.

    Returns:
        The exported module, on the device of ``model``.

    Raises:
        ValueError: a live seed with ``live="error"``, an unknown ``live`` value, or a batch
            dimension that cannot be dynamic. Errors of `torch.export` itself (a forward
            it cannot trace) pass through unchanged.

    Example:
        >>> from esper_lightning.hosts import CifarCNNHost
        >>> host = CifarCNNHost("baseline", slots=["r0c1"])  # grown and fossilized elsewhere
        >>> shipped = export(host, torch.randn(2, 3, 32, 32))
        >>> shipped(torch.randn(5, 3, 32, 32)).shape
        torch.Size([5, 10])
        >>> _ = export(host, torch.randn(2, 3, 32, 32), path="model.pt2")  # doctest: +SKIP
    """
    if live not in LIVE_POLICIES:
        raise ValueError(f"unknown live policy {live!r}; accepted: {', '.join(LIVE_POLICIES)}")
    args = example_input if isinstance(example_input, tuple) else (example_input,)
    shapes = _dynamic_shapes(args, dynamic_shapes)
    _check_live(model, live)
    plain = _without_slots(copy.deepcopy(model)).eval()
    program = torch.export.export(plain, args, dynamic_shapes=shapes)
    if path is not None:
        _save_atomically(program, Path(path))
    return program.module()


def _save_atomically(program: torch.export.ExportedProgram, path: Path) -> None:
    """``torch.export.save`` to a temporary file beside ``path``, then rename it into place."""
    # Ending in .pt2: torch.export.save warns about any other suffix (of the user's too).
    partial = path.with_name(f".{path.name}.partial.pt2")
    try:
        torch.export.save(program, partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _check_live(model: nn.Module, live: str) -> None:
    if live == "drop":
        return
    for module in model.modules():
        if isinstance(module, SeedSlot) and module.stage in _REFUSED:
            raise ValueError(
                f"slot {module.slot_id!r} holds a live seed ({module.stage.name}); fossilize or "
                "prune it before export, or pass live='drop' to export without it"
            )


def _dynamic_shapes(args: tuple[Any, ...], dynamic_shapes: Any) -> Any:
    if isinstance(dynamic_shapes, str) and dynamic_shapes != BATCH:
        raise ValueError(
            f"unknown dynamic_shapes {dynamic_shapes!r}; accepted: {BATCH!r}, None or a "
            "torch.export dynamic_shapes specification"
        )
    if dynamic_shapes != BATCH:
        return dynamic_shapes
    spec: list[dict[int, Any] | None] = []
    for index, arg in enumerate(args):
        if not isinstance(arg, Tensor):
            spec.append(None)
            continue
        if arg.dim() == 0 or arg.shape[0] < 2:
            # torch.export specialises sizes 0 and 1, so such a batch cannot stay dynamic.
            raise ValueError(
                f"example input {index} has shape {tuple(arg.shape)}: a dynamic batch needs at "
                "least 2 rows in dim 0; pass a larger example or dynamic_shapes=None"
            )
        spec.append({0: Dim.DYNAMIC})
    return tuple(spec)


def _without_slots(root: nn.Module) -> nn.Module:
    """Replace every slot in ``root`` (a private copy) by plain torch, in place."""
    if isinstance(root, SeedSlot):
        return _replacement(root)
    replaced: dict[int, nn.Module] = {}
    found = [(n, m) for n, m in root.named_modules(remove_duplicate=False)
             if isinstance(m, SeedSlot)]
    for name, slot in found:
        if id(slot) not in replaced:
            replaced[id(slot)] = _replacement(slot)
        parent_name, _, attr = name.rpartition(".")
        setattr(root.get_submodule(parent_name), attr, replaced[id(slot)])
    for module in root.modules():
        hooks = module._forward_hooks
        for key, hook in list(hooks.items()):
            if isinstance(hook, SlotHook):  # an injected slot: keep its place in hook order
                hooks[key] = _PlainHook(replaced[id(hook.slot)], hook.keyword,
                                        hook.slot.growth is not None)
    return root


def _replacement(slot: SeedSlot) -> nn.Module:
    """What ``slot`` computes in eval mode, as plain torch (live seeds were checked before)."""
    if slot.stage != SeedStage.FOSSILIZED:
        return nn.Identity()  # an identity stage, or a live seed that live='drop' leaves out
    assert slot.seed is not None and slot.blend is not None, f"fossil without a seed in {slot!r}"
    return FossilBlend(slot.seed, slot.gate, slot.blend.algorithm, slot.alpha)
