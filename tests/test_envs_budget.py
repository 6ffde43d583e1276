"""Envs under a compute budget: equal slices per epoch that add up to the budget, a schedule
over the budget spent, data that never repeats within a pass, budgets drawn per episode from its
rng seed, and metering that changes nothing."""

import copy
import itertools
import math
from collections import Counter

import numpy as np
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from esper_lightning.core.actions import Action, LifecycleOp
from esper_lightning.core.flops import FlopMeter
from esper_lightning.core.lifecycle import GateConfig
from esper_lightning.core.seeding import SeedingConfig
from esper_lightning.data.text import TextTensorLoader
from esper_lightning.envs import (
    EnvPool,
    EnvSpec,
    draw_budget_in_range,
    draw_budget_scale,
    smallest_budget_flops,
)
from esper_lightning.envs.tasks import TextTask
from esper_lightning.rl import build_observation
from esper_lightning.rl import observations as ob
from esper_lightning.schedule import LRSchedule, batch_fraction

TASK = TextTask(block_size=16, val_blocks=8)
BATCH = 8
#: `TASK` with epochs of 4 batches where no budget sets them (not a pass over the text each,
#: 133 batches): for the tests that read what an epoch does, not how long it is.
SHORT = TextTask(block_size=16, val_blocks=8, train_blocks=4 * BATCH)


def spec(**changes) -> EnvSpec:
    values = {"task": TASK, "host_preset": "w32l1", "slots": ("r0c0",), "batch_size": BATCH,
              "host_lr": 1e-3, "episode_length": 4,
              "seeding": SeedingConfig(gate_config=GateConfig(min_training_epochs=1)), **changes}
    return EnvSpec(**values)


@pytest.fixture
def data(text_file):
    return TASK.load(text_file)


def static_step() -> int:
    torch.manual_seed(0)
    host = TASK.make_host("w32l1", ("r0c0",), 1e-3)
    return FlopMeter().training_step(host, TASK.example_batch(BATCH))


def play(pool: EnvPool, actions: list[Action], rng_seed: int = 3, **reset) -> list[float]:
    """One episode; the training FLOPs at the end of every epoch."""
    observations = pool.reset([rng_seed] * len(pool), **reset)
    spent = [observations[0].report.train_flops]
    for action in actions:
        observations = [s.observation for s in pool.step([action] * len(pool))]
        spent.append(observations[0].report.train_flops)
    return spent


def counted_step(model: torch.nn.Module, x: torch.Tensor) -> int:
    """One real training step of a copy of ``model`` counted by `FlopCounterMode` (attention
    under the math backend, which it has formulas for): apart from the ledger's meter."""
    counter = FlopCounterMode(display=False)
    with counter, sdpa_kernel(SDPBackend.MATH):
        copy.deepcopy(model)(x).float().sum().backward()
    return int(counter.get_total_flops())


def test_an_episode_charges_what_its_live_seed_adds_as_growth(data):
    step = static_step()
    pool = EnvPool(spec(budget_flops=12.5 * step * 4), *data, ["cpu"])
    env, x = pool.envs[0], TASK.example_batch(BATCH)
    first = pool.reset([7])[0]
    assert first.flops["growth"] == 0 and first.flops["train"] == first.report.train_flops
    before = first.flops
    script = [Action(LifecycleOp.GERMINATE, 0, blueprint="lora"), Action(LifecycleOp.ADVANCE, 0),
              Action(LifecycleOp.ADVANCE, 0)]
    stages = []
    for action in script:
        observation = pool.step([action])[0].observation
        after = observation.flops
        stages.append(env.engine.slots["r0c0"].stage.name)
        batches, whole = env._epoch_batches, counted_step(env.host, x)
        # The budget spends whole steps, as before growth was told apart; the host's share of
        # each is the seedless host's (the episode's first epoch), the rest is the seed's.
        assert after["train"] - before["train"] == batches * step
        assert after["growth"] - before["growth"] == batches * (whole - step)
        assert after["validation"] > before["validation"]
        before = after
    assert stages == ["GERMINATED", "TRAINING", "BLENDING"] and before["growth"] > 0
    assert env.ledger.spent == before["train"] + before["growth"] == (
        observation.report.train_flops)


