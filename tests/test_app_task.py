"""`app/task.py`: from a `TaskConfig` to what the envs are built with (here: the seeding)."""

from __future__ import annotations

from esper_lightning.app.config import PRESETS, PPORunConfig, load_config
from esper_lightning.app.task import seeding_config
from esper_lightning.core.lifecycle import GateConfig
from esper_lightning.core.seeding import SeedingConfig


def test_the_task_keys_build_one_seeding_config():
    config = PPORunConfig(max_seeds=2, blueprints=("norm", "conv_light"), min_training_epochs=3,
                          blend_gradient="detached", layer_scale_init=1.0)
    assert seeding_config(config) == SeedingConfig(
        blueprints=("conv_light", "norm"), max_seeds=2,  # kept sorted by the config
        gate_config=GateConfig(min_training_epochs=3), blend_gradient="detached",
        layer_scale_init=1.0)
    assert seeding_config(PPORunConfig()) == SeedingConfig(
        gate_config=GateConfig(min_training_epochs=PPORunConfig().min_training_epochs))
    for name in PRESETS:  # every preset's keys make a seeding the core accepts
        preset = load_config(name)
        assert seeding_config(preset).gate_config.min_training_epochs == (
            preset.min_training_epochs)
