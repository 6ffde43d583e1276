"""`esper-lightning compare`: pairing, verdicts, resuming, the born-grown baseline, tuning and
the command line's errors."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import logging
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import scripted_step
from torch import nn

from esper_lightning import blueprints as blueprint_registry
from esper_lightning.app.cli import main
from esper_lightning.app.compare import runner as compare_module
from esper_lightning.app.compare.arms import EpisodePlan, check_policy, parse_controller
from esper_lightning.app.compare.plots import save_figures as draw_figures
from esper_lightning.app.compare.records import METRICS, Metric
from esper_lightning.app.compare.runner import (
    Comparison,
    balanced_root,
    evaluation_rng_seed,
    tuning_grid,
    tuning_rng_seed,
)
from esper_lightning.app.compare.stats import mean_ci
from esper_lightning.app.config import CompareConfig, preset_values
from esper_lightning.app.task import reward_config
from esper_lightning.controllers import GrowerController, StaticController
from esper_lightning.core.actions import Action, AlphaSpeed, LifecycleOp
from esper_lightning.core.engine import MorphogenesisEngine
from esper_lightning.core.lifecycle import ACTIVE_STAGES, GateConfig
from esper_lightning.core.seeding import SeedingConfig
from esper_lightning.core.slots import SeedSlot
from esper_lightning.envs import Observation, Step
from esper_lightning.errors import ConfigError
from esper_lightning.rl.checkpoint import read_checkpoint, write_checkpoint
from esper_lightning.rl.rewards import RewardConfig


def fixture_config(cifar_dir: Path, out: Path, **changes) -> CompareConfig:
    values = {"data_dir": str(cifar_dir), "out": str(out), "episode_length": 3,
              "batch_size": 16, "slots": ("r0c1", "r0c2"), "min_training_epochs": 1,
              "envs": 2, "seeds": 2, "progress": False, **changes}
    return CompareConfig(**values)


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return [{k: v for k, v in row.items() if k != "wall_seconds"} for row in csv.DictReader(f)]


@pytest.fixture(autouse=True)
def _no_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """A comparison played in a test draws no figures: drawing is about half of a tiny
    comparison's time, and the drawing itself is test_app_compare_plots.py's to test. The one
    comparison whose figures are read (`drawn`) draws them all, as the command does (a language
    model's figures are drawn and read by test_app_compare_runner_budget.py's budgeted
    comparison)."""
    monkeypatch.setattr(compare_module.plots, "save_figures", lambda *args, **kwargs: [])


#: The command line `drawn` records.
DRAWN_COMMAND = ["esper-lightning", "compare", "--preset", "smoke", "--out", "my out"]


@pytest.fixture(scope="module")
def drawn(_cifar_master: Path, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """One comparison of static, ``twin`` (a second static controller) and ``grower:norm`` on 2
    episodes, with `FINAL_TRAIN_LOSS` added to the metrics and every figure drawn, played once
    for the tests that read its ``records`` and its folder ``out`` (read-only)."""
    root = tmp_path_factory.mktemp("drawn")
    data = Path(shutil.copytree(_cifar_master, root / "cifar"))
    config = fixture_config(data, root / "out", controllers=("static", "twin", "grower:norm"),
                            seeds=2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(METRICS, FINAL_TRAIN_LOSS.name, FINAL_TRAIN_LOSS)
        patch.setattr(compare_module.plots, "save_figures", draw_figures)
        comparison = Comparison(config, custom={"twin": lambda plan: StaticController()},
                                command=DRAWN_COMMAND)
        records = comparison.run()
    return SimpleNamespace(records=records, out=root / "out")


def _entry(entries: list[dict], controller: str) -> dict:
    """The entry of ``controller`` in a list of summary.json's."""
    (entry,) = (e for e in entries if e["controller"] == controller)
    return entry


