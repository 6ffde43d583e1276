"""scripts/controller_targets.py: the study's targets read off real comparison reports.

The stage folders are written by `compare`'s own report (`Comparison.report`) from seeded
synthetic episodes, so the script reads the files `compare` writes, not a copy of their shape.
Stack arms stand in for the policies (a group is any arms) and ``static`` for the lookup.
"""

from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import script_module

from esper_lightning.app.compare.records import EpisodeRecord, append_record_csv
from esper_lightning.app.config import CompareConfig
from esper_lightning.app.task import budget_flops

REFERENCE = "static"
TIMING = ("stack:2@0.2:identity", "stack:2@0.4:identity", "stack:2@0.6:identity")
ALL = ("stack:2@0.3:identity", "stack:2@0.5:identity", "stack:2@0.7:identity")
#: Each arm's offset from the reference (bits): the timing seeds agree (-0.011 to -0.009).
OFFSETS = {REFERENCE: 0.0, TIMING[0]: -0.011, TIMING[1]: -0.010, TIMING[2]: -0.009,
           ALL[0]: -0.012, ALL[1]: -0.009, ALL[2]: -0.010}
SCALES = (0.5, 2.0)
#: Epochs of a synthetic episode: a stack arm germinates at its TAU of them.
EPOCHS = 10


@pytest.fixture(scope="module")
def ct():
    with script_module("controller_targets") as module:
        yield module


def _config(text_file: Path, out: Path, arms: dict[str, float], **budget: float
            ) -> CompareConfig:
    groups = [f"timing={','.join(TIMING)}"]
    if ALL[0] in arms:
        groups.append(f"all={','.join(ALL)}")
    return CompareConfig(task="lm", host_preset="grow2", slots=("r1c0",), **budget or
                         {"budget_steps": 40}, budget_scales=SCALES, controllers=tuple(arms),
                         data_dir=str(text_file), arm_groups=tuple(groups),
                         group_pairs=("all=timing",) if ALL[0] in arms else (), out=str(out),
                         progress=False)


#: What each arm germinates at its TAU (block_identity where not named): the second
#: nine-blueprint seed germinates a LoRA, which is no growth.
GERMINATES = {ALL[1]: "lora"}


def _curves(arm: str, budget: float, named: bool) -> dict[str, Any]:
    """Per-epoch curves of an episode in which a stack arm germinates at its TAU, static never
    (``named`` False: without ``germinated_seeds``, as written before it was recorded)."""
    rise = round(float(arm.split("@")[1].split(":")[0]) * EPOCHS) if "@" in arm else EPOCHS
    seeds = (("r1c0", GERMINATES.get(arm, "block_identity")),) if rise < EPOCHS else ()
    return {"accuracy_curve": (50.0,) * EPOCHS,
            "germinated_curve": tuple(0.0 if t < rise else 1.0 for t in range(EPOCHS)),
            "train_flops_curve": tuple(budget * (t + 1) / EPOCHS for t in range(EPOCHS)),
            "germinated_seeds": seeds if named else None}


def _stage(root: Path, stage: str, text_file: Path, arms: dict[str, float], n: int = 12,
           curves: bool = True, named: bool = True, **budget: float) -> list[EpisodeRecord]:
    """A stage folder as `compare` leaves it: settings, episodes and its report (``curves``
    False: episodes without a germination curve, as written before it was recorded;
    ``named`` False: without the seeds germinated)."""
    from esper_lightning.app.compare import runner

    config = _config(text_file, root / stage, arms, **budget)
    base = float(budget_flops(config))
    rng = np.random.default_rng(11)
    records = []
    for i in range(n):
        shared = rng.normal(2.5, 0.1)
        for arm, offset in arms.items():
            bits = shared + offset * (1 + i % 2) + rng.normal(0.0, 0.001)
            budget = base * SCALES[i % 2]
            records.append(EpisodeRecord(arm, i, 100 + i, "grow2", {
                "outcome": 50.0, "final_accuracy": 50.0, "seed_params": 0,
                "total_params": 1000, "seeds_germinated": 0, "seeds_fossilized": 0,
                "seeds_pruned": 0, "wall_seconds": 1.0, "final_bits": bits, "test_bits": bits,
                "budget_flops": budget,
                **(_curves(arm, budget, named) if curves else {"accuracy_curve": (50.0,)})}))
    comparison = runner.Comparison(config)
    comparison._write_config()
    for record in records:
        append_record_csv(comparison.episodes_csv, record)
    comparison.report(records)
    return records


