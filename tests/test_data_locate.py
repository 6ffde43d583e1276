"""The torch-free split arithmetic and the text-size check the command line runs before torch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from esper_lightning.data.files import DataError
from esper_lightning.data.locate import (
    HELD_OUT_FRACTION,
    check_text_blocks,
    check_text_size,
    text_split_lengths,
)
from esper_lightning.data.text import TextDataModule, split_text


@pytest.mark.parametrize("fraction", [HELD_OUT_FRACTION, 0.2, 0.37, 0.5, 0.95])
def test_the_lengths_are_the_lengths_split_text_cuts(fraction: float):
    for n in range(1, 400):
        parts = split_text(torch.zeros(n, dtype=torch.uint8), fraction)
        assert text_split_lengths(n, fraction) == tuple(map(len, parts)), n
    assert text_split_lengths(31) == (28, 1, 2)  # the test half takes the odd byte


def test_a_bad_fraction_is_refused():
    for bad in (0.0, 1.0, -0.1, True):
        with pytest.raises(ValueError, match="val_fraction must be in"):
            text_split_lengths(100, bad)


def test_each_part_must_hold_one_block_and_its_target():
    check_text_blocks((17, 17, 17), 16, "a.txt")  # T + 1 tokens: one block
    for lengths, part in (((16, 17, 17), "training head"), ((17, 16, 17), "validation split"),
                          ((17, 17, 16), "test split")):
        with pytest.raises(DataError, match=f"its {part} holds 16 of its 50 bytes and one "
                                            "block needs 17"):
            check_text_blocks(lengths, 16, "a.txt")


@pytest.mark.parametrize(("size", "block_size"), [(31, 32), (31, 8), (100, 4), (200, 9),
                                                  (200, 8), (5000, 32)])
def test_the_size_check_says_what_reading_the_text_says(tmp_path: Path, size: int,
                                                         block_size: int):
    path = tmp_path / "t.txt"
    path.write_bytes(b"x" * size)
    module = TextDataModule(path, block_size=block_size)

    def error(check) -> str | None:
        try:
            check()
        except DataError as err:
            return str(err)
        return None

    from_size = error(lambda: check_text_size(path, block_size))
    assert from_size == error(module.setup)
    assert (from_size is None) == (min(text_split_lengths(size)) > block_size)
