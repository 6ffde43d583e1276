"""`core.outcome`: accuracy and parameter cost averaged over the same epochs, read from the
engine's reports."""

import pytest
import torch
from torch import nn

from esper_lightning.core.engine import MorphogenesisEngine
from esper_lightning.core.outcome import episode_outcome, parameter_cost, report_outcome
from esper_lightning.core.slots import SeedSlot


def test_the_cost_is_the_mean_of_the_last_epochs():
    assert parameter_cost([900, 0, 600, 600, 0], 1000, 1.0) == pytest.approx(0.4)
    assert parameter_cost([300, 300, 300], 1000, 0.0) == 0.0
    assert episode_outcome([40.0, 50.0, 60.0], [0, 0, 300], 1000, 3.0) == pytest.approx(49.7)
    with pytest.raises(ValueError, match="last 3 epochs, got 2"):
        parameter_cost([1, 2], 1000, 1.0)


def test_the_engine_reports_the_seeds_present_at_each_accuracy():
    torch.manual_seed(0)
    model = nn.Module()
    model.slot = SeedSlot("r0c0", channels=4)
    model.host = nn.Linear(4, 4)
    engine = MorphogenesisEngine(model)
    engine.record_epoch(40.0)
    engine.slots["r0c0"].germinate("norm")
    size = engine.seed_params
    engine.record_epoch(50.0)
    engine.record_epoch(55.0)
    engine.slots["r0c0"].prune("test")  # gone before the last epoch is measured
    engine.record_epoch(56.0)
    report = engine.report()
    assert report.seed_params_history == (0, size, size, 0) and report.seed_params == 0
    assert report_outcome(report, 2.0) == pytest.approx(
        (50.0 + 55.0 + 56.0) / 3 - 2.0 * (2 * size / 3) / engine.host_params)
    restored = MorphogenesisEngine(model)
    restored.load_state_dict(engine.state_dict())
    assert restored.report().seed_params_history == report.seed_params_history
