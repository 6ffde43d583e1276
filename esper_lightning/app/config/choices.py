"""What a configuration checks, as plain data: the command line checks a whole configuration
before it imports torch. The tasks are their own descriptors (`envs.task_specs`, plain data
registered beside the classes that play them); the other choices here are torch-free copies of
facts that torch-side modules own (`rl.rewards.RewardMode`, `core.outcome`, `core.slots`),
checked against them in tests/test_app_config.py."""

from __future__ import annotations

from typing import Literal

from esper_lightning.envs.task_specs import TASKS, task_names
from esper_lightning.schedule import LR_SCHEDULES

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
# The tasks' names and presets are those registered when this module is first imported (the
# command line's choices); `TaskConfig` checks a name and a preset against the registry itself,
# so a task registered later from Python is accepted there too.
TaskName = Literal[task_names()]  # type: ignore[valid-type]
HostPresetName = Literal[tuple(dict.fromkeys(p for t in TASKS.values() for p in t.presets))]  # type: ignore[valid-type]
RewardName = Literal[REWARD_MODES]  # type: ignore[valid-type]
OutcomeName = Literal[OUTCOMES]  # type: ignore[valid-type]
PrecisionName = Literal[PRECISIONS]  # type: ignore[valid-type]
BlendGradientName = Literal[BLEND_GRADIENTS]  # type: ignore[valid-type]
LRScheduleName = Literal[LR_SCHEDULES]  # type: ignore[valid-type]
#: How ``esper-lightning ppo`` runs: one process, or Lightning's data-parallel launchers.
STRATEGIES = ("auto", "ddp", "ddp_spawn", "ddp_fork")
StrategyName = Literal[STRATEGIES]  # type: ignore[valid-type]