# --- pairing on the real env pool ---------------------------------------------------------------
def test_identical_controllers_give_identical_episodes(drawn):
    out = drawn.out
    by = {(r.controller, r.episode_index): r for r in drawn.records}
    for i in range(2):
        assert by["static", i]["accuracy_curve"] == by["twin", i]["accuracy_curve"]
        assert by["static", i].episode_rng_seed == evaluation_rng_seed(0, i)
    assert by["static", 0]["accuracy_curve"] != by["static", 1]["accuracy_curve"]  # differ
    summary = json.loads((out / "summary.json").read_text())
    pair = _entry(summary["comparisons"], "twin")
    assert pair["outcome_diff_mean"] == 0.0 and pair["outcome_diff_ci"] == [0.0, 0.0]
    assert _entry(summary["comparisons"], "grower:norm")["outcome_diff_mean"] != 0.0
    for name in ("episodes.csv", "summary.md", "outcome_vs_params.png", "accuracy_curves.png"):
        assert (out / name).stat().st_size > 0
    assert list((out / "tensorboard").glob("version_*/events.out.tfevents.*"))
    # The report opens with what was run, says the two coincide, and leaves out what applies
    # only under a compute budget or to text.
    text = (out / "summary.md").read_text()
    assert text.startswith("# Comparison of 3 controllers on cifar (smoke)\n\n| setting |")
    for row in ("| preset | smoke |", "| budget | none: 3 epochs |", "root rng seed 0 |",
                "| controllers | static (the reference), twin, grower:norm |",
                "| code | esper-lightning ", "| machine | ",
                "| command | `esper-lightning compare --preset smoke --out 'my out'` |",
                "twin played exactly as static in every episode"):
        assert row in text
    for absent in ("## Compute", "## Speed-up", "final loss (bits)", "test loss (bits)",
                   "byte"):
        assert absent not in text
    assert "grower:norm played exactly as" not in text
    assert not (out / "loss_vs_flops.png").exists()
    assert not list(out.glob("*bits*.png"))


def test_interrupted_comparison_resumes_to_the_same_table(cifar_dir, tmp_path, monkeypatch):
    # One episode each, in chunks of one (envs=1): the run stops after static's, before the
    # random controller's, and the resumed run plays that one alone.
    straight = fixture_config(cifar_dir, tmp_path / "a", controllers=("static", "random"),
                              envs=1, seeds=1)
    Comparison(straight).run()
    resumed = fixture_config(cifar_dir, tmp_path / "b", controllers=("static", "random"),
                             envs=1, seeds=1)
    real = compare_module.play_episodes
    calls = {"n": 0}

    def crash_on_second_chunk(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(compare_module, "play_episodes", crash_on_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        Comparison(resumed).run()
    assert [r["controller"] for r in read_rows(tmp_path / "b" / "episodes.csv")] == ["static"]
    monkeypatch.setattr(compare_module, "play_episodes", real)
    Comparison(resumed).run()
    assert read_rows(tmp_path / "b" / "episodes.csv") == read_rows(tmp_path / "a" / "episodes.csv")


def test_rerun_with_other_task_settings_is_refused_and_writes_nothing(cifar_dir, tmp_path):
    Comparison(fixture_config(cifar_dir, tmp_path / "out", controllers=("static",),
                              seeds=1)).run()
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir() if p.is_file()}
    with pytest.raises(ConfigError, match="holds a comparison with other settings: episode_length"):
        Comparison(fixture_config(cifar_dir, tmp_path / "out", controllers=("static",),
                                  episode_length=4))
    after = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir() if p.is_file()}
    assert after == before


# --- a metric added in one place ----------------------------------------------------------------
#: The final training loss: measured by the env, reported nowhere. This one entry is all it
#: takes for every output of a comparison to carry it.
FINAL_TRAIN_LOSS = Metric("final_train_loss", lambda e: e.reports[-1].train_loss,
                          "final train loss", fmt=".4f", better="lower", paired=True, plot=True,
                          description="mean training loss of the last epoch")


def test_a_metric_added_in_one_place_reaches_every_output(drawn):
    out = drawn.out  # played with FINAL_TRAIN_LOSS added to METRICS, and nothing else
    rows = list(csv.DictReader((out / "episodes.csv").open()))
    loss = {(r["controller"], int(r["episode_index"])): float(r["final_train_loss"])
            for r in rows}
    assert len(loss) == 6 and all(0.0 < v < 10.0 for v in loss.values())
    diffs = [loss["grower:norm", i] - loss["static", i] for i in range(2)]
    summary = json.loads((out / "summary.json").read_text())
    static = _entry(summary["controllers"], "static")
    assert static["final_train_loss_mean"] == pytest.approx((loss["static", 0]
                                                            + loss["static", 1]) / 2)
    assert static["final_train_loss_ci"] == list(mean_ci([loss["static", i]
                                                                for i in range(2)]))
    pair = _entry(summary["comparisons"], "grower:norm")
    assert pair["final_train_loss_diff_mean"] == pytest.approx(np.mean(diffs))
    assert pair["final_train_loss_diff_ci"] == list(mean_ci(diffs))
    text = (out / "summary.md").read_text()
    assert "| final train loss [95% CI] |" in text and "| Δ final train loss [95% CI] |" in text
    assert f"| {np.mean(diffs):+.4f} [" in text
    assert (out / "final_train_loss_vs_params.png").read_bytes()[:4] == b"\x89PNG"


