"""Tuning a growth lookup from a comparison (`app.compare.lookup`, ``esper-lightning lookup``)
and playing it (``lookup:PATH``): the per-budget choice, "never" from static, the tuning cost,
one-line refusals, and a lookup arm that equals, bit for bit, the stack arm it looks up."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from esper_lightning.app.compare import lookup as lookup_module
from esper_lightning.app.compare.lookup import families, main, tune_lookup
from esper_lightning.app.compare.records import EpisodeRecord
from esper_lightning.controllers.lookup import read_lookup
from esper_lightning.errors import ConfigError

BASE = 1e12
ARMS = ("stack:2@0.2:identity", "stack:2@0.4:identity", "stack:2@0.6:identity")
#: Bits added per arm at each budget scale: never growing is best at 0.5, 0.6 at 1, 0.2 at 4.
OFFSETS = {0.5: {"static": 0.00, ARMS[0]: 0.09, ARMS[1]: 0.05, ARMS[2]: 0.02},
           1.0: {"static": 0.10, ARMS[0]: 0.06, ARMS[1]: 0.03, ARMS[2]: 0.00},
           4.0: {"static": 0.30, ARMS[0]: 0.00, ARMS[1]: 0.04, ARMS[2]: 0.08}}
PER_BUDGET = 4


def _record(controller: str, index: int, bits: float, scale: float) -> EpisodeRecord:
    return EpisodeRecord(controller, index, 1000 + index, "grow2", {
        "outcome": 50.0, "final_accuracy": 50.0, "seed_params": 0, "total_params": 1000,
        "accuracy_curve": (50.0, 50.0), "seeds_germinated": 0, "seeds_fossilized": 0,
        "seeds_pruned": 0, "wall_seconds": 2.0, "final_bits": bits, "test_bits": bits,
        "budget_flops": scale * BASE, "train_flops": scale * BASE})


def _records(controllers=("static", *ARMS)) -> list[EpisodeRecord]:
    rng = np.random.default_rng(3)
    records, index = [], 0
    for scale, offsets in OFFSETS.items():
        for _ in range(PER_BUDGET):
            base = rng.normal(2.0, 0.2)
            records += [_record(c, index, base + offsets[c] + rng.normal(0, 0.003), scale)
                        for c in controllers]
            index += 1
    return records


def test_the_lookup_takes_each_budgets_best_time_never_where_static_wins_and_its_cost():
    lookup = tune_lookup(_records(), BASE, tuning={"rng_seed": 510})
    assert (lookup.operator, lookup.depth) == ("identity", 2)
    assert lookup.points == ((0.5, None), (1.0, (0.6,)), (4.0, (0.2,)))
    cost = lookup.tuning
    assert cost["rng_seed"] == 510 and cost["arms"] == ["static", *ARMS]
    assert cost["episodes"] == 4 * 3 * PER_BUDGET  # every arm, every tuning episode
    assert cost["episodes_per_budget"] == {"0.5": PER_BUDGET, "1": PER_BUDGET, "4": PER_BUDGET}
    assert cost["train_flops"] == pytest.approx(4 * PER_BUDGET * (0.5 + 1 + 4) * BASE)
    assert cost["wall_seconds"] == 2.0 * cost["episodes"]
    assert cost["means"]["4"][ARMS[0]] < cost["means"]["4"][ARMS[2]]
    # Budget-blind: 0.6 is best on average (+0.10 in all, 0.4 +0.12, 0.2 +0.15, static +0.40).
    assert cost["best_single"] == ARMS[2]
    without_static = tune_lookup(_records(ARMS), BASE)  # never is no choice without static
    assert without_static.points[0] == (0.5, (0.6,))


def test_an_arm_with_episodes_the_others_lack_is_refused():
    """An arm's extra episode (here a very good one of static's) would move the budget-blind
    choice were it counted, and the file would record episodes no choice rested on were it
    dropped: the tuning asks for the comparison to be finished instead."""
    records = [*_records(), _record("static", 99, 0.0, 0.5)]
    with pytest.raises(ConfigError, match=rf"{re.escape(ARMS[0])} played {PER_BUDGET} of the "
                                          rf"{PER_BUDGET + 1} episodes at budget scale 0.5"):
        tune_lookup(records, BASE)


def test_a_budget_scale_no_tuning_episode_drew_is_refused(tmp_path):
    from types import SimpleNamespace

    from esper_lightning.app.compare.lookup import _played
    from esper_lightning.app.compare.records import append_record_csv

    for record in _records():
        append_record_csv(tmp_path / "episodes.csv", record)
    tmp = tmp_path
    with pytest.raises(ConfigError, match="no tuning episode drew budget scale 2; accepted: a "
                                          "comparison whose every budget scale played"):
        _played(tmp, SimpleNamespace(budget_scales=(0.5, 1.0, 2.0, 4.0)), BASE)
    assert len(_played(tmp, SimpleNamespace(budget_scales=(0.5, 1.0, 4.0)), BASE)) == 48


def test_comparisons_of_one_budget_each_pool_into_one_lookup(tmp_path, capsys):
    """One tuning comparison per budget (each budget gets its episodes): their episode indices
    overlap but stay apart, and the lookup reads every budget; another host is refused."""
    import dataclasses

    from esper_lightning.app.compare.records import append_record_csv
    from esper_lightning.app.config import CompareConfig
    from esper_lightning.app.task import budget_flops

    task = {"task": "lm", "host_preset": "grow2", "slots": ["r1c0"], "budget_steps": 40}
    base = budget_flops(CompareConfig(**task))
    folders = []
    for k, scale in enumerate((1.0, 4.0)):
        folder = tmp_path / f"at-{scale:g}"
        folder.mkdir()
        (folder / "compare_config.json").write_text(json.dumps(
            {**task, "budget_scales": [scale], "rng_seed": 700 + k}))
        for r in _records():
            if r["budget_flops"] == scale * BASE:  # re-indexed from 0 in each folder
                values = {**r.values, "budget_flops": scale * base}
                append_record_csv(folder / "episodes.csv", dataclasses.replace(
                    r, episode_index=r.episode_index % PER_BUDGET, values=values))
        folders.append(str(folder))
    assert main([*folders, "--out", str(tmp_path / "l.json")]) == 0
    lookup = read_lookup(tmp_path / "l.json")
    assert lookup.points == ((1.0, (0.6,)), (4.0, (0.2,)))
    assert lookup.tuning["episodes_per_budget"] == {"1": PER_BUDGET, "4": PER_BUDGET}
    assert lookup.tuning["comparison"] == folders and lookup.tuning["rng_seed"] == [700, 701]
    capsys.readouterr()
    config = json.loads((tmp_path / "at-4" / "compare_config.json").read_text())
    (tmp_path / "at-4" / "compare_config.json").write_text(json.dumps(
        {**config, "host_preset": "grow2-w64"}))
    assert main([*folders, "--out", str(tmp_path / "m.json")]) == 2
    assert "a lookup pools comparisons of one host and base" in capsys.readouterr().err


def test_stack_families_and_what_the_tuning_refuses():
    assert families(["stack:4@0.1,0.3:identity", "stack:4@0.2,0.5:identity", "stack:2@0.2"]) \
        == {"4:identity:2": {"stack:4@0.1,0.3:identity": (0.1, 0.3),
                             "stack:4@0.2,0.5:identity": (0.2, 0.5)},
            "2:copy:1": {"stack:2@0.2": (0.2,)}}
    two = [*_records(), _record("stack:2@0.3:copy", 0, 2.0, 0.5)]
    with pytest.raises(ConfigError, match="several stack:K@TAU families in the comparison "
                                          r"\(2:identity:1, 2:copy:1\); accepted: exactly one"):
        tune_lookup(two, BASE)
    with pytest.raises(ConfigError, match=r"stack:2@0\.3:copy played no episode at budget "
                                          "scale 1; a lookup compares every arm of its family"):
        tune_lookup(two, BASE, family="2:copy:1")  # static and it: played apart
    # An arm that played fewer of a budget's episodes than the others (an unfinished
    # comparison): the choice would rest on fewer episodes than the file records.
    unfinished = [r for r in _records() if not (r.controller == ARMS[0] and r.episode_index == 0)]
    with pytest.raises(ConfigError, match=rf"{re.escape(ARMS[0])} played {PER_BUDGET - 1} of "
                                          rf"the {PER_BUDGET} episodes at budget scale 0.5; a "
                                          "lookup compares every arm on the same episodes"):
        tune_lookup(unfinished, BASE)
    alone = [*_records(ARMS), _record("stack:2@0.3:copy", 0, 2.0, 0.5)]
    with pytest.raises(ConfigError, match="family '2:copy:1' has one arm"):
        tune_lookup(alone, BASE, family="2:copy:1")
    with pytest.raises(ConfigError, match="family '9:copy:1' is not in the comparison"):
        tune_lookup(two, BASE, family="9:copy:1")
    with pytest.raises(ConfigError, match="no stack:K@TAU families"):
        tune_lookup([r for r in _records() if r.controller == "static"], BASE)


def test_the_command_refuses_in_one_line(tmp_path, capsys):
    out = str(tmp_path / "l.json")
    assert main([str(tmp_path / "absent"), "--out", out]) == 2
    assert capsys.readouterr().err == (f"esper-lightning lookup: error: comparison folder "
                                       f"'{tmp_path / 'absent'}' does not exist; accepted: the "
                                       "folder a comparison wrote (compare --out)\n")
    assert main([str(tmp_path), "--out", out]) == 2
    assert capsys.readouterr().err == (f"esper-lightning lookup: error: '{tmp_path}' holds no "
                                       "comparison (no compare_config.json)\n")
    (tmp_path / "compare_config.json").write_text(json.dumps(
        {"task": "lm", "host_preset": "grow2", "slots": ["r1c0"], "budget_steps": 40,
         "budget_scales": [1.0, 4.0]}))
    assert main([str(tmp_path), "--out", out]) == 2
    assert capsys.readouterr().err == (f"esper-lightning lookup: error: '{tmp_path}' has played "
                                       "no episode yet (no episodes.csv); run the comparison "
                                       "first\n")
    (tmp_path / "episodes.csv").write_text("")
    assert main([str(tmp_path), "--out", str(tmp_path)]) == 2
    assert f"--out '{tmp_path}' is a folder; accepted: a file path" in capsys.readouterr().err
    assert main([str(tmp_path), "--out", str(tmp_path / "episodes.csv" / "l.json")]) == 2
    assert "is a file, so no folder can be made there" in capsys.readouterr().err
    for judged in ("speed", "loss_curve", "test_bits"):  # a curve; the final tables' split
        assert main([str(tmp_path), "--out", "x", "--judged", judged]) == 2
        err = capsys.readouterr().err
        assert f"judged metric {judged!r} cannot choose a lookup; accepted: outcome" in err
        assert "final_bits" in err and "test_bits" not in err.split("accepted")[1]
    assert main([str(tmp_path)]) == 2  # --out is required
    assert not (tmp_path / "l.json").exists()


def test_a_tuned_lookup_plays_the_stack_arm_it_looks_up_bit_for_bit(text_file, tmp_path,
                                                                    monkeypatch):
    """Tune on a comparison at budget scales 1 and 4 (tuning episodes of their own), then
    play the lookup at scale 2, between them: the tuned times are equal there, so the lookup
    arm is that stack arm, episode for episode."""
    from esper_lightning.app.compare import runner
    from esper_lightning.app.config import CompareConfig

    monkeypatch.setattr(runner.plots, "save_figures", lambda *args, **kwargs: None)
    monkeypatch.setattr(runner, "_log_tensorboard", lambda *args, **kwargs: None)
    task = dict(task="lm", host_preset="grow2", slots=("r1c0",), budget_steps=8,
                episode_length=4, batch_size=8, block_size=16, val_subset=8, envs=2,
                lr_schedule="wsd", warmup_fraction=0.1, data_dir=str(text_file),
                progress=False)
    tuning = CompareConfig(**task, controllers=("static", "stack:2@0.25:identity",
                                                "stack:2@0.5:identity"),
                           budget_scales=(1.0, 4.0), seeds=2, rng_seed=510,
                           out=str(tmp_path / "tuning"))
    runner.Comparison(tuning).run()
    assert main([str(tmp_path / "tuning"), "--out", str(tmp_path / "lookup.json")]) == 0
    lookup = read_lookup(tmp_path / "lookup.json")
    assert [s for s, _ in lookup.points] == [1.0, 4.0] and lookup.tuning["episodes"] == 6
    assert lookup.tuning["rng_seed"] == 510 and lookup.tuning["host_preset"] == "grow2"
    from esper_lightning.app.task import budget_flops

    assert lookup.tuning["base_flops"] == budget_flops(tuning)
    chosen = {taus for _, taus in lookup.points}
    # Make both budgets choose one time (whatever the tiny tuning chose), then play it at 2.
    tau = next(t for t in chosen if t is not None) if chosen != {None} else (0.25,)
    table = {**json.loads((tmp_path / "lookup.json").read_text()),
             "points": [{"scale": 1.0, "taus": list(tau)}, {"scale": 4.0, "taus": list(tau)}]}
    (tmp_path / "lookup.json").write_text(json.dumps(table))
    stack = f"stack:2@{tau[0]:g}:identity"
    final = CompareConfig(**task, controllers=(stack, f"lookup:{tmp_path / 'lookup.json'}"),
                          reference=stack, budget_scales=(2.0,), seeds=2, rng_seed=20261999,
                          out=str(tmp_path / "final"))
    comparison = runner.Comparison(final)
    comparison.run()
    from esper_lightning.app.compare.records import read_records_csv

    records = read_records_csv(comparison.episodes_csv)
    by_arm = {c: [r for r in records if r.controller == c] for c in final.controllers}
    assert [r["test_bits"] for r in by_arm[stack]] == [
        r["test_bits"] for r in by_arm[final.controllers[1]]]
    assert all(r["seeds_fossilized"] == 1 for r in by_arm[final.controllers[1]])
    summary = json.loads((tmp_path / "final" / "summary.json").read_text())
    assert summary["cost"] == {final.controllers[1]: {
        "made_by": "tuning", "episodes": 6, "train_flops": lookup.tuning["train_flops"],
        "wall_seconds": lookup.tuning["wall_seconds"]}}
    assert "## What each arm cost to make" in (tmp_path / "final" / "summary.md").read_text()


def test_the_cost_table_says_how_many_settings_amortise_a_policy():
    from esper_lightning.app.compare.report import cost_markdown

    lines = cost_markdown({
        "policy:p.pt": {"made_by": "PPO training", "episodes": 320, "train_flops": 3.2e14,
                        "wall_seconds": 5200.0, "rounds": 20},
        "lookup:l.json": {"made_by": "tuning", "episodes": 165, "train_flops": 8e13,
                          "wall_seconds": 2900.0}})
    assert "| policy:p.pt | PPO training | 320 | 3.2e+14 | 5,200 |" in lines
    assert "| lookup:l.json | tuning | 165 | 8e+13 | 2,900 |" in lines
    assert any("costs as much compute as tuning lookup:l.json for 4.0 settings" in line
               for line in lines)
    assert cost_markdown({}) == []


def test_a_lookup_the_host_cannot_play_is_refused_before_anything_runs(tmp_path):
    from esper_lightning.app.compare.runner import Comparison
    from esper_lightning.app.config import CompareConfig
    from esper_lightning.controllers.lookup import GrowthLookup

    deeper = GrowthLookup("identity", 4, ((1.0, (0.2,)),)).write(tmp_path / "deeper.json")
    config = dict(task="lm", host_preset="grow2", slots=("r1c0",), budget_steps=8,
                  out=str(tmp_path / "out"))
    with pytest.raises(ConfigError, match=r"growth lookup 'missing\.json' not found"):
        Comparison(CompareConfig(**config, controllers=("static", "lookup:missing.json")))
    with pytest.raises(ConfigError, match=rf"^lookup:{deeper}: .*K=4 is not the host's grown "
                                          r"depth; accepted: stack:2"):
        Comparison(CompareConfig(**config, controllers=("static", f"lookup:{deeper}")))
    assert not (tmp_path / "out").exists()


def test_a_lookup_tuned_at_another_base_budget_or_host_plays_only_as_a_transfer(tmp_path):
    """Its scales are multiples of the base it was tuned at: elsewhere they mean other
    budgets, so only --transfer_policies (an evaluation without retuning) lets it play."""
    from esper_lightning.app.compare.runner import Comparison
    from esper_lightning.app.config import CompareConfig
    from esper_lightning.app.task import budget_flops
    from esper_lightning.controllers.lookup import GrowthLookup

    config = dict(task="lm", host_preset="grow2", slots=("r1c0",), budget_steps=40,
                  out=str(tmp_path / "out"))
    base = budget_flops(CompareConfig(**config))
    tuned = {"host_preset": "grow2", "base_flops": base}
    points = ((1.0, (0.2,)),)
    same = GrowthLookup("identity", 2, points, tuned).write(tmp_path / "same.json")
    Comparison(CompareConfig(**config, controllers=("static", f"lookup:{same}")))
    half = GrowthLookup("identity", 2, points, {**tuned, "base_flops": base / 2}).write(
        tmp_path / "half.json")
    with pytest.raises(ConfigError, match=rf"^lookup:{half} was tuned at base_flops=.*; the "
                                          r"comparison uses base_flops=.* --transfer_policies"):
        Comparison(CompareConfig(**config, controllers=("static", f"lookup:{half}")))
    other = GrowthLookup("identity", 2, points, {**tuned, "host_preset": "grow2-w64"}).write(
        tmp_path / "other.json")
    with pytest.raises(ConfigError, match=r"was tuned at host_preset='grow2-w64'"):
        Comparison(CompareConfig(**config, controllers=("static", f"lookup:{other}")))
    for lookup in (half, other):
        Comparison(CompareConfig(**config, controllers=("static", f"lookup:{lookup}"),
                                 transfer_policies=True))


# --- the command line: the flags it always took, in compare's style -----------------------------
@pytest.fixture
def tuned(monkeypatch) -> list[dict]:
    """What ``main`` hands the tuning (`lookup._tune`), recorded instead of tuned."""
    seen: list[dict] = []
    monkeypatch.setattr(lookup_module, "_tune", lambda args: seen.append(
        {k: v for k, v in args.as_dict().items() if k != "config"}) or 0)
    return seen


@pytest.mark.parametrize(("argv", "expected"), [
    # docs/evidence.md and docs/tutorials/compare-controllers.md, as written there
    (["results/controller/tune-lookup-0.25", "results/controller/tune-lookup-0.5", "--out",
      "/tmp/l.json"], {"comparison": ["results/controller/tune-lookup-0.25",
                                      "results/controller/tune-lookup-0.5"],
                       "out": "/tmp/l.json", "family": None, "judged": "final_bits"}),
    (["--out", "l.json", "cmp", "--family", "2:identity:1", "--judged", "val_loss"],
     {"comparison": ["cmp"], "out": "l.json", "family": "2:identity:1", "judged": "val_loss"}),
])
def test_the_command_takes_folders_out_family_and_judged(tuned, argv, expected):
    assert main(argv) == 0
    assert tuned == [expected]


def test_print_config_writes_what_config_reads_back(tuned, tmp_path, capsys):
    argv = ["a", "b", "--out", "l.json", "--family", "2:identity:1"]
    assert main([*argv, "--print_config"]) == 0
    assert tuned == []
    file = tmp_path / "lookup.yaml"
    file.write_text(capsys.readouterr().out)
    assert main(["--config", str(file)]) == 0
    assert main(argv) == 0
    assert tuned[0] == tuned[1] and tuned[0]["comparison"] == ["a", "b"]


def test_help_lists_the_arguments_it_listed_and_config(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: esper-lightning lookup ")
    for option in ("comparison [comparison ...]", "--out OUT", "--family FAMILY",
                   "--judged JUDGED", "--config CONFIG", "--print_config", "--version"):
        assert option in text, option


@pytest.mark.parametrize(("argv", "message"), [
    ([], "the following arguments are required: comparison, --out"),
    (["cmp"], "the following arguments are required: --out"),
    (["cmp", "--out", "l.json", "--bogus"], "unrecognized arguments: --bogus"),
    (["--config", "CONFIG"], "unknown config key 'jugded'; accepted: comparison, out, family, "
                             "judged"),
])
def test_a_bad_command_line_is_one_line_and_status_2(tuned, argv, message, tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text("comparison: [cmp]\nout: l.json\njugded: val_loss\n")
    assert main([a.replace("CONFIG", str(tmp_path / "bad.yaml")) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("esper-lightning lookup: error: "), err
    assert message in err and tuned == [], err
