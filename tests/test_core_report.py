"""`EpochReport` (`core.report`): its growth FLOPs, a part of its training FLOPs, and the reports
built or pickled before the field existed, which read 0 growth."""

from __future__ import annotations

import copyreg
import dataclasses
import pickle

import numpy as np
from lifecycle_mdp import make_report

from esper_lightning.core.report import EpochReport
from esper_lightning.core.slots import SeedSlot


def _report(**changes) -> EpochReport:
    """A report as the code before ``growth_flops`` built it (no such keyword), then
    ``changes``."""
    report = make_report([SeedSlot("r0c0", channels=4)], max_epochs=8)
    return dataclasses.replace(report, **changes)


class _OldPickle:
    """Pickles as an `EpochReport` pickled before ``growth_flops`` existed: its class, and its
    fields' state without that key (what pickle wrote for the dataclass then)."""

    def __init__(self, report: EpochReport) -> None:
        self.state = {k: v for k, v in vars(report).items() if k != "growth_flops"}

    def __reduce__(self):
        # ``_reconstructor``: an EpochReport made without ``__init__``, as pickle does
        return copyreg._reconstructor, (EpochReport, object, None), self.state


def test_a_report_built_without_growth_reads_none_and_keeps_what_it_is_given():
    assert _report().growth_flops == 0.0
    report = _report(train_flops=5e9, growth_flops=2e9, budget_flops=1e10)
    assert report.growth_flops == 2e9
    # Growth is a part of the training steps' FLOPs, not added to them: the budget reads those.
    assert report.budget_fraction == 0.5 and report.spent_fraction == 0.5


def _same(a: EpochReport, b: EpochReport) -> bool:
    """Field by field, the masks' arrays by value (an array's ``==`` is elementwise)."""
    masks = [np.array_equal(getattr(a.masks, f.name), getattr(b.masks, f.name))
             for f in dataclasses.fields(a.masks)]
    return all(masks) and all(getattr(a, f.name) == getattr(b, f.name)
                              for f in dataclasses.fields(a) if f.name != "masks")


def test_an_old_pickle_loads_with_zero_growth_and_a_new_one_keeps_its_growth():
    new = _report(train_flops=5e9, growth_flops=2e9)
    assert _same(pickle.loads(pickle.dumps(new)), new)
    old = pickle.loads(pickle.dumps(_OldPickle(new)))
    assert type(old) is EpochReport and "growth_flops" not in vars(old)
    assert old.growth_flops == 0.0 and old.train_flops == 5e9
    assert _same(old, dataclasses.replace(new, growth_flops=0.0))
    assert not _same(old, new)  # the comparison sees the growth
