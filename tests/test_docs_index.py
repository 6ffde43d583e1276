"""docs/index.md's first screen (what mkdocs-material shows at 1280×800 before any scrolling):
the install commands and the headline results, each number copied from the README or
docs/results.md."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INDEX = ROOT / "docs" / "index.md"
#: A number as the results write them: 0.016, +0.021, −0.029, 1.11×.
NUMBER = re.compile(r"[+−]?\d+\.\d+×?")


def first_screen() -> str:
    """The page up to its first picture or second-level heading: about 25 lines of Markdown,
    which the theme renders in under 700 pixels at that size."""
    text = INDEX.read_text()
    return re.split(r"\n!\[|\n## ", text, maxsplit=1)[0]


def test_the_first_screen_has_the_install_commands_and_the_results():
    screen = first_screen()
    assert len(screen.splitlines()) <= 32
    for command in ("pip install torch --index-url https://download.pytorch.org/whl/cpu",
                    "pip install -e .", "python examples/cifar_ppo.py --preset smoke"):
        assert f"\n{command}" in screen, command
    assert "**What it has shown**" in screen and "[Results](results.md)" in screen


def test_every_number_on_the_first_screen_is_the_readmes_or_the_results():
    sources = (ROOT / "README.md").read_text() + (ROOT / "docs" / "results.md").read_text()
    shown = first_screen().split("**What it has shown**", 1)[1]
    numbers = NUMBER.findall(shown)
    assert len(numbers) >= 8  # the claims carry their intervals
    assert [n for n in numbers if n not in sources] == []
