"""`compare` at equal compute: the loss at the budget judged, the speed-up at equal loss, per-arm
and tuned learning rates, and tables written before FLOPs were counted."""

from __future__ import annotations

import csv
import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from helpers import scripted_step
from scipy import stats as scipy_stats
from torch import nn

from esper_lightning.app.compare import runner as compare_module
from esper_lightning.app.compare.arms import EpisodePlan
from esper_lightning.app.compare.records import (
    SCHEMA_VERSION,
    EpisodeRecord,
    append_record_csv,
    fieldnames,
    read_records_csv,
)
from esper_lightning.app.compare.runner import Comparison
from esper_lightning.app.compare.speedup import flops_to_reach, speedups
from esper_lightning.app.config import CompareConfig
from esper_lightning.app.task import reward_config, static_step_flops
from esper_lightning.core.engine import MorphogenesisEngine
from esper_lightning.core.lifecycle import GateConfig
from esper_lightning.core.seeding import SeedingConfig
from esper_lightning.core.slots import SeedSlot
from esper_lightning.envs import Observation, Step, draw_budget_scale
from esper_lightning.errors import ConfigError
from esper_lightning.rl.rewards import RewardConfig

#: The columns this change added: a table from before has none of them.
NEW_COLUMNS = ("final_bits", "train_flops", "data_passes", "train_flops_curve")


