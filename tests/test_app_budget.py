"""Compute budgets and schedules in the configuration and on the command line: what is
accepted, what contradicts a budget, one-line refusals (exit status 2), and the budget in
FLOPs the envs get."""

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import as_a_process

from esper_lightning.app.cli import main, parse_config
from esper_lightning.app.config import (
    CompareConfig,
    ConfigError,
    PPORunConfig,
    TaskConfig,
    compatibility_errors,
    load_config,
)
from esper_lightning.app.task import budget_flops, env_spec, make_task, static_step_flops

ROOT = Path(__file__).resolve().parents[1]
LM = {"task": "lm", "host_preset": "w32l1", "slots": ["r0c0"], "block_size": 16,
      "batch_size": 8, "episode_length": 4}


@pytest.mark.parametrize(("values", "message"), [
    ({"budget_flops": -1.0}, "budget_flops must be a number > 0 (FLOPs) or null, got -1.0"),
    ({"budget_flops": float("nan")}, "budget_flops must be a number > 0 (FLOPs) or null"),
    ({"budget_flops": "lots"}, "budget_flops must be a float, got 'lots'"),
    ({"budget_steps": 0}, "budget_steps must be an int >= 1 or null, got 0"),
    ({"budget_flops": 1e9, "budget_steps": 5}, None),
    ({**LM, "budget_steps": 40, "train_subset": 64}, "train_subset=64 sets the training blocks "
     "of an epoch, which a budget sets"),
    ({"lr_schedule": "step"}, "unknown lr_schedule 'step'"),
    ({"lr_schedule": "wsd", "warmup_fraction": 0.5, "decay_fraction": 0.6},
     "warmup_fraction=0.5 + decay_fraction=0.6 exceed the whole run"),
    ({"min_lr_ratio": 0.1}, "min_lr_ratio=0.1 has no effect with lr_schedule 'constant'"),
    ({"budget_flops": 1e12, "budget_scales": []}, "budget_scales is empty; accepted: distinct "
     "numbers > 0, multiples of the base budget, e.g. 0.5 1 2, or null for one budget"),
    ({"budget_flops": 1e12, "budget_scales": [1, 0]}, "budget_scales=[1.0, 0.0] holds 0.0; "
     "accepted: distinct numbers > 0"),
    ({"budget_flops": 1e12, "budget_scales": [2, -1]}, "budget_scales=[2.0, -1.0] holds -1.0"),
    ({"budget_flops": 1e12, "budget_scales": [1, float("inf")]}, "holds inf; accepted"),
    ({"budget_flops": 1e12, "budget_scales": [1, 1.0]}, "budget_scales=[1.0, 1.0] holds a "
     "scale twice; accepted: distinct numbers > 0"),
    ({"budget_flops": 1e12, "budget_scales": ["big"]}, "budget_scales must be a list of "
     "numbers, got ['big']"),
    ({"budget_flops": 1e12, "budget_scales": 2}, "budget_scales must be a list of numbers, "
     "got 2"),
    ({"budget_scales": [0.5, 2]}, "budget_scales=[0.5, 2.0] scale a budget, and none is set; "
     "accepted: budget_flops or budget_steps with them, or budget_scales null"),
    ({"budget_flops": 1e12, "budget_range": [4, 0.25]}, "budget_range=[4.0, 0.25] is not a "
     "range; accepted: LOW HIGH with 0 < LOW < HIGH, multiples of the base budget, e.g. 0.25 4"),
    ({"budget_flops": 1e12, "budget_range": [0.25]}, "budget_range=[0.25] is not a range"),
    ({"budget_flops": 1e12, "budget_range": [0, 4]}, "budget_range=[0.0, 4.0] is not a range"),
    ({"budget_range": [0.25, 4]}, "budget_range=[0.25, 4.0] scales a budget, and none is set; "
     "accepted: budget_flops or budget_steps with it, or budget_range null"),
])
def test_bad_budgets_and_schedules_are_one_line(values, message):
    if message is None:  # both in the same layer: refused (a layer cannot mean both)
        with pytest.raises(ConfigError, match="are both set; accepted: one of them"):
            CompareConfig(**values)
        return
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, overrides=values, cls=CompareConfig)


def test_a_later_layer_replaces_the_budget_of_an_earlier_one():
    preset = load_config("lm-grow", cls=CompareConfig)
    assert preset.budget_flops == 6000 * 402_653_184 and preset.budget_steps is None
    steps = preset.replace(budget_steps=40)
    assert (steps.budget_flops, steps.budget_steps) == (None, 40)
    assert steps.replace(budget_flops=1e12).budget_steps is None
    on_the_command_line = parse_config("compare", ["--preset", "lm-grow", "--budget_steps", "40"])
    assert (on_the_command_line.budget_flops, on_the_command_line.budget_steps) == (None, 40)


