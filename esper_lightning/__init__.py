"""esper-lightning: morphogenetic training for PyTorch Lightning.

Networks that grow while they train: seeds germinate in slots of a host model, incubate without
disturbing it, blend in, and are fossilized or pruned. The main user API is importable from here::

    from esper_lightning import GovernorCallback, HeuristicController, MorphogenesisCallback

The core names (`SeedSlot`, `SeedStage`, `Action`, ...) come from `esper_lightning.core`, which
never imports Lightning. Every name is imported on first use, so ``import esper_lightning.core``
stays Lightning-free and ``import esper_lightning`` imports no torch at all. The layout is
explained in docs/design.md.
"""

from __future__ import annotations

from esper_lightning._lazy import lazy_exports

__version__ = "0.1.0"

#: Names of `esper_lightning.core` offered here.
_CORE = (
    "Action", "ActionMasks", "AlphaAlgorithm", "AlphaController", "AlphaCurve", "AlphaMode",
    "ComputeLedger", "DepthGrowth", "EpochReport", "GateConfig", "GateMode", "GateResult",
    "LifecycleOp", "MaskContext", "SeedSlot", "SeedStage", "SeedingConfig", "SlotReport",
    "compute_masks",
    "export", "find_slots", "materialize", "restore_slots",
)
#: Every public name, resolved lazily from its module (PEP 562): ``import esper_lightning`` alone
#: imports neither torch nor Lightning, so the command line answers ``--help`` at once.
_LAZY = {
    **dict.fromkeys(_CORE, "esper_lightning.core"),
    "MorphogenesisCallback": "esper_lightning.callbacks",
    "ComputeBudget": "esper_lightning.callbacks",
    "GovernorCallback": "esper_lightning.callbacks",
    "HeuristicController": "esper_lightning.controllers",
    "HeuristicConfig": "esper_lightning.controllers",
    "PolicyController": "esper_lightning.controllers",
    "RandomController": "esper_lightning.controllers",
    "StaticController": "esper_lightning.controllers",
    "StackController": "esper_lightning.controllers",
    "CifarCNNHost": "esper_lightning.hosts",
    "load_grown": "esper_lightning.grown",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


__all__ = [
    "Action",
    "ActionMasks",
    "AlphaAlgorithm",
    "AlphaController",
    "AlphaCurve",
    "AlphaMode",
    "CifarCNNHost",
    "ComputeBudget",
    "ComputeLedger",
    "DepthGrowth",
    "EpochReport",
    "GateConfig",
    "GateMode",
    "GateResult",
    "GovernorCallback",
    "HeuristicConfig",
    "HeuristicController",
    "LifecycleOp",
    "MaskContext",
    "MorphogenesisCallback",
    "PolicyController",
    "RandomController",
    "SeedSlot",
    "SeedStage",
    "SeedingConfig",
    "SlotReport",
    "StackController",
    "StaticController",
    "compute_masks",
    "export",
    "find_slots",
    "load_grown",
    "materialize",
    "restore_slots",
]
