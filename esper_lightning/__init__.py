"""esper-lightning: morphogenetic training for PyTorch Lightning.

Networks that grow while they train: seeds germinate in slots of a host model, incubate without
disturbing it, blend in, and are fossilized or pruned.
"""

from esper_lightning.actions import Action, ActionMasks, LifecycleOp, MaskContext, compute_masks
from esper_lightning.alpha import AlphaAlgorithm, AlphaController, AlphaCurve, AlphaMode
from esper_lightning.lifecycle import GateMode, GateResult, SeedStage
from esper_lightning.slots import SeedSlot, SlotReport, find_slots

__version__ = "0.1.0"

__all__ = [
    "Action",
    "ActionMasks",
    "AlphaAlgorithm",
    "AlphaController",
    "AlphaCurve",
    "AlphaMode",
    "GateMode",
    "GateResult",
    "LifecycleOp",
    "MaskContext",
    "SeedSlot",
    "SeedStage",
    "SlotReport",
    "compute_masks",
    "find_slots",
]