def test_the_slices_add_up_to_the_budget_within_one_batch(data):
    step = static_step()
    budget = 10.5 * step * 4  # ten and a half batches per epoch
    pool = EnvPool(spec(budget_flops=budget), *data, ["cpu"])
    spent = play(pool, [Action()] * 3)
    for k, flops in enumerate(spent, start=1):  # epoch k trains until k/4 of the budget
        assert k * budget / 4 <= flops < k * budget / 4 + step
    report = pool.envs[0].observe().report
    assert 1.0 <= report.budget_fraction < 1.0 + step / budget
    assert report.spent_fraction == report.budget_fraction
    assert pool.envs[0]._steps == 42  # 10.5 batches per slice: 11, 10, 11, 10
    with pytest.raises(RuntimeError, match="spent its budget"):
        pool.envs[0].start_epoch()


def test_a_bigger_host_takes_fewer_batches_for_the_same_compute(data):
    step = static_step()
    pool = EnvPool(spec(budget_flops=40.0 * step), *data, ["cpu", "cpu"])
    grown = [("r0c0", "mlp")]
    pool.reset([3, 3], implants=[(), grown])
    for _ in range(3):
        pool.step([Action(), Action()])
    plain, big = (env.engine for env in pool.envs)
    assert big.seed_params > 0
    assert pool.envs[1]._steps < pool.envs[0]._steps
    for engine in (plain, big):
        assert 40 * step <= engine.train_flops < 40 * step + 2 * step


def test_the_schedule_follows_the_budget_for_host_and_seed_groups(data):
    step = static_step()
    budget = 20.0 * step
    schedule = LRSchedule("wsd", warmup_fraction=0.1, decay_fraction=0.5, min_lr_ratio=0.1)
    pool = EnvPool(spec(budget_flops=budget, lr_schedule=schedule), *data, ["cpu"])
    play(pool, [Action(LifecycleOp.GERMINATE, 0, blueprint="lora"), Action(), Action()])
    env = pool.envs[0]
    groups = env.optimizer.optimizer.param_groups
    seed = [g for g in groups if g["name"].startswith("seed/")]
    assert seed, "the seed trained in its own group"
    # The last batch trained at the multiplier of its own middle: every group alike.
    last_cost = env.ledger.meter.training_step(env.host, TASK.example_batch(BATCH))
    middle = batch_fraction(env.engine.train_flops - last_cost, last_cost, budget)
    multiplier = schedule.multiplier(middle)
    assert 0.1 < multiplier < 0.2  # late in the decay, near its floor
    for group in groups:
        assert group["lr"] == pytest.approx(group["initial_lr"] * multiplier)


def test_a_pass_never_repeats_a_token_and_a_longer_run_starts_another(data):
    train, _ = data
    loader = TextTensorLoader(train, block_size=16, batch_size=BATCH, rng_seed=5)
    passes = [loader.pass_starts() for _ in range(2)]
    for starts in passes:
        # One grid, every block distinct and whole (its target too): no token twice in a pass.
        offset = int(starts.min())
        assert 0 <= offset < 16 and bool(((starts - offset) % 16 == 0).all())
        assert len(set(starts.tolist())) == len(starts) == (len(train) - 1 - offset) // 16
        assert int(starts.max()) + 16 < len(train)
    assert not torch.equal(passes[0], passes[1])  # the next pass: another order (and cut)
    loader.reseed(5)  # the stream draws its passes the same way, batch by batch
    x, y = next(loader.stream())
    first = passes[0][:BATCH]
    assert torch.equal(x, torch.stack([train[s:s + 16].long() for s in first.tolist()]))
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_data_passes_count_what_an_episode_saw(data):
    # The head of the training split only (32 batches): a pass is counted the same on any
    # corpus, and the budget of two and a half passes below trains 80 batches, not 330.
    train, val = data[0][:32 * BATCH * 16], data[1]
    step = static_step()
    pool = EnvPool(spec(budget_flops=4.0 * step * 4), train, val, ["cpu"])
    play(pool, [Action()] * 3)
    seen = pool.envs[0]._steps * BATCH * 16
    assert pool.envs[0].observe().data_passes == seen / len(train) < 1
    # A budget worth more than the corpus goes on into another pass, cut elsewhere.
    long = EnvPool(spec(budget_flops=2.5 * len(train) / (BATCH * 16) * step), train, val,
                   ["cpu"])
    play(long, [Action()] * 3)
    assert long.envs[0].observe().data_passes > 2


