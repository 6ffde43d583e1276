"""Depth growth on a schedule: `StackController`, its compare specs (``stack:``, ``born:``) and
the heuristic's germination window by the spent fraction of the run."""

from __future__ import annotations

import dataclasses
import doctest

import pytest
import torch
import torch.nn.functional as F
from helpers import torch_round_trip

import esper_lightning.controllers.stack as stack_module
from esper_lightning.app.compare import Comparison, parse_controller
from esper_lightning.app.config import CompareConfig, preset_values
from esper_lightning.controllers import HeuristicConfig, HeuristicController, StackController
from esper_lightning.controllers.stack import born_implants, parse_stack, stack_controller
from esper_lightning.core.actions import Action, LifecycleOp
from esper_lightning.core.engine import MorphogenesisEngine
from esper_lightning.core.lifecycle import LIVE_STAGES, SeedStage
from esper_lightning.errors import ConfigError
from esper_lightning.hosts import GPTHost

GROWTH = ("r1c0", "r1c1", "r1c2")
Op = LifecycleOp


class Episode:
    """A grow4 host under a real engine: each epoch one training step (gradient health), the
    counterfactual contributions of blended seeds, then report, decide, execute, tick."""

    def __init__(self, controller, budget: float | None = 100.0, max_epochs: int | None = None,
                 slots: tuple[str, ...] = GROWTH) -> None:
        torch.manual_seed(0)
        self.host = GPTHost("grow4", slots=slots)
        self.engine = MorphogenesisEngine(self.host, rng_seed=0)
        self.optimizer = self.host.configure_optimizers()
        self.engine.attach_optimizer(self.optimizer)
        self.engine.budget_flops = budget
        self.controller, self.max_epochs = controller, max_epochs
        self.gen = torch.Generator().manual_seed(1)
        self.decisions: list[tuple[float | None, Op, str | None]] = []

    def epoch(self, spent: float) -> None:
        x = torch.randint(0, 256, (4, 16), generator=self.gen)
        self.optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(self.host(x).flatten(0, 1), x.flatten()).backward()
        self.optimizer.step()
        self.engine.capture_gradient_stats()
        blended = {sid: 0.1 for sid, s in self.engine.slots.items()
                   if s.stage in (SeedStage.BLENDING, SeedStage.HOLDING)}
        self.engine.record_epoch(30.0, 2.0, 2.1, blended)
        self.engine.train_flops = spent
        report = self.engine.report(self.max_epochs)
        action = self.controller.decide(report)
        outcome = self.engine.execute(action)
        assert outcome.success, (report.epoch, action, outcome.reason)
        self.engine.tick()
        slot = report.slot_ids[action.slot] if action.op != Op.WAIT else None
        self.decisions.append((report.spent_fraction, action.op, slot))


EXPECTED_GROWTH = [
    (Op.GERMINATE, "r1c0"), (Op.ADVANCE, "r1c0"), (Op.ADVANCE, "r1c0"),  # to BLENDING
    (Op.GERMINATE, "r1c1"), (Op.ADVANCE, "r1c1"), (Op.ADVANCE, "r1c1"),
    (Op.GERMINATE, "r1c2"), (Op.ADVANCE, "r1c2"), (Op.ADVANCE, "r1c2"),  # 4 blocks at alpha 1
    (Op.ADVANCE, "r1c0"), (Op.ADVANCE, "r1c1"), (Op.ADVANCE, "r1c2"),  # to HOLDING
    (Op.FOSSILIZE, "r1c0"), (Op.FOSSILIZE, "r1c1"), (Op.FOSSILIZE, "r1c2"),
]


@pytest.mark.parametrize("init", ["copy", "identity", "random"])
def test_stack_waits_until_tau_then_grows_three_blocks_as_fast_as_the_lifecycle_allows(init):
    episode = Episode(StackController(depth=4, tau=0.5, init=init))
    for k in range(1, 27):  # 5 % of the budget per epoch: the 10th report is at tau
        episode.epoch(spent=5.0 * k)
    before = [(f, op) for f, op, _ in episode.decisions if f < 0.5]
    assert len(before) == 9 and all(op == Op.WAIT for _, op in before)
    after = [(op, slot) for f, op, slot in episode.decisions if f >= 0.5]
    assert after[:15] == EXPECTED_GROWTH and after[15] == (Op.WAIT, None)
    slots = episode.engine.slots
    assert [(slots[s].stage, slots[s].state.blueprint) for s in GROWTH] == (
        [(SeedStage.FOSSILIZED, f"block_{init}")] * 3)


def test_stack_without_a_budget_reads_the_epochs_and_refuses_an_unknown_run_length():
    episode = Episode(StackController(depth=2, tau=0.25), budget=None, max_epochs=8)
    for _ in range(4):
        episode.epoch(spent=0.0)
    assert [op for _, op, _ in episode.decisions] == [Op.WAIT, Op.GERMINATE, Op.ADVANCE,
                                                      Op.ADVANCE]
    assert episode.decisions[1][0] == 0.25  # the second epoch's report: 2 / 8
    assert episode.decisions[1][2] == "r1c2"  # one seed: the last slot
    blind = Episode(StackController(depth=2, tau=0.25), budget=None, max_epochs=None)
    with pytest.raises(ConfigError, match="needs a compute budget or a planned number of epochs"):
        blind.epoch(spent=0.0)


