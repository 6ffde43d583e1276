"""Fabric environments and the lockstep pool."""

import pytest
import torch

from esper_lightning.core.actions import Action, LifecycleOp
from esper_lightning.core.lifecycle import GateConfig, SeedStage
from esper_lightning.core.seeding import SeedingConfig
from esper_lightning.core.timing import SeedTiming
from esper_lightning.data import load_cifar10
from esper_lightning.envs import EnvPool, EnvSpec, episode_rng_seed
from esper_lightning.rl import RewardConfig, RewardMode, compute_reward

SPEC = EnvSpec(slots=("r0c1", "r0c2"), batch_size=16, episode_length=5,  # SCRIPT's 4 decisions
               seeding=SeedingConfig(gate_config=GateConfig(min_training_epochs=1)))
GERMINATE = Action(LifecycleOp.GERMINATE, 0, blueprint="conv_light")
ADVANCE = Action(LifecycleOp.ADVANCE, 0)
SCRIPT = [[GERMINATE, Action()], [ADVANCE, GERMINATE], [ADVANCE, Action()], [Action(), Action()]]


@pytest.fixture
def data(cifar_dir):
    return load_cifar10(cifar_dir, True), load_cifar10(cifar_dir, False)


def _numbers(observations):
    return [(o.report.val_accuracy, o.report.val_loss, o.train_loss,
             tuple((s.stage, s.alpha) for s in o.report.slots)) for o in observations]


def test_env_seeds_are_deterministic_and_distinct():
    seeds = {episode_rng_seed(0, r, i, e) for r in range(3) for i in range(4) for e in range(2)}
    assert len(seeds) == 24
    assert episode_rng_seed(7, 1, 2) == episode_rng_seed(7, 1, 2) != episode_rng_seed(8, 1, 2)


def test_the_spec_passes_its_seeding_whole_to_every_engine(data):
    assert EnvSpec().seeding == SeedingConfig(gate_config=GateConfig())  # as the envs had it
    seeding = SeedingConfig(gate_config=GateConfig(min_training_epochs=1), max_seeds=1,
                            blend_gradient="detached", layer_scale_init=0.5,
                            timing=SeedTiming(embargo=2), grad_stats_every=4)
    spec = EnvSpec(slots=("r0c1", "r0c2"), batch_size=16, episode_length=5, seeding=seeding)
    env = EnvPool(spec, *data, ["cpu"]).envs[0]
    env.reset(3)
    assert env.engine.seeding is seeding and env.engine.mask_context.max_seeds == 1
    slot = env.engine.slots["r0c1"]
    assert (slot.blend_gradient, slot.layer_scale_init, slot.embargo_ticks) == ("detached", 0.5, 2)
    with pytest.raises(ValueError, match=r"timing.hold='3 epochs' needs the run's plan"):
        EnvSpec(seeding=SeedingConfig(timing=SeedTiming(hold="3 epochs")))
    with pytest.raises(TypeError, match="seeding must be a SeedingConfig, got NoneType"):
        EnvSpec(seeding=None)


def test_each_env_has_its_own_fabric_and_no_stream_on_cpu(data):
    pool = EnvPool(SPEC, *data, ["cpu", "cpu"])
    assert pool.envs[0].fabric is not pool.envs[1].fabric
    assert all(env.stream is None for env in pool.envs)


def test_cuda_streams_on_a_cpu_device_are_refused(data):
    with pytest.raises(ValueError, match=r"cuda_stream=True needs a CUDA device, got device='cpu'"):
        EnvPool(SPEC, *data, ["cpu"], cuda_streams=True)


def test_lockstep_pool_equals_envs_run_one_after_another(data):
    pool = EnvPool(SPEC, *data, ["cpu", "cpu"])
    seeds = [episode_rng_seed(0, 0, i) for i in range(2)]
    pooled = [_numbers(pool.reset(seeds))]
    for actions in SCRIPT:
        pooled.append(_numbers([s.observation for s in pool.step(actions)]))

    alone = EnvPool(SPEC, *data, ["cpu", "cpu"])
    sequential = [[], *[[] for _ in SCRIPT]]
    for i, env in enumerate(alone.envs):
        env.reset(seeds[i])
        for _ in range(env.start_epoch()):  # the first epoch trains before the first decision
            env.train_batch()
        env.validate()
        sequential[0].append(_numbers([env.observe()])[0])
        for t, actions in enumerate(SCRIPT):
            env.execute(actions[i])
            for _ in range(env.start_epoch()):
                env.train_batch()
            env.validate()
            sequential[t + 1].append(_numbers([env.observe()])[0])
    assert pooled == sequential
    assert pooled[-1][0][3][0][0] == SeedStage.BLENDING  # the script really grew a seed


def test_same_seeds_same_episode_and_fresh_host_per_reset(data):
    pool = EnvPool(SPEC, *data, ["cpu"])
    first = _numbers([*pool.reset([123]), pool.step([GERMINATE])[0].observation])
    second = _numbers([*pool.reset([123]), pool.step([GERMINATE])[0].observation])
    other = _numbers([*pool.reset([124]), pool.step([GERMINATE])[0].observation])
    assert first == second and first != other
    assert pool.envs[0].engine.slots["r0c1"].stage == SeedStage.GERMINATED


def test_nan_in_the_host_is_a_governor_terminal(data):
    pool = EnvPool(SPEC, *data, ["cpu"])
    pool.reset([1])
    with torch.no_grad():
        pool.envs[0].host.blocks[0].conv.weight.fill_(float("nan"))
    observations = [step.observation for step in pool.step([Action()])]
    assert observations[0].rollback_reason == "governor_nan"


def test_a_step_returns_the_reward_of_its_transition_and_the_episode_end(data):
    sparse = RewardConfig(mode=RewardMode.SPARSE, param_cost=0.5)
    pool = EnvPool(SPEC, *data, ["cpu", "cpu"])
    before = pool.reset([3, 4], rewards=[None, sparse])
    assert [env.reward_config for env in pool.envs] == [SPEC.reward, sparse]
    for t, actions in enumerate(SCRIPT):
        steps = pool.step(actions)
        last = t == len(SCRIPT) - 1
        assert [s.terminated for s in steps] == [last, last]
        for k, (step, prior) in enumerate(zip(steps, before, strict=True)):
            config = pool.envs[k].reward_config
            again = compute_reward(prior.report, step.outcome.executed, step.observation.report,
                                   config, terminal=last,
                                   rollback=step.observation.rollback_reason is not None)
            assert step.reward == again
        before = [s.observation for s in steps]
    # The sparse episode is rewarded only at its end: its outcome, at param_cost 0.5.
    assert steps[1].reward.terminal != 0.0 and steps[1].reward.pbrs == 0.0
    with pytest.raises(RuntimeError, match="the episode ended after 4 decisions; reset"):
        pool.step([Action(), Action()])
    pool.reset([3, 4])  # a new episode steps again, under the spec's reward
    assert pool.envs[1].reward_config == SPEC.reward
    assert not pool.step([Action(), Action()])[0].terminated
