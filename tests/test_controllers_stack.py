"""Depth growth on a schedule: `StackController`, its compare specs (``stack:``, ``born:``) and
the heuristic's germination window by the spent fraction of the run."""

from __future__ import annotations

import dataclasses
import doctest

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import torch_round_trip

import esper_lightning.controllers.stack as stack_module
from esper_lightning.app.compare import runner as compare_runner
from esper_lightning.app.compare.runner import Comparison
from esper_lightning.app.config import CompareConfig, preset_values
from esper_lightning.controllers import HeuristicConfig, HeuristicController, StackController
from esper_lightning.core.actions import Action, LifecycleOp
from esper_lightning.core.engine import MorphogenesisEngine
from esper_lightning.core.lifecycle import ACTIVE_STAGES, LIVE_STAGES, SeedStage
from esper_lightning.errors import ConfigError
from esper_lightning.hosts import GPT_PRESETS, GPTHost

CHAIN = ("r1c0", "r1c1", "r1c2")  # grow4x1's growth slots, one block each
Op = LifecycleOp


class Episode:
    """A growing host under a real engine: each epoch one training step (gradient health), the
    counterfactual contributions of blended seeds, then report, decide, execute, tick."""

    def __init__(self, controller, budget: float | None = 100.0, max_epochs: int | None = None,
                 preset: str = "grow4", slots: tuple[str, ...] | None = None) -> None:
        torch.manual_seed(0)
        self.host = GPTHost(preset, slots=slots or GPT_PRESETS[preset].growth_slot_ids)
        self.engine = MorphogenesisEngine(self.host, rng_seed=0)
        self.optimizer = self.host.configure_optimizers()
        self.engine.attach_optimizer(self.optimizer)
        self.engine.compute.reset(budget)
        self.controller, self.max_epochs = controller, max_epochs
        self.gen = torch.Generator().manual_seed(1)
        self.decisions: list[tuple[float | None, Op, str | None]] = []
        #: After each decision: the blocks the next epoch trains at alpha 1.
        self.depths: list[int] = []

    def epoch(self, spent: float) -> None:
        x = torch.randint(0, 256, (4, 16), generator=self.gen)
        self.optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(self.host(x).flatten(0, 1), x.flatten()).backward()
        self.optimizer.step()
        self.engine.capture_gradient_stats()
        blended = {sid: 0.1 for sid, s in self.engine.slots.items()
                   if s.stage in (SeedStage.BLENDING, SeedStage.HOLDING)}
        self.engine.record_epoch(30.0, 2.0, 2.1, blended)
        self.engine.compute.restore_train_flops(spent)
        report = self.engine.report(self.max_epochs)
        action = self.controller.decide(report)
        outcome = self.engine.execute(action)
        assert outcome.success, (report.epoch, action, outcome.reason)
        self.engine.tick()
        slot = report.slot_ids[action.slot] if action.op != Op.WAIT else None
        self.decisions.append((report.spent_fraction, action.op, slot))
        self.depths.append(self.depth_at_alpha_1())

    def depth_at_alpha_1(self) -> int:
        config = self.host.config
        blocks = dict(zip(config.growth_slot_ids, config.growth_depths, strict=True))
        return config.n_layer + sum(
            blocks[s.slot_id] for s in self.engine.slots.values()
            if s.stage in ACTIVE_STAGES and s.alpha == 1.0 and s.slot_id.startswith("r1c"))


