"""Reading a file that is no PPO checkpoint: every reader (``--resume``, ``policy:PATH``,
`PolicyController`) refuses it in one complete line naming the file and what is expected, warns
nothing and leaves the file as it was."""

import hashlib
import warnings

import pytest
from helpers import BAD_FILE_REASONS, bad_checkpoints

from esper_lightning.app.compare.arms import check_policy
from esper_lightning.app.config import CompareConfig, load_config
from esper_lightning.app.ppo.trainer import PPOTrainer
from esper_lightning.controllers import PolicyController
from esper_lightning.errors import ConfigError
from esper_lightning.rl.checkpoint import EXPECTED, read_checkpoint


def _resume(path, tmp_path):
    PPOTrainer(load_config("smoke", overrides={"resume": str(path), "progress": False,
                                               "logdir": str(tmp_path / "logs")}))


def _compare(path, tmp_path):
    check_policy(str(path), load_config("smoke", cls=CompareConfig))


READERS = {"resume": _resume, "policy": _compare,
           "controller": lambda path, tmp_path: PolicyController(path)}


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("kind", BAD_FILE_REASONS)
def test_every_reader_refuses_a_bad_file_in_one_complete_line(tmp_path, reader, kind):
    path = bad_checkpoints(tmp_path / "files")[kind]
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning would be a second line on stderr
        with pytest.raises(ConfigError) as err:
            READERS[reader](path, tmp_path)
    message = str(err.value)
    assert "\n" not in message and f"'{path}'" in message
    assert BAD_FILE_REASONS[kind] in message and message.endswith(EXPECTED)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert not (tmp_path / "logs").exists()


def test_a_folder_a_missing_file_and_another_version(tmp_path):
    with pytest.raises(ConfigError, match=rf"^checkpoint '{tmp_path}' is a folder; {EXPECTED}$"):
        read_checkpoint(tmp_path)
    with pytest.raises(ConfigError, match=r"^checkpoint '.*missing.pt' does not exist$"):
        read_checkpoint(tmp_path / "missing.pt")
