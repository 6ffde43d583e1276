import json

import pytest

from esper_lightning.app import config as config_module
from esper_lightning.app.config import (
    PRESETS,
    ConfigError,
    PPORunConfig,
    compatibility_errors,
    load_config,
)


def test_presets_are_valid_and_layered(tmp_path):
    for name in PRESETS:
        assert isinstance(load_config(name), PPORunConfig)
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"envs": 3, "slots": ["r0c0"]}))
    config = load_config("smoke", path, {"envs": 5})
    assert config.envs == 5 and config.slots == ("r0c0",) and config.episode_length == 4


def test_yaml_files(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("rounds: 7\nreward: sparse\n")
    config = load_config(None, path)
    assert config.rounds == 7 and config.reward == "sparse"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"bogus": 1}, "unknown config key(s) 'bogus'; accepted: data_dir"),
        ({"envs": 0}, "envs must be >= 1, got 0"),
        # The true bound, not a generic ">= 1" that 1 and 2 then fail against.
        ({"episode_length": 0}, "episode_length must be >= 3 (the outcome averages the last 3 "
                                "epochs), got 0"),
        ({"envs": "2"}, "envs must be an int, got '2'"),
        ({"slots": ["r0c9"]}, "unknown slot 'r0c9'; accepted: r0c0"),
        ({"slots": "r0c1"}, "slots must be a list of strings"),
        ({"precision": "fp8"}, "unknown precision 'fp8'; accepted: 32-true, bf16-mixed"),
        ({"device": "tpu"}, "unknown device 'tpu'; accepted: cpu, cuda, cuda:N"),
        ({"reward": "dense"}, "unknown reward 'dense'; accepted: shaped, simplified, sparse"),
        ({"gamma": 1.5}, r"gamma must be in \[0.0, 1.0\], got 1.5"),
        ({"blueprints": []}, "blueprints is empty; accepted: blueprint names of the task's slots"),
        ({"blueprints": ["norm", "norm"]}, "blueprints lists a blueprint twice: norm, norm"),
        ({"minibatch_envs": 3}, "minibatch_envs=3 does not divide envs=2; accepted: 1, 2$"),
        ({"envs": 6, "minibatch_envs": 4}, "minibatch_envs=4 does not divide envs=6; accepted: "
                                           "1, 2, 3, 6$"),
        ({"envs": 4, "minibatch_envs": 4, "ab": ["shaped", "sparse"]},
         r"minibatch_envs=4 does not divide the 2 envs of each policy \(envs=4, "
         r"ab=\['shaped', 'sparse'\]\); accepted: 1, 2$"),
    ],
)
def test_bad_values_name_themselves(values, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")
                       if "\\[" not in message else message):
        load_config("smoke", overrides=values)


def test_bad_file(tmp_path):
    path = tmp_path / "run.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot parse config file"):
        load_config(None, path)
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(None, tmp_path / "missing.json")


def test_env_devices_cycle():
    config = load_config(None, overrides={"envs": 3, "minibatch_envs": 1,
                                          "devices": ["cpu", "cpu"]})
    assert config.env_devices == ("cpu", "cpu", "cpu")


