"""PolicyController: a PPO checkpoint driving MorphogenesisCallback in a plain Trainer."""


import lightning as L
import pytest
import torch
from helpers import torch_round_trip, train_smoke_policy

from esper_lightning.callbacks import MorphogenesisCallback
from esper_lightning.controllers import PolicyController
from esper_lightning.data import CIFAR10DataModule
from esper_lightning.hosts import CifarCNNHost


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return train_smoke_policy(tmp_path_factory.mktemp("policy"))


class Recorder(PolicyController):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.actions = []

    def decide(self, report):
        action = super().decide(report)
        assert report.masks.allows(action)  # the policy only proposes legal actions
        self.actions.append(action)
        return action


def _fit(data, controller, tmp_path):
    torch.manual_seed(0)
    callback = MorphogenesisCallback(controller)
    trainer = L.Trainer(max_epochs=3, default_root_dir=tmp_path, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[callback])
    trainer.fit(CifarCNNHost("baseline", slots=["r0c1", "r0c2"]),
                datamodule=CIFAR10DataModule(data, batch_size=16))
    return callback


def test_drives_a_plain_trainer_deterministically(checkpoint, tmp_path):
    data, save = checkpoint
    first, second = Recorder(save), Recorder(save)
    _fit(data, first, tmp_path / "a")
    _fit(data, second, tmp_path / "b")
    assert len(first.actions) == 3
    assert first.actions == second.actions


def test_state_round_trip_continues_the_recurrent_state(checkpoint, tmp_path):
    data, save = checkpoint
    controller = Recorder(save)
    _fit(data, controller, tmp_path)
    state = torch_round_trip(controller.state_dict())
    other = PolicyController(save)
    other.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(controller.hidden, other.hidden, strict=True))


def test_slot_mismatch_is_a_clear_error(checkpoint, tmp_path):
    data, save = checkpoint
    torch.manual_seed(0)
    callback = MorphogenesisCallback(PolicyController(save))
    trainer = L.Trainer(max_epochs=1, default_root_dir=tmp_path, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        callbacks=[callback])
    with pytest.raises(ValueError, match=r"trained for slots \['r0c1', 'r0c2'\]; the callback"):
        trainer.fit(CifarCNNHost("baseline", slots=["r0c0"]),
                    datamodule=CIFAR10DataModule(data, batch_size=16))
    assert callback.engine is not None
