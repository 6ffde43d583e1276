"""The Lightning-free core of morphogenetic training.

Everything a growing network needs, written against plain PyTorch so that both adapters (the
Trainer callbacks in `esper_lightning.callbacks`, the Fabric environments in
`esper_lightning.envs`) share one implementation of every rule:

* `lifecycle`: seed stages, legal transitions, quality gates, seed metrics;
* `alpha`: the blend schedule; `slots`: `SeedSlot`, the module a seed grows in;
* `actions`: the factored action space and its masks;
* `seeding`: `SeedingConfig`, how seeds grow in a run, passed whole to both adapters;
* `engine`: `MorphogenesisEngine`, which executes actions and ticks slots; `optim`: seed param
  groups that keep the optimizer and its LR schedulers in step; `injection`: slots after named
  submodules;
* `counterfactual`: each seed's contribution, measured with the seed's alpha at 0 (separate
  forwards by default, or one fused forward);
* `divergence` and `snapshot`: the governor's rules and what a rollback restores; `rollback`:
  `roll_back`, the one rollback routine both adapters call;
* `report`: `EpochReport`, what a controller sees; `telemetry`: the ``morpho/*`` metrics;
  `outcome`: the episode outcome a controller is judged by;
* `exporter`: `export`, a grown model as a plain torch module with its fossilized seeds folded in.

No module here imports Lightning (a test checks it).
"""

from esper_lightning.core.actions import (
    Action,
    ActionMasks,
    LifecycleOp,
    MaskContext,
    compute_masks,
)
from esper_lightning.core.alpha import AlphaAlgorithm, AlphaController, AlphaCurve, AlphaMode
from esper_lightning.core.compute import ComputeLedger
from esper_lightning.core.depth import DepthGrowth, materialize
from esper_lightning.core.divergence import Governor, GovernorConfig
from esper_lightning.core.engine import LifecycleEvent, MorphogenesisEngine, StepOutcome
from esper_lightning.core.exporter import export
from esper_lightning.core.injection import restore_slots
from esper_lightning.core.lifecycle import GateConfig, GateMode, GateResult, SeedStage
from esper_lightning.core.report import EpochReport
from esper_lightning.core.seeding import SeedingConfig
from esper_lightning.core.slots import SeedSlot, SlotReport, find_slots
from esper_lightning.core.snapshot import Snapshot, restore_snapshot, take_snapshot

__all__ = [
    "Action",
    "ActionMasks",
    "AlphaAlgorithm",
    "AlphaController",
    "AlphaCurve",
    "AlphaMode",
    "ComputeLedger",
    "DepthGrowth",
    "EpochReport",
    "GateConfig",
    "GateMode",
    "GateResult",
    "Governor",
    "GovernorConfig",
    "LifecycleEvent",
    "LifecycleOp",
    "MaskContext",
    "MorphogenesisEngine",
    "SeedSlot",
    "SeedStage",
    "SeedingConfig",
    "SlotReport",
    "Snapshot",
    "StepOutcome",
    "compute_masks",
    "export",
    "find_slots",
    "materialize",
    "restore_slots",
    "restore_snapshot",
    "take_snapshot",
]
