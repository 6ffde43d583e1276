"""docs/reference/tensorboard.md names every tag literal the package writes (a tag built by an
f-string is checked by its literal prefix, e.g. ``morpho/seeds_``)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: A tag literal in the package: a quoted ``family/name`` of the families the loggers write.
FAMILIES = "morpho|compute|governor|charts|actions|rewards|losses|compare"
TAG = re.compile(r"""["'](?:f")?((?:""" + FAMILIES + r""")/[a-z_]+)["'{]""")


def test_every_tag_the_package_writes_is_documented():
    text = (ROOT / "docs" / "reference" / "tensorboard.md").read_text()
    found = {m for path in (ROOT / "esper_lightning").rglob("*.py")
             for m in TAG.findall(path.read_text())}
    assert {"morpho/seed_params", "compute/lr_multiplier", "governor/rollbacks"} <= found
    missing = sorted(tag for tag in found if f"`{tag}" not in text)
    assert not missing, f"docs/reference/tensorboard.md does not name {missing}"
