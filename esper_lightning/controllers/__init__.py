"""Controllers: decide once per epoch what happens to the seeds.

Every controller follows the `Controller` protocol (``decide``, ``reset``, ``state_dict``,
``load_state_dict``) and reads the same `EpochReport`; `ControllerBase` adds the optional hooks
the callback uses (``last_reason``, ``earliest_germination``, ``timing``, ``check_blueprints``) at
their defaults::

    from esper_lightning.controllers import HeuristicController

    controller = HeuristicController()
    action = controller.decide(report)  # once per epoch, after validation
"""

from esper_lightning.controllers.base import (
    Controller,
    ControllerBase,
    ExplainsDecisions,
    NamesBlueprints,
    PlansGermination,
    check_named_blueprint,
)
from esper_lightning.controllers.baselines import (
    GrowerController,
    RandomController,
    ScriptedController,
    StaticController,
)
from esper_lightning.controllers.heuristic import HeuristicConfig, HeuristicController
from esper_lightning.controllers.policy import PolicyController
from esper_lightning.controllers.stack import StackController

__all__ = [
    "Controller",
    "ControllerBase",
    "ExplainsDecisions",
    "GrowerController",
    "HeuristicConfig",
    "HeuristicController",
    "NamesBlueprints",
    "PlansGermination",
    "PolicyController",
    "RandomController",
    "ScriptedController",
    "StackController",
    "StaticController",
    "check_named_blueprint",
]
