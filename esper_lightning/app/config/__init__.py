"""Typed, strict configuration of the application's commands.

`TaskConfig` (`task`) is the task every env plays (data, host, slots, episode length, reward);
`PPORunConfig` (`ppo`) adds how a controller is learned (``esper-lightning ppo``) and
`CompareConfig` (`compare`) how controllers are compared (``esper-lightning compare``). A
configuration is built in layers (`layers`): the defaults, a preset (`presets`), an optional
JSON/YAML file, then command-line flags. Every layer is checked strictly (`checks`): an unknown
key, a wrong type or an out-of-range value raises `ConfigError` with a one-line message naming
the bad value and what is accepted. What the checks know of the tasks is plain data (the tasks'
descriptors, `envs.task_specs`, and `choices`), so nothing here imports torch. The docstrings'
``Args`` sections are the command-line help (jsonargparse reads them), so every field is
documented exactly once.
"""

from esper_lightning.app.config.checks import field_types
from esper_lightning.app.config.choices import (
    BLEND_GRADIENTS,
    OUTCOME_EPOCHS,
    OUTCOMES,
    PRECISIONS,
    REWARD_MODES,
    STRATEGIES,
)
from esper_lightning.app.config.compare import CompareConfig
from esper_lightning.app.config.layers import (
    ADDED_KEY_DEFAULTS,
    COMPATIBILITY_KEYS,
    EXCLUSIVE_KEYS,
    INVOCATION_KEYS,
    TASK_DEFAULTED_KEYS,
    compatibility_errors,
    config_differences,
    from_layers,
    from_mapping,
    layered,
    policy_checkpoint,
    read_config_file,
    saved_values,
)
from esper_lightning.app.config.ppo import PPORunConfig
from esper_lightning.app.config.presets import PRESETS, load_config, preset_values
from esper_lightning.app.config.task import TaskConfig, check_hardware
from esper_lightning.errors import ConfigError

__all__ = [
    "ADDED_KEY_DEFAULTS", "BLEND_GRADIENTS", "COMPATIBILITY_KEYS", "EXCLUSIVE_KEYS",
    "INVOCATION_KEYS", "OUTCOMES", "OUTCOME_EPOCHS", "PRECISIONS", "PRESETS", "REWARD_MODES",
    "STRATEGIES", "TASK_DEFAULTED_KEYS", "CompareConfig", "ConfigError",
    "PPORunConfig", "TaskConfig", "check_hardware", "compatibility_errors",
    "config_differences", "field_types", "from_layers", "from_mapping", "layered",
    "load_config", "policy_checkpoint", "preset_values", "read_config_file", "saved_values",
]