#: Each stage `stage` built: its arguments, the folder it was built in and its records.
Built = dict[Any, tuple[Path, list[EpisodeRecord]]]


@pytest.fixture(scope="module")
def _built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Built]:
    """Where `stage` keeps each stage it built (a folder per argument set, for the module)."""
    return tmp_path_factory.mktemp("stages"), {}


@pytest.fixture
def stage(quiet, text_file: Path, _built: tuple[Path, Built]
          ) -> Callable[..., list[EpisodeRecord]]:
    """`_stage` without its text argument: a stage built with the same arguments before in
    this module is copied, not reported again (`Comparison.report` is most of a test, and
    several tests read the same stage). The copy is the test's own, to change as it likes; its
    records are a fresh build's (`_stage` is seeded), and only its settings' ``out`` and
    ``data_dir`` name the folder and text it was first built with, which no reader uses."""
    built, records = _built

    def play(root: Path, name: str, arms: dict[str, float], n: int = 12, curves: bool = True,
             named: bool = True, **budget: float) -> list[EpisodeRecord]:
        key = (name, tuple(arms.items()), n, curves, named, tuple(sorted(budget.items())))
        if key not in records:
            master = built / str(len(records))
            records[key] = master, _stage(master, name, text_file, arms, n, curves, named,
                                          **budget)
        master, played = records[key]
        shutil.copytree(master / name, root / name)
        return list(played)

    return play


@pytest.fixture
def quiet(monkeypatch):
    from esper_lightning.app import task
    from esper_lightning.app.compare import runner

    monkeypatch.setattr(runner.plots, "save_figures", lambda *args, **kwargs: None)
    monkeypatch.setattr(runner.plots, "save_figure", lambda *args, **kwargs: None)
    for figure in ("regret_figure", "growth_figure"):  # drawn only for save_figure
        monkeypatch.setattr(runner.plots, figure, lambda *args, **kwargs: None)
    monkeypatch.setattr(runner, "_log_tensorboard", lambda *args, **kwargs: None)
    # A stage's budget is measured once per test, not again by each reader of the stage (the
    # measurement builds the host and counts a step on meta tensors: a fifth of a test here).
    monkeypatch.setattr(task, "static_step_flops", functools.cache(task.static_step_flops))


def _row(lines: list[str], start: str) -> list[str]:
    (line,) = [x for x in lines if x.startswith(start)]
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_each_unseen_setting_gets_compares_own_group_verdict(ct, quiet, stage, tmp_path):
    stage(tmp_path, "final-budgets", {k: OFFSETS[k] for k in (REFERENCE, *TIMING)})
    lines = ct.targets(tmp_path)
    summary = json.loads((tmp_path / "final-budgets" / "summary.json").read_text())
    (group,) = [g for g in summary["groups"] if g["group"] == "timing"]
    row = _row(lines, "| timing − static | budgets")
    assert row[2] == f"{group['difference']:+.4f}" and group["difference"] < -0.01
    assert row[3] == f"[{group['seed_ci'][0]:+.4f}, {group['seed_ci'][1]:+.4f}]"
    assert row[4] == f"[{group['ci'][0]:+.4f}, {group['ci'][1]:+.4f}]" and row[5] == "12"
    seeds = [f"{group['member_means'][a]:+.4f}" for a in TIMING]
    assert row[6] == f"{', '.join(seeds)} (SD {group['spread']:.4f})"
    assert row[7] == "better: **met**"
    assert _row(lines, "| timing − lookup | text")[2] == "not played yet"
    assert _row(lines, "| regret")[2] == "not played yet"
    assert _row(lines, "| all − timing")[2] == (
        "the nine-blueprint policies have not joined final-budgets")
    assert any(line.startswith("The nine-blueprint group `all` has not joined") for line in lines)