@pytest.mark.parametrize(("init", "lag"), [("identity", 0), ("copy", 1), ("random", 1)])
def test_stack_on_grow4_reaches_four_blocks_within_one_decision_of_tau(init, lag):
    episode = Episode(StackController(tau=0.5, operator=init))
    for k in range(1, 17):  # 5 % of the budget per epoch: the 10th report is at tau
        episode.epoch(spent=5.0 * k)
    fractions = [f for f, _, _ in episode.decisions]
    at_tau = fractions.index(0.5)
    assert at_tau == 9 and all(op == Op.WAIT for _, op, _ in episode.decisions[:at_tau])
    after = [(op, slot) for _, op, slot in episode.decisions[at_tau:]]
    # Germinate (straight to BLENDING), wait out the blend, to HOLDING, fossilize, then rest.
    expected = ([(Op.GERMINATE, "r1c0")] + [(Op.WAIT, None)] * lag
                + [(Op.ADVANCE, "r1c0"), (Op.FOSSILIZE, "r1c0")])
    assert after[:len(expected)] == expected
    assert set(after[len(expected):]) == {(Op.WAIT, None)}
    assert episode.depths[:at_tau] == [1] * at_tau
    assert episode.depths[at_tau:at_tau + lag] == [1] * lag  # alpha 1/2: not yet 4 blocks
    assert set(episode.depths[at_tau + lag:]) == {4}
    slot = episode.engine.slots["r1c0"]
    assert (slot.stage, slot.state.blueprint, len(slot.seed)) == (
        SeedStage.FOSSILIZED, f"block_{init}", 3)


@pytest.mark.parametrize("init", ["identity", "copy"])
def test_stack_on_grow4x1_germinates_one_block_per_decision(init):
    episode = Episode(StackController(tau=0.0, operator=init), preset="grow4x1")
    for k in range(1, 12):
        episode.epoch(spent=float(k))
    grow = [(Op.GERMINATE, s) for s in CHAIN]
    keep = [(Op.ADVANCE, s) for s in CHAIN] + [(Op.FOSSILIZE, s) for s in CHAIN]
    assert [(op, slot) for _, op, slot in episode.decisions] == grow + keep + [(Op.WAIT, None)] * 2
    # Full depth at alpha 1 from the third decision (identity) or the fourth (copy).
    assert episode.depths.index(4) == {"identity": 2, "copy": 3}[init]


def test_stack_without_a_budget_reads_the_epochs_and_refuses_an_unknown_run_length():
    episode = Episode(StackController(tau=0.25, operator="identity"), budget=None,
                      max_epochs=8, preset="grow2")
    for _ in range(4):
        episode.epoch(spent=0.0)
    assert [op for _, op, _ in episode.decisions] == [Op.WAIT, Op.GERMINATE, Op.ADVANCE,
                                                      Op.FOSSILIZE]
    assert episode.decisions[1][:3:2] == (0.25, "r1c0")  # the second epoch's report: 2 / 8
    blind = Episode(StackController(tau=0.25), budget=None, max_epochs=None,
                    preset="grow2")
    with pytest.raises(ConfigError, match="needs a compute budget or a planned run length"):
        blind.epoch(spent=0.0)


def test_stack_grows_in_the_slots_it_is_given_and_refuses_others():
    episode = Episode(StackController(tau=0.0, slots=("r1c1", "r1c0")), preset="grow4x1")
    for k in range(1, 4):
        episode.epoch(spent=float(k))
    assert [(op, slot) for _, op, slot in episode.decisions] == [
        (Op.GERMINATE, "r1c1"), (Op.GERMINATE, "r1c0"), (Op.ADVANCE, "r1c1")]
    with pytest.raises(ConfigError, match="3 taus for 1 slots; give one tau, or one per slot"):
        StackController(tau=(0.1, 0.2, 0.3), slots=("r1c0",))
    other = Episode(StackController(tau=0.0, slots=("r1c0", "r1c2")), preset="grow4x1",
                    slots=("r1c0", "r1c1"))
    with pytest.raises(ConfigError, match=r"'r1c2' is not a growth slot of this run; accepted: "
                                          r"r1c0, r1c1"):
        other.epoch(spent=1.0)
    plain = Episode(StackController(tau=0.0), preset="grow4", slots=("r0c0",))
    with pytest.raises(ConfigError, match=r"^stack: no slot of this run is a growth slot, so "
                                          r"nothing can grow deeper; accepted: Morphogenesis"):
        plain.epoch(spent=1.0)


