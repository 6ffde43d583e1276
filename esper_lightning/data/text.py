"""Byte-level text for language-model hosts: tokenizer, file reader, TinyStories download, loaders.

Tokens are the UTF-8 bytes of the text (vocabulary 256), held as a uint8 tensor, so any file is
valid input and no tokenizer needs training or downloading. A language-model sample is a block of
``T`` consecutive tokens ``x`` and the same block shifted by one, ``y``: ``y[t]`` is the token
that follows ``x[t]``.

Example:
    >>> import tempfile
    >>> from esper_lightning.data import TextDataModule
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     story = Path(tmp) / "story.txt"
    ...     _ = story.write_text("Once upon a time, " * 100)
    ...     dm = TextDataModule(story, block_size=16, batch_size=4)  # or download=True: TinyStories
    ...     dm.setup("fit")
    >>> x, y = next(iter(dm.train_dataloader()))
    >>> x.shape, torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one token
    (torch.Size([4, 16]), True)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from esper_lightning.data.files import (
    DataError,
    PathLike,
    check_bool,
    check_int,
    fetch_verified,
    file_digest,
    make_data_dir,
    one_line,
    require_setup,
    resolve_data_dir,
)
from esper_lightning.data.locate import (
    HELD_OUT_FRACTION,
    TINYSTORIES_VALID_NAME,
    check_text_blocks,
    check_val_fraction,
    find_text_file,
    text_split_lengths,
)
from esper_lightning.data.sampling import EpochSeededSampler, ResumableLoader, mixed_rng_seed

__all__ = [
    "HELD_OUT_FRACTION",
    "TINYSTORIES_VALID_NAME",
    "TINYSTORIES_VALID_SHA256",
    "TINYSTORIES_VALID_URL",
    "ByteTokenizer",
    "StepBatches",
    "TextDataModule",
    "TextSplits",
    "TextTensorLoader",
    "check_text_blocks",
    "download_tinystories",
    "evaluation_starts",
    "find_text_file",
    "load_text_splits",
    "load_text_tokens",
    "split_text",
    "split_tokens",
    "validation_blocks",
]

TINYSTORIES_VALID_URL = (
    "https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/TinyStories-valid.txt"
)
# SHA-256 of the file as the Hugging Face Hub publishes it (the Git LFS object id of
# TinyStories-valid.txt in the dataset repo roneneldan/TinyStories, 19,447,282 bytes).
TINYSTORIES_VALID_SHA256 = "94e431816c4cce81ff71e4408ff8d3bda9a42e8d2663986697c3954288cb38b4"


class ByteTokenizer:
    """Text <-> token ids through UTF-8 bytes: one token per byte, ``vocab_size = 256``.

    Decoding replaces byte sequences that are not valid UTF-8 (a model's output can hold any
    bytes) with U+FFFD instead of failing.

    Example:
        >>> tok = ByteTokenizer()
        >>> tok.encode("hé")
        [104, 195, 169]
        >>> tok.decode([104, 195, 169])
        'hé'
    """

    vocab_size: int = 256

    def encode(self, text: str) -> list[int]:
        """Token ids (ints in 0..255) of ``text``."""
        return list(text.encode("utf-8"))

    def decode(self, tokens: Iterable[int] | torch.Tensor) -> str:
        """Text of token ids (a list of ints or an integer tensor of any shape, flattened)."""
        if isinstance(tokens, torch.Tensor):
            tokens = tokens.reshape(-1).tolist()
        return bytes(tokens).decode("utf-8", errors="replace")


def load_text_tokens(path: PathLike) -> torch.Tensor:
    """Read a file's bytes as byte-level tokens.

    Args:
        path: Any file; its raw bytes are the tokens (UTF-8 text gives UTF-8 tokens).

    Returns:
        uint8 ``[N]`` CPU tensor that owns its memory.

    Raises:
        DataError: The file is missing, unreadable or empty.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     _ = (Path(tmp) / "story.txt").write_text("Once upon a time")
        ...     load_text_tokens(Path(tmp) / "story.txt")[:4]  # the bytes of "Once"
        tensor([ 79, 110,  99, 101], dtype=torch.uint8)
    """
    file = Path(path).expanduser()
    if not file.is_file():
        raise DataError(f"text file '{file}' not found; pass path= pointing at an existing file")
    try:
        data = file.read_bytes()
    except OSError as err:
        raise DataError(f"cannot read text file '{file}': {one_line(err)}") from err
    if not data:
        raise DataError(f"text file '{file}' is empty; a language model needs some text")
    # bytearray: a writable buffer, so the tensor owns (rather than borrows) its memory.
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def split_tokens(
    tokens: torch.Tensor, val_fraction: float = HELD_OUT_FRACTION
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut ``tokens`` into a contiguous training head and held-out tail (`split_text` cuts the
    tail into the validation and test splits).

    A contiguous split (not a shuffle of blocks) keeps held-out text unseen: random training
    blocks may start anywhere in the head, but never overlap the tail.

    Args:
        tokens: ``[N]`` tokens.
        val_fraction: Share of tokens (rounded down) in the held-out tail, in (0, 1).

    Returns:
        ``(train, held_out)`` views of ``tokens``: ``tokens[:N - n]`` and ``tokens[N - n:]``.

    Raises:
        ValueError: ``val_fraction`` is outside (0, 1) or ``tokens`` is not 1-D.
    """
    if tokens.dim() != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tuple(tokens.shape)}")
    cut = text_split_lengths(len(tokens), val_fraction)[0]
    return tokens[:cut], tokens[cut:]


