"""A growth schedule looked up by budget: the strongest non-learned timing a practitioner tunes.

A `GrowthLookup` holds, for a few budgets (multiples of a task's base budget), the growth times
that played best there on tuning episodes (``esper-lightning lookup`` writes one from a
comparison of ``stack:`` arms, `esper_lightning.app.compare.lookup`), or "never" where not
growing played best. `LookupController` grows at the times the table gives for the episode's
budget (`EpochReport.budget_scale`), **interpolated linearly in log budget** between the two
tabled budgets around it and held at the nearest one outside them. "Never" counts as a growth
time of 1 in the interpolation, and an interpolated time of 1 or more never grows: between a
budget that grows at 0.6 and one that never grows, the lookup grows late. A later growth slot
may never grow where the first does (``[0.3, 1]``: one growth, 1 -> 2 blocks of ``grow124``),
and interpolates the same way, slot by slot.

A lookup is a small JSON file::

    {"kind": "growth-lookup", "version": 1, "operator": "identity", "depth": 2,
     "points": [{"scale": 0.5, "taus": null}, {"scale": 1.0, "taus": [0.4]},
                {"scale": 2.0, "taus": [0.2]}],
     "tuning": {...}}

``taus`` has one growth time per growth slot of the host (``stack:K@TAU,TAU``), and ``tuning``
says what choosing it cost (episodes, their rng seeds, the metric), so a comparison can count
the tuning a lookup needs per new setting against a policy's one-off training.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from esper_lightning.controllers.base import WAIT, check_state, state_header
from esper_lightning.controllers.stack import NEVER, StackController
from esper_lightning.core.actions import Action
from esper_lightning.core.report import EpochReport
from esper_lightning.errors import ConfigError, read_json_file

__all__ = ["LOOKUP_KIND", "GrowthLookup", "LookupController", "read_lookup"]

#: The ``kind`` a lookup file declares, and the version this code writes.
LOOKUP_KIND, LOOKUP_VERSION = "growth-lookup", 1


@dataclass(frozen=True)
class GrowthLookup:
    """Growth times by budget (the module docstring).

    Attributes:
        operator: the growth operator every growth uses.
        depth: the host's depth once grown (``K`` of ``stack:K@...``).
        points: ``(budget scale, taus or None for never)``, scales ascending.
        tuning: how it was chosen (free-form, written as it is).
    """

    operator: str
    depth: int
    points: tuple[tuple[float, tuple[float, ...] | None], ...]
    tuning: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        scales = [s for s, _ in self.points]
        if not scales or scales != sorted(set(scales)) or not all(s > 0 for s in scales):
            raise ConfigError(f"a growth lookup needs distinct budget scales > 0, ascending; "
                              f"got {scales}")
        widths = {len(t) for _, t in self.points if t is not None}
        if len(widths) > 1:
            raise ConfigError(f"a growth lookup gives one tau per growth slot at every budget; "
                              f"got {sorted(widths)} taus at different budgets")
        for scale, taus in self.points:
            if taus is not None and (not 0.0 <= taus[0] < NEVER or list(taus) != sorted(taus)
                                     or not all(t <= NEVER for t in taus)):
                raise ConfigError(f"growth lookup at budget scale {scale:g}: taus must be in "
                                  f"[0, 1) (a later slot's may be 1: never) and not decrease, "
                                  f"got {list(taus)}")

    @property
    def slots(self) -> int:
        """Growth times per budget (one per growth slot); 1 for a table that never grows."""
        return next((len(t) for _, t in self.points if t is not None), 1)

    def taus_at(self, scale: float) -> tuple[float, ...] | None:
        """The growth times at budget ``scale`` (None: never grow; see the module docstring).

        Example:
            >>> table = GrowthLookup("identity", 2, ((0.5, None), (1.0, (0.4,)), (2.0, (0.2,))))
            >>> table.taus_at(1.0), table.taus_at(8.0), table.taus_at(0.5) is None
            ((0.4,), (0.2,), True)
            >>> tuple(round(table.taus_at(s)[0], 6) for s in (math.sqrt(2), math.sqrt(0.5)))
            (0.3, 0.7)
        """
        scales = [s for s, _ in self.points]
        i = bisect.bisect_left(scales, scale)
        if i < len(scales) and scales[i] == scale:
            return self.points[i][1]
        if i == 0 or i == len(scales):
            return self.points[min(i, len(scales) - 1)][1]
        (low, below), (high, above) = self.points[i - 1], self.points[i]
        w = (math.log(scale) - math.log(low)) / (math.log(high) - math.log(low))
        never = (NEVER,) * self.slots
        taus = tuple((1 - w) * a + w * b for a, b in zip(below or never, above or never,
                                                         strict=True))
        return None if taus[0] >= NEVER else taus

    def to_dict(self) -> dict[str, Any]:
        return {"kind": LOOKUP_KIND, "version": LOOKUP_VERSION, "operator": self.operator,
                "depth": self.depth,
                "points": [{"scale": s, "taus": None if t is None else list(t)}
                           for s, t in self.points],
                "tuning": dict(self.tuning)}

    def write(self, path: str | Path) -> Path:
        """Write the table as JSON to ``path`` (its folder is made)."""
        file = Path(path)
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return file

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "lookup") -> GrowthLookup:
        """The table of a `to_dict` object; one-line `ConfigError` naming what is wrong."""
        if not isinstance(data, Mapping) or data.get("kind") != LOOKUP_KIND:
            raise ConfigError(f"{source} is not a growth lookup (its kind must be "
                              f"{LOOKUP_KIND!r})")
        if data.get("version") != LOOKUP_VERSION:
            raise ConfigError(f"{source} has version {data.get('version')!r}; accepted: "
                              f"{LOOKUP_VERSION}")
        try:
            points = tuple((float(p["scale"]), None if p["taus"] is None
                            else tuple(float(t) for t in p["taus"])) for p in data["points"])
            return cls(str(data["operator"]), int(data["depth"]), points,
                       dict(data.get("tuning", {})))
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(f"{source} is not a well-formed growth lookup: {err}") from None


def read_lookup(path: str | Path) -> GrowthLookup:
    """The growth lookup in the JSON file ``path`` (one-line `ConfigError` otherwise)."""
    data = read_json_file(path, "growth lookup")
    return GrowthLookup.from_dict(data, source=f"growth lookup '{Path(path)}'")


class LookupController(StackController):
    """Grow at the times a `GrowthLookup` gives for the episode's budget.

    At each decision it reads the budget's growth times off the table
    (`GrowthLookup.taus_at` of `EpochReport.budget_scale`) and plays `StackController` with
    them; where the table says never, it waits.

    Args:
        lookup: the table.
        slots: growth slot ids to grow in, in order (None: every growth slot of the run).

    Example:
        >>> table = GrowthLookup("identity", 2, ((0.5, None), (2.0, (0.2,))))
        >>> LookupController(table).blueprint
        'block_identity'
    """

    def __init__(self, lookup: GrowthLookup, slots: Sequence[str] | None = None) -> None:
        first = next((t for _, t in lookup.points if t is not None), (0.0,) * lookup.slots)
        super().__init__(first if len(first) > 1 else first[0], lookup.operator, slots)
        self.lookup = lookup

    def decide(self, report: EpochReport) -> Action:
        taus = self.lookup.taus_at(report.budget_scale)
        if taus is None:
            self.last_reason = f"the lookup never grows at budget scale {report.budget_scale:.3g}"
            return WAIT
        self.taus = taus
        return super().decide(report)

    def state_dict(self) -> dict[str, Any]:
        return state_header("lookup") | {"lookup": self.lookup.to_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, "lookup", ("lookup",))
        saved = GrowthLookup.from_dict(state["lookup"], source="the saved lookup")
        if saved != self.lookup:
            raise ValueError("the saved lookup controller played another table; load it into "
                             "a LookupController of the same GrowthLookup")
