"""Load a grown model back from a Lightning checkpoint, seeds included.

A `SeedSlot` saves everything needed to rebuild its seed in its ``_extra_state`` (the slot's
manifest), so a model whose class declares its slots (like `CifarCNNHost`) loads with plain
``load_from_checkpoint``. Slots that `MorphogenesisCallback` injected after named submodules are
different: a freshly built model does not have them, so its strict load fails on the unexpected
``esper_slots.*`` keys. `restore_slots` injects them again from their manifests, and `load_grown`
does that between building the user's module and loading its weights.

To make ``MyModule.load_from_checkpoint(path)`` work directly, call `restore_slots` from the
module's ``on_load_checkpoint`` hook, which Lightning runs before it loads the state dict::

    class MyModule(L.LightningModule):
        def on_load_checkpoint(self, checkpoint):
            restore_slots(self, checkpoint["state_dict"])
"""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import lightning as L
import torch
from torch import nn

from esper_lightning.core.injection import INJECTED_SLOTS_ATTR, resolve_slots

__all__ = ["load_grown", "restore_slots"]

ModuleT = TypeVar("ModuleT", bound=L.LightningModule)

#: Entries every checkpoint written by a `lightning.Trainer` has.
_LIGHTNING_KEYS = ("state_dict", "pytorch-lightning_version")
#: Suffix under which ``nn.Module.get_extra_state`` is saved (a slot's manifest).
_EXTRA_STATE = "._extra_state"
#: Lightning's warnings for a non-strict load: the strict load that follows checks every key.
_NON_STRICT_WARNINGS = r"Found keys that are (not )?in the model state dict"


def restore_slots(model: nn.Module, state_dict: Mapping[str, Any]) -> tuple[str, ...]:
    """Inject into ``model`` the slots that were injected when ``state_dict`` was saved.

    Each ``esper_slots.<key>._extra_state`` entry is an injected slot's manifest, which names
    its module path (``slot_id``) and topology. After this, ``model.load_state_dict(state_dict)``
    loads strictly and rebuilds every seed (stage, alpha, blend) with its weights. Slots already
    present are kept (their hook is re-attached), so calling it twice is harmless.

    Args:
        model: a freshly built model (e.g. a LightningModule) of the class that was trained.
        state_dict: the saved state dict (``checkpoint["state_dict"]`` for Lightning).

    Returns:
        The module paths of the injected slots, in state-dict order.

    Raises:
        ValueError: a manifest that does not match its key, or a path ``model`` lacks.

    Example:
        >>> class MyModule(L.LightningModule):
        ...     def on_load_checkpoint(self, checkpoint):
        ...         restore_slots(self, checkpoint["state_dict"])
    """
    saved = _saved_slots(state_dict)
    for topology in dict.fromkeys(saved.values()):
        resolve_slots(model, [p for p, t in saved.items() if t == topology], topology)
    return tuple(saved)


def load_grown(
    cls: type[ModuleT], checkpoint_path: str | Path, map_location: Any = None, **kwargs: Any
) -> ModuleT:
    """Load a checkpoint written by a fit with `MorphogenesisCallback` into ``cls``, seeds and all.

    Builds the module with ``cls.load_from_checkpoint`` (hyper-parameters, ``map_location``
    and ``kwargs`` work as there), injects the checkpoint's injected slots (`restore_slots`) and
    loads the whole state dict strictly, so every seed comes back in its stage with its weights
    and alpha. Slots the class declares itself come back through the same strict load.

    Args:
        cls: the user's LightningModule class that was trained.
        checkpoint_path: a local ``.ckpt`` file written by a `lightning.Trainer`.
        map_location: as for ``load_from_checkpoint``.
        **kwargs: passed to ``load_from_checkpoint`` (hyper-parameter overrides,
            ``hparams_file``, ``weights_only``); not ``strict``, the final load is always strict.

    Returns:
        The loaded module (in training mode, as ``load_from_checkpoint`` returns it).

    Raises:
        FileNotFoundError: no file at ``checkpoint_path``.
        ValueError: a file that is not a Lightning checkpoint, or a ``strict`` argument.
        TypeError: ``cls`` is not a LightningModule subclass.

    Example:
        >>> model = load_grown(MyModule, "checkpoints/last.ckpt")  # doctest: +SKIP
        >>> shipped = esper_lightning.core.export(model.eval(), example)  # doctest: +SKIP
    """
    if not (isinstance(cls, type) and issubclass(cls, L.LightningModule)):
        raise TypeError(f"load_grown needs a LightningModule subclass, got {cls!r}")
    if "strict" in kwargs:
        raise ValueError(f"load_grown always loads strictly; drop strict={kwargs['strict']!r}")
    checkpoint = _read_checkpoint(Path(checkpoint_path), kwargs.get("weights_only"))
    state_dict = checkpoint["state_dict"]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NON_STRICT_WARNINGS)
        # Not strict yet: the injected slots' keys have no module until restore_slots.
        model = cls.load_from_checkpoint(
            checkpoint_path, map_location=map_location, strict=False, **kwargs
        )
    restore_slots(model, state_dict)
    model.load_state_dict(state_dict, strict=True)
    return model


def _read_checkpoint(path: Path, weights_only: bool | None) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {str(path)!r}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=weights_only)
    except (RuntimeError, pickle.UnpicklingError, EOFError, ValueError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ValueError(f"cannot read {str(path)!r} as a torch checkpoint: {reason}") from error
    if not isinstance(checkpoint, dict) or any(k not in checkpoint for k in _LIGHTNING_KEYS):
        raise ValueError(
            f"{str(path)!r} is not a Lightning checkpoint (it needs the entries "
            f"{', '.join(map(repr, _LIGHTNING_KEYS))}); save it with a lightning.Trainer"
        )
    return checkpoint


def _saved_slots(state_dict: Mapping[str, Any]) -> dict[str, str]:
    """Injected slots in a state dict: module path -> topology, read from their manifests."""
    prefix = INJECTED_SLOTS_ATTR + "."
    saved: dict[str, str] = {}
    for key, manifest in state_dict.items():
        if not (key.startswith(prefix) and key.endswith(_EXTRA_STATE)):
            continue
        name = key[len(prefix):-len(_EXTRA_STATE)]
        if "." in name:  # extra state of a module inside a slot, not a slot's manifest
            continue
        if not isinstance(manifest, Mapping) or not {"slot_id", "topology"} <= manifest.keys():
            raise ValueError(f"state dict entry {key!r} is not a slot manifest")
        path = manifest["slot_id"]
        if not isinstance(path, str) or path.replace(".", "__") != name:
            raise ValueError(f"state dict entry {key!r} holds the manifest of slot {path!r}")
        saved[path] = manifest["topology"]
    return saved