class TextSplits(NamedTuple):
    """A text's three parts (uint8 ``[N]`` views, in file order): what is trained on, what
    decisions and tuning read, and what only final tables read."""

    train: torch.Tensor
    validation: torch.Tensor
    test: torch.Tensor


def split_text(tokens: torch.Tensor,
               held_out_fraction: float = HELD_OUT_FRACTION) -> TextSplits:
    """The one split of a text: a contiguous training head, then the held-out tail
    (`split_tokens`) cut in two halves, validation first and test last.

    Contiguous parts keep the held-out text unseen (training blocks start anywhere in the head
    but never reach the tail), and the test half is read by nothing that chooses anything.

    Example:
        >>> parts = split_text(torch.arange(200, dtype=torch.uint8))
        >>> [len(p) for p in parts], int(parts.validation[0]), int(parts.test[0])
        ([180, 10, 10], 180, 190)
    """
    train, held_out = split_tokens(tokens, held_out_fraction)  # checks both arguments
    validation = text_split_lengths(len(tokens), held_out_fraction)[1]
    return TextSplits(train, held_out[:validation], held_out[validation:])


def load_text_splits(file: PathLike, block_size: int,
                     held_out_fraction: float = HELD_OUT_FRACTION) -> TextSplits:
    """The text in ``file`` read (`load_text_tokens`) and split (`split_text`), each part
    holding a block of ``block_size`` tokens (`check_text_blocks`).

    Raises:
        DataError: The file is missing, unreadable, empty, or too short for a block.
    """
    parts = split_text(load_text_tokens(file), held_out_fraction)
    check_text_blocks(list(map(len, parts)), block_size, file)
    return parts


def _check_tokens(tokens: object, block_size: int, what: str) -> torch.Tensor:
    if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.uint8 or tokens.dim() != 1:
        shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise ValueError(f"{what} must be a uint8 [N] tensor, got {shape}")
    if len(tokens) < block_size + 1:
        raise ValueError(
            f"{what} has {len(tokens)} tokens, too few for one block of block_size={block_size} "
            f"(needs {block_size + 1}); use a smaller block_size or more text"
        )
    return tokens