@pytest.fixture(autouse=True)
def _figures_only_where_read(request: pytest.FixtureRequest,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A comparison here draws its figures only in a test that asks for `figures` (those that
    read a figure): drawing is about half of a tiny comparison's time, and the drawing itself
    is test_app_compare_plots.py's to test."""
    if "figures" not in request.fixturenames:
        monkeypatch.setattr(compare_module.plots, "save_figures", lambda *args, **kwargs: [])


@pytest.fixture
def figures() -> None:
    """This test's comparisons draw every figure, as the command does."""


def record(controller: str, index: int, losses, flops, **values) -> EpisodeRecord:
    n = len(losses)
    return EpisodeRecord(controller, index, 100 + index, "w32l1", {
        "outcome": 50.0, "final_accuracy": 50.0, "total_params": 10, "seed_params": 0,
        "accuracy_curve": (50.0,) * n, "loss_curve": tuple(losses),
        "train_flops_curve": tuple(flops), "seeds_germinated": 0, "seeds_fossilized": 0,
        "seeds_pruned": 0, "wall_seconds": 1.0, **values})


# --- the speed-up at equal loss -----------------------------------------------------------------
def test_flops_to_reach_interpolates_between_the_bracketing_epochs():
    assert flops_to_reach([10, 20, 30], [3.0, 2.0, 1.0], 1.5) == 25.0
    assert flops_to_reach([10, 20, 30], [3.0, 2.0, 1.0], 2.0) == 20.0  # reached on the point
    assert flops_to_reach([10, 20, 30], [3.0, 2.0, 1.0], 5.0) == 10.0  # at most the first
    assert flops_to_reach([10, 20, 30], [3.0, 2.0, 1.0], 0.5) is None  # never
    assert flops_to_reach([10, 20, 30, 40], [3.0, 1.0, 2.5, 0.5], 2.0) == 15.0  # the first time


def test_speedups_on_constructed_curves_equal_the_hand_computation():
    budget = [25.0, 50.0, 75.0, 100.0]
    records = [
        # The reference ends at 100 FLOPs with losses 2.0 and 1.0 in its two episodes.
        record("big", 0, [4.0, 3.0, 2.5, 2.0], budget),
        record("big", 1, [3.0, 2.0, 1.5, 1.0], budget),
        # Episode 0: reaches 2.0 between 25 (3.0) and 50 (1.0): 37.5 FLOPs -> 100 / 37.5.
        # Episode 1: reaches 1.0 on its third point, 75 FLOPs -> 100 / 75.
        record("fast", 0, [3.0, 1.0, 0.9, 0.8], budget),
        record("fast", 1, [2.0, 1.5, 1.0, 0.9], budget),
        # Reaches 2.0 only in episode 0, at 100 FLOPs; never 1.0 in episode 1.
        record("slow", 0, [5.0, 4.0, 3.0, 2.0], budget),
        record("slow", 1, [5.0, 4.0, 3.0, 2.0], budget),
    ]
    rows = {row.controller: row for row in speedups(records, "big")}
    assert rows["big"].ratios == {0: 1.0, 1: 1.0}
    fast = rows["fast"]
    assert fast.ratios == {0: pytest.approx(100 / 37.5), 1: pytest.approx(100 / 75)}
    logs = np.log([100 / 37.5, 100 / 75])
    assert fast.geometric_mean == pytest.approx(math.exp(logs.mean()))
    interval = scipy_stats.t.interval(0.95, 1, loc=logs.mean(), scale=scipy_stats.sem(logs))
    assert fast.ci == pytest.approx(tuple(math.exp(v) for v in interval))
    slow = rows["slow"]
    assert slow.ratios == {0: 1.0, 1: None} and slow.reached == 1
    assert slow.geometric_mean == 1.0 and slow.ci is None  # one episode: no interval
    unmetered = [record("big", 0, [2.0], [0.0]), record("fast", 0, [1.0], [0.0])]
    assert speedups(unmetered, "big") == []  # no FLOPs counted: nothing to say


# --- tables from before FLOPs were counted ------------------------------------------------------
def test_a_table_written_before_flops_were_counted_still_reads_and_resumes(tmp_path):
    path = tmp_path / "episodes.csv"
    old = [name for name in fieldnames() if name not in NEW_COLUMNS]
    full = record("static", 0, [2.0, 1.5], [1.0, 2.0], final_bits=1.5 / math.log(2.0))
    with path.open("w", newline="") as f:  # exactly what the previous version wrote
        writer = csv.DictWriter(f, fieldnames=old, lineterminator="\n", extrasaction="ignore")
        writer.writeheader()
        writer.writerow(full.to_row())
    assert full.to_row()["schema"] == str(SCHEMA_VERSION)
    (old_record,) = read_records_csv(path)
    assert old_record["loss_curve"] == (2.0, 1.5)
    assert all(old_record[name] in (None, ()) for name in NEW_COLUMNS)
    append_record_csv(path, record("static", 1, [2.0, 1.4], [1.0, 2.0]))
    with path.open() as f:
        assert next(csv.reader(f)) == old  # resumed in its own columns
    assert [r.episode_index for r in read_records_csv(path)] == [0, 1]


# --- a budgeted comparison on the language-model task -------------------------------------------
def test_budgeted_lm_comparison_judges_the_test_loss_at_the_budget(text_file, tmp_path,
                                                                  figures):
    config = CompareConfig(
        task="lm", host_preset="w32l1", slots=("r0c0",), block_size=16, batch_size=8,
        episode_length=4, val_subset=8, min_training_epochs=1, data_dir=str(text_file),
        controllers=("static", "grower:lora"), seeds=2, envs=2, budget_steps=24,
        lr_schedule="wsd", warmup_fraction=0.1, arm_lr=("grower:lora=2e-3",),
        out=str(tmp_path / "out"), progress=False)
    records = Comparison(config).run()
    budget = 24 * static_step_flops(config)
    for r in records:
        spent = r["train_flops_curve"]
        assert len(spent) == 4 and budget <= spent[-1] < budget * (1 + 2 / 24)
        assert r["final_bits"] == pytest.approx(r["loss_curve"][-1] / math.log(2.0))
        assert 0 < r["data_passes"] < 1
        # The test split, measured once at the end: another text than validation's.
        assert 0 < r["test_bits"] != r["final_bits"] and 0 < r["test_outcome"] < 100
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["judged"] == "test_bits" and summary["arm_lr"] == {"grower:lora": 2e-3}
    (pair,) = summary["comparisons"]
    assert pair["test_bits_diff_ci"] is not None and "verdict" in pair
    assert {c["controller"] for c in summary["speedup"]["controllers"]} == {"static",
                                                                             "grower:lora"}
    text = (out / "summary.md").read_text()
    assert "| controller | episodes | test loss (bits) [95% CI] |" in text
    assert "## Speed-up at equal loss" in text and "## Compute" in text
    assert (out / "loss_vs_flops.png").stat().st_size > 0
    assert (out / "test_bits_differences.png").stat().st_size > 0


def test_a_folder_from_before_budgets_were_recorded_takes_a_new_arm(text_file, tmp_path):
    config = CompareConfig(
        task="lm", host_preset="w32l1", slots=("r0c0",), block_size=16, batch_size=8,
        episode_length=3, val_subset=4, min_training_epochs=1, data_dir=str(text_file),
        controllers=("static",), seeds=2, envs=2, budget_steps=6, out=str(tmp_path / "out"),
        progress=False)
    Comparison(config).run()
    table = tmp_path / "out" / "episodes.csv"
    with table.open() as f:
        rows = list(csv.DictReader(f))
    columns = [c for c in rows[0] if c != "budget_flops"]  # as the version before wrote it
    with table.open("w", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    # The new arm's rows know their budget, the old ones do not: the run reports the table as
    # it keeps it (its own columns), which is what a rerun reports too.
    grown = config.replace(controllers=("static", "grower:lora"))
    records = Comparison(grown).run()
    assert len(records) == 4 and all(r["budget_flops"] is None for r in records)
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| grower:lora | static | 2 |" in summary
    Comparison(grown).run()  # plays nothing
    assert (tmp_path / "out" / "summary.md").read_text() == summary


def test_budgets_that_vary_by_episode_pair_controllers_and_are_recorded(text_file, tmp_path):
    scales = (0.5, 1.0, 2.0)
    config = CompareConfig(
        task="lm", host_preset="w32l1", slots=("r0c0",), block_size=16, batch_size=8,
        episode_length=3, val_subset=4, data_dir=str(text_file), controllers=("static", "random"),
        seeds=4, envs=2, budget_steps=6, budget_scales=(2.0, 0.5, 1.0), rng_seed=1,
        out=str(tmp_path / "out"), progress=False)
    records = Comparison(config).run()
    step = static_step_flops(config)
    budgets = {}
    for r in records:  # the budget is the episode's: its rng seed's draw, for every controller
        budget = 6 * step * draw_budget_scale(scales, r.episode_rng_seed)
        assert r["budget_flops"] == budgets.setdefault(r.episode_index, budget)
        if r.controller == "static":
            assert budget <= r["train_flops"] < budget + step  # within one step
    assert len(budgets) == 4 and len(set(budgets.values())) > 1  # the budgets did vary
    out = tmp_path / "out"
    assert json.loads((out / "compare_config.json").read_text())["budget_scales"] == [
        0.5, 1.0, 2.0]  # kept sorted
    with (out / "episodes.csv").open() as f:
        assert "budget_flops" in next(csv.reader(f))
    with pytest.raises(ConfigError, match=r"budget_scales=\[0\.5, 1\.0, 2\.0\] \(now \[1\.0, "
                                          r"2\.0\]\); use another --out"):
        Comparison(config.replace(budget_scales=(1.0, 2.0)))
    Comparison(config.replace(budget_scales=(1.0, 0.5, 2.0)))  # the same set: resumes


def test_each_arm_trains_at_its_own_learning_rate(text_file, tmp_path, monkeypatch):
    seen: list[tuple[str, float]] = []
    original = compare_module.play_episodes

    def spy(pool, plans, controllers, task):
        played = original(pool, plans, controllers, task)
        for k, plan in enumerate(plans):
            group = pool.envs[k].optimizer.optimizer.param_groups[0]
            seen.append((plan.label, group["initial_lr"]))
        return played

    monkeypatch.setattr(compare_module, "play_episodes", spy)
    config = CompareConfig(
        task="lm", host_preset="w32l1", slots=("r0c0",), block_size=16, batch_size=8,
        episode_length=3, val_subset=4, train_subset=16, data_dir=str(text_file),
        controllers=("static", "random"), seeds=1, envs=2, host_lr=1e-3,
        arm_lr=("random=5e-3",), out=str(tmp_path / "out"), progress=False)
    Comparison(config).run()
    assert sorted(seen) == [("random", 5e-3), ("static", 1e-3)]


# --- tuning each arm's learning rate ------------------------------------------------------------
class LearningRatePool:
    """A stand-in for `EnvPool` whose host accuracy peaks at a learning rate of 3e-3 (a real
    engine and reports; the accuracy is scripted)."""

    def __init__(self, n: int, config: CompareConfig) -> None:
        self.envs = [_LearningRateEnv(config.episode_length, reward_config(config))
                     for _ in range(n)]

    def reset(self, rng_seeds, which, implants, host_lrs=None):
        return [self.envs[i].reset(seed, lr)
                for i, seed, lr in zip(which, rng_seeds, host_lrs, strict=True)]

    def step(self, actions, which):
        return [self.envs[i].step(a) for i, a in zip(which, actions, strict=True)]

    def test(self, which):
        """The scripted accuracy on the test split too (a loss of 1 nat)."""
        return [(1.0, self.envs[i].accuracy) for i in which]


class _LearningRateEnv:
    def __init__(self, episode_length: int, reward: RewardConfig) -> None:
        self.episode_length, self.reward = episode_length, reward

    def reset(self, rng_seed: int, lr: float | None) -> Observation:
        model = nn.Module()
        model.slots = nn.ModuleList([SeedSlot("r0c1", channels=4)])
        model.host = nn.Linear(4, 4)
        self.engine = MorphogenesisEngine(
            model, seeding=SeedingConfig(gate_config=GateConfig(min_training_epochs=1)))
        noise = torch.rand((), generator=torch.Generator().manual_seed(rng_seed)).item()
        self.accuracy = 60.0 - 20.0 * abs(math.log10(lr or 1e-2) - math.log10(3e-3)) + noise
        self.lr, self.decisions = lr, 0
        return self._observe()

    def step(self, action) -> Step:
        return scripted_step(self, action)

    def _observe(self) -> Observation:
        self.engine.record_epoch(self.accuracy, 1.0, 1.0)
        self.observation = Observation(self.engine.report(max_epochs=4), None, 1.0)
        return self.observation


def test_tuning_picks_each_arms_best_rate_on_tuning_episodes(cifar_dir, tmp_path):
    config = CompareConfig(data_dir=str(cifar_dir), out=str(tmp_path / "out"), episode_length=4,
                           slots=("r0c1",), controllers=("static", "random"), seeds=2, envs=2,
                           tune_lr=(1e-3, 3e-3, 1e-2), arm_lr=("random=1e-2",),
                           tuning_seeds=2, progress=False)
    comparison = Comparison(config, pool=LearningRatePool(2, config))
    records = comparison.run()
    chosen = json.loads((tmp_path / "out" / "lr_tuned.json").read_text())
    assert list(chosen) == ["static"] and chosen["static"]["chosen"] == 3e-3  # random has one
    tuning = read_records_csv(tmp_path / "out" / "tuning.csv")
    assert {r.controller for r in tuning} == {"static@lr=0.001", "static@lr=0.003",
                                              "static@lr=0.01"}
    assert {r.episode_rng_seed for r in tuning}.isdisjoint({r.episode_rng_seed for r in records})
    assert comparison.arm_lrs == {"static": 3e-3, "random": 1e-2}
    # The evaluation episodes played at the chosen rates: the scripted accuracy says so.
    static = [r for r in records if r.controller == "static"]
    assert all(r["final_accuracy"] > 59.0 for r in static)
    again = Comparison(config, pool=LearningRatePool(2, config))
    again.run()  # a rerun reads the choice back instead of tuning again
    assert again.arm_lrs == comparison.arm_lrs
    assert len(read_records_csv(tmp_path / "out" / "tuning.csv")) == len(tuning)
    # A controller added to the folder later is tuned too, the others' choices kept.
    more = dataclasses.replace(config, controllers=("static", "random", "heuristic"))
    added = Comparison(more, pool=LearningRatePool(2, more))
    added.run()
    assert added.arm_lrs == {"static": 3e-3, "random": 1e-2, "heuristic": 3e-3}
    assert list(json.loads((tmp_path / "out" / "lr_tuned.json").read_text())) == [
        "static", "heuristic"]
    assert len(read_records_csv(tmp_path / "out" / "tuning.csv")) == 2 * len(tuning)


def test_an_arms_rate_belongs_to_the_arm_a_folder_takes_new_arms(cifar_dir, tmp_path):
    values = dict(data_dir=str(cifar_dir), out=str(tmp_path / "out"), episode_length=4,
                  slots=("r0c1",), seeds=2, envs=2, progress=False)
    first = CompareConfig(controllers=("static",), arm_lr=("static=3e-3",), **values)
    played = Comparison(first, pool=LearningRatePool(2, first)).run()
    # A new controller with its own rate joins the folder; static's episodes are reused.
    both = CompareConfig(controllers=("static", "random"),
                         arm_lr=("static=3e-3", "random=1e-3"), **values)
    records = Comparison(both, pool=LearningRatePool(2, both)).run()
    static = [r for r in records if r.controller == "static"]
    assert [r.to_row() for r in static] == [r.to_row() for r in played]
    saved = json.loads((tmp_path / "out" / "controllers.json").read_text())
    assert saved == {"static": {"kind": "static", "lr": 3e-3},
                     "random": {"kind": "random", "lr": 1e-3}}
    # Another rate for an arm that played here is another arm: refused in one line.
    other = CompareConfig(controllers=("static",), arm_lr=("static=1e-2",), **values)
    with pytest.raises(ConfigError, match=r"static is not the controller that played its 2 "
                                          r"episodes .*arm_lr 0.003 then, 0.01 now"):
        Comparison(other, pool=LearningRatePool(2, other))
    unrated = CompareConfig(controllers=("static",), **values)
    with pytest.raises(ConfigError, match=r"arm_lr 0\.003 then, None now"):
        Comparison(unrated, pool=LearningRatePool(2, unrated))


def test_plans_carry_no_rate_without_arm_lr_or_tuning(cifar_dir, tmp_path):
    config = CompareConfig(data_dir=str(cifar_dir), out=str(tmp_path / "out"),
                           controllers=("static",), seeds=2, progress=False)
    plans = Comparison(config)._plans(list(Comparison(config).specs.values()), [])
    assert [p.host_lr for p in plans] == [None, None]
    assert EpisodePlan("static", 0, 1).host_lr is None



def test_the_untuned_heuristic_deepens_a_host_through_its_growth_slot():
    growing = CompareConfig(task="lm", host_preset="grow4", slots=("r1c0",))
    heuristic = compare_module.default_heuristic(growing)
    assert heuristic.blueprint_rotation == ("block_identity",)
    assert heuristic.germinate_until_fraction == 0.8
    for config in (CompareConfig(task="lm", host_preset="grow4", slots=("r0c0",)),
                   CompareConfig(task="lm", host_preset="w32l1", slots=("r0c0",)),
                   CompareConfig()):
        assert compare_module.default_heuristic(config) == compare_module.HeuristicConfig()


def test_a_born_arm_tunes_its_rate_on_the_host_it_is_born_as(text_file, tmp_path):
    """``born:4`` is the four-block host in its tuning episodes as in its evaluation episodes:
    a rate tuned on the one-block host would be another arm's."""
    seen: list[tuple] = []

    class Recording(LearningRatePool):
        def reset(self, rng_seeds, which, implants, host_lrs=None):
            seen.extend(tuple(i) for i in implants)
            return super().reset(rng_seeds, which, implants, host_lrs)

    config = CompareConfig(task="lm", host_preset="grow4", slots=("r1c0",), block_size=16,
                           batch_size=8, train_subset=16, val_subset=4, episode_length=4,
                           data_dir=str(text_file), controllers=("static", "born:4"), seeds=1,
                           envs=2, tune_lr=(1e-3, 3e-3), tuning_seeds=1,
                           out=str(tmp_path / "out"), progress=False)
    Comparison(config, pool=Recording(2, config)).run()
    born = (("r1c0", "block_random"),)
    # static's two tuning episodes and its evaluation episode are born plain, born:4's grown.
    assert sorted(seen) == sorted([(), (), ()] + [born] * 3)