def test_a_setting_whose_seeds_disagree_does_not_meet_the_target(ct, quiet, stage,
                                                                 tmp_path):
    split = {REFERENCE: 0.0, TIMING[0]: -0.03, TIMING[1]: 0.0, TIMING[2]: 0.01}
    stage(tmp_path, "final-host", split)
    row = _row(ct.targets(tmp_path), "| timing − static | host")
    assert row[7].startswith("no detectable difference at 12 episodes") and row[7].endswith(
        ": not met")


def test_per_budget_rows_are_the_members_mean_difference_on_that_budgets_episodes(
        ct, quiet, stage, tmp_path):
    # As final-host: a base budget given in FLOPs, which each scale multiplies.
    arms = {k: OFFSETS[k] for k in (REFERENCE, *TIMING)}
    records = stage(tmp_path, "final-host", arms, budget_flops=3e10)
    lines = ct.targets(tmp_path)
    lines = lines[:[x.startswith("When they grew") for x in lines].index(True)]  # per budget
    bits = {(r.controller, r.episode_index): r["test_bits"] for r in records}
    for k, scale in enumerate(SCALES):
        episodes = range(k, 12, 2)
        expected = np.mean([np.mean([bits[(a, i)] for a in TIMING]) - bits[(REFERENCE, i)]
                            for i in episodes])
        row = _row(lines, f"| host (width 64) | {scale:g} |")
        assert row[2:5] == ["timing − lookup", "6", f"{expected:+.4f}"]
        seeds = [np.mean([bits[(a, i)] - bits[(REFERENCE, i)] for i in episodes])
                 for a in TIMING]
        assert row[6] == ", ".join(f"{s:+.4f}" for s in seeds)


def test_growth_rows_say_when_the_lookup_and_each_seed_grew(ct, quiet, stage, tmp_path):
    stage(tmp_path, "final-text", {k: OFFSETS[k] for k in (REFERENCE, *TIMING)})
    lines = ct.targets(tmp_path)
    start = lines.index("| setting | budget (× base) | lookup | timing seed 1 | timing seed 2 "
                        "| timing seed 3 |")
    for scale in SCALES:
        row = _row(lines[start:], f"| text (Python stdlib) | {scale:g} |")
        assert row[2:] == ["—, — (0 of 6 grew)", "0.20, — (6 of 6 grew)",
                           "0.40, — (6 of 6 grew)", "0.60, — (6 of 6 grew)"]


def test_the_nine_blueprint_seeds_get_their_growth_germinations_and_budget_rows(
        ct, quiet, stage, tmp_path):
    """Where the group `all` played (final-budgets), its seeds get growth columns (a LoRA is
    no growth), a germination table and per-budget rows against the lookup and the timing
    seeds; a stage it did not play says so in its columns."""
    records = stage(tmp_path, "final-budgets", OFFSETS)
    stage(tmp_path, "final-text", {k: OFFSETS[k] for k in (REFERENCE, *TIMING)})
    lines = ct.targets(tmp_path)
    start = lines.index("| setting | budget (× base) | lookup | timing seed 1 | timing seed 2 "
                        "| timing seed 3 | all seed 1 | all seed 2 | all seed 3 |")
    row = _row(lines[start:], "| budgets 0.35–2.8× | 0.5 |")
    assert row[6:] == ["0.30, — (6 of 6 grew)", "—, — (0 of 6 grew)", "0.70, — (6 of 6 grew)"]
    assert _row(lines[start:], "| text (Python stdlib) | 2 |")[6:] == ["not played"] * 3
    assert _row(lines, "| all seed 2 | 12 |") == ["all seed 2", "12", "12", "0", "0%", "lora 12"]
    assert _row(lines, "| all seed 1 | 12 |")[2:] == ["12", "12", "100%", "block_identity 12"]
    bits = {(r.controller, r.episode_index): r["test_bits"] for r in records}
    pair = np.mean([np.mean([bits[(a, i)] - bits[(t, i)] for a, t in zip(ALL, TIMING, strict=True)])
                    for i in range(0, 12, 2)])
    assert _row(lines, "| budgets 0.35–2.8× | 0.5 | all − timing |")[4] == f"{pair:+.4f}"
    assert _row(lines, "| budgets 0.35–2.8× | 2 | all − lookup |")[3] == "6"


