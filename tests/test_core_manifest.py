"""A slot's manifest: what a loading slot refuses, and what older formats meant."""

from __future__ import annotations

import pytest

from esper_lightning.core.manifest import (
    MANIFEST_VERSION,
    blend_gradient_of,
    check_manifest,
    identity_of,
    saved_growth_blocks,
)
from esper_lightning.core.slots import SeedSlot


def _manifest(**changes):
    manifest = SeedSlot("r0c1", channels=8).manifest()
    manifest.update(changes)
    return manifest


@pytest.mark.parametrize(("manifest", "topology", "blocks", "message"), [
    ({"version": 0}, "cnn", None, "manifest version 0; accepted: 1"),
    ({"topology": "transformer"}, "cnn", None,
     "manifest topology 'transformer' != slot topology 'cnn'"),
    ({"growth": {"blocks": 2, "identity": None, "place": None}}, "cnn", None,
     "the manifest is of a growth slot of 2 block(s), this slot is no growth slot"),
    ({}, "cnn", 3, "the manifest is of no growth slot, this slot is a growth slot of 3 block"),
])
def test_a_manifest_the_slot_cannot_load_is_refused_in_one_line(manifest, topology, blocks,
                                                                 message):
    with pytest.raises(ValueError, match="slot 'r0c1': " + message.replace("(", r"\(")
                       .replace(")", r"\)")):
        check_manifest(_manifest(**manifest), "r0c1", topology, blocks)


def test_a_slot_that_still_infers_its_topology_takes_any():
    check_manifest(_manifest(topology="transformer"), "r0c1", None, None)
    check_manifest(_manifest(), "r0c1", "cnn", None)
    assert _manifest()["version"] == MANIFEST_VERSION


def test_older_formats_mean_what_they_meant():
    old = _manifest()
    del old["blend_gradient"], old["growth"]
    # CNN seeds were detached while blending before the key existed; others took the default.
    assert blend_gradient_of(old, "cnn") == "detached"
    assert blend_gradient_of(old, "transformer", default="through") == "through"
    assert blend_gradient_of(_manifest(blend_gradient="through"), "cnn") == "through"
    # Growth slots kept their blocks per seed as growth_depth (1 when absent).
    assert saved_growth_blocks(old, growth_slot=True) == 1
    assert saved_growth_blocks({**old, "growth_depth": 3}, growth_slot=True) == 3
    assert saved_growth_blocks(old, growth_slot=False) is None
    assert identity_of(old) is None
    assert identity_of(_manifest(growth={"blocks": 1, "identity": "gate"})) == "gate"
