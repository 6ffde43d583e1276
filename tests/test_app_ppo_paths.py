"""Where a PPO run saves, and the earlier checkpoints it refuses to replace (torch-free)."""

import re

import pytest

from esper_lightning.app.config import PPORunConfig
from esper_lightning.app.ppo.paths import checkpoint_path, logger_name, refuse_overwrite
from esper_lightning.errors import ConfigError


def test_an_ab_run_saves_one_file_per_reward_mode_beside_the_path(tmp_path):
    one, ab = PPORunConfig(), PPORunConfig(ab=("shaped", "sparse"), envs=4)
    assert checkpoint_path(tmp_path / "ckpt.pt", one, "shaped") == tmp_path / "ckpt.pt"
    assert [checkpoint_path(tmp_path / "ckpt.pt", ab, m) for m in ab.reward_modes] == [
        tmp_path / "ckpt.shaped.pt", tmp_path / "ckpt.sparse.pt"]


def test_an_earlier_checkpoint_is_replaced_only_when_resumed_or_overwritten(tmp_path):
    save = tmp_path / "ckpt.pt"
    refuse_overwrite(PPORunConfig(save=str(save)))  # nothing there yet
    save.write_bytes(b"an earlier run")
    refused = re.escape(f"save '{save}' already exists; pass --resume {save}")
    with pytest.raises(ConfigError, match=refused):
        refuse_overwrite(PPORunConfig(save=str(save)))
    with pytest.raises(ConfigError, match="is not the checkpoint this run resumes"):
        refuse_overwrite(PPORunConfig(save=str(save), resume=str(tmp_path / "other.pt")))
    refuse_overwrite(PPORunConfig(save=str(save), resume=str(save)))  # it continues that run
    refuse_overwrite(PPORunConfig(save=str(save), overwrite=True))
    assert save.read_bytes() == b"an earlier run"


def test_a_folder_is_never_a_save_path_overwrite_or_not(tmp_path):
    # It trained a round and then failed with IsADirectoryError, leaving a .tmp file behind.
    for overwrite in (False, True):
        with pytest.raises(ConfigError, match=re.escape(
                f"save '{tmp_path}' is a folder; accepted: a file path such as "
                f"{tmp_path / 'ckpt.pt'}")):
            refuse_overwrite(PPORunConfig(save=str(tmp_path), overwrite=overwrite))


def test_each_policy_of_an_ab_run_is_checked(tmp_path):
    (tmp_path / "ckpt.sparse.pt").write_bytes(b"one policy of an earlier A/B run")
    with pytest.raises(ConfigError, match=re.escape("ckpt.sparse.pt' already exists")):
        refuse_overwrite(PPORunConfig(save=str(tmp_path / "ckpt.pt"), ab=("shaped", "sparse"),
                                      envs=4))


def test_an_ab_run_logs_one_tensorboard_run_per_policy():
    one, ab = PPORunConfig(), PPORunConfig(ab=("shaped", "sparse"), envs=4)
    assert logger_name(one, "shaped") == "ppo"
    assert [logger_name(ab, m) for m in ab.reward_modes] == ["ppo-shaped", "ppo-sparse"]