def test_the_tables_read_while_the_nine_blueprint_seeds_play(ct, quiet, stage, tmp_path):
    """From its first episode the settings name the group `all`, from its last the report:
    in between the tables are those before it joined, not an error."""
    stage(tmp_path, "final-budgets", {k: OFFSETS[k] for k in (REFERENCE, *TIMING)})
    before = ct.targets(tmp_path)
    settings = tmp_path / "final-budgets" / "compare_config.json"
    config = json.loads(settings.read_text())
    config["controllers"] += list(ALL)
    config["arm_groups"] += [f"all={','.join(ALL)}"]
    config["group_pairs"] = ["all=timing"]
    settings.write_text(json.dumps(config))
    assert ct.targets(tmp_path) == before
    assert _row(before, "| all − timing")[2] == (
        "the nine-blueprint policies have not joined final-budgets")
    assert not any(x.startswith("| all seed") or "| all − lookup |" in x for x in before)


def test_growth_columns_counted_from_every_germination_are_marked(ct, quiet, stage,
                                                                  tmp_path):
    records = stage(tmp_path, "final-text",
                     {k: OFFSETS[k] for k in (REFERENCE, *TIMING)}, named=False)
    lines = ct.targets(tmp_path)

    def ending(blueprint):  # each episode's seeds at the end: the one it germinated, kept
        return [EpisodeRecord(r.controller, r.episode_index, r.episode_rng_seed, r.host, {
            **r.values, "final_seeds": (("r1c0", blueprint),) * round(
                r["germinated_curve"][-1])}) for r in records]

    assert ct._all_growth(ending("block_identity")) and not ct._all_growth(ending("lora"))
    assert not ct._all_growth(records)  # seeds at the end not recorded
    assert "| setting | budget (× base) | lookup † | timing seed 1 † | timing seed 2 † | " \
           "timing seed 3 † |" in lines
    (note,) = [x for x in lines if "† marks arms whose episodes were written before" in x]
    assert note.endswith("there every germination counts.")  # no final seeds tell more


