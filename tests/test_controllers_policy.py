"""PolicyController: a PPO checkpoint driving MorphogenesisCallback in a plain Trainer."""


import lightning as L
import pytest
import torch
from helpers import torch_round_trip
from lifecycle_mdp import make_report
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from esper_lightning.blueprints import blueprint_index
from esper_lightning.callbacks import MorphogenesisCallback
from esper_lightning.controllers import PolicyController
from esper_lightning.core.actions import LifecycleOp, MaskContext
from esper_lightning.core.slots import SeedSlot
from esper_lightning.data import CIFAR10DataModule
from esper_lightning.hosts import CifarCNNHost
from esper_lightning.rl.checkpoint import policy_entries, write_checkpoint
from esper_lightning.rl.normalizers import RunningMeanStd
from esper_lightning.rl.observations import obs_dim
from esper_lightning.rl.policy import FactoredRecurrentActorCritic, PolicyConfig


@pytest.fixture
def checkpoint(smoke_policy):
    """The session's one-round PPO checkpoint and its data (read-only: conftest's)."""
    return smoke_policy


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


@pytest.fixture(scope="module")
def deterministic_runs(smoke_policy, tmp_path_factory):
    """Two deterministic controllers of the checkpoint, each through the same 3-epoch fit. Shared
    by the tests that only read them (one pair of fits for the module, not a fit per test)."""
    data, save = smoke_policy
    runs = Recorder(save), Recorder(save)
    for run, folder in zip(runs, "ab", strict=True):
        _fit(data, run, tmp_path_factory.mktemp("deterministic") / folder)
    return runs


def test_drives_a_plain_trainer_deterministically(deterministic_runs):
    first, second = deterministic_runs
    assert len(first.actions) == 3
    assert first.actions == second.actions


def test_state_round_trip_continues_the_recurrent_state(checkpoint, deterministic_runs):
    _, save = checkpoint
    controller = deterministic_runs[0]
    # The fit moved the recurrent state: the check below is not that of two fresh states.
    assert not torch.equal(controller.hidden[0], controller.policy.initial_state(1)[0])
    state = torch_round_trip(controller.state_dict())
    other = PolicyController(save)
    other.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(controller.hidden, other.hidden, strict=True))


def test_a_sampling_policy_with_an_rng_seed_draws_the_same_and_resumes_its_draws(
        checkpoint, tmp_path):
    data, save = checkpoint
    runs = [Recorder(save, deterministic=False, rng_seed=3) for _ in range(2)]
    for k, controller in enumerate(runs):
        torch.manual_seed(100 + k)  # the global generator differs; the policy's own does not
        _fit(data, controller, tmp_path / str(k))
    assert runs[0].actions == runs[1].actions
    assert not torch.equal(runs[0].generator.get_state(),
                           torch.Generator().manual_seed(3).get_state())  # it drew
    state = torch_round_trip(runs[0].state_dict())
    other = PolicyController(save, deterministic=False, rng_seed=99)
    other.load_state_dict(state)
    assert torch.equal(other.generator.get_state(), runs[0].generator.get_state())
    with pytest.raises(ValueError, match=r"unknown keys \['generator'\]"):
        PolicyController(save).load_state_dict(state)
    with pytest.raises(ValueError, match=r"missing keys \['generator'\]"):
        other.load_state_dict(PolicyController(save).state_dict())
    with pytest.raises(ValueError, match="rng_seed=3 seeds sampled actions; a deterministic "
                                         "policy draws none"):
        PolicyController(save, rng_seed=3)


def test_slot_mismatch_is_a_clear_error(checkpoint, tmp_path):
    data, save = checkpoint
    torch.manual_seed(0)
    callback = MorphogenesisCallback(PolicyController(save))
    trainer = L.Trainer(max_epochs=1, default_root_dir=tmp_path, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        callbacks=[callback])
    # At setup, before a step (it was the first decision's error, after an epoch had trained).
    with pytest.raises(MisconfigurationException, match=(
            r"^MorphogenesisCallback: PolicyController was trained for slots \['r0c1', 'r0c2'\], "
            r"the callback has \['r0c0'\]; pass those slots")):
        trainer.fit(CifarCNNHost("baseline", slots=["r0c0"]),
                    datamodule=CIFAR10DataModule(data, batch_size=16))
    assert callback.engine is not None and trainer.global_step == 0


# --- a policy trained with a subset of the blueprints ------------------------------------------
def _biased_bundle(allowed_blueprints, tmp_path):
    """A saved policy whose heads prefer GERMINATE and, of the blueprints, ``lora`` by far, then
    ``lora_large``: whatever else it germinates was forced by the masks."""
    torch.manual_seed(0)
    policy = FactoredRecurrentActorCritic(PolicyConfig(n_slots=1, hidden_dim=16,
                                                       head_hidden_dim=16))
    with torch.no_grad():
        policy.heads["op"][-1].bias[LifecycleOp.GERMINATE] = 50.0
        policy.heads["blueprint"][-1].bias[blueprint_index("lora")] = 50.0
        policy.heads["blueprint"][-1].bias[blueprint_index("lora_large")] = 25.0
    path = tmp_path / "biased.pt"
    write_checkpoint(policy_entries(policy, RunningMeanStd(shape=(obs_dim(1),)), ("r0c0",), 1,
                                    allowed_blueprints=allowed_blueprints), path)
    return path


def _cnn_report(blueprints=("norm", "lora", "lora_large")):
    return make_report([SeedSlot("r0c0", channels=4)], max_epochs=1,
                       context=MaskContext(blueprints))


@pytest.mark.parametrize(("trained", "germinated"), [
    (None, "lora"), (("norm",), "norm"), (("norm", "lora_large"), "lora_large"),
])
def test_a_policy_germinates_only_the_blueprints_it_was_trained_with(trained, germinated,
                                                                     tmp_path):
    controller = PolicyController(_biased_bundle(trained, tmp_path))
    assert controller.bundle.allowed_blueprints == trained
    action = controller.decide(_cnn_report())
    assert (action.op, action.blueprint) == (LifecycleOp.GERMINATE, germinated)


def test_a_run_that_allows_none_of_its_blueprints_gets_no_germination(tmp_path):
    controller = PolicyController(_biased_bundle(("block_identity",), tmp_path))
    report = _cnn_report()
    assert report.masks.op[LifecycleOp.GERMINATE]  # the run itself would allow one
    assert controller.decide(report).op == LifecycleOp.WAIT
