"""Load a grown model back from a Lightning checkpoint, seeds included.

A `SeedSlot` saves everything needed to rebuild its seed in its ``_extra_state`` (the slot's
manifest), so a model whose class declares its slots (like `CifarCNNHost`) loads with plain
``load_from_checkpoint``. Slots that `MorphogenesisCallback` injected after named submodules are
different: a freshly built model does not have them, so its strict load fails on the unexpected
``esper_slots.*`` keys. `restore_slots` injects them again from their manifests, and `load_grown`
does that between building the user's module and loading its weights.

Plain ``MyModule.load_from_checkpoint(path)`` cannot be made to do it from the checkpoint's
side: Lightning (2.6, ``lightning/pytorch/core/saving.py``, ``_load_state``) builds the class,
calls only the class's own ``configure_model`` and ``on_load_checkpoint``, then PyTorch's strict
``load_state_dict``; the checkpoint is read with ``weights_only`` by default, so nothing in it
runs. It therefore fails with PyTorch's ``Error(s) in loading state_dict for MyModule:
Unexpected key(s) in state_dict: "esper_slots...."``, and `MorphogenesisCallback` says, once
per fit where it writes such a checkpoint, to load it with ``load_grown(MyModule, path)``.

To make ``MyModule.load_from_checkpoint(path)`` work directly, call `restore_slots` (from
`esper_lightning.core.injection`) in the module's ``on_load_checkpoint`` hook, which Lightning
runs before it loads the state dict::

    class MyModule(L.LightningModule):
        def on_load_checkpoint(self, checkpoint):
            restore_slots(self, checkpoint["state_dict"])
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any, TypeVar

import lightning as L
import torch

from esper_lightning.core.injection import restore_slots

__all__ = ["load_grown"]

ModuleT = TypeVar("ModuleT", bound=L.LightningModule)

#: Entries every checkpoint written by a `lightning.Trainer` has.
_LIGHTNING_KEYS = ("state_dict", "pytorch-lightning_version")
#: Lightning's warnings for a non-strict load: the strict load that follows checks every key.
_NON_STRICT_WARNINGS = r"Found keys that are (not )?in the model state dict"


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
        # Named by its type: an instance's repr is the whole module, many lines long.
        what = (f"the class {cls.__qualname__}" if isinstance(cls, type)
                else f"an instance of {type(cls).__qualname__}")
        raise TypeError(f"load_grown needs a LightningModule subclass (the class, e.g. "
                        f"load_grown(MyModule, path)), got {what}")
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
    try:
        restore_slots(model, state_dict)
        model.load_state_dict(state_dict, strict=True)
    except (ValueError, RuntimeError) as err:  # torch's own message runs to many lines
        first = " ".join(str(err).split())[:300]
        raise ValueError(f"load_grown({cls.__qualname__}, '{checkpoint_path}'): the checkpoint "
                         f"does not fit {cls.__qualname__} ({first}); pass the LightningModule "
                         "class that wrote it") from None
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