def test_each_growth_slot_may_wait_for_its_own_tau():
    episode = Episode(StackController(tau=(0.0, 0.3, 0.6), operator="identity"),
                      preset="grow4x1")
    for k in range(1, 11):  # a tenth of the budget per epoch
        episode.epoch(spent=10.0 * k)
    germinated = [(f, slot) for f, op, slot in episode.decisions if op == Op.GERMINATE]
    assert germinated == [(0.1, "r1c0"), (0.3, "r1c1"), (0.6, "r1c2")]
    assert episode.depths[:8] == [2, 2, 3, 3, 3, 4, 4, 4]
    with pytest.raises(ConfigError, match="must not decrease"):
        StackController(tau=(0.5, 0.2))
    once = Episode(StackController(tau=(0.2, 1.0, 1.0), operator="identity"), preset="grow4x1")
    for k in range(1, 11):  # a later slot's tau of 1 never comes: it grows once
        once.epoch(spent=10.0 * k)
    assert [(f, slot) for f, op, slot in once.decisions if op == Op.GERMINATE] == [
        (0.2, "r1c0")]
    assert once.depths[-1] == 2
    with pytest.raises(ConfigError, match=r"2 taus for the run's 3 growth slots"):
        Episode(StackController(tau=(0.1, 0.2)), preset="grow4x1").epoch(spent=50.0)


def test_stack_reacts_to_a_governor_prune_and_regrows():
    episode = Episode(StackController(tau=0.0))
    episode.epoch(spent=1.0)
    assert episode.engine.slots["r1c0"].stage == SeedStage.BLENDING
    episode.engine.prune_live("rollback")
    for k in range(2, 12):
        episode.epoch(spent=float(k))
    ops = [op for _, op, _ in episode.decisions[1:]]
    # The embargo first (5 decisions EMBARGOED, 1 RESETTING, then empty), then again.
    assert ops[:7] == [Op.WAIT] * 7 and ops[7] == Op.GERMINATE
    assert episode.engine.slots["r1c0"].stage in LIVE_STAGES | {SeedStage.FOSSILIZED}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"tau": 1.0}, r"tau must be in \[0, 1\) \(or a list of such, a later slot's may be 1: "
                    r"never\), got 1.0"),
     ({"tau": (1.0, 1.0)}, r"tau must be in \[0, 1\)"),
     ({"tau": (0.2, 1.5)}, r"tau must be in \[0, 1\)"),
     ({"tau": ()}, r"tau must be in \[0, 1\)"),
     ({"tau": "0.5"}, r"tau must be in \[0, 1\) .*got '0.5'"),
     ({"tau": True}, r"tau must be in \[0, 1\) .*got True"),
     ({"tau": float("nan")}, r"tau must be in \[0, 1\) .*got nan"),
     ({"tau": 0.5, "operator": "zero"}, "unknown growth operator 'zero'; accepted: copy, "
                                         "identity, random")],
)
def test_bad_stack_settings_are_one_line_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        StackController(**kwargs)


def test_one_slot_may_be_named_by_its_string_and_taus_given_as_any_sequence():
    assert StackController(0.5, slots="blocks.0+1").slots == ("blocks.0+1",)
    assert StackController(np.array([0.1, 0.5])).taus == (0.1, 0.5)
    assert StackController(np.float32(0.25)).taus == (0.25,)


def test_stack_state_is_a_header_and_earliest_germination_follows_tau():
    controller = StackController(tau=0.5)
    state = torch_round_trip(controller.state_dict())
    assert state == {"controller": "stack", "version": 1}
    StackController(tau=0.8).load_state_dict(state)
    with pytest.raises(ValueError, match="expected 'stack'"):
        controller.load_state_dict({"controller": "static", "version": 1})
    assert controller.earliest_germination(20) == 9  # (9 + 1) / 20 = 0.5
    assert StackController(tau=0.0).earliest_germination(20) == 0
    assert controller.earliest_germination(None) is None


def test_docstring_examples_run():
    result = doctest.testmod(stack_module)
    assert result.attempted > 0 and result.failed == 0


