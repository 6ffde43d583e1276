import json

import pytest

from esper_lightning.app.config import PRESETS, ConfigError, PPORunConfig, load_config


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
        ({"envs": "2"}, "envs must be a int, got '2'"),
        ({"slots": ["r0c9"]}, "unknown slot 'r0c9'; accepted: r0c0"),
        ({"slots": "r0c1"}, "slots must be a list of strings"),
        ({"precision": "fp8"}, "unknown precision 'fp8'; accepted: 32-true, bf16-mixed"),
        ({"device": "tpu"}, "unknown device 'tpu'; accepted: cpu, cuda, cuda:N"),
        ({"reward": "dense"}, "unknown reward 'dense'; accepted: shaped, simplified, sparse"),
        ({"gamma": 1.5}, r"gamma must be in \[0.0, 1.0\], got 1.5"),
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
    config = load_config(None, overrides={"envs": 3, "devices": ["cpu", "cpu"]})
    assert config.env_devices == ("cpu", "cpu", "cpu")
