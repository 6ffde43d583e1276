"""A blueprint from outside the package: registered in one call, grown by controllers through
the callback, learned by PPO, and saved in policy checkpoints that load wherever the action space
fits and refuse with one line where it does not."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import fields
from pathlib import Path

import lightning as L
import pytest
import torch
from helpers import ClassifierSteps
from lifecycle_mdp import make_report
from torch import nn

from esper_lightning.blueprints import (
    BUILTIN_TABLE,
    BlueprintError,
    BlueprintSpec,
    blueprint_index,
    blueprint_table,
    build,
    param_count,
    register,
    scratch_registry,
    unregister,
)
from esper_lightning.callbacks import MorphogenesisCallback
from esper_lightning.controllers import GrowerController, HeuristicConfig, PolicyController
from esper_lightning.core.actions import HEADS, Action, LifecycleOp, MaskContext
from esper_lightning.core.engine import execute_on_slot
from esper_lightning.core.lifecycle import GateConfig, SeedStage
from esper_lightning.core.slots import SeedSlot
from esper_lightning.data import CIFAR10DataModule
from esper_lightning.errors import ConfigError
from esper_lightning.rl import (
    FactoredRecurrentActorCritic,
    MaskBatch,
    PolicyConfig,
    PPOConfig,
    RolloutBuffer,
    RunningMeanStd,
    ValueNormalizer,
    batch_observations,
    load_policy_file,
    load_policy_weights,
    make_optimizer,
    obs_dim,
    policy_entries,
    ppo_update,
    read_checkpoint,
    write_checkpoint,
)
from esper_lightning.rl.checkpoint import CHECKPOINT_VERSION, VERSION_1_BLUEPRINTS
from esper_lightning.rl.observations import BASE_DIM, OBSERVATION_VERSION

NAME = "user_ib"
ALLOWED = ("norm", NAME)


class InvertedBottleneck(nn.Module):
    """A user's seed: ``x + gamma * pw(act(GN(dw3x3(act(GN(expand(x)))))))``, hidden width 2C,
    with a small gain so it is live and near the identity at birth.

    Params: ``4C^2 + 28C`` (expand 2C^2, two norms 8C, dw 18C, project 2C^2 + C, gamma C).
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        hidden = 2 * channels
        self.branch = nn.Sequential(
            nn.Conv2d(channels, hidden, 1, bias=False), nn.GroupNorm(1, hidden), nn.ReLU(),
            nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False),
            nn.GroupNorm(1, hidden), nn.ReLU(),
            nn.Conv2d(hidden, channels, 1),
        )
        self.gamma = nn.Parameter(torch.full((channels,), 1e-3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.gamma.view(-1, 1, 1) * self.branch(x)


def _count(c: int) -> int:
    return 2 * c * c + 4 * c + 18 * c + 4 * c + 2 * c * c + c + c


@pytest.fixture
def user_seed() -> Iterator[str]:
    """Registers the user's seed for one test; the registry and the table are put back."""
    with scratch_registry():
        register(BlueprintSpec(NAME, "cnn", InvertedBottleneck, "x + g*pw(dw(expand x)); 4C^2+28C"))
        yield NAME
        unregister(NAME, "cnn")


# --- registration -------------------------------------------------------------------------------
def test_registering_gives_the_next_index_and_unregistering_keeps_it(user_seed):
    index = blueprint_index(NAME)
    assert index == len(BUILTIN_TABLE) + 1 == len(blueprint_table()) - 1
    assert param_count(NAME, 8) == _count(8)
    spec = unregister(NAME, "cnn")
    assert blueprint_index(NAME) == index  # append-only: the name keeps its place
    register(spec)
    assert blueprint_index(NAME) == index and len(blueprint_table()) == index + 1
    # One name, two topologies: one index.
    register(BlueprintSpec(NAME, "transformer", lambda d: nn.Identity(), "identity"))
    assert blueprint_index(NAME) == index and len(blueprint_table()) == index + 1
    assert blueprint_index("attention") == 2  # the built-in shared by both topologies


def test_built_in_indices_are_the_historical_ones():
    assert blueprint_table()[:13] == (
        None, "conv_light", "attention", "norm", "depthwise", "bottleneck", "conv_small",
        "conv_heavy", "lora", "lora_large", "mlp_small", "mlp", "flex_attention",
    ) == VERSION_1_BLUEPRINTS


@pytest.mark.parametrize("name", ["", "My_Seed", "grower:x", "1x1", "a b", None])
def test_a_bad_name_fails_loudly_and_takes_no_index(name):
    before = blueprint_table()
    with pytest.raises(BlueprintError, match="lower-case letters, digits and underscores"):
        register(BlueprintSpec(name, "cnn", lambda c: nn.Identity(), "bad"))  # type: ignore[arg-type]
    assert blueprint_table() == before


def test_the_user_seed_is_live_at_birth(user_seed):
    torch.manual_seed(0)
    seed = build(NAME, 8)
    x = torch.randn(4, 8, 6, 6)
    out = seed(x)
    assert ((out - x).norm() / x.norm()).item() < 1e-2
    (out * torch.randn_like(out)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().max() > 0 for p in seed.parameters())


# --- controllers: a grower through the callback, the heuristic's rotation ------------------------
class TinyModule(ClassifierSteps):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def test_a_grower_grows_the_user_seed_through_the_callback(user_seed, cifar_dir, tmp_path):
    torch.manual_seed(0)
    callback = MorphogenesisCallback(GrowerController(NAME), slots=["net.1"],
                                     gate_config=GateConfig(min_training_epochs=1))
    trainer = L.Trainer(max_epochs=4, default_root_dir=tmp_path, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[callback])
    trainer.fit(TinyModule(), datamodule=CIFAR10DataModule(cifar_dir, batch_size=16))
    slot = callback.engine.slots["net.1"]
    assert isinstance(slot.seed, InvertedBottleneck)
    assert slot.stage in (SeedStage.BLENDING, SeedStage.HOLDING)
    assert [(e.kind, e.blueprint) for e in callback.engine.events] == [("germinated", NAME)]
    assert not torch.allclose(slot.seed.gamma, torch.full_like(slot.seed.gamma, 1e-3))  # trained


def test_the_heuristic_rotation_takes_the_user_seed(user_seed):
    from esper_lightning.controllers import HeuristicController

    controller = HeuristicController(HeuristicConfig.fixed_timing(
        blueprint_rotation=(NAME, "norm"), min_epochs_before_germinate=0,
        stabilization_epochs=0, plateau_epochs_to_germinate=0,
        finish_by_end=False))  # a one-decision report: the rotation, not the run's length
    slots = [SeedSlot("r0c0", channels=4)]
    action = controller.decide(make_report(slots, context=MaskContext(ALLOWED)))
    assert (action.op, action.blueprint) == (LifecycleOp.GERMINATE, NAME)
    with pytest.raises(ValueError, match="unknown blueprint 'nope'; known: conv_light"):
        HeuristicConfig(blueprint_rotation=("nope",))


# --- PPO: a couple of updates on a one-slot bandit, then the checkpoint --------------------------
def _reports(n: int, allowed: Sequence[str] = ALLOWED) -> list:
    return [make_report([SeedSlot("r0c0", channels=4)], max_epochs=1,
                        context=MaskContext(tuple(allowed))) for _ in range(n)]


def _germinate_probability(policy: FactoredRecurrentActorCritic) -> float:
    """P(blueprint = the user seed | GERMINATE) on an empty slot."""
    raw, indices, masks = batch_observations(_reports(1))
    action = torch.tensor([[Action(LifecycleOp.GERMINATE, 0, blueprint=NAME).indices()]])
    steps = MaskBatch(**{f.name: getattr(masks, f.name)[:, None] for f in fields(MaskBatch)})
    with torch.no_grad():
        out = policy.evaluate(raw[:, None], indices[:, None], action, steps,
                              policy.initial_state(1), torch.ones(1, 1, dtype=torch.bool))
    return out.log_probs[0, 0, HEADS.index("blueprint")].exp().item()


def _bandit_rollout(policy: FactoredRecurrentActorCritic, n_envs: int = 16,
                    steps: int = 4) -> RolloutBuffer:
    """One-decision episodes on a fresh empty slot: reward 1 for germinating the user seed
    (built for real in the slot), 0 for anything else."""
    buffer = RolloutBuffer(n_envs, steps, policy.config)
    done = torch.ones(n_envs, dtype=torch.bool)
    for _ in range(steps):
        reports = _reports(n_envs)
        raw, indices, masks = batch_observations(reports)
        hidden = policy.initial_state(n_envs)
        out = policy.act(raw, indices, masks, hidden, episode_starts=done)
        rewards = []
        for row in out.actions.tolist():
            action = Action.from_indices(row)
            slot = SeedSlot("r0c0", channels=4)
            execute_on_slot(slot, action)
            grew = action.op == LifecycleOp.GERMINATE and isinstance(slot.seed,
                                                                     InvertedBottleneck)
            rewards.append(float(grew))
        buffer.add(obs=raw, blueprint_idx=indices, hidden=hidden, masks=masks,
                   actions=out.actions, log_probs=out.log_probs, values=out.value,
                   rewards=torch.tensor(rewards), episode_starts=done, terminated=done,
                   truncated=torch.zeros_like(done))
    return buffer


def _trained_policy() -> tuple[FactoredRecurrentActorCritic, RunningMeanStd]:
    torch.manual_seed(0)
    policy = FactoredRecurrentActorCritic(PolicyConfig(n_slots=1, hidden_dim=16,
                                                       head_hidden_dim=16))
    config = PPOConfig(learning_rate=3e-3, minibatch_envs=8, target_kl=None)
    optimizer, values = make_optimizer(policy, config), ValueNormalizer()
    for _ in range(2):
        ppo_update(policy, optimizer, _bandit_rollout(policy), config, values)
    return policy.eval(), RunningMeanStd(shape=(obs_dim(1),))


def _save(policy, obs_rms, path: Path) -> Path:
    write_checkpoint(policy_entries(policy, obs_rms, ("r0c0",), horizon=1), path)
    return path


def test_ppo_learns_the_user_seed_and_its_checkpoint_round_trips(user_seed, tmp_path):
    torch.manual_seed(0)
    fresh = FactoredRecurrentActorCritic(PolicyConfig(n_slots=1, hidden_dim=16,
                                                      head_hidden_dim=16))
    policy, obs_rms = _trained_policy()
    assert policy.config.head_sizes["blueprint"] == blueprint_index(NAME) + 1
    assert _germinate_probability(policy) > _germinate_probability(fresh) + 0.05
    path = _save(policy, obs_rms, tmp_path / "ckpt.pt")
    assert read_checkpoint(path)["blueprints"] == list(blueprint_table())
    bundle = load_policy_file(path)
    assert bundle.blueprints == blueprint_table()
    for key, value in policy.state_dict().items():
        assert torch.equal(bundle.policy.state_dict()[key], value), key
    report = _reports(1)[0]
    raw, indices, masks = batch_observations([report])
    expected = policy.act(raw, indices, masks, policy.initial_state(1), deterministic=True)
    assert PolicyController(bundle).decide(report) == Action.from_indices(expected.actions[0])


def test_a_policy_trained_with_a_user_seed_acts_where_it_is_unknown_and_refuses_a_renumbering(
    tmp_path,
):
    with scratch_registry():
        register(BlueprintSpec(NAME, "cnn", InvertedBottleneck, "user seed"))
        policy, obs_rms = _trained_policy()
        path = _save(policy, obs_rms, tmp_path / "ckpt.pt")
    assert NAME not in blueprint_table()  # a process that never registered it
    controller = PolicyController(path)
    assert controller.bundle.blueprints == (*blueprint_table(), NAME)
    action = controller.decide(_reports(1, ("norm", "conv_light"))[0])  # it knows both: acts
    assert action.blueprint in (None, "norm", "conv_light")
    with scratch_registry():  # this process gives the same index to a blueprint of its own
        register(BlueprintSpec("other", "cnn", lambda c: nn.Identity(), "identity"))
        index = blueprint_index("other")
        with pytest.raises(ConfigError, match=f"policy '{path}' has blueprint '{NAME}' at index "
                           f"{index}; this process has 'other' there"):
            load_policy_file(path)


def test_a_policy_from_before_a_registration_acts_in_runs_it_knows_and_refuses_others(tmp_path):
    torch.manual_seed(0)
    old = FactoredRecurrentActorCritic(PolicyConfig(n_slots=1, hidden_dim=16, head_hidden_dim=16))
    path = _save(old, RunningMeanStd(shape=(obs_dim(1),)), tmp_path / "old.pt")
    with scratch_registry():
        register(BlueprintSpec(NAME, "cnn", InvertedBottleneck, "user seed"))
        controller = PolicyController(path)
        assert len(controller.bundle.blueprints) == len(blueprint_table()) - 1
        action = controller.decide(_reports(1, ("norm", "conv_light"))[0])
        assert action.blueprint in (None, "norm", "conv_light")
        with pytest.raises(ConfigError, match=(
            rf"policy '{path}' knows the blueprints \[none, conv_light, .*\]; "
            rf"this run also allows {NAME}: leave them out")):
            controller.decide(_reports(1)[0])
        # Resuming training needs the very same head: a one-line error, not a size mismatch.
        grown = FactoredRecurrentActorCritic(PolicyConfig(n_slots=1, hidden_dim=16,
                                                          head_hidden_dim=16))
        with pytest.raises(ConfigError, match=rf"checkpoint has the blueprint head \[none, "
                           rf"conv_light, .*\]; this run builds \[.*, {NAME}\]"):
            load_policy_weights(grown, read_checkpoint(path), "checkpoint")


def test_a_policy_trained_with_a_subset_acts_in_runs_that_allow_blueprints_it_never_saw(
    tmp_path,
):
    torch.manual_seed(0)
    old = FactoredRecurrentActorCritic(PolicyConfig(n_slots=1, hidden_dim=16, head_hidden_dim=16))
    path = tmp_path / "subset.pt"
    write_checkpoint(policy_entries(old, RunningMeanStd(shape=(obs_dim(1),)), ("r0c0",), 1,
                                    allowed_blueprints=("norm",)), path)
    assert load_policy_file(_save(old, RunningMeanStd(shape=(obs_dim(1),)),
                                  tmp_path / "all.pt")).allowed_blueprints is None
    with scratch_registry():
        register(BlueprintSpec(NAME, "cnn", InvertedBottleneck, "user seed"))
        controller = PolicyController(path)
        assert NAME not in controller.bundle.blueprints
        action = controller.decide(_reports(1)[0])  # the run allows NAME: it plays norm only
        assert action.blueprint in (None, "norm")


def test_version_1_checkpoints_read_with_the_built_in_table(tmp_path):
    torch.manual_seed(0)
    # The trainer wrote version 1: only the hidden width was ever set, on the first built-ins.
    policy = FactoredRecurrentActorCritic(PolicyConfig(n_slots=1, hidden_dim=16,
                                                       blueprints=VERSION_1_BLUEPRINTS))
    state = policy_entries(policy, RunningMeanStd(shape=(obs_dim(1),)), ("r0c0",), horizon=1)
    for key in ("blueprints", "head_sizes", "policy_head_hidden", "blueprint_embed_dim",
                "observation_version"):
        del state[key]  # what version 1 did not write
    torch.save({"version": 1, **state}, tmp_path / "v1.pt")
    read = read_checkpoint(tmp_path / "v1.pt")
    assert tuple(read["blueprints"]) == VERSION_1_BLUEPRINTS and len(read["blueprints"]) == 13
    assert (read["policy_head_hidden"], read["blueprint_embed_dim"]) == (
        policy.config.head_hidden_dim, policy.config.blueprint_embed_dim)
    # Its policy read the observation before the budget scale: refused, not mis-read.
    with pytest.raises(ConfigError, match="reads observation version 1"):
        load_policy_file(tmp_path / "v1.pt")
    torch.save({"version": CHECKPOINT_VERSION + 1, **state}, tmp_path / "v4.pt")
    with pytest.raises(ConfigError, match="not an esper-lightning PPO checkpoint"):
        read_checkpoint(tmp_path / "v4.pt")


def test_a_policy_of_another_observation_version_is_refused_in_one_line(tmp_path):
    torch.manual_seed(0)
    policy = FactoredRecurrentActorCritic(PolicyConfig(n_slots=1, hidden_dim=16,
                                                       head_hidden_dim=16))
    state = policy_entries(policy, RunningMeanStd(shape=(obs_dim(1),)), ("r0c0",), horizon=1)
    assert state["observation_version"] == OBSERVATION_VERSION == 2
    del state["observation_version"]  # what version 2 wrote: 23 base features
    torch.save({"version": 2, **state}, tmp_path / "v2.pt")
    message = (rf"policy '{tmp_path / 'v2.pt'}' reads observation version 1; this release "
               rf"builds version 2 \({BASE_DIM} \+ 30 features per slot, docs/rl.md section 1\)")
    with pytest.raises(ConfigError, match=message) as refused:
        load_policy_file(tmp_path / "v2.pt")
    assert "\n" not in str(refused.value) and BASE_DIM == 24
    # Resuming its training: the same line, not a tensor size mismatch.
    with pytest.raises(ConfigError, match="checkpoint reads observation version 1"):
        load_policy_weights(policy, read_checkpoint(tmp_path / "v2.pt"), "checkpoint")
    write_checkpoint({**state, "observation_version": 2}, tmp_path / "v3.pt")
    assert read_checkpoint(tmp_path / "v3.pt")["version"] == CHECKPOINT_VERSION == 3
    load_policy_weights(policy, read_checkpoint(tmp_path / "v3.pt"), "checkpoint")  # accepted


def test_a_checkpoint_with_other_head_sizes_is_a_one_line_error(tmp_path):
    torch.manual_seed(0)
    policy = FactoredRecurrentActorCritic(PolicyConfig(n_slots=1, hidden_dim=16,
                                                       head_hidden_dim=16))
    state = policy_entries(policy, RunningMeanStd(shape=(obs_dim(1),)), ("r0c0",), horizon=1)
    state["head_sizes"]["tempo"] = 4
    write_checkpoint(state, tmp_path / "ckpt.pt")
    with pytest.raises(ConfigError, match=r"has the action heads \{.*'tempo': 4.*\}; this "
                       r"version builds \{.*'tempo': 3"):
        load_policy_file(tmp_path / "ckpt.pt")