def test_lm_comparison_of_stack_born_and_static_on_grow4(text_file, tmp_path, monkeypatch):
    # No figures: this test reads none, and they were a third of its time.
    monkeypatch.setattr(compare_runner.plots, "save_figures", lambda *args, **kwargs: [])
    values = preset_values("lm-smoke", CompareConfig)
    # 12 epochs, not 20: 8 were already enough for the stacked block to become a fossil.
    config = CompareConfig(**{
        **values, "data_dir": str(text_file), "out": str(tmp_path / "out"),
        "host_preset": "grow4", "slots": ("r1c0",), "episode_length": 12, "train_subset": 32,
        "controllers": ("static", "born:4", "stack:4@0.15:identity"), "seeds": 1, "envs": 3,
        "progress": False})
    records = {r.controller: r for r in Comparison(config).run()}
    assert records["born:4"]["final_seeds"] == (("r1c0", "block_random"),)
    assert records["born:4"]["seeds_germinated"] == 0
    stacked = records["stack:4@0.15:identity"]
    assert stacked["final_seeds"] == (("r1c0", "block_identity"),)
    assert (stacked["seeds_germinated"], stacked["seeds_fossilized"]) == (1, 1)
    assert records["static"]["seed_params"] == 0
    assert records["born:4"]["seed_params"] == stacked["seed_params"] == 3 * (12 * 32**2 + 13 * 32)


# --- the heuristic's germination window --------------------------------------------------------
def _quick(**window) -> HeuristicController:
    return HeuristicController(HeuristicConfig(
        min_epochs_before_germinate=0, stabilization_epochs=0, plateau_epochs_to_germinate=0,
        blueprint_rotation=("block_copy",), **window))


def test_heuristic_germinates_block_seeds_only_inside_its_window():
    episode = Episode(_quick(germinate_from_fraction=0.3, germinate_until_fraction=0.35))
    for k in range(1, 9):
        episode.epoch(spent=5.0 * k)
    ops = [(f, op) for f, op, _ in episode.decisions]
    assert all(op == Op.WAIT for f, op in ops if f < 0.3)
    # Straight to BLENDING; alpha 1/2 for one epoch, then to HOLDING.
    assert ops[5] == (0.3, Op.GERMINATE) and [op for _, op in ops[6:8]] == [Op.WAIT, Op.ADVANCE]
    late = Episode(_quick(germinate_until_fraction=0.35))
    for k in range(7, 10):
        late.epoch(spent=5.0 * k)
    assert [op for _, op, _ in late.decisions] == [Op.WAIT] * 3
    assert "too late to germinate" in late.controller.last_reason


def test_heuristic_without_a_window_is_unchanged_and_a_window_needs_a_run_length():
    assert HeuristicConfig().germinate_from_fraction is None
    plain = Episode(_quick(), budget=None, max_epochs=None)
    plain.epoch(spent=0.0)
    assert plain.decisions[0][1] == Op.GERMINATE
    blind = Episode(_quick(germinate_from_fraction=0.5), budget=None, max_epochs=None)
    with pytest.raises(ConfigError, match="need a compute budget or a planned number"):
        blind.epoch(spent=0.0)
    with pytest.raises(ValueError, match=r"germinate_from_fraction 0\.6 is after"):
        HeuristicConfig(germinate_from_fraction=0.6, germinate_until_fraction=0.5)
    with pytest.raises(ValueError, match=r"germinate_until_fraction must be in \[0, 1\]"):
        HeuristicConfig(germinate_until_fraction=1.5)
    windowed = HeuristicController(dataclasses.replace(HeuristicConfig(),
                                                       germinate_from_fraction=0.5))
    assert windowed.earliest_germination(40) == 19


def test_a_growth_seed_in_a_plain_slot_is_masked_and_costs_a_turn_not_the_run():
    episode = Episode(StackController(tau=0.0), preset="grow2", slots=("r0c0", "r1c0"))
    report = episode.engine.report()
    action = Action(Op.GERMINATE, slot=0, blueprint="block_copy")  # r0c0 follows block 0
    assert not report.masks.allows(action)  # the blueprint mask depends on the slot...
    assert report.masks.allows(dataclasses.replace(action, slot=1))
    outcome = episode.engine.execute(action)  # ...and the engine still refuses it as a WAIT
    assert not outcome.success and outcome.reason == "blueprint_block_copy_not_hostable_in_slot_0"