def test_the_growth_presets_budgets_are_steps_of_their_grown_host():
    """The presets write their budgets in FLOPs of the grown host's step (the unit their
    pilots sized them in): if the FLOP count of a step changes, so must they."""
    for preset, grown, steps in (("lm-grow", "w32l4", 6000), ("lm-grow-cpu", "w32l2", 2000),
                                 ("lm-grow124-cpu", "w32l4", 1500)):
        config = load_config(preset, cls=PPORunConfig)
        grown_step = static_step_flops(config.replace(host_preset=grown, slots=("r0c0",)))
        assert config.budget_flops == steps * grown_step, preset
    timing = load_config("lm-grow-cpu", cls=CompareConfig)
    assert timing.budget_scales == (0.5, 1.0, 2.0) and timing.outcome == "bits"
    assert budget_flops(timing) == 2000 * 226_492_416  # the smallest scale still fits


def test_a_budget_and_schedule_shape_the_task_a_checkpoint_resumes():
    saved = PPORunConfig().to_dict()
    for key in ("budget_flops", "budget_steps", "lr_schedule"):
        del saved[key]  # a checkpoint written before budgets existed
    assert compatibility_errors(saved, PPORunConfig()) == []
    budgeted = PPORunConfig(budget_steps=100)
    assert compatibility_errors(saved, budgeted) == ["budget_steps=None (now 100)"]


def test_budget_scales_are_a_sorted_set_the_envs_get_and_a_checkpoint_resumes():
    config = load_config(None, overrides={"budget_steps": 40, "budget_scales": [2, 0.5, 1]},
                         cls=PPORunConfig)
    assert config.budget_scales == (0.5, 1.0, 2.0) and config.to_dict()["budget_scales"] == [
        0.5, 1.0, 2.0]
    assert load_config(None, overrides={"budget_scales": None}, cls=CompareConfig
                       ).budget_scales is None
    before = PPORunConfig(budget_steps=40).to_dict()
    del before["budget_scales"]  # a checkpoint written before budget scales existed
    assert compatibility_errors(before, PPORunConfig(budget_steps=40)) == []
    assert compatibility_errors(before, config) == ["budget_scales=None (now [0.5, 1.0, 2.0])"]
    spec = env_spec(CompareConfig(**LM, budget_steps=40, budget_scales=(1.0, 0.5)))
    assert spec.budget_scales == (0.5, 1.0)
    assert spec.budget_flops == 40 * static_step_flops(CompareConfig(**LM))


def test_a_budget_range_replaces_budget_scales_trains_and_is_refused_by_compare():
    """A layer that sets budget_range clears the preset's budget_scales (one says how an
    episode draws its budget); the envs get the range; a checkpoint remembers it; compare,
    which groups episodes by budget, refuses it in one line naming what it accepts."""
    config = parse_config("ppo", ["--preset", "lm-grow-cpu", "--budget_range", "0.25", "4"])
    assert config.budget_range == (0.25, 4.0) and config.budget_scales is None
    both = {"budget_steps": 40, "budget_scales": [1.0], "budget_range": [0.5, 2.0]}
    with pytest.raises(ConfigError, match="are both set; accepted: one of them"):
        CompareConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in both.items()})
    ranged = PPORunConfig(**LM, budget_steps=40, budget_range=(0.5, 2.0))
    assert env_spec(ranged).budget_range == (0.5, 2.0)
    before = ranged.to_dict()
    del before["budget_range"]  # a checkpoint written before budget ranges existed
    assert compatibility_errors(before, ranged) == ["budget_range=None (now [0.5, 2.0])"]
    with pytest.raises(ConfigError, match=re.escape(
            "budget_range=[0.5, 2.0] gives every episode a budget of its own, and compare groups "
            "episodes by budget; accepted: budget_scales, the budgets to compare at")):
        CompareConfig(**LM, budget_steps=40, budget_range=(0.5, 2.0))


def test_the_smallest_drawable_budget_must_still_give_every_epoch_a_batch():
    config = PPORunConfig(**LM, budget_steps=6, budget_range=(0.5, 2.0))  # 4 epochs
    with pytest.raises(ConfigError, match=re.escape("budget_steps=6 at its smallest scale 0.5 "
                                                    "gives each of the episode's 4 epochs")):
        budget_flops(config)
    assert budget_flops(config.replace(budget_steps=8)) == 8 * static_step_flops(config)


def test_the_smallest_scale_must_still_give_every_epoch_a_batch():
    config = CompareConfig(**LM, budget_steps=6, budget_scales=(0.5, 2.0))  # 4 epochs
    step = static_step_flops(config)
    message = (f"budget_steps=6 at its smallest scale 0.5 gives each of the episode's 4 epochs "
               f"less than one training batch of the static host ({step:,} FLOPs); accepted: at "
               f"least {8 * step} FLOPs (budget_steps >= 8)")
    with pytest.raises(ConfigError, match=re.escape(message)):
        budget_flops(config)
    assert budget_flops(config.replace(budget_steps=8)) == 8 * step  # the least


def test_budget_steps_are_steps_of_the_static_host():
    config = CompareConfig(**LM, budget_steps=40)
    step = static_step_flops(config)
    assert budget_flops(config) == 40 * step
    spec = env_spec(config.replace(lr_schedule="wsd", warmup_fraction=0.05))
    assert spec.budget_flops == 40 * step and spec.lr_schedule.multiplier(1.0) == 0.0
    assert budget_flops(CompareConfig(**LM)) is None
    assert budget_flops(CompareConfig(**LM, budget_flops=1e12)) == 1e12