def test_growth_rows_say_what_they_cannot_show(ct, quiet, stage, tmp_path):
    arms = {k: OFFSETS[k] for k in (REFERENCE, *TIMING)}
    stage(tmp_path, "final-host", arms, curves=False)
    assert "| host (width 64) | — | not recorded (final-host's episodes predate " \
           "germinated_curve) |" in ct.targets(tmp_path)
    # A timing group of two in one stage and of three in another: no table of one width.
    stage(tmp_path, "final-text", arms)
    summary = json.loads((tmp_path / "final-text" / "summary.json").read_text())
    config = json.loads((tmp_path / "final-host" / "compare_config.json").read_text())
    config["arm_groups"] = [f"timing={TIMING[0]},{TIMING[1]}"]
    (tmp_path / "final-host" / "compare_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="the stages' timing groups differ in size"):
        ct.growth_lines(tmp_path)
    assert summary["growth"][0]["controller"] == REFERENCE


def test_growth_rows_refuse_an_arm_missing_at_a_budget(ct, quiet, stage, tmp_path):
    records = stage(tmp_path, "final-text", {k: OFFSETS[k] for k in
                                                          (REFERENCE, *TIMING)})
    from esper_lightning.app.compare.records import append_record_csv

    csv = tmp_path / "final-text" / "episodes.csv"
    csv.unlink()
    for r in records:  # the third seed never played the 2x episodes
        if not (r.controller == TIMING[2] and r.episode_index % 2):
            append_record_csv(csv, r)
    with pytest.raises(ValueError, match=r"final-text: stack:2@0\.6:identity played no "
                                         r"episode at budget"):
        ct.growth_lines(tmp_path)


@pytest.mark.parametrize(("lookup", "target"), [
    (0.0, "**met**"),  # regrets 0.0163 (lookup) and 0.0011 (timing)
    (-0.0105, "not met"),  # about 0.0005 and 0.0011
    (-0.02, "cannot be met: the lookup's regret is not above 0"),  # the oracle never grows
])
def test_regret_is_met_only_at_half_the_lookups_or_less(ct, quiet, stage, tmp_path, lookup,
                                                        target):
    # The oracle's grid is the stack arms with static as "never"; static plays the lookup.
    arms = {REFERENCE: lookup, **{k: OFFSETS[k] for k in TIMING}}
    stage(tmp_path, "final-oracle", arms)
    summary = json.loads((tmp_path / "final-oracle" / "summary.json").read_text())
    rows = {r["controller"]: r for r in summary["regret"][0]["controllers"]}
    row = _row(ct.targets(tmp_path), "| regret")
    assert row[2] == (f"timing {rows['timing']['regret_mean']:+.4f}, "
                      f"lookup {rows[REFERENCE]['regret_mean']:+.4f}")
    assert row[5] == "12" and row[7] == target


def test_replay_check_compares_the_oracles_episodes_with_final_budgets_bit_for_bit(
        ct, quiet, stage, tmp_path):
    arms = {k: OFFSETS[k] for k in (REFERENCE, *TIMING)}
    stage(tmp_path, "final-budgets", arms, n=6)
    assert not any(line.startswith("Replay check") for line in ct.targets(tmp_path))
    oracle = stage(tmp_path, "final-oracle", arms, n=8)  # one generator: the
    csv = tmp_path / "final-oracle" / "episodes.csv"  # same first 6 episodes, and 2 more
    for r in oracle:  # and an arm final-budgets does not play, which is not compared
        append_record_csv(csv, EpisodeRecord("stack:2@0.8:identity", r.episode_index,
                                             r.episode_rng_seed, r.host, r.values))
    (line,) = [x for x in ct.targets(tmp_path) if x.startswith("Replay check")]
    assert line == ("Replay check: final-oracle's 24 rows of arms final-budgets has played "
                    "(4 arms) equal final-budgets' on the same episodes (episode seed, test and "
                    "validation bits, exactly); 8 more not played in final-budgets yet.")
    csv.unlink()
    for r in oracle:  # one row of the first seed is off by 1e-9 bits
        if r.controller == TIMING[0] and r.episode_index == 3:
            r = EpisodeRecord(r.controller, 3, r.episode_rng_seed, r.host,
                              {**r.values, "test_bits": r["test_bits"] + 1e-9})
        append_record_csv(csv, r)
    (line,) = [x for x in ct.targets(tmp_path) if x.startswith("Replay check")]
    assert "differ from final-budgets' in 1 of 24 (largest |Δ test bits| 1e-09: " \
           f"{TIMING[0]}, episode 3)" in line


def test_replay_reproduces_a_stage_from_a_rerun_of_its_first_episodes(ct, quiet, stage,
                                                                      tmp_path, capsys):
    arms = {k: OFFSETS[k] for k in (REFERENCE, *TIMING)}
    stage(tmp_path / "results", "final-text", arms, n=6)
    rerun = stage(tmp_path / "rerun", "final-text", arms, n=2)  # its first 2
    results, again = tmp_path / "results", tmp_path / "rerun" / "final-text"
    assert ct.main([str(results), "--replay", str(again)]) == 0
    assert capsys.readouterr().out == (
        f"Reproduced: {again}'s 8 rows of arms final-text has played (4 arms) equal "
        "final-text's on the same episodes (episode seed, test and validation bits, exactly).\n")
    csv = again / "episodes.csv"
    csv.unlink()
    for r in rerun:  # one row's validation loss off by 1e-12: not reproduced
        if r.controller == TIMING[1] and r.episode_index == 1:
            r = EpisodeRecord(r.controller, 1, r.episode_rng_seed, r.host,
                              {**r.values, "final_bits": r["final_bits"] + 1e-12})
        append_record_csv(csv, r)
        if r.controller == TIMING[2]:  # and an arm the committed rows do not hold
            append_record_csv(csv, EpisodeRecord("stack:2@0.9:identity", r.episode_index,
                                                 r.episode_rng_seed, r.host, r.values))
    assert ct.main([str(results), "--replay", str(again)]) == 1
    out = capsys.readouterr().out
    assert out.endswith("; 2 rows of arms final-text has not played, not compared.\n")
    assert out.startswith(
        f"NOT reproduced: {again}'s 8 rows of arms final-text has played (4 arms) differ "
        f"from final-text's in 1 of 8 (largest |Δ validation bits| 1e-12: {TIMING[1]}, "
        "episode 1)")


def test_replay_refuses_a_folder_that_is_no_stages_rerun(ct, quiet, stage, tmp_path,
                                                         capsys):
    arms = {k: OFFSETS[k] for k in (REFERENCE, *TIMING)}
    (record, *_) = stage(tmp_path / "results", "final-text", arms, n=2)
    assert ct.main([str(tmp_path / "results"), "--replay", str(tmp_path / "final-host")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("controller_targets: error: no ") and "final-host" in err
    other = EpisodeRecord("stack:2@0.9:identity", 0, record.episode_rng_seed, record.host,
                          record.values)  # an arm final-text does not play
    (tmp_path / "rerun" / "final-text").mkdir(parents=True)
    append_record_csv(tmp_path / "rerun" / "final-text" / "episodes.csv", other)
    assert ct.main([str(tmp_path / "results"), "--replay",
                    str(tmp_path / "rerun" / "final-text")]) == 1
    assert capsys.readouterr().out == (f"NOT reproduced: {tmp_path / 'rerun' / 'final-text'} "
                                       "holds no row of an arm final-text has played.\n")
    rerun = tmp_path / "rerun" / "final-text" / "episodes.csv"  # an episode not committed:
    append_record_csv(rerun, EpisodeRecord(record.controller, 7, 1, record.host, record.values))
    assert ct.main([str(tmp_path / "results"), "--replay", str(rerun.parent)]) == 1  # none
    assert capsys.readouterr().out.startswith(f"NOT reproduced: {rerun.parent}'s 0 rows ")
    with pytest.raises(SystemExit) as exit_:  # --replay writes no document: refused
        ct.main([str(tmp_path / "results"), "--replay", str(rerun.parent), "--docs", "x.md"])
    assert exit_.value.code == 2 and "leave out --docs" in capsys.readouterr().err
    own = tmp_path / "results" / "final-text"  # the stage against itself: refused
    assert ct.main([str(tmp_path / "results"), "--replay", str(own)]) == 2
    assert "is the stage's own folder" in capsys.readouterr().err


def test_replay_fails_when_the_rerun_lacks_a_committed_row_of_its_episodes(ct, quiet, stage,
                                                                           tmp_path, capsys):
    arms = {k: OFFSETS[k] for k in (REFERENCE, *TIMING)}
    records = stage(tmp_path / "results", "final-text", arms, n=4)
    again = tmp_path / "rerun" / "final-text"
    again.mkdir(parents=True)
    for r in records:  # the first 2 episodes, one arm left out
        if r.episode_index < 2 and r.controller != TIMING[2]:
            append_record_csv(again / "episodes.csv", r)
    assert ct.main([str(tmp_path / "results"), "--replay", str(again)]) == 1
    assert capsys.readouterr().out.endswith(
        f"equal final-text's on the same episodes (episode seed, test and validation bits, "
        f"exactly); 2 of final-text's rows of its first 2 episodes are not in the rerun (first: "
        f"{TIMING[2]}, episode 0).\n")
    assert ct.main([str(tmp_path / "results"), "--replay", str(again), "--episodes", "3"]) == 1
    assert "; 6 of final-text's rows of its first 3 episodes" in capsys.readouterr().out
    with pytest.raises(SystemExit):  # --episodes is the rerun's: without --replay, refused
        ct.main([str(tmp_path / "results"), "--episodes", "3"])
    assert "--episodes goes with --replay" in capsys.readouterr().err


def test_each_finished_stage_gets_its_summed_wall_time(ct, quiet, stage, tmp_path):
    arms = {k: OFFSETS[k] for k in (REFERENCE, *TIMING)}
    records = stage(tmp_path, "final-text", arms)
    csv = tmp_path / "final-text" / "episodes.csv"
    csv.unlink()
    for r in records:  # 48 rows of 90 s: 1.2 hours on one thread
        append_record_csv(csv, EpisodeRecord(r.controller, r.episode_index, r.episode_rng_seed,
                                             r.host, {**r.values, "wall_seconds": 90.0}))
    lines = ct.targets(tmp_path)
    start = lines.index("| stage | episode rows | wall time (hours) |")
    assert lines[start + 2:] == ["| final-text | 48 | 1.20 |"]  # only the played stage


@pytest.mark.parametrize(("offsets", "target"), [
    ({ALL[0]: -0.012, ALL[1]: -0.009, ALL[2]: -0.010}, "**met**"),
    ({ALL[0]: 0.0, ALL[1]: 0.001, ALL[2]: -0.001}, "not met"),  # each seed loses about 0.01
])
def test_the_curriculum_is_met_when_its_interval_against_timing_holds_zero(
        ct, quiet, stage, tmp_path, offsets, target):
    stage(tmp_path, "final-budgets", {**OFFSETS, **offsets})
    summary = json.loads((tmp_path / "final-budgets" / "summary.json").read_text())
    (pair,) = [g for g in summary["groups"] if g["paired"]]
    (versus,) = [g for g in summary["groups"] if g["group"] == "all" and not g["paired"]]
    lines = ct.targets(tmp_path)
    row = _row(lines, "| all − timing")
    assert row[2] == f"{pair['difference']:+.4f}" and row[7].endswith(f": {target}")
    assert (pair["seed_ci"][0] <= 0.0 <= pair["seed_ci"][1]) == (target == "**met**")
    assert _row(lines, "| all − static")[2] == f"{versus['difference']:+.4f}"
    assert not any(line.startswith("The nine-blueprint group") for line in lines)


def test_docs_get_the_tables_between_their_markers_and_bad_input_is_one_line(
        ct, quiet, stage, tmp_path, capsys):
    stage(tmp_path, "final-budgets", OFFSETS)
    docs = tmp_path / "results.md"
    docs.write_text("# Results\n<!-- controller:targets:begin -->\nold\n"
                    "<!-- controller:targets:end -->\nkept\n")
    assert ct.main([str(tmp_path), "--docs", str(docs)]) == 0
    text = docs.read_text()
    assert "old" not in text and text.endswith("<!-- controller:targets:end -->\nkept\n")
    assert "| timing − static | budgets 0.35–2.8× | " in text
    bare = tmp_path / "bare.md"
    bare.write_text("# nothing\n")
    assert ct.main([str(tmp_path), "--docs", str(bare)]) == 2
    assert bare.read_text() == "# nothing\n"
    assert ct.main([str(tmp_path / "missing")]) == 2
    foreign = tmp_path / "other" / "final-text"  # a comparison without the plan's groups
    shutil.copytree(tmp_path / "final-budgets", foreign)
    summary = json.loads((foreign / "summary.json").read_text())
    (foreign / "summary.json").write_text(json.dumps({**summary, "groups": []}))
    assert ct.main([str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "controller:targets:begin" in err[0] and "missing" in err[1]
    assert "has no group 'timing'" in err[2]
