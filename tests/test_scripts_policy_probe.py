"""scripts/policy_probe.py: the op head's probabilities along argmax play, without changing it."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from helpers import script_module

from esper_lightning.app.compare.arms import EpisodePlan
from esper_lightning.app.compare.runner import evaluation_rng_seed, play_episodes
from esper_lightning.app.task import germinable_blueprints
from esper_lightning.controllers import PolicyController

ROOT = Path(__file__).resolve().parents[1]
#: A committed policy (the final tables' timing policy, seed 2) on a tiny budget of the text
#: fixture: a real episode of the task it was trained on, in seconds.
POLICY = str(ROOT / "policies" / "grow124-timing-s2.pt")
SMALL = ["--budget_steps", "40", "--val_subset", "32"]


@pytest.fixture(scope="module")
def pp():
    with script_module("policy_probe") as module:
        yield module


def _row(decision: int, p_germinate: float, op: str = "WAIT", episode: int = 0,
         scale: float = 1.0) -> dict[str, object]:
    return {"policy": "p.pt", "budget_scale": scale, "episode": episode, "decision": decision,
            "p_germinate": p_germinate, "op": op}


def test_first_growth_takes_the_decisions_before_argmax_first_grows(pp):
    never = [_row(0, 0.1), _row(1, 0.3), _row(2, 0.2)]
    grows = [_row(0, 0.4, episode=1), _row(1, 0.6, "GERMINATE", episode=1),
             _row(2, 0.9, episode=1)]
    at_once = [_row(0, 0.7, "GERMINATE", scale=2.0), _row(1, 0.2, scale=2.0)]
    cell, doubled = pp.first_growth(never + grows + at_once)
    assert cell["episodes"] == 2 and cell["argmax_grew"] == 0.5
    assert cell["max_p_germinate"] == pytest.approx(0.4)  # 0.9 comes after the growth
    # Sampled play's chance to germinate before argmax would (never: the whole episode).
    assert cell["sampled_grows_first"] == pytest.approx(((1 - 0.9 * 0.7 * 0.8) + 0.4) / 2)
    assert cell["max_p_germinate_after"] == pytest.approx(0.9)
    assert doubled["max_p_germinate"] is None and doubled["sampled_grows_first"] == 0
    assert doubled["max_p_germinate_after"] == pytest.approx(0.2)


def test_first_growth_reads_what_a_nine_blueprint_policy_would_germinate(pp):
    rows = [{**_row(0, 0.2), "p_growth": 0.25, "blueprint": ""},
            {**_row(1, 0.6, "GERMINATE"), "p_growth": 0.75, "blueprint": "lora"},
            {**_row(2, 0.7, "GERMINATE"), "p_growth": 0.5, "blueprint": "block_copy"}]
    (cell,) = pp.first_growth(rows)
    assert cell["mean_p_growth"] == pytest.approx(0.5)
    assert cell["argmax_growth_share"] == pytest.approx(0.5)  # block_copy grows, lora not
    (old,) = pp.first_growth([_row(0, 0.2)])  # a probe's rows from before these columns
    assert old["mean_p_growth"] is None and old["argmax_growth_share"] is None


def test_the_table_reads_back_from_the_csv_as_printed_after_probing(pp, tmp_path, capsys):
    rows = [{**_row(d, p, op, episode=e, scale=s), "rng_seed": 1, "budget_spent": 0.1,
             "p_wait": 1 - p, "p_op": max(p, 1 - p)}
            for e, s in ((0, 10.0), (1, 2.0))
            for d, p, op in ((0, 0.2, "WAIT"), (1, 0.6, "GERMINATE"), (2, 0.1, "WAIT"))]
    pp.print_table(rows)
    printed = capsys.readouterr().out
    out = tmp_path / "rows.csv"
    with out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, pp.FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    assert pp.main(["--table", str(out)]) == 0
    assert capsys.readouterr().out == printed
    assert printed.index("| p.pt | 2.0 |") < printed.index("| p.pt | 10.0 |")  # as numbers
    assert pp.main(["--table", str(tmp_path / "none.csv")]) == 2
    assert "--table takes one probe CSV" in capsys.readouterr().err
    figure = tmp_path / "p.png"
    assert pp.main(["--table", str(out), "--plot", str(figure)]) == 0
    assert figure.read_bytes().startswith(b"\x89PNG")
    fig = pp.probability_figure(rows)
    assert [ax.get_title() for ax in fig.axes] == ["budget 2x base", "budget 10x base"]
    # One line per episode and a dot where argmax germinated, on each budget's panel.
    assert [len(ax.lines) for ax in fig.axes] == [3, 3]  # the line, its dot, the 0.5 mark
    assert pp.main(["--table", str(out), "--plot", str(tmp_path / "p.svg")]) == 2


def test_probing_changes_no_action_and_reads_the_argmax(pp, text_file, tmp_path):
    args, flags = pp.build_parser().parse_known_args(
        [POLICY, "--budget_scales", "1", "--episodes", "1", "--rng_seed", "5",
         "--data_dir", str(text_file), *SMALL])
    config = pp.episodes_config(args, flags)
    plan = EpisodePlan("p", 0, evaluation_rng_seed(5, 0))
    probed = pp.ProbedPolicy(POLICY)
    acted = []  # the op's probability as the policy's own act() computed it
    act = probed.policy.act

    def recording_act(*args, **kwargs):
        out = act(*args, **kwargs)
        acted.append(float(out.log_probs[0, 0].exp()))
        return out

    probed.policy.act = recording_act
    (with_probe,) = play_episodes(pp.make_pool(config), [plan], [probed], config)
    (plain,) = play_episodes(pp.make_pool(config), [plan], [PolicyController(POLICY)], config)
    # Every metric of the episode, bit for bit, but its wall time.
    timed = {k for k in plain.values if "second" in k}
    assert timed and {k: v for k, v in with_probe.values.items() if k not in timed} == {
        k: v for k, v in plain.values.items() if k not in timed}
    assert [probe[3] for probe in probed.probes] == pytest.approx(acted, abs=1e-6)
    for p_wait, p_germinate, op, p_op, spent, p_growth, blueprint in probed.probes:
        # The timing policy plays block_identity alone: any germination of it grows.
        assert p_growth == pytest.approx(1.0) and blueprint in ("", "block_identity")
        assert 0 <= p_germinate <= 1 and p_wait + p_germinate <= 1 + 1e-6
        assert p_op >= max(p_wait, p_germinate) - 1e-7  # argmax: the most probable op
        assert p_op == (p_wait if op == "WAIT" else p_germinate if op == "GERMINATE" else p_op)
        assert 0 < spent <= 1.0 + 1e-9


def test_a_nine_blueprint_policy_spreads_its_germinations_over_growth_and_others(pp,
                                                                                text_file):
    """P(a growth blueprint | germinate) is the blueprint head's mass on the growth operators'
    blueprints, computed as the policy's own act() computes that head."""
    policy = str(ROOT / "policies" / "grow124-all-s1.pt")
    args, flags = pp.build_parser().parse_known_args(
        [policy, "--budget_scales", "1", "--episodes", "1", "--rng_seed", "5",
         "--data_dir", str(text_file), *SMALL])
    config = pp.episodes_config(args, flags)
    probed = pp.ProbedPolicy(policy)
    heads = []  # the blueprint head's probabilities where act() germinated or not
    logits_of = probed.policy._logits

    def recording_logits(core):
        logits = logits_of(core)
        heads.append(logits["blueprint"].softmax(-1)[0])
        return logits

    probed.policy._logits = recording_logits
    play_episodes(pp.make_pool(config), [EpisodePlan("p", 0, evaluation_rng_seed(5, 0))],
                  [probed], config)
    names = probed.policy.config.blueprints
    growth = [i for i, n in enumerate(names) if n in ("block_copy", "block_identity",
                                                       "block_random")]
    p_growth = [probe[5] for probe in probed.probes]
    assert all(0.0 < p < 1.0 for p in p_growth)  # nine blueprints allowed, none certain
    # Each decision computes the head twice (the probe, then act): the same distribution.
    # The head spans every topology's blueprints; the mask leaves the task's nine.
    allowed = [names.index(n) for n in germinable_blueprints(config)]
    assert len(allowed) == 9
    for p, head in zip(p_growth, heads[::2], strict=True):
        assert p == pytest.approx(float(head[growth].sum() / head[allowed].sum()), abs=1e-6)


def test_main_writes_a_row_per_decision_and_a_table(pp, text_file, tmp_path, capsys):
    out = tmp_path / "probe.csv"
    assert pp.main([POLICY, "--budget_scales", "1", "--episodes", "1", "--rng_seed", "5",
                    "--data_dir", str(text_file), *SMALL, "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert rows and tuple(rows[0]) == pp.FIELDS
    assert [int(r["decision"]) for r in rows] == list(range(len(rows)))
    assert {r["budget_scale"] for r in rows} == {"1.0"}
    table = capsys.readouterr().out
    assert f"| {POLICY} | 1.0 | 1 |" in table
    if all(r["op"] == "WAIT" for r in rows):
        chance = 1 - math.prod(1 - float(r["p_germinate"]) for r in rows)
        assert f"| 0.00 | {max(float(r['p_germinate']) for r in rows):.3f} | {chance:.3f} |" \
            in table


def test_bad_input_is_one_line_and_exit_2(pp, text_file, capsys):
    code = pp.main([POLICY, "--budget_scales", "-1", "--episodes", "1", "--rng_seed", "5",
                    "--data_dir", str(text_file)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("policy_probe.py: ") and err.count("\n") == 1
    assert "-1" in err