def test_a_budget_below_one_batch_per_epoch_is_refused_with_the_smallest_accepted():
    config = CompareConfig(**LM, budget_steps=3)  # 4 epochs
    step = static_step_flops(config)
    message = (f"budget_steps=3 gives each of the episode's 4 epochs less than one training "
               f"batch of the static host ({step:,} FLOPs); accepted: at least {4 * step} FLOPs "
               f"(budget_steps >= 4)")
    with pytest.raises(ConfigError, match=re.escape(message)):
        budget_flops(config)
    assert budget_flops(config.replace(budget_flops=4.0 * step)) == 4 * step  # the least


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "esper_lightning.app.cli", *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.fixture
def run_main() -> Callable[..., tuple[int, str]]:
    """``esper-lightning ARGS`` in process (`cli.main`), as a process of its own would run it
    (`helpers.as_a_process`: its warnings on stderr, the package's logger put back): its status
    and what it wrote on stderr."""
    def run(*args: str) -> tuple[int, str]:
        done = as_a_process(main, args)
        return done.returncode, done.stderr

    return run


def test_cli_refuses_a_bad_budget_in_one_line_seen_from_outside(tmp_path):
    # What the user sees from outside: the command's exit status and its only line, nothing
    # on stdout (the cases below run the same `main` in process, without a launch each).
    out = tmp_path / "out"
    result = cli("compare", "--controllers", "static", "--out", str(out), "--budget_flops", "-5")
    assert result.returncode == 2, result.stderr
    assert result.stderr == ("esper-lightning compare: error: budget_flops must be a number > 0 "
                             "(FLOPs) or null, got -5.0\n") and result.stdout == ""
    assert not out.exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--budget_flops", "abc"], "budget_flops must be a float or null, got 'abc'"),
    (["--budget_flops", "-5"], "budget_flops must be a number > 0 (FLOPs) or null, got -5.0"),
    (["--lr_schedule", "wsd", "--decay_fraction", "0"],
     "decay_fraction must be in (0, 1] or null, got 0.0"),
    (["--tune_lr", "fast"], "tune_lr must be a float, got 'fast'"),
    (["--arm_lr", "static"], "bad arm_lr 'static'; accepted: NAME=LR with LR > 0"),
    (["--budget_flops", "1e12", "--budget_scales", "0.5", "x"],
     "budget_scales must be a list of floats or null, got 'x'"),
    (["--budget_flops", "1e12", "--budget_scales", "0", "1"],
     "budget_scales=[0.0, 1.0] holds 0.0; accepted: distinct numbers > 0, multiples of the "
     "base budget, e.g. 0.5 1 2"),
    (["--budget_flops", "1e12", "--budget_scales"], "budget_scales is empty; accepted:"),
    (["--budget_scales", "0.5", "2"], "budget_scales=[0.5, 2.0] scale a budget, and none is "
     "set; accepted: budget_flops or budget_steps with them"),
])
def test_cli_refuses_bad_budgets_in_one_line_with_status_2(args, message, tmp_path, run_main):
    out = tmp_path / "out"
    status, err = run_main("compare", "--controllers", "static", "--out", str(out), *args)
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err
    assert not out.exists()


def test_cli_refuses_a_budget_smaller_than_an_epoch_before_writing(text_file, tmp_path,
                                                                   run_main):
    out = tmp_path / "out"
    status, err = run_main("compare", "--controllers", "static", "--task", "lm", "--host_preset",
                           "w32l1", "--slots", "r0c0", "--batch_size", "8", "--block_size", "16",
                           "--episode_length", "4", "--budget_steps", "2", "--data_dir",
                           str(text_file), "--out", str(out), "--no-progress")
    assert status == 2, err
    assert "budget_steps=2 gives each of the episode's 4 epochs less than one" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_make_task_refuses_a_task_it_does_not_know():
    class Stray:  # a config whose task name passed a check that make_task does not share
        task = "audio"

    with pytest.raises(ValueError, match="unknown task 'audio'; accepted: cifar, lm"):
        make_task(Stray())  # type: ignore[arg-type]


def test_make_task_builds_the_class_registered_under_the_name():
    import dataclasses

    from esper_lightning.envs import register_task, tasks, unregister_task

    class ShortText(tasks.TextTask):  # a task registered under its own name
        spec = dataclasses.replace(tasks.TextTask.spec, name="short")

    register_task(ShortText.spec, ShortText)
    try:
        config = TaskConfig(task="short", host_preset="grow4", slots=("r1c0",), batch_size=8,
                            train_subset=8, val_subset=4)
        played = make_task(config)
        assert make_task(config.replace(block_size=16)).block_size == 16
    finally:
        unregister_task("short")
    assert type(played) is ShortText
    assert (played.block_size, played.train_blocks, played.val_blocks) == (32, 8, 4)