def test_stack_grows_in_the_slots_it_is_given_and_refuses_too_few():
    episode = Episode(StackController(depth=3, tau=0.0, slots=("r1c1", "r1c0")))
    for k in range(1, 4):
        episode.epoch(spent=float(k))
    assert [slot for _, _, slot in episode.decisions] == ["r1c1", "r1c1", "r1c1"]
    with pytest.raises(ConfigError, match="2 block seed"):
        StackController(depth=3, tau=0.5, slots=("r1c0",))
    few = Episode(StackController(depth=4, tau=0.0), slots=("r1c0", "r1c1"))
    with pytest.raises(ConfigError, match="3 block seed"):
        few.epoch(spent=1.0)


def test_stack_reacts_to_a_governor_prune_and_regrows():
    episode = Episode(StackController(depth=2, tau=0.0))
    for k in range(1, 4):
        episode.epoch(spent=float(k))
    assert episode.engine.slots["r1c2"].stage == SeedStage.BLENDING
    episode.engine.prune_live("rollback")
    for k in range(4, 14):
        episode.epoch(spent=float(k))
    ops = [op for _, op, _ in episode.decisions[3:]]
    assert Op.GERMINATE in ops and ops[0] == Op.WAIT  # the embargo first, then again
    assert episode.engine.slots["r1c2"].stage in LIVE_STAGES | {SeedStage.FOSSILIZED}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"depth": 1, "tau": 0.5}, "depth 1 must exceed the host's 1 block"),
     ({"depth": 4, "tau": 1.0}, r"tau must be in \[0, 1\), got 1.0"),
     ({"depth": 4, "tau": 0.5, "init": "zero"}, "unknown init 'zero'; accepted: copy, "
                                                 "identity, random")],
)
def test_bad_stack_settings_are_one_line_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        StackController(**kwargs)


def test_stack_state_is_a_header_and_earliest_germination_follows_tau():
    controller = StackController(depth=4, tau=0.5)
    state = torch_round_trip(controller.state_dict())
    assert state == {"controller": "stack", "version": 1}
    StackController(depth=4, tau=0.8).load_state_dict(state)
    with pytest.raises(ValueError, match="expected 'stack'"):
        controller.load_state_dict({"controller": "static", "version": 1})
    assert controller.earliest_germination(20) == 9  # (9 + 1) / 20 = 0.5
    assert StackController(depth=4, tau=0.0).earliest_germination(20) == 0
    assert controller.earliest_germination(None) is None


# --- compare specs -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "parsed"),
    [("4@0.5", (4, 0.5, "copy")), ("4@0.25:identity", (4, 0.25, "identity")),
     ("3@.8:random", (3, 0.8, "random"))],
)
def test_parse_stack(text, parsed):
    assert parse_stack(text) == parsed
    assert parse_controller(f"stack:{text}").kind == "stack"


@pytest.mark.parametrize("text", ["4", "4@", "@0.5", "4@0.5:", "4@1..2", "x@0.5:copy"])
def test_bad_stack_spec_is_one_line(text):
    with pytest.raises(ConfigError, match=r"accepted: stack:K@TAU\[:INIT\]|is not a number"):
        parse_stack(text)


def test_stack_and_born_specs_are_checked_against_the_host():
    assert stack_controller("4@0.5:identity", 1, GROWTH, "transformer").n_seeds == 3
    with pytest.raises(ConfigError, match=r"grows 3 block seed.*has 2 slot"):
        stack_controller("4@0.5", 1, GROWTH[:2], "transformer")
    with pytest.raises(ConfigError, match="'block_copy' does not exist for topology 'cnn'"):
        stack_controller("4@0.5", 1, ("r0c0", "r0c1", "r0c2"), "cnn")
    assert born_implants("3", 1, GROWTH) == (("r1c1", "block_random"), ("r1c2", "block_random"))
    with pytest.raises(ConfigError, match="accepted: born:K"):
        born_implants("four", 1, GROWTH)
    with pytest.raises(ConfigError, match="between 1 and 3 block seeds"):
        born_implants("5", 1, GROWTH)


def test_docstring_examples_run():
    result = doctest.testmod(stack_module)
    assert result.attempted > 0 and result.failed == 0


def test_lm_comparison_of_stack_born_and_static_on_grow4(text_file, tmp_path):
    values = preset_values("lm-smoke", CompareConfig)
    config = CompareConfig(**{
        **values, "data_dir": str(text_file), "out": str(tmp_path / "out"),
        "host_preset": "grow4", "slots": GROWTH, "episode_length": 20, "train_subset": 32,
        "controllers": ("static", "born:4", "stack:4@0.15:identity"), "seeds": 1, "envs": 3,
        "progress": False})
    records = {r.controller: r for r in Comparison(config).run()}
    random_blocks = tuple((s, "block_random") for s in GROWTH)
    assert records["born:4"]["final_seeds"] == random_blocks
    assert records["born:4"]["seeds_germinated"] == 0
    assert records["stack:4@0.15:identity"]["final_seeds"] == tuple(
        (s, "block_identity") for s in GROWTH)
    assert records["stack:4@0.15:identity"]["seeds_fossilized"] == 3
    assert records["static"]["seed_params"] == 0
    assert records["born:4"]["seed_params"] == records["stack:4@0.15:identity"]["seed_params"]


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
    assert ops[5] == (0.3, Op.GERMINATE) and ops[6][1] == Op.ADVANCE
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


def test_a_block_seed_in_a_slot_without_a_block_costs_a_turn_not_the_run():
    episode = Episode(StackController(depth=2, tau=0.0))
    report = episode.engine.report()
    action = Action(Op.GERMINATE, slot=0, blueprint="block_copy")
    assert report.masks.allows(action)  # the masks cannot see a slot's context...
    episode.host.slots["r1c0"].preceding = None
    outcome = episode.engine.execute(action)  # ...the engine refuses it as a WAIT
    assert not outcome.success and "follows none" in outcome.reason