def test_a_budget_below_one_batch_per_epoch_is_refused(data):
    step = static_step()
    pool = EnvPool(spec(budget_flops=3.0 * step), *data, ["cpu"])  # 4 epochs
    with pytest.raises(ValueError, match=r"gives each of the 4 epochs .* less than one "
                                         r"training batch of the host"):
        pool.reset([0])
    # The boundary: one batch per epoch exactly is a budget every epoch can train on.
    assert smallest_budget_flops(step, 4) == 4 * step
    spent = play(EnvPool(spec(budget_flops=4.0 * step), *data, ["cpu"]), [Action()] * 3)
    assert spent[0] > 0 and all(b > a for a, b in itertools.pairwise(spent))


# --- budgets that vary by episode ---------------------------------------------------------------
SCALES = (0.5, 1.0, 2.0)


def test_the_budget_scale_is_a_pure_function_of_the_episodes_rng_seed():
    torch.manual_seed(0)
    np.random.seed(0)
    before = torch.get_rng_state(), np.random.get_state()[1].copy()
    draws = [draw_budget_scale(SCALES, rng_seed) for rng_seed in range(3000)]
    assert draws == [draw_budget_scale(SCALES, rng_seed) for rng_seed in range(3000)]
    # No global generator is drawn from (nor reseeded): other draws are untouched.
    assert torch.equal(torch.get_rng_state(), before[0])
    assert np.array_equal(np.random.get_state()[1], before[1])
    counts = Counter(draws)
    assert set(counts) == set(SCALES)
    for scale in SCALES:  # uniform: 1000 each, a binomial sd of about 26
        assert abs(counts[scale] - 1000) < 100, counts
    assert EnvSpec(task=TASK, host_preset="w32l1", slots=("r0c0",)).budget_scale(5) == 1.0


def test_an_episode_spends_its_drawn_budget_and_observes_its_scale(data):
    step = static_step()
    base = 8.0 * step * 4  # eight batches per epoch at scale 1
    rng_seeds = {}
    for rng_seed in range(100):  # one episode at each end of the scales
        rng_seeds.setdefault(draw_budget_scale((0.5, 2.0), rng_seed), rng_seed)
    pool = EnvPool(spec(budget_flops=base, budget_scales=(0.5, 2.0)), *data, ["cpu", "cpu"])
    observations = pool.reset([rng_seeds[0.5], rng_seeds[2.0]])
    for _ in range(3):
        observations = [s.observation for s in pool.step([Action(), Action()])]
    for scale, observation in zip((0.5, 2.0), observations, strict=True):
        report = observation.report
        assert report.budget_scale == scale and report.budget_flops == base * scale
        assert base * scale <= report.train_flops < base * scale + step  # within one step
        assert 1.0 <= report.budget_fraction < 1.0 + step / (base * scale)
        features = build_observation(report)
        assert features[ob.BUDGET_SCALE] == pytest.approx(math.log2(scale))
        assert features[ob.EPOCH] == 1.0
    assert pool.envs[1]._steps == 4 * pool.envs[0]._steps == 4 * 16


def test_budget_scales_need_a_budget_and_positive_scales():
    for bad in ({"budget_scales": (1.0,)}, {"budget_flops": 1e9, "budget_scales": (0.0, 1.0)},
                {"budget_flops": 1e9, "budget_scales": ()}):
        with pytest.raises(ValueError, match="budget_scales must be numbers > 0 that scale a "
                                             "budget_flops"):
            spec(**bad)