def test_the_task_picks_host_slots_and_learning_rate_unless_given():
    cifar = load_config(None)
    assert (cifar.task, cifar.host_preset, cifar.slots, cifar.host_lr, cifar.block_size) == (
        "cifar", "baseline", ("r0c0", "r0c1", "r0c2"), 0.01, None)
    lm = load_config(None, overrides={"task": "lm"})
    assert (lm.host_preset, lm.slots, lm.host_lr) == ("tiny", ("r0c0", "r0c1"), 1e-3)
    assert PPORunConfig(task="lm") == lm
    # A value given in a layer stays; one still at the old task's default follows the task.
    tuned = load_config(None, overrides={"host_lr": 0.05}).replace(task="lm")
    assert tuned.host_lr == 0.05 and tuned.host_preset == "tiny"
    assert load_config(None, overrides={"task": "lm", "slots": ["r0c1"]}).slots == ("r0c1",)
    smoke = load_config("lm-smoke")
    assert (smoke.task, smoke.block_size, smoke.slots) == ("lm", 32, ("r0c0", "r0c1"))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"task": "nlp"}, "unknown task 'nlp'; accepted: cifar, lm"),
        ({"task": "lm", "host_preset": "baseline"},
         "unknown host_preset 'baseline' for task 'lm'; accepted: tiny, small, medium"),
        ({"host_preset": "tiny"}, "unknown host_preset 'tiny' for task 'cifar'"),
        ({"task": "lm", "slots": ["r0c2"]}, "unknown slot 'r0c2'; accepted: r0c0, r0c1"),
        ({"block_size": 64}, "block_size is for task 'lm' only; task 'cifar' takes null"),
        ({"task": "lm", "block_size": 129}, "block_size must be in [1, 128] for host_preset"),
        ({"task": "lm", "train_subset": 100},
         "train_subset (training blocks per epoch) must be >= batch_size=128"),
        ({"task": "lm", "host_lr": "fast"}, "host_lr must be a float, got 'fast'"),
    ],
)
def test_task_values_are_checked_in_one_line(values, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides=values)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_configs_saved_before_the_task_existed_are_cifar():
    saved = PPORunConfig().to_dict()
    del saved["task"], saved["block_size"]
    assert compatibility_errors(saved, PPORunConfig()) == []
    assert compatibility_errors(saved, PPORunConfig(task="lm")) == [
        "task='cifar' (now 'lm')", "slots=['r0c0', 'r0c1', 'r0c2'] (now ['r0c0', 'r0c1'])",
        "host_preset='baseline' (now 'tiny')"]


def test_a_blueprint_subset_is_a_sorted_list_and_part_of_what_a_checkpoint_resumes():
    config = load_config("smoke", overrides={"blueprints": ["norm", "attention"]})
    assert config.blueprints == ("attention", "norm")  # any order: the same subset
    with pytest.raises(ConfigError, match="blueprints must be a list of strings, got 'norm'"):
        load_config("smoke", overrides={"blueprints": "norm"})
    saved = PPORunConfig().to_dict()
    del saved["blueprints"]  # a checkpoint from before subsets: all blueprints
    assert compatibility_errors(saved, PPORunConfig()) == []
    assert compatibility_errors(saved, PPORunConfig(blueprints=("norm",))) == [
        "blueprints=None (now ['norm'])"]


def test_what_the_configuration_checks_agrees_with_what_runs():
    # The configuration keeps plain copies of these facts so that it imports no torch; the
    # modules that compute rewards and outcomes are the ones that must agree. (The tasks keep
    # no copy: the configuration reads their descriptors, tests/test_envs_task_specs.py.)
    from esper_lightning.core.outcome import OUTCOME_EPOCHS, OUTCOMES
    from esper_lightning.rl.rewards import RewardMode

    assert tuple(mode.value for mode in RewardMode) == config_module.REWARD_MODES
    assert config_module.OUTCOME_EPOCHS == OUTCOME_EPOCHS
    assert config_module.OUTCOMES == OUTCOMES


def test_layers_are_checked_once_at_the_end_so_a_later_one_repairs_an_earlier():
    from esper_lightning.app.config import PPORunConfig, from_layers

    checkpoint = {"ab": ["shaped", "sparse", "simplified"], "envs": 6}
    config = from_layers([checkpoint, {"envs": 2}, {"envs": 6}], PPORunConfig)
    assert (config.ab, config.envs) == (("shaped", "sparse", "simplified"), 6)
    with pytest.raises(ConfigError, match="envs=2"):
        from_layers([checkpoint, {"envs": 2}], PPORunConfig)
    # A later layer's task moves the defaults an earlier layer left at the old task's.
    assert from_layers([{"envs": 2}, {"task": "lm"}], PPORunConfig).host_preset == "tiny"

