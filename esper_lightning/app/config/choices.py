"""What a configuration checks of the tasks, as plain data: the command line checks a whole
configuration before it imports torch, and these copies of the facts that torch-side modules
own (`envs.TASKS`, `rl.rewards.RewardMode`, `core.outcome`, `core.slots`) are checked against
them in tests/test_app_config.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from esper_lightning.hosts.presets import GPT_PRESETS
from esper_lightning.hosts.presets import PRESETS as CNN_PRESETS  # PRESETS in presets.py: the runs'
from esper_lightning.schedule import LR_SCHEDULES


@dataclass(frozen=True)
class TaskChoices:
    """What a configuration checks of a task: its host presets (with their slot ids) and what a
    run that names none uses. Plain data, so the command line checks a whole configuration
    before it imports torch; the `Task` classes of `esper_lightning.envs.tasks` play the tasks
    and carry the same facts (tests/test_app_config.py checks that they agree)."""

    presets: Mapping[str, Any]
    default_preset: str
    default_slots: tuple[str, ...]
    default_host_lr: float

    def slot_ids(self, preset: str) -> tuple[str, ...]:
        """Every slot id of host ``preset``, in action order."""
        return self.presets[preset].slot_ids  # type: ignore[no-any-return]


#: The tasks a configuration may name (``--task``).
TASK_CHOICES: dict[str, TaskChoices] = {
    "cifar": TaskChoices(CNN_PRESETS, "baseline", ("r0c0", "r0c1", "r0c2"), 0.01),
    "lm": TaskChoices(GPT_PRESETS, "tiny", ("r0c0", "r0c1"), 1e-3),
}
#: The reward modes of `esper_lightning.rl.rewards.RewardMode`, by value.
REWARD_MODES = ("shaped", "simplified", "sparse")
#: Epochs the outcome averages (`esper_lightning.core.outcome.OUTCOME_EPOCHS`).
OUTCOME_EPOCHS = 3
#: What the outcome measures (`esper_lightning.core.outcome.OUTCOMES`).
OUTCOMES = ("accuracy", "bits")
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")
#: `esper_lightning.core.slots.BLEND_GRADIENTS` (plain data: parsing never imports torch).
BLEND_GRADIENTS = ("detached", "through")
# Choices as types, so the command-line help lists them.
TaskName = Literal[tuple(TASK_CHOICES)]  # type: ignore[valid-type]
HostPresetName = Literal[tuple(p for t in TASK_CHOICES.values() for p in t.presets)]  # type: ignore[valid-type]
RewardName = Literal[REWARD_MODES]  # type: ignore[valid-type]
OutcomeName = Literal[OUTCOMES]  # type: ignore[valid-type]
PrecisionName = Literal[PRECISIONS]  # type: ignore[valid-type]
BlendGradientName = Literal[BLEND_GRADIENTS]  # type: ignore[valid-type]
LRScheduleName = Literal[LR_SCHEDULES]  # type: ignore[valid-type]
#: How ``esper-lightning ppo`` runs: one process, or Lightning's data-parallel launchers.
STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_fork")
StrategyName = Literal[STRATEGIES]  # type: ignore[valid-type]