def test_a_budget_range_draws_log_uniformly_from_the_episodes_rng_seed():
    """Each factor of two of [0.25, 4] holds a quarter of the draws (log-uniform), and a draw is
    a pure function of the rng seed that touches no global generator."""
    torch.manual_seed(0)
    np.random.seed(0)
    before = torch.get_rng_state(), np.random.get_state()[1].copy()
    draws = np.array([draw_budget_in_range((0.25, 4.0), rng_seed) for rng_seed in range(4000)])
    assert draws.tolist() == [draw_budget_in_range((0.25, 4.0), r) for r in range(4000)]
    assert torch.equal(torch.get_rng_state(), before[0])
    assert np.array_equal(np.random.get_state()[1], before[1])
    assert draws.min() >= 0.25 and draws.max() <= 4.0
    octaves = np.histogram(np.log2(draws), bins=[-2, -1, 0, 1, 2])[0]
    assert all(abs(n - 1000) < 100 for n in octaves), octaves  # binomial sd about 27
    ranged = spec(budget_flops=1e9, budget_range=(0.25, 4.0))
    assert ranged.budget_scale(11) == draw_budget_in_range((0.25, 4.0), 11)


def test_an_episode_of_a_budget_range_spends_its_own_budget(data):
    step = static_step()
    base = 8.0 * step * 4
    pool = EnvPool(spec(budget_flops=base, budget_range=(0.5, 2.0)), *data, ["cpu", "cpu"])
    observations = pool.reset([3, 4])
    for _ in range(3):
        observations = [s.observation for s in pool.step([Action(), Action()])]
    for rng_seed, observation in zip((3, 4), observations, strict=True):
        scale = draw_budget_in_range((0.5, 2.0), rng_seed)
        report = observation.report
        assert report.budget_scale == scale and report.budget_flops == base * scale
        assert base * scale <= report.train_flops < base * scale + step
        assert build_observation(report)[ob.BUDGET_SCALE] == pytest.approx(math.log2(scale))


@pytest.mark.parametrize("bad", [{"budget_range": (0.5, 2.0)},
                                 {"budget_flops": 1e9, "budget_range": (2.0, 0.5)},
                                 {"budget_flops": 1e9, "budget_range": (0.5, 2.0),
                                  "budget_scales": (1.0,)}])
def test_a_budget_range_needs_a_budget_a_range_and_no_scales(bad):
    with pytest.raises(ValueError, match="budget_range must be"):
        spec(**bad)


def _numbers(observations):
    return [(o.report.val_accuracy, o.report.val_loss, o.train_loss) for o in observations]


def test_metering_changes_no_number_of_an_episode(data, monkeypatch):
    script = [Action(LifecycleOp.GERMINATE, 0, blueprint="lora"), Action(LifecycleOp.ADVANCE, 0),
              Action()]
    # SHORT epochs: a meter that moved a weight would show in the first batch after it measured.
    pool = EnvPool(spec(task=SHORT), *data, ["cpu"])
    metered = _numbers(pool.reset([9]) + [pool.step([a])[0].observation for a in script])
    assert pool.envs[0].ledger.meter.measurements > 0 and pool.envs[0].engine.train_flops > 0
    monkeypatch.setattr(FlopMeter, "_measure", lambda self, *args, **kwargs: 0)
    pool = EnvPool(spec(task=SHORT), *data, ["cpu"])
    bare = _numbers(pool.reset([9]) + [pool.step([a])[0].observation for a in script])
    assert metered == bare


def test_validation_and_counterfactual_flops_are_counted_apart(data):
    pool = EnvPool(spec(task=SHORT), *data, ["cpu"])
    observations = pool.reset([1])
    engine = pool.envs[0].engine
    assert engine.validation_flops > 0 and engine.counterfactual_flops == 0  # nothing blends
    assert observations[0].report.train_flops == engine.train_flops > engine.validation_flops