def evaluation_starts(n_tokens: int, block_size: int, max_blocks: int | None = None) -> list[int]:
    """Start offsets of the non-overlapping evaluation blocks of ``n_tokens`` tokens: all of
    them (block ``i`` at ``i * T``), or ``max_blocks`` of them spread evenly over the whole text,
    so a short evaluation still averages over the whole split rather than its first passage.

    Example:
        >>> evaluation_starts(41, 4), evaluation_starts(41, 4, max_blocks=3)
        ([0, 4, 8, 12, 16, 20, 24, 28, 32, 36], [0, 12, 24])
    """
    n = (n_tokens - 1) // block_size
    keep = n if max_blocks is None else min(n, max_blocks)
    return [block_size * ((i * n) // keep) for i in range(keep)]


def validation_blocks(
    tokens: torch.Tensor,
    block_size: int,
    max_blocks: int | None = None,
    device: str | torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut tokens into non-overlapping blocks, in order (`evaluation_starts`): every block, or
    ``max_blocks`` spread evenly over the tokens.

    Args:
        tokens: uint8 ``[N]``, at least ``block_size + 1`` of them.
        block_size: Block length ``T``.
        max_blocks: Keep at most this many blocks, evenly spread; all by default.
        device: Where the returned tensors live; ``tokens``'s device if None.

    Returns:
        ``(x, y)``: int64 ``[n_blocks, T]`` each, ``y`` being ``x`` shifted by one token.

    Example:
        >>> x, y = validation_blocks(torch.arange(10, dtype=torch.uint8), block_size=4)
        >>> x
        tensor([[0, 1, 2, 3],
                [4, 5, 6, 7]])
        >>> y
        tensor([[1, 2, 3, 4],
                [5, 6, 7, 8]])
    """
    check_int("block_size", block_size, 1)
    check_int("max_blocks", max_blocks, 1, allow_none=True)
    tokens = _check_tokens(tokens, block_size, "validation tokens")
    starts = torch.tensor(evaluation_starts(len(tokens), block_size, max_blocks))  # [n]
    tokens = tokens.to(device) if device is not None else tokens
    window = torch.arange(block_size + 1, device=tokens.device)  # [T + 1]
    chunk = tokens[starts.to(tokens.device)[:, None] + window].long()  # [n, T + 1]
    return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


# --------------------------------------------------------------------------------------- download


def download_tinystories(
    data_dir: PathLike | None = None,
    url: str | None = None,
    sha256: str | None = None,
    progress: bool = True,
) -> Path:
    """Download the TinyStories validation split (``TinyStories-valid.txt``, ~19 MB) if needed.

    A file already in ``data_dir`` with the expected SHA-256 is used as is; a missing or damaged
    one is (re)downloaded through a temporary file that is verified before it is renamed into
    place, so an interrupted download never leaves a file that looks valid.

    Args:
        data_dir: Destination folder; ``None`` means :func:`default_data_dir`
            (``$ESPER_DATA_DIR`` or ``~/.cache/esper_lightning/data``).
        url: Where to fetch the file; :data:`TINYSTORIES_VALID_URL` if None.
        sha256: Expected hex SHA-256; :data:`TINYSTORIES_VALID_SHA256` if None.
        progress: Show a tqdm progress bar.

    Returns:
        Path of the verified ``TinyStories-valid.txt``.

    Raises:
        DataError: Network failure (e.g. offline with no local copy), checksum mismatch, or an
            unwritable folder; the message names the folder and how to provide the file.

    Example:
        >>> path = download_tinystories(progress=False)  # doctest: +SKIP

        From a mirror (here a local file), checked against its SHA-256:

        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     mirror = Path(tmp) / "stories.txt"
        ...     _ = mirror.write_text("Once upon a time")
        ...     path = download_tinystories(Path(tmp) / "data", url=mirror.as_uri(),
        ...                                 sha256=file_digest(mirror, "sha256"), progress=False)
        ...     path.name, path.read_text()
        ('TinyStories-valid.txt', 'Once upon a time')
    """
    url = TINYSTORIES_VALID_URL if url is None else url
    sha256 = TINYSTORIES_VALID_SHA256 if sha256 is None else sha256
    root = resolve_data_dir(data_dir)
    target = root / TINYSTORIES_VALID_NAME
    if target.is_file() and file_digest(target, "sha256") == sha256:
        return target
    make_data_dir(root)
    hint = (
        f"put {TINYSTORIES_VALID_NAME} in '{root}', or pass path= pointing at a local text file"
    )
    fetch_verified(url, target, sha256, "sha256", progress, hint=hint)
    return target


# ------------------------------------------------------------------------------------ loaders


class _RandomBlockSampler(EpochSeededSampler[int]):
    """Yield ``num_blocks`` random block start offsets per epoch, drawn from a generator seeded
    with :func:`mixed_rng_seed` of ``(rng_seed, epoch)``; see :class:`EpochSeededSampler`."""

    def __init__(self, num_offsets: int, num_blocks: int, rng_seed: int) -> None:
        super().__init__(num_blocks, rng_seed)
        self.num_offsets = num_offsets

    def epoch_rng_seed(self) -> int:
        return mixed_rng_seed(self.rng_seed, self.epoch)

    def __iter__(self) -> Iterator[int]:
        offsets = torch.randint(0, self.num_offsets, (len(self),), generator=self.generator())
        return iter(offsets.tolist())


class _Blocks(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """int64 ``(x, y)`` blocks of length ``T``; block ``i`` starts at ``starts[i]``."""

    def __init__(self, tokens: torch.Tensor, block_size: int, starts: Sequence[int]) -> None:
        self.tokens = tokens
        self.block_size = block_size
        self.starts = starts

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.starts[index]
        chunk = self.tokens[start : start + self.block_size + 1].long()  # [T + 1]
        return chunk[:-1], chunk[1:]


class TextDataModule(L.LightningDataModule):
    """Byte-level language-model batches ``(x, y)``, int64 ``[B, T]``, from one text file.

    The file's bytes are split into a contiguous training head and a validation tail
    (:func:`split_tokens`). Training samples are blocks at random offsets of the head, drawn by
    the loader's sampler from a ``torch.Generator`` seeded with ``(rng_seed, epoch)`` (Lightning
    calls its ``set_epoch`` every epoch), so batches are a function of ``(rng_seed, epoch)``
    for any ``num_workers``. The held-out tail is cut in a validation and a test split
    (`split_text`): validation samples are the validation split's non-overlapping blocks, test
    samples the test split's, in order.

    Args:
        path: A local text file. Exactly one of ``path`` and ``download=True`` is required.
        download: Use the TinyStories validation split, downloaded by :meth:`prepare_data` into
            ``data_dir`` unless a verified copy is there.
        data_dir: Download folder; ``None`` means :func:`default_data_dir`. Only with
            ``download=True``.
        block_size: Tokens per block ``T``.
        batch_size: Blocks per batch.
        val_fraction: Share of the file's bytes held out at its end (validation and test).
        train_blocks: Random blocks per training epoch; by default ``len(head) // T``, about one
            pass over the head.
        val_blocks: At most this many validation (and test) blocks, spread evenly over the
            split (`evaluation_starts`); all by default.
        rng_seed: Base seed of the training offsets.
        num_workers: DataLoader worker processes (0 loads in the main process).

    Example:
        >>> dm = TextDataModule(download=True, block_size=128, batch_size=32, train_blocks=3200)
        >>> trainer = L.Trainer(max_epochs=10)
        >>> trainer.fit(GPTHost("tiny"), datamodule=dm)  # doctest: +SKIP
    """

    def __init__(
        self,
        path: PathLike | None = None,
        download: bool = False,
        data_dir: PathLike | None = None,
        block_size: int = 128,
        batch_size: int = 32,
        val_fraction: float = 0.1,
        train_blocks: int | None = None,
        val_blocks: int | None = None,
        rng_seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        check_bool("download", download)
        if (path is None) == (not download):
            got = "both" if download else "neither"
            raise ValueError(
                f"TextDataModule needs exactly one of path= (a local text file) or download=True "
                f"(TinyStories validation split), got {got}"
            )
        if data_dir is not None and not download:
            raise ValueError(f"data_dir={str(data_dir)!r} is only used with download=True")
        check_int("block_size", block_size, 1)
        check_int("batch_size", batch_size, 1)
        check_int("train_blocks", train_blocks, 1, allow_none=True)
        check_int("val_blocks", val_blocks, 1, allow_none=True)
        check_int("rng_seed", rng_seed, 0)
        check_int("num_workers", num_workers, 0)
        check_val_fraction(val_fraction)
        self.download = download
        self.data_dir = resolve_data_dir(data_dir) if download else None
        self.path = Path(path).expanduser() if path is not None else None
        self.block_size, self.batch_size = block_size, batch_size
        self.val_fraction = val_fraction
        self.train_blocks, self.val_blocks = train_blocks, val_blocks
        self.rng_seed, self.num_workers = rng_seed, num_workers
        self.train_tokens: torch.Tensor | None = None
        self.val_tokens: torch.Tensor | None = None
        self.test_tokens: torch.Tensor | None = None

    @property
    def file(self) -> Path:
        """The text file read by :meth:`setup`."""
        if self.path is not None:
            return self.path
        assert self.data_dir is not None
        return self.data_dir / TINYSTORIES_VALID_NAME

    def prepare_data(self) -> None:
        """Download TinyStories (validation split) when ``download=True`` and it is missing."""
        if self.download:
            download_tinystories(self.data_dir)

    def setup(self, stage: str | None = None) -> None:
        """Read and split the text (once; later calls reuse it).

        Raises:
            DataError: The file is missing, unreadable, empty, or too short: a split holds
                fewer than ``block_size + 1`` tokens.
        """
        if self.val_tokens is not None:
            return
        if self.download and not self.file.is_file():
            raise DataError(
                f"{TINYSTORIES_VALID_NAME} not found in '{self.data_dir}'; call prepare_data() "
                "first (a Trainer does) or pass path= pointing at a local text file"
            )
        parts = load_text_splits(self.file, self.block_size, self.val_fraction)
        self.train_tokens, self.val_tokens, self.test_tokens = parts

    def _loader(self, dataset: _Blocks, sampler: Sampler[int] | None) -> DataLoader:
        # The training loader (the one with a sampler) resumes mid-epoch exactly.
        loader = DataLoader if sampler is None else ResumableLoader
        return loader(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            shuffle=False,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        """Random blocks of the training head; see the class docs on seeding."""
        tokens = require_setup(self.train_tokens, "train_dataloader")
        offsets = len(tokens) - self.block_size
        n_blocks = self.train_blocks or max(1, len(tokens) // self.block_size)
        sampler = _RandomBlockSampler(offsets, n_blocks, self.rng_seed)
        return self._loader(_Blocks(tokens, self.block_size, range(offsets)), sampler)

    def _eval_loader(self, tokens: torch.Tensor | None, caller: str) -> DataLoader:
        tokens = require_setup(tokens, caller)
        starts = evaluation_starts(len(tokens), self.block_size, self.val_blocks)
        return self._loader(_Blocks(tokens, self.block_size, starts), None)

    def val_dataloader(self) -> DataLoader:
        """Non-overlapping blocks of the validation split, in order."""
        return self._eval_loader(self.val_tokens, "val_dataloader")

    def test_dataloader(self) -> DataLoader:
        """Non-overlapping blocks of the test split, in order (final tables only)."""
        return self._eval_loader(self.test_tokens, "test_dataloader")


class StepBatches:
    """The training batch of step ``i`` of a run as a pure function of ``(rng_seed, i)``.

    Batches come in passes over the tokens that never repeat a token within a pass: pass ``p``
    (steps ``p·P`` to ``p·P + P − 1``, ``P`` batches per pass) cuts the tokens at an offset in
    ``[0, T)`` into non-overlapping blocks and shuffles them, both drawn from a generator seeded
    with `mixed_rng_seed` of ``(rng_seed, p)``. Every pass has the same ``P`` (the blocks the
    worst offset leaves, in whole batches), so which pass a step falls in never depends on
    earlier passes: a run can start, stop, branch and resume at any step and see the same
    batches as one run from step 0 (`esper_lightning.app.frontier`'s branched cooldowns).

    Args:
        tokens: uint8 ``[N]`` training tokens (on the device the batches should live on).
        block_size: Tokens per block ``T``.
        batch_size: Blocks per batch ``B``.
        rng_seed: The run's data seed.

    Example:
        >>> batches = StepBatches(torch.arange(200, dtype=torch.uint8), 16, 4, rng_seed=3)
        >>> x, y = batches(5)
        >>> x.shape, torch.equal(x[:, 1:], y[:, :-1]), torch.equal(batches(5)[0], x)
        (torch.Size([4, 16]), True, True)
        >>> batches.per_pass  # 11 blocks at the worst offset: 2 whole batches
        2
    """

    def __init__(self, tokens: torch.Tensor, block_size: int, batch_size: int,
                 rng_seed: int) -> None:
        check_int("block_size", block_size, 1)
        check_int("batch_size", batch_size, 1)
        self.tokens = _check_tokens(tokens, block_size, "tokens")
        self.block_size, self.batch_size, self.rng_seed = block_size, batch_size, rng_seed
        #: Batches per pass: the fewest blocks any offset leaves, in whole batches.
        self.per_pass = (len(tokens) - block_size) // block_size // batch_size
        if self.per_pass < 1:
            raise ValueError(f"{len(tokens)} tokens hold fewer than batch_size={batch_size} "
                             f"blocks of {block_size}; use more text or smaller batches")
        self._window = torch.arange(block_size + 1, device=tokens.device)  # [T + 1]
        self._pass: tuple[int, torch.Tensor] | None = None  # (pass index, its block starts)

    def starts(self, pass_index: int) -> torch.Tensor:
        """The block starts of pass ``pass_index``, in training order: ``o + T·perm``."""
        t = self.block_size
        generator = torch.Generator().manual_seed(mixed_rng_seed(self.rng_seed, pass_index))
        offset = int(torch.randint(0, t, (1,), generator=generator))
        n_blocks = (len(self.tokens) - 1 - offset) // t
        order = torch.randperm(n_blocks, generator=generator)
        return (offset + t * order).to(self.tokens.device)

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` of step ``step``: int64 ``[B, T]`` each, ``y`` = ``x`` shifted by one."""
        pass_index, i = divmod(step, self.per_pass)
        if self._pass is None or self._pass[0] != pass_index:
            self._pass = (pass_index, self.starts(pass_index))
        batch = self._pass[1][i * self.batch_size:(i + 1) * self.batch_size]
        chunk = self.tokens[batch[:, None] + self._window].long()  # [B, T + 1]
        return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


class TextTensorLoader:
    """Random language-model batches cut on the fly from tokens held on one device.

    The uint8 tokens are copied to ``device`` once. Each ``iter()`` is an epoch of
    ``n_blocks // batch_size`` batches whose block offsets are all drawn up front from the
    loader's own ``torch.Generator`` (on ``device``, seeded with ``rng_seed``), so the stream of
    epochs does not depend on how many batches of an epoch were consumed. No workers and no
    per-sample Python: one gather per batch, as RL environments training many hosts need.

    Args:
        tokens: uint8 ``[N]`` training tokens, ``N > block_size``.
        block_size: Tokens per block ``T``.
        batch_size: Blocks per batch ``B``.
        n_blocks: Blocks per epoch; ``N // block_size`` (about one pass) by default.
        device: Where the tokens, the generator and the batches live.
        rng_seed: Seed of the generator.

    Example:
        >>> ids = ByteTokenizer().encode("Once upon a time, " * 100)
        >>> train, val = split_tokens(torch.tensor(ids, dtype=torch.uint8))
        >>> loader = TextTensorLoader(train, block_size=16, batch_size=4)  # or device="cuda"
        >>> x, y = next(iter(loader))  # int64 [4, 16] each
        >>> x.shape, torch.equal(x[:, 1:], y[:, :-1])
        (torch.Size([4, 16]), True)
        >>> val_x, val_y = validation_blocks(val, block_size=16)
        >>> val_x.shape
        torch.Size([11, 16])
    """

    def __init__(
        self,
        tokens: torch.Tensor,
        block_size: int,
        batch_size: int,
        *,
        n_blocks: int | None = None,
        device: str | torch.device = "cpu",
        rng_seed: int = 0,
    ) -> None:
        check_int("block_size", block_size, 1)
        check_int("batch_size", batch_size, 1)
        check_int("n_blocks", n_blocks, 1, allow_none=True)
        tokens = _check_tokens(tokens, block_size, "tokens")
        self.n_blocks = len(tokens) // block_size if n_blocks is None else n_blocks
        if self.n_blocks < batch_size:
            raise ValueError(
                f"n_blocks={self.n_blocks} is fewer than batch_size={batch_size}: an epoch would "
                "have no batch; raise n_blocks or lower batch_size"
            )
        self.device = torch.device(device)
        self.tokens = tokens.to(self.device).contiguous()
        self.block_size = block_size
        self.batch_size = batch_size
        self._window = torch.arange(block_size + 1, device=self.device)  # [T + 1]
        self.generator = torch.Generator(device=self.device)
        self.rng_seed = rng_seed
        self.generator.manual_seed(rng_seed)
        self.epoch = 0

    @property
    def num_offsets(self) -> int:
        """Number of distinct block start offsets."""
        return len(self.tokens) - self.block_size

    def __len__(self) -> int:
        """Batches per epoch."""
        return self.n_blocks // self.batch_size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield one epoch of ``(x, y)``, int64 ``[B, T]`` each, ``y`` = ``x`` shifted by one."""
        n = len(self)
        starts = torch.randint(0, self.num_offsets, (n, self.batch_size),
                               generator=self.generator, device=self.device)  # [n, B]
        self.epoch += 1
        for i in range(n):
            chunk = self.tokens[starts[i, :, None] + self._window].long()  # [B, T + 1]
            yield chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()

    def stream(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """An endless stream of ``(x, y)`` batches that never repeats a token within a pass.

        A pass draws a random offset ``o`` in ``[0, T)``, cuts the tokens into the
        non-overlapping blocks starting at ``o, o + T, o + 2T, ...`` (each with its next-token
        target), shuffles them and yields them ``batch_size`` at a time; the last blocks that do
        not fill a batch are left out. Then the next pass starts, with a new offset and order:
        a run that needs more than the corpus sees it again, cut elsewhere. Everything is drawn
        from the loader's generator (`reseed` restarts it).

        Example:
            >>> loader = TextTensorLoader(torch.arange(200, dtype=torch.uint8), 16, 4)
            >>> batches = loader.stream()
            >>> starts = torch.cat([next(batches)[0][:, 0] for _ in range(2)])  # one pass
            >>> len(set(starts.tolist())), bool(((starts - starts[0]) % 16 == 0).all())
            (8, True)
        """
        n_tokens, t = len(self.tokens), self.block_size
        if (n_tokens - t) // t < self.batch_size:  # the fewest blocks a pass can have
            raise ValueError(
                f"{n_tokens} tokens hold {(n_tokens - t) // t} non-overlapping blocks of {t} at "
                f"some offsets, fewer than batch_size={self.batch_size}: a pass could fill no "
                "batch; lower batch_size or block_size, or use more text"
            )
        while True:
            starts = self.pass_starts()  # [n_blocks]
            for i in range(len(starts) // self.batch_size):
                batch = starts[i * self.batch_size:(i + 1) * self.batch_size]
                chunk = self.tokens[batch[:, None] + self._window].long()  # [B, T + 1]
                yield chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()

    def pass_starts(self) -> torch.Tensor:
        """The block starts of one pass of `stream`, in training order: ``o + T·perm``."""
        n_tokens, t = len(self.tokens), self.block_size
        offset = int(torch.randint(0, t, (1,), generator=self.generator, device=self.device))
        n_blocks = (n_tokens - 1 - offset) // t  # block i: tokens [o+iT, o+iT+T], target too
        order = torch.randperm(n_blocks, generator=self.generator, device=self.device)
        return offset + t * order

    def reseed(self, rng_seed: int) -> None:
        """Restart the random stream from ``rng_seed``; the next ``iter()`` is a fresh epoch."""
        self.rng_seed = rng_seed
        self.generator.manual_seed(rng_seed)
        self.epoch = 0

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(n_tokens={len(self.tokens)}, block_size={self.block_size}, "
            f"batch_size={self.batch_size}, n_blocks={self.n_blocks}, device={self.device}, "
            f"rng_seed={self.rng_seed})"
        )