def checksums(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_table_without_its_settings_is_refused_and_left_unchanged(cifar_dir, tmp_path):
    out = tmp_path / "out"
    Comparison(fixture_config(cifar_dir, out, controllers=("static",), seeds=1,
                              episode_length=4)).run()
    (out / "compare_config.json").unlink()
    before = checksums(out)
    with pytest.raises(ConfigError, match=r"holds episodes\.csv but no compare_config\.json"):
        Comparison(fixture_config(cifar_dir, out, controllers=("static",), seeds=1))
    assert checksums(out) == before


def test_rows_played_with_other_settings_are_refused_whatever_the_config_says(cifar_dir,
                                                                             tmp_path):
    out = tmp_path / "out"
    Comparison(fixture_config(cifar_dir, out, controllers=("static",), seeds=1,
                              episode_length=4)).run()
    saved = json.loads((out / "compare_config.json").read_text())
    (out / "compare_config.json").write_text(json.dumps({**saved, "episode_length": 3}))
    before = checksums(out)
    with pytest.raises(ConfigError, match=r"episode 0 of static was played with other "
                                          r"settings \(4 epochs, not 3\)"):
        Comparison(fixture_config(cifar_dir, out, controllers=("static",), seeds=1))
    assert checksums(out) == before


def test_the_same_data_folder_relative_or_absolute_resumes(cifar_dir, tmp_path, monkeypatch):
    out = tmp_path / "out"
    absolute = fixture_config(cifar_dir, out, controllers=("static",), seeds=1)
    Comparison(absolute).run()
    monkeypatch.chdir(cifar_dir.parent)
    relative = fixture_config(Path(cifar_dir.name), out, controllers=("static",), seeds=1)
    assert relative.data_dir != absolute.data_dir
    assert len(Comparison(relative).run()) == 1  # accepted, nothing replayed
    saved = json.loads((out / "compare_config.json").read_text())
    assert saved["data_dir"] == str(cifar_dir.resolve())


def retrain(path: Path) -> None:
    """The same file path, other weights: what training again into ``--save`` leaves."""
    state = torch.load(path, weights_only=True)

    def perturb(value):
        if isinstance(value, dict):
            return {k: perturb(v) for k, v in value.items()}
        return value + 1.0 if torch.is_tensor(value) and value.is_floating_point() else value

    torch.save(perturb(state), path)


def test_a_policy_retrained_into_the_same_file_is_another_controller(trained_policy, played):
    data, _ = trained_policy
    policy, out = played / "ckpt.pt", played / "out"
    config = CompareConfig(**_smoke_values(data, policy, out))
    recorded = json.loads((out / "controllers.json").read_text())
    assert recorded[f"policy:{policy}"]["sha256"] == hashlib.sha256(
        policy.read_bytes()).hexdigest()
    assert len(Comparison(config).run()) == 2  # the same file resumes
    retrain(policy)
    before = checksums(out)
    with pytest.raises(ConfigError, match=re.escape(f"policy:{policy} is not the controller "
                                                    "that played its 1 episodes")):
        Comparison(config)
    assert checksums(out) == before


def test_a_foreign_episode_table_is_refused_before_anything_is_written(cifar_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "episodes.csv").write_text("name,score\nme,1\n")
    with pytest.raises(ConfigError, match=r"episodes\.csv: header \['name', 'score'\]"):
        Comparison(fixture_config(cifar_dir, out, controllers=("static",)))
    assert sorted(p.name for p in out.iterdir()) == ["episodes.csv"]


# --- a controller better by construction --------------------------------------------------------
class ScriptedHostPool:
    """A stand-in for `EnvPool` whose host accuracy is scripted from the real lifecycle: a
    blended ``norm`` seed in the first slot adds ``10 · alpha`` points, on top of a plateau that
    differs per episode. Everything else is real: `SeedSlot`s, the engine, masks and reports."""

    def __init__(self, n: int, config: CompareConfig) -> None:
        self.episode_length, self.slots = config.episode_length, config.slots
        self.envs = [_ScriptedEnv(config.slots, config.episode_length, reward_config(config))
                     for _ in range(n)]

    def reset(self, rng_seeds, which, implants, host_lrs=None):
        return [self.envs[i].reset(seed, seeds)
                for i, seed, seeds in zip(which, rng_seeds, implants, strict=True)]

    def step(self, actions, which):
        return [self.envs[i].step(a) for i, a in zip(which, actions, strict=True)]

    def test(self, which):
        return [self.envs[i].test() for i in which]


class _ScriptedEnv:
    def __init__(self, slots: tuple[str, ...], episode_length: int,
                 reward: RewardConfig) -> None:
        self.slot_ids, self.episode_length, self.reward = slots, episode_length, reward
        self.engine: MorphogenesisEngine | None = None

    def reset(self, rng_seed: int, implants=()) -> Observation:
        model = nn.Module()
        model.slots = nn.ModuleList(SeedSlot(sid, channels=4) for sid in self.slot_ids)
        model.host = nn.Linear(4, 4)
        self.engine = MorphogenesisEngine(
            model, seeding=SeedingConfig(gate_config=GateConfig(min_training_epochs=1)))
        for slot_id, blueprint in implants:
            self.engine.implant(slot_id, blueprint)
        self.plateau = 40.0 + 10.0 * torch.rand((), generator=torch.Generator().manual_seed(
            rng_seed)).item()
        self.decisions = 0
        return self._observe()

    def step(self, action) -> Step:
        return scripted_step(self, action)

    def _accuracy(self) -> tuple[float, float]:
        slot = self.engine.slots[self.slot_ids[0]]
        gain = 10.0 * slot.alpha if slot.stage in ACTIVE_STAGES else 0.0
        return self.plateau + gain + 0.1 * self.engine.epoch, gain

    def test(self) -> tuple[float, float]:
        """The scripted host on the test split: a point below its validation accuracy."""
        return 1.0, self._accuracy()[0] - 1.0

    def _observe(self) -> Observation:
        slot = self.engine.slots[self.slot_ids[0]]
        accuracy, gain = self._accuracy()
        for s in self.engine.slots.values():
            if s.state is not None:
                s.state.metrics.gradient_health, s.state.metrics.has_exploding = 1.0, False
        contributions = {slot.slot_id: gain} if gain else {}
        self.engine.record_epoch(accuracy, 1.0, 1.0, contributions)
        self.observation = Observation(self.engine.report(max_epochs=self.episode_length), None,
                                       1.0)
        return self.observation


def test_a_controller_better_by_construction_is_reported_better(cifar_dir, tmp_path):
    config = fixture_config(cifar_dir, tmp_path / "out", episode_length=10, seeds=8, envs=4,
                            controllers=("static", "grower:norm"))
    pool = ScriptedHostPool(4, config)
    Comparison(config, pool=pool).run()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    (pair,) = summary["comparisons"]
    assert pair["controller"] == "grower:norm" and pair["n_pairs"] == 8
    assert pair["verdict"] == "better" and pair["outcome_diff_ci"][0] > 5.0


class PruneAtTheEnd:
    """Grows a ``norm`` seed, keeps it blended, and prunes it instantly at the last decision:
    two of the three outcome epochs are measured with the seed, the last without."""

    def __init__(self, plan: EpisodePlan) -> None:
        self.grower = GrowerController("norm", fossilize=False)

    def reset(self) -> None:
        self.grower.reset()

    def decide(self, report):
        if report.epoch == report.max_epochs - 2:
            return Action(LifecycleOp.PRUNE, 0, alpha_speed=AlphaSpeed.INSTANT)
        return self.grower.decide(report)


def test_pruning_at_the_last_decision_does_not_dodge_the_parameter_cost(cifar_dir, tmp_path):
    config = fixture_config(cifar_dir, tmp_path / "out", episode_length=12, seeds=2, envs=2,
                            param_cost=20.0, controllers=("keep", "prune"), reference="keep")
    pool = ScriptedHostPool(2, config)
    custom = {"keep": lambda plan: GrowerController("norm", fossilize=False),
              "prune": PruneAtTheEnd}
    records = {(r.controller, r.episode_index): r
               for r in Comparison(config, custom=custom, pool=pool).run()}
    host = 20  # the scripted host: one 4x4 linear layer
    for i in range(2):
        keep, prune = records["keep", i], records["prune", i]
        size = keep["seed_params"]
        assert size > 0 and prune["seed_params"] == 0 and prune["seeds_pruned"] == 1
        for record, mean_size in ((keep, size), (prune, 2 * size / 3)):
            accuracy = sum(record["accuracy_curve"][-3:]) / 3
            assert record["outcome"] == pytest.approx(accuracy - 20.0 * mean_size / host)
        # The pruned episode's last epoch lost the seed's 10 points, its cost fell by a third:
        # the two together keep it below keeping the seed.
        assert prune["outcome"] < keep["outcome"]


def test_a_rollback_restores_and_the_episode_goes_on(cifar_dir, tmp_path, monkeypatch):
    from test_app_ppo_trainer import force_one_rollback

    force_one_rollback(monkeypatch)
    config = fixture_config(cifar_dir, tmp_path / "out", controllers=("static",), seeds=1,
                            episode_length=4, envs=1)
    (record,) = Comparison(config).run()
    assert len(record["accuracy_curve"]) == 4
    # static: no seeds, no shaping; the return is the outcome minus one rollback penalty.
    assert record["episode_return"] == pytest.approx(record["outcome"] - 10.0)


# --- the born-grown baseline -------------------------------------------------------------------
class ByEpisode:
    """A grower of another blueprint in each episode (its factory gets the plan)."""

    BLUEPRINTS = ("norm", "conv_light", "depthwise")

    def __init__(self, plan: EpisodePlan) -> None:
        self.grower = GrowerController(self.BLUEPRINTS[plan.index % 3], fossilize=False)

    def reset(self) -> None:
        self.grower.reset()

    def decide(self, report):
        return self.grower.decide(report)


def test_matched_is_born_with_exactly_what_its_grower_grew_in_each_episode(cifar_dir, tmp_path):
    config = fixture_config(cifar_dir, tmp_path / "out", episode_length=8, seeds=3, envs=3,
                            controllers=("static", "mixed", "matched:mixed"))
    pool = ScriptedHostPool(3, config)
    records = Comparison(config, custom={"mixed": ByEpisode}, pool=pool).run()
    by = {(r.controller, r.episode_index): r for r in records}
    for i, blueprint in enumerate(ByEpisode.BLUEPRINTS):
        grown, born = by["mixed", i], by["matched:mixed", i]
        assert grown["final_seeds"] == (("r0c1", blueprint),)
        assert born["final_seeds"] == grown["final_seeds"]
        assert born["seed_params"] == grown["seed_params"] > 0
        assert (born["seeds_germinated"], born["seeds_fossilized"]) == (0, 0)  # implanted
    assert by["static", 0]["final_seeds"] == ()
    rows = list(csv.DictReader((tmp_path / "out" / "episodes.csv").open()))
    assert {r["final_seeds"] for r in rows if r["controller"] == "static"} == {"none"}


def test_a_table_without_grown_seeds_cannot_feed_matched(cifar_dir, tmp_path):
    out = tmp_path / "out"
    config = fixture_config(cifar_dir, out, seeds=1, controllers=("static", "grower:norm"))
    Comparison(config).run()
    with (out / "episodes.csv").open() as f:
        rows = list(csv.DictReader(f))
    columns = [c for c in rows[0] if c != "final_seeds"]  # as an older version wrote it
    with (out / "episodes.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    before = checksums(out)
    matched = fixture_config(cifar_dir, out, seeds=1,
                             controllers=("static", "grower:norm", "matched:grower:norm"))
    with pytest.raises(ConfigError, match="were recorded without the seeds they grew"):
        Comparison(matched)
    assert checksums(out) == before


def test_lm_comparison_records_token_accuracy_and_loss(text_file, tmp_path):
    values = preset_values("lm-smoke", CompareConfig)
    # Episodes of 3 epochs (the preset's 4 less one): the grower germinates at the first
    # decision either way, and every curve is as long as the episode.
    config = CompareConfig(**{**values, "data_dir": str(text_file), "out": str(tmp_path / "out"),
                              "controllers": ("static", "grower:lora", "matched:grower:lora"),
                              "seeds": 2, "envs": 2, "progress": False, "episode_length": 3})
    records = Comparison(config).run()
    assert len(records) == 6 and {r.host for r in records} == {"tiny"}
    for r in records:
        assert len(r["loss_curve"]) == len(r["accuracy_curve"]) == config.episode_length
        assert 0.0 < min(r["loss_curve"]) < 6.0  # per-token cross-entropy, below ln 256
    grown = [r for r in records if r.controller == "grower:lora"]
    assert all(r["seeds_germinated"] == 1 and r["seed_params"] > 0 for r in grown)
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "## Validation loss" in summary and "| grower:lora | static | 2 |" in summary
    assert json.loads((tmp_path / "out" / "compare_config.json").read_text())["task"] == "lm"


def test_a_folder_written_before_tasks_existed_resumes_as_cifar(cifar_dir, tmp_path):
    config = fixture_config(cifar_dir, tmp_path / "out", controllers=("static",), seeds=1)
    Comparison(config).run()
    saved_path = tmp_path / "out" / "compare_config.json"
    saved = json.loads(saved_path.read_text())
    del saved["task"], saved["block_size"]
    saved_path.write_text(json.dumps(saved))
    assert len(Comparison(config).run()) == 1  # accepted, nothing replayed


def test_matched_controller_is_born_with_the_growers_seeds(cifar_dir, tmp_path):
    grower, matched = "grower:conv_light", "matched:grower:conv_light"
    # The grower is the reference: no static episode is played, none is read.
    config = fixture_config(cifar_dir, tmp_path / "out", seeds=1, episode_length=4,
                            controllers=(grower, matched), reference=grower)
    records = {r.controller: r for r in Comparison(config).run()}
    grown = records["grower:conv_light"]["seed_params"]
    assert grown > 0
    assert records["matched:grower:conv_light"]["seed_params"] == grown
    assert records["matched:grower:conv_light"]["final_seeds"] == (("r0c1", "conv_light"),)
    assert records["matched:grower:conv_light"]["seeds_germinated"] == 0


# --- tuning the heuristic ----------------------------------------------------------------------
def test_tuning_picks_the_best_configuration_on_tuning_episodes(cifar_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(compare_module, "TUNING_GRID", {"fossilize_contribution": (0.0, 0.5)})
    config = fixture_config(cifar_dir, tmp_path / "out", controllers=("static", "heuristic"),
                            tune_heuristic=True, tuning_seeds=1, seeds=1)
    Comparison(config).run()
    saved = json.loads((tmp_path / "out" / "heuristic_tuned.json").read_text())
    rows = list(csv.DictReader((tmp_path / "out" / "tuning.csv").open()))
    assert {r["controller"] for r in rows} == {"tune-0", "tune-1"}
    assert {int(r["episode_rng_seed"]) for r in rows} == {tuning_rng_seed(0, 0)}
    best = max(rows, key=lambda r: (float(r["outcome"]), -int(r["controller"][-1])))
    assert saved["chosen"] == best["controller"]
    evaluation = {int(r["episode_rng_seed"]) for r in
                  csv.DictReader((tmp_path / "out" / "episodes.csv").open())}
    assert not evaluation & {tuning_rng_seed(0, i) for i in range(10)}


def test_evaluation_and_tuning_seeds_never_overlap_training_seeds():
    from esper_lightning.envs import episode_rng_seed

    training = {episode_rng_seed(0, r, i, e) for r in range(200) for i in range(8)
                for e in range(2)}
    evaluation = {evaluation_rng_seed(0, i) for i in range(200)}
    tuning = {tuning_rng_seed(0, i) for i in range(200)}
    assert not training & evaluation and not training & tuning and not evaluation & tuning


def test_balanced_root_is_the_first_root_whose_episodes_draw_each_budget_equally():
    from esper_lightning.envs import draw_budget_scale

    scales = (0.35, 0.7, 1.4)

    def counts(root):
        drawn = [draw_budget_scale(scales, evaluation_rng_seed(root, i)) for i in range(6)]
        return [drawn.count(scale) for scale in scales]

    root = balanced_root(scales, 6, start=500)
    assert counts(root) == [2, 2, 2]
    assert balanced_root((1.4, 0.35, 0.7), 6, start=500) == root  # given in any order
    assert all(counts(r) != [2, 2, 2] for r in range(500, root))  # the first such root
    with pytest.raises(ValueError, match="episodes=7 is not a positive multiple"):
        balanced_root(scales, 7, start=500)
    assert root > 500  # so the roots before it are a search that finds none
    with pytest.raises(ValueError, match=rf"no root in \[500, {root}\)"):
        balanced_root(scales, 6, start=500, tries=root - 500)


# --- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize("blueprint", ["lora", "nonsense"])
def test_a_grower_of_a_blueprint_the_task_lacks_is_refused(cifar_dir, tmp_path, blueprint):
    # Once accepted: `grower:lora` on CIFAR waited every episode and never grew; an unknown
    # name listed the transformer blueprints too.
    config = fixture_config(cifar_dir, tmp_path / "out", controllers=("static",
                                                                       f"grower:{blueprint}"))
    cnn = ", ".join(blueprint_registry.available("cnn"))
    with pytest.raises(ConfigError) as info:
        Comparison(config)
    assert str(info.value) == (f"grower: blueprint {blueprint!r} does not exist for topology "
                               f"'cnn'; accepted: {cnn}")
    assert not (tmp_path / "out").exists()


def test_the_tuning_grid_keeps_each_rotation_to_the_tasks_blueprints():
    for topology in ("cnn", "transformer"):
        rotations = {config.blueprint_rotation for config in tuning_grid(topology)}
        names = {n for rotation in rotations for n in rotation}
        assert names <= set(blueprint_registry.available(topology)) and len(rotations) == 2
    assert {c.blueprint_rotation for c in tuning_grid("transformer")} == {
        ("attention", "norm"), ("norm", "attention")}


def test_the_tuning_grid_keeps_a_growth_heuristics_block_seeds():
    base = compare_module.default_heuristic(
        CompareConfig(task="lm", host_preset="grow4", slots=("r1c0",)))
    grid = tuning_grid("transformer", base)
    assert len(grid) == 4  # plateau length x fossilization bar; the rotation is the base's
    assert {c.blueprint_rotation for c in grid} == {("block_identity",)}
    assert {c.germinate_until_fraction for c in grid} == {0.8}
    assert {(c.plateau_epochs_to_germinate, c.fossilize_contribution) for c in grid} == {
        (1, 0.0), (1, 0.5), (3, 0.0), (3, 0.5)}


@pytest.mark.parametrize("text", ["bogus", "policy", "policy:", "matched", "static:x"])
def test_unknown_controller_names(text):
    with pytest.raises(ConfigError, match=f"unknown controller '{text}'; accepted: static"):
        parse_controller(text)


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``esper-lightning compare ARGS`` in this process: its exit status and its stderr. (The
    command in a fresh process, as a user runs it, is tests/test_app_cli.py's: each one here
    would pay ~12 s of importing torch and Lightning again.) The package's logger starts
    without handlers, as in a fresh process, so the command's own log lines land on stderr."""
    logger = logging.getLogger("esper_lightning")
    handlers, level = list(logger.handlers), logger.level
    logger.handlers.clear()
    capsys.readouterr()
    try:
        status = main(["compare", *args])
    finally:
        logger.handlers[:] = handlers
        logger.setLevel(level)
    return status, capsys.readouterr().err


def cli_error_line(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The one line ``compare ARGS`` fails with (exit status 2, no traceback)."""
    status, stderr = run_cli(capsys, *args)
    assert status == 2, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.fixture
def trained_policy(smoke_policy):
    """A one-round PPO checkpoint on slots r0c1 r0c2 of the baseline host (the session's,
    read-only: conftest's ``smoke_policy``)."""
    return smoke_policy


def _smoke_values(data: Path, policy: Path, out: Path) -> dict:
    """The ``smoke`` comparison of static and ``policy:POLICY`` on 1 episode, into ``out``."""
    return {**preset_values("smoke", CompareConfig), "data_dir": str(data), "out": str(out),
            "seeds": 1, "progress": False, "controllers": ("static", f"policy:{policy}")}


@pytest.fixture(scope="module")
def _played_once(smoke_policy, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``work/`` (a copy of the smoke policy, ``ckpt.pt``, and its ``smoke`` comparison with
    static, ``out/``) played once per module, and ``pristine/``, its copy."""
    data, trained = smoke_policy
    root = tmp_path_factory.mktemp("played")
    work = root / "work"
    work.mkdir()
    (work / "ckpt.pt").write_bytes(trained.read_bytes())
    with pytest.MonkeyPatch.context() as patch:  # no figures: none is read
        patch.setattr(compare_module.plots, "save_figures", lambda *args, **kwargs: [])
        Comparison(CompareConfig(**_smoke_values(data, work / "ckpt.pt", work / "out"))).run()
    shutil.copytree(work, root / "pristine")
    return root


@pytest.fixture
def played(_played_once: Path) -> Path:
    """The folder of a policy ``ckpt.pt`` and the ``smoke`` comparison ``out/`` that it and
    static played, as the comparison left it: the test may change either (the next test gets
    them back at the same paths, which the comparison's controller names hold)."""
    work = _played_once / "work"
    shutil.rmtree(work)
    shutil.copytree(_played_once / "pristine", work)
    return work


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--controllers", "static", "bogus"], "unknown controller 'bogus'"),
        (["--seeds", "0"], "seeds must be >= 1, got 0"),
        (["--controllers", "static", "policy:/nowhere/ckpt.pt"], "does not exist"),
        (["--controllers", "static", "policy:UNREADABLE"], "cannot read checkpoint"),
        (["--controllers", "static", "policy:POLICY", "--slots", "r0c0"],
         "was trained with slots=['r0c1', 'r0c2']"),
        (["--controllers", "static", "policy:POLICY", "--host_preset", "impaired",
          "--slots", "r0c1", "r0c2"], "was trained with host_preset='baseline'; the comparison "
                                      "uses host_preset='impaired'; --transfer_policies lets it "
                                      "play another host of the same task"),
        (["--controllers", "static", "policy:POLICY", "--task", "lm", "--slots", "r0c0", "r0c1",
          "--data-dir", "TEXT"],  # the text is there: the command checks it before the policy
         "was trained with task='cifar'; the comparison uses task='lm'"),
        (["--controllers", "static", "grower:lora"],
         "grower: blueprint 'lora' does not exist for topology 'cnn'; accepted: norm, attention"),
    ],
)
def test_cli_errors_are_one_line_and_leave_out_untouched(trained_policy, tmp_path, extra,
                                                         message, capsys):
    data, policy = trained_policy
    unreadable = tmp_path / "bad.pt"
    unreadable.write_text("not a checkpoint")
    out = tmp_path / "out"
    out.mkdir()
    (out / "episodes.csv").write_text("keep me\n")
    text = tmp_path / "plays.txt"
    text.write_text("To be, or not to be, that is the question. " * 200)
    extra = [a.replace("POLICY", str(policy)).replace("UNREADABLE", str(unreadable))
             .replace("TEXT", str(text)) for a in extra]
    line = cli_error_line(capsys, "--preset", "smoke", "--data-dir", str(data), "--out",
                          str(out), *extra)
    assert message in line
    assert (out / "episodes.csv").read_text() == "keep me\n"


@pytest.mark.parametrize("case", ["no settings", "retrained policy", "moved policy",
                                  "cut table"])
def test_cli_refuses_to_mix_results_in_one_line(trained_policy, played, case, capsys):
    data, _ = trained_policy
    policy, out = played / "ckpt.pt", played / "out"
    controllers = ("static", f"policy:{policy}")
    if case == "no settings":
        (out / "compare_config.json").unlink()
        message = "holds episodes.csv but no compare_config.json"
    elif case == "retrained policy":
        retrain(policy)
        message = f"policy:{policy} is not the controller that played its 1 episodes"
    elif case == "moved policy":  # the same file content, played from elsewhere then
        played = json.loads((out / "controllers.json").read_text())
        played[f"policy:{policy}"]["path"] = "/elsewhere/ckpt.pt"
        (out / "controllers.json").write_text(json.dumps(played))
        message = f"(file /elsewhere/ckpt.pt then, {policy.resolve()} now)"
    else:  # a copy cut short in the middle of its last row
        table = (out / "episodes.csv").read_bytes()
        (out / "episodes.csv").write_bytes(table[:len(table) - 40])
        message = "malformed records file"
    before = checksums(out)
    line = cli_error_line(capsys, "--preset", "smoke", "--data-dir", str(data), "--out",
                          str(out), "--seeds", "1", "--controllers", *controllers)
    assert message in line
    assert checksums(out) == before


def test_policy_controllers_play_in_the_comparison(trained_policy, tmp_path):
    data, policy = trained_policy
    config = CompareConfig(data_dir=str(data), out=str(tmp_path / "out"), episode_length=3,
                           slots=("r0c1", "r0c2"), batch_size=16, seeds=1, envs=2,
                           progress=False, controllers=("static", f"policy:{policy}"))
    records = Comparison(config).run()
    assert {r.controller for r in records} == {"static", f"policy:{policy}"}


def test_a_policy_trained_with_a_subset_plays_only_where_the_comparison_allows_one(
    trained_policy, tmp_path,
):
    data, trained = trained_policy
    state = read_checkpoint(trained)
    path = tmp_path / "subset.pt"
    write_checkpoint({**state, "allowed_blueprints": ["norm"]}, path)
    config = CompareConfig(data_dir=str(data), slots=("r0c1", "r0c2"),
                           controllers=(f"policy:{path}",), reference=f"policy:{path}")
    assert check_policy(str(path), config).allowed_blueprints == ("norm",)
    with pytest.raises(ConfigError, match=rf"policy '{re.escape(str(path))}' was trained to "
                       r"germinate only norm; the comparison allows none of them \(attention\)"):
        check_policy(str(path), dataclasses.replace(config, blueprints=("attention",)))
    with pytest.raises(ConfigError, match="unknown blueprint 'bogus' for the slots of task "
                       "'cifar'; accepted: norm, "):
        check_policy(str(path), dataclasses.replace(config, blueprints=("bogus",)))


def test_a_policy_transfers_to_another_host_only_when_asked(trained_policy, tmp_path, caplog):
    data, policy = trained_policy  # trained on the baseline host
    config = CompareConfig(data_dir=str(data), out=str(tmp_path / "out"), episode_length=3,
                           slots=("r0c1", "r0c2"), batch_size=16, seeds=1, envs=1,
                           progress=False, controllers=(f"policy:{policy}",),
                           reference=f"policy:{policy}", host_preset="impaired")
    with pytest.raises(ConfigError, match=r"host_preset='baseline'.*--transfer_policies"):
        Comparison(config)
    with caplog.at_level(logging.INFO, logger="esper_lightning"):
        records = Comparison(dataclasses.replace(config, transfer_policies=True)).run()
    assert [r.host for r in records] == ["impaired"]
    assert "plays host_preset='impaired': transfer" in caplog.text


def test_grower_controller_grows_and_fossilizes():
    controller = GrowerController("norm")
    plan = EpisodePlan("grower:norm", 0, 1)
    env = _ScriptedEnv(("r0c1",), 13, RewardConfig())  # 12 decisions
    observation = env.reset(plan.rng_seed)
    for _ in range(12):
        observation = env.step(controller.decide(observation.report)).observation
    assert env.engine.event_counts()["fossilized"] == 1


def test_blend_gradient_reaches_every_env_and_is_part_of_the_task():
    from esper_lightning.app.config import PPORunConfig, compatibility_errors
    from esper_lightning.app.task import env_spec

    assert env_spec(CompareConfig(blend_gradient="detached")).seeding.blend_gradient == "detached"
    assert env_spec(CompareConfig()).seeding.blend_gradient is None  # the slots': "through"
    saved = {k: v for k, v in PPORunConfig().to_dict().items() if k != "blend_gradient"}
    assert compatibility_errors(saved, PPORunConfig()) == []  # saved before the key existed
    assert compatibility_errors({**saved, "blend_gradient": "detached"}, PPORunConfig()) == [
        "blend_gradient='detached' (now None)"]
    with pytest.raises(ConfigError, match="unknown blend_gradient 'sideways'; accepted: "
                       "detached, through"):
        CompareConfig(blend_gradient="sideways")
