"""Where the data is on disk: CIFAR-10's batch folder and a text task's file, found, or refused
with a one-line `DataError`; and how a text splits (`text_split_lengths`), so a file too short
for its blocks is refused from its size alone.

Plain Python, no torch: the command line checks a data path with these before it imports torch
and Lightning, so a wrong ``--data-dir`` or a text too short is one line at once, the same line
the data loaders (`data.cifar10`, `data.text`, which re-export these names) raise when they read
the data.

Example:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     cifar10_present(tmp)
    False
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from esper_lightning.data.files import DataError, PathLike, resolve_data_dir

__all__ = [
    "FOLDER_NAME",
    "HELD_OUT_FRACTION",
    "TEST_FILES",
    "TINYSTORIES_VALID_NAME",
    "TRAIN_FILES",
    "check_text_blocks",
    "check_text_size",
    "check_val_fraction",
    "cifar10_not_found",
    "cifar10_present",
    "find_batches_dir",
    "find_text_file",
    "missing_files",
    "text_split_lengths",
]

FOLDER_NAME = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILES = ("test_batch",)
#: The file `data.text.download_tinystories` writes, found first in a text folder.
TINYSTORIES_VALID_NAME = "TinyStories-valid.txt"
#: Share of a text held out at its end, never trained on. Its first half is the **validation**
#: split (every decision, tuning, reward and in-run evaluation reads it) and its second half the
#: **test** split (final tables only): `text_split_lengths`, the one split every text task uses.
HELD_OUT_FRACTION = 0.1
#: The parts of a split text, in file order, as messages name them.
_TEXT_PARTS = ("training head", "validation split", "test split")


def missing_files(folder: Path) -> list[str]:
    """The CIFAR-10 batch files ``folder`` lacks, in order."""
    return [name for name in (*TRAIN_FILES, *TEST_FILES) if not (folder / name).is_file()]


def find_batches_dir(data_dir: PathLike | None) -> Path | None:
    """Locate the folder holding the batch files, or ``None`` when there is no complete copy.

    Args:
        data_dir: Either the folder that contains ``cifar-10-batches-py/`` or that folder itself;
            ``None`` means :func:`default_data_dir`.
    """
    root = resolve_data_dir(data_dir)
    for candidate in (root / FOLDER_NAME, root):
        if candidate.is_dir() and not missing_files(candidate):
            return candidate
    return None


def cifar10_present(data_dir: PathLike | None) -> bool:
    """Whether ``data_dir`` holds a complete CIFAR-10 copy (all batch files exist)."""
    return find_batches_dir(data_dir) is not None


def cifar10_not_found(root: Path) -> DataError:
    """The error for a folder ``root`` with no complete CIFAR-10 copy (a partial copy's missing
    files named)."""
    partial = root / FOLDER_NAME if (root / FOLDER_NAME).is_dir() else root
    missing = missing_files(partial) if partial.is_dir() else []
    # Listing every file is noise when none is there; name the gaps of a partial copy only.
    partly_there = 0 < len(missing) < len(TRAIN_FILES) + len(TEST_FILES)
    detail = f" (missing {', '.join(missing)})" if partly_there else ""
    return DataError(
        f"CIFAR-10 not found in '{root}': expected {FOLDER_NAME}/ with data_batch_1..5 and "
        f"test_batch{detail}; pass download=True (or --download) or point --data-dir / "
        "ESPER_DATA_DIR at an existing copy"
    )


def find_text_file(path: PathLike | None, downloadable: bool = True) -> Path:
    """The text file a user pointed at: a file as is, or the one file a folder holds.

    A folder holds its text when it has ``TinyStories-valid.txt`` (what
    `data.text.download_tinystories` writes) or else exactly one ``*.txt`` file.

    Args:
        path: A text file or a folder; ``None`` means :func:`default_data_dir`.
        downloadable: Whether the caller can download the text (``--download``), which the
            refusal then offers; a caller that cannot (``frontier run``), or that was named a
            text to learn (the examples' ``--text``), passes False.

    Raises:
        DataError: No such file or folder, or a folder with no text file or several.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     _ = (Path(tmp) / "plays.txt").write_text("To be, or not to be")
        ...     find_text_file(tmp).name
        'plays.txt'
    """
    target = resolve_data_dir(path)
    if target.is_file():
        return target
    hint = "pass a text file or a folder holding one" + (
        ", or download=True (--download) for the TinyStories validation split"
        if downloadable else "")
    if not target.is_dir():
        raise DataError(f"text file or folder '{target}' not found; {hint}")
    if (target / TINYSTORIES_VALID_NAME).is_file():
        return target / TINYSTORIES_VALID_NAME
    found = sorted(p for p in target.glob("*.txt") if p.is_file())
    if len(found) != 1:
        what = "no *.txt file" if not found else f"{len(found)} *.txt files"
        raise DataError(f"folder '{target}' holds {what}; {hint}")
    return found[0]


def text_split_lengths(n_tokens: int,
                       held_out_fraction: float = HELD_OUT_FRACTION) -> tuple[int, int, int]:
    """Tokens in each part of a text of ``n_tokens``: the training head, then the held-out
    tail (``held_out_fraction`` of the tokens, rounded down) cut in two halves, validation
    first and test last (the test half takes the odd token). `data.text.split_text` cuts by
    these lengths.

    Raises:
        ValueError: ``held_out_fraction`` is outside (0, 1).

    Example:
        >>> text_split_lengths(200), text_split_lengths(31)
        ((180, 10, 10), (28, 1, 2))
    """
    check_val_fraction(held_out_fraction)
    held_out = int(n_tokens * held_out_fraction)
    return n_tokens - held_out, held_out // 2, held_out - held_out // 2


def check_val_fraction(val_fraction: object) -> None:
    """A `ValueError` unless ``val_fraction`` (a text's held-out share) is a number in (0, 1)."""
    if isinstance(val_fraction, bool) or not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction!r}")


def check_text_blocks(lengths: Sequence[int], block_size: int, file: PathLike) -> None:
    """A one-line `DataError` unless each part of a split text holds one block.

    A block of ``T`` tokens and its shifted targets need ``T + 1`` tokens, in the training head,
    the validation split and the test split alike (`text_split_lengths`).

    Args:
        lengths: tokens in the training head, the validation split and the test split.
        block_size: tokens per block ``T``.
        file: the text file, named in the message.

    Raises:
        DataError: A part holds fewer than ``block_size + 1`` tokens.
    """
    for part, length in zip(_TEXT_PARTS, lengths, strict=True):
        if length < block_size + 1:
            raise DataError(
                f"text file '{file}' is too short for block_size={block_size}: its {part} holds "
                f"{length} of its {sum(lengths)} bytes and one block needs "
                f"{block_size + 1}; use a smaller block_size or a longer text"
            )


def check_text_size(file: PathLike, block_size: int,
                    held_out_fraction: float = HELD_OUT_FRACTION) -> None:
    """`check_text_blocks` from the file's size alone (its bytes are its tokens), before
    anything reads it: what the command line runs before torch loads.

    Raises:
        DataError: A part of the split text holds fewer than ``block_size + 1`` bytes.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     _ = (Path(tmp) / "a.txt").write_text("x" * 100)
        ...     check_text_size(Path(tmp) / "a.txt", block_size=8)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        esper_lightning.data.files.DataError: text file '...a.txt' is too short for block_size=8...
    """
    n_tokens = Path(file).expanduser().stat().st_size
    check_text_blocks(text_split_lengths(n_tokens, held_out_fraction), block_size, file)
