"""The docs site's generated reference pages (configuration keys, presets, commands, compare's
arms) are what `scripts/docs_reference.py` writes from the code today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_generated_reference_pages_are_up_to_date():
    done = subprocess.run([sys.executable, "scripts/docs_reference.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_configuration_page_documents_every_key():
    import dataclasses

    from esper_lightning.app.config import CompareConfig, PPORunConfig

    text = (ROOT / "docs" / "reference" / "configuration.md").read_text()
    for cls in (PPORunConfig, CompareConfig):
        for field in dataclasses.fields(cls):
            row = next(line for line in text.splitlines() if line.startswith(f"| `{field.name}` |"))
            assert not row.endswith("|  |"), f"{field.name} has no description"
