"""The docs site's generated reference pages (configuration keys, presets, commands, compare's
arms) are what `scripts/docs_reference.py` writes from the code today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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


def test_the_cli_page_names_every_command_that_takes_config_and_no_other(monkeypatch):
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_reference",
                                                  ROOT / "scripts" / "docs_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    names = ["ppo", "compare", "frontier run", "frontier select", "frontier report",
             "frontier widths", "lookup", "ship"]
    assert module._config_commands() == names
    text = (ROOT / "docs" / "reference" / "cli.md").read_text()
    assert f"Every command ({', '.join(f'`{n}`' for n in names)}) takes `--config FILE`" in text
    # A command without them would make the sentence false: the page is refused, not written.
    monkeypatch.setattr(module, "_own_parsers", lambda: {"bare": argparse.ArgumentParser()})
    with pytest.raises(ValueError, match="'esper-lightning bare' takes no --config/--print_config"):
        module._config_commands()
