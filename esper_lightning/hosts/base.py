"""`SlottedHost`: what every built-in host shares — seed slots at fixed places, in action order."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import lightning as L
from torch import Tensor, nn

from esper_lightning.core.slots import SeedSlot, host_parameters


class SlottedHost(L.LightningModule):
    """A `LightningModule` whose architecture offers slots at named places.

    Subclasses call `_build_slots` in ``__init__`` and pass activations through `_slot` at each
    place; the keys of ``slots`` are then the action order controllers see (the canonical order
    of the architecture, whatever order the user listed the slots in).
    """

    slots: nn.ModuleDict

    def _build_slots(
        self,
        available: Sequence[str],
        requested: Sequence[str] | None,
        preset: str,
        make_slot: Callable[[str], SeedSlot],
    ) -> None:
        chosen = tuple(available if requested is None else requested)
        unknown = [s for s in chosen if s not in available]
        if unknown:
            raise ValueError(
                f"unknown slot id(s) {', '.join(map(repr, unknown))} for preset {preset!r}; "
                f"accepted: {', '.join(available)}"
            )
        self.slots = nn.ModuleDict({sid: make_slot(sid) for sid in available if sid in chosen})

    def _slot(self, slot_id: str, x: Tensor) -> Tensor:
        return self.slots[slot_id](x) if slot_id in self.slots else x

    def host_parameters(self) -> list[nn.Parameter]:
        """Parameters of the host itself, excluding any seed."""
        return host_parameters(self)
