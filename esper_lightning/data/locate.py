"""Where the data is on disk: CIFAR-10's batch folder and a text task's file, found, or refused
with a one-line `DataError`.

Plain Python, no torch: the command line checks a data path with these before it imports torch
and Lightning, so a wrong ``--data-dir`` is one line at once, the same line the data loaders
(`data.cifar10`, `data.text`, which re-export these names) raise when they read the data.

Example:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     cifar10_present(tmp)
    False
"""

from __future__ import annotations

from pathlib import Path

from esper_lightning.data.files import DataError, PathLike, resolve_data_dir

__all__ = [
    "FOLDER_NAME",
    "TEST_FILES",
    "TINYSTORIES_VALID_NAME",
    "TRAIN_FILES",
    "cifar10_not_found",
    "cifar10_present",
    "find_batches_dir",
    "find_text_file",
    "missing_files",
]

FOLDER_NAME = "cifar-10-batches-py"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILES = ("test_batch",)
#: The file `data.text.download_tinystories` writes, found first in a text folder.
TINYSTORIES_VALID_NAME = "TinyStories-valid.txt"


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
            refusal then offers; a command that cannot (``frontier run``) passes False.

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
