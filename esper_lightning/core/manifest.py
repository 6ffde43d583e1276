"""A slot's manifest: the plain data that rebuilds its seed, its version and its migrations.

A `SeedSlot` saves its manifest as the module's extra state (`SeedSlot.manifest`), so a
checkpoint's ``state_dict`` rebuilds every seed before its weights load. What a manifest must
say to be loaded into a slot, and what a manifest written by an older version meant, live here;
the slot adopts what it says (`SeedSlot.load_manifest`).

Migrations (a checkpoint of every earlier format resumes exactly):

* before ``blend_gradient`` was saved, a CNN slot's BLENDING seeds were detached from the host
  (`blend_gradient_of`);
* before growth sites, a growth slot saved its blocks per seed as ``growth_depth``
  (`saved_growth_blocks`).

Example:
    >>> check_manifest({"version": MANIFEST_VERSION, "topology": "cnn", "growth": None},
    ...                "r0c1", topology="cnn", growth_blocks=None)
    >>> blend_gradient_of({"topology": "cnn"}, "cnn")  # written before the key existed
    'detached'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["MANIFEST_VERSION", "blend_gradient_of", "check_manifest", "identity_of",
           "saved_growth_blocks"]

MANIFEST_VERSION = 1
#: What a manifest written before ``blend_gradient`` existed meant, per topology.
_LEGACY_BLEND_GRADIENT = {"cnn": "detached"}


def check_manifest(manifest: Mapping[str, Any], slot_id: str, topology: str | None,
                   growth_blocks: int | None) -> None:
    """Refuse, in one line, a manifest this slot cannot load: another version, another
    topology, or a growth slot of another size (a host of another shape).

    Args:
        manifest: The saved manifest.
        slot_id: The slot loading it (for the message).
        topology: The slot's topology (None: it still infers its own, and adopts the saved).
        growth_blocks: Blocks per seed of the slot's growth site; None: not a growth slot.
    """
    if manifest.get("version") != MANIFEST_VERSION:
        raise ValueError(f"slot {slot_id!r}: manifest version {manifest.get('version')!r}; "
                         f"accepted: {MANIFEST_VERSION}")
    saved_topology = manifest.get("topology")
    if None not in (saved_topology, topology) and saved_topology != topology:
        raise ValueError(f"slot {slot_id!r}: manifest topology {saved_topology!r} "
                         f"!= slot topology {topology!r}")
    saved = saved_growth_blocks(manifest, growth_blocks is not None)
    if saved != growth_blocks:
        raise ValueError(f"slot {slot_id!r}: the manifest is of {_kind(saved)}, this slot is "
                         f"{_kind(growth_blocks)} (a model of another shape)")


def _kind(growth_blocks: int | None) -> str:
    return "no growth slot" if growth_blocks is None else (
        f"a growth slot of {growth_blocks} block(s)")


def saved_growth_blocks(manifest: Mapping[str, Any], growth_slot: bool) -> int | None:
    """Blocks per seed of the growth slot the manifest was saved from (None: not one). A
    manifest from before growth sites kept them as ``growth_depth`` (1 when absent) and did
    not say whether its slot grew; the loading slot's kind (``growth_slot``) says."""
    if "growth" not in manifest:
        return manifest.get("growth_depth", 1) if growth_slot else None
    growth = manifest["growth"]
    return None if growth is None else int(growth["blocks"])


def identity_of(manifest: Mapping[str, Any]) -> str | None:
    """How ``identity`` made copies in the saved growth slot, if it had checked."""
    growth = manifest.get("growth")
    return None if growth is None else growth.get("identity")


def blend_gradient_of(manifest: Mapping[str, Any], topology: str | None,
                      default: str = "through") -> str:
    """The saved ``blend_gradient``, or what a manifest from before it meant for ``topology``
    (``default``: the slots' own default, `core.slots.DEFAULT_BLEND_GRADIENT`, where the
    topology had none of its own)."""
    legacy = _LEGACY_BLEND_GRADIENT.get(topology or "", default)
    return str(manifest.get("blend_gradient", legacy))
