"""Tests for byte-level text data: tokenizer, reader, split, download, DataModule, TensorLoader."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from helpers import epoch_batches, one_line_message

from esper_lightning.data import text
from esper_lightning.data.files import DataError
from esper_lightning.data.text import (
    TINYSTORIES_VALID_NAME,
    ByteTokenizer,
    TextDataModule,
    TextTensorLoader,
    download_tinystories,
    evaluation_starts,
    find_text_file,
    load_text_tokens,
    split_text,
    split_tokens,
    validation_blocks,
)

PERIOD = 251  # a prime: the fixture's byte at position i is i % 251


@pytest.fixture
def ramp_file(tmp_path: Path) -> Path:
    """5000 bytes where byte i is i % 251: a block's first byte gives its offset (mod 251), and
    contiguous blocks count up by one."""
    path = tmp_path / "ramp.bin"
    path.write_bytes(bytes(i % PERIOD for i in range(5000)))
    return path


def _assert_contiguous(x: torch.Tensor, y: torch.Tensor) -> None:
    """Every row counts up by one (mod 251) and ``y`` is ``x`` shifted by one token."""
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape
    assert torch.equal(x[:, 1:], (x[:, :-1] + 1) % PERIOD)
    assert torch.equal(y, (x + 1) % PERIOD)


# ------------------------------------------------------------------------- tokenizer and files


def test_tokenizer_round_trip_with_non_ascii():
    tok = ByteTokenizer()
    sample = "Once upon a time, Zoë saw a 猫 🐱 — naïve café."
    ids = tok.encode(sample)
    assert ids == list(sample.encode("utf-8")) and all(0 <= i < 256 for i in ids)
    assert len(ids) > len(sample)  # multi-byte characters take several tokens
    assert tok.decode(ids) == sample
    assert tok.decode(torch.tensor(ids, dtype=torch.uint8).view(1, -1)) == sample
    assert tok.vocab_size == 256
    assert tok.decode([104, 0xFF, 105]) == "h\ufffdi"  # invalid bytes never raise


def test_load_text_tokens_reads_bytes(tmp_path: Path):
    path = tmp_path / "t.txt"
    path.write_text("héllo", encoding="utf-8")
    tokens = load_text_tokens(path)
    assert tokens.dtype == torch.uint8 and tokens.tolist() == list("héllo".encode())
    tokens[0] = 0  # owns writable memory


@pytest.mark.parametrize("case", ["missing", "empty", "folder"])
def test_load_text_tokens_errors_name_the_file(tmp_path: Path, case: str):
    path = tmp_path / "t.txt"
    if case == "empty":
        path.write_bytes(b"")
    elif case == "folder":
        path.mkdir()
    with pytest.raises(DataError) as err:
        load_text_tokens(path)
    message = one_line_message(err)
    assert str(path) in message
    assert ("empty" in message.replace(str(path), "")) == (case == "empty")


def test_find_text_file_takes_a_file_or_the_one_text_file_of_a_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "README.md").write_text("not the corpus")
    only = folder / "plays.txt"
    only.write_text("To be, or not to be")
    assert find_text_file(only) == only and find_text_file(folder) == only
    (folder / "more.txt").write_text("that is the question")
    tiny = folder / TINYSTORIES_VALID_NAME  # what download_tinystories writes wins
    tiny.write_text("Once upon a time")
    assert find_text_file(folder) == tiny
    monkeypatch.setenv("ESPER_DATA_DIR", str(folder))
    assert find_text_file(None) == tiny


@pytest.mark.parametrize(("case", "message"), [
    ("missing", "text file or folder '{path}' not found"),
    ("no_text", "folder '{path}' holds no *.txt file"),
    ("two_texts", "folder '{path}' holds 2 *.txt files"),
])
def test_find_text_file_errors_are_one_line(tmp_path: Path, case: str, message: str):
    path = tmp_path / "corpus"
    if case != "missing":
        path.mkdir()
        (path / "notes.md").write_text("x")
    if case == "two_texts":
        (path / "a.txt").write_text("a")
        (path / "b.txt").write_text("b")
    with pytest.raises(DataError) as err:
        find_text_file(path)
    text_of_error = one_line_message(err)
    assert text_of_error.startswith(message.format(path=path))
    assert "download=True" in text_of_error
    with pytest.raises(DataError) as err:  # a caller that cannot download offers no download
        find_text_file(path, downloadable=False)
    assert one_line_message(err).endswith("pass a text file or a folder holding one")


def test_split_is_contiguous_with_the_tail_for_validation():
    tokens = torch.arange(100, dtype=torch.uint8)
    train, val = split_tokens(tokens, val_fraction=0.25)
    assert train.tolist() == list(range(75)) and val.tolist() == list(range(75, 100))
    assert torch.equal(torch.cat([train, val]), tokens)
    for bad in (0.0, 1.0, -0.1, True):
        with pytest.raises(ValueError, match="val_fraction must be in"):
            split_tokens(tokens, bad)


def test_split_text_holds_out_validation_then_test():
    tokens = torch.arange(250, dtype=torch.uint8)
    parts = split_text(tokens, held_out_fraction=0.2)
    assert [len(p) for p in parts] == [200, 25, 25]
    assert torch.equal(torch.cat(list(parts)), tokens)  # contiguous, in file order, no gaps
    assert parts.validation[0] == 200 and parts.test[0] == 225
    odd = split_text(torch.arange(101, dtype=torch.uint8), held_out_fraction=0.1)
    assert [len(p) for p in odd] == [91, 5, 5]


def test_evaluation_starts_spread_over_the_whole_split():
    assert evaluation_starts(50, 8) == [0, 8, 16, 24, 32, 40]  # (50 - 1) // 8 blocks
    spread = evaluation_starts(1001, 10, max_blocks=4)
    assert spread == [0, 250, 500, 750]  # not the first passage
    assert len(set(evaluation_starts(1001, 10, max_blocks=99))) == 99  # distinct blocks
    assert evaluation_starts(50, 8, max_blocks=100) == evaluation_starts(50, 8)


def test_validation_blocks_in_order_and_capped():
    tokens = torch.arange(50, dtype=torch.uint8)
    x, y = validation_blocks(tokens, block_size=8)
    assert x.shape == (6, 8)  # (50 - 1) // 8
    assert torch.equal(x.flatten(), torch.arange(48))
    assert torch.equal(y.flatten(), torch.arange(1, 49))
    x2, _ = validation_blocks(tokens, block_size=8, max_blocks=2)
    assert torch.equal(x2, x[[0, 3]])  # spread over the tokens, not the first two
    with pytest.raises(ValueError, match="too few for one block of block_size=64"):
        validation_blocks(tokens, block_size=64)


# -------------------------------------------------------------------------------- DataModule


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of path= .* got neither"),
        ({"path": "a.txt", "download": True}, "exactly one of path= .* got both"),
        ({"path": "a.txt", "data_dir": "d"}, "data_dir='d' is only used with download=True"),
        ({"path": "a.txt", "block_size": 0}, "block_size must be an int >= 1, got 0"),
        ({"path": "a.txt", "val_fraction": 1.5}, r"val_fraction must be in \(0, 1\), got 1.5"),
    ],
)
def test_datamodule_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TextDataModule(**kwargs)


def test_loaders_before_setup_name_the_call(ramp_file: Path):
    dm = TextDataModule(ramp_file, block_size=16)
    for loader in (dm.train_dataloader, dm.val_dataloader, dm.test_dataloader):
        with pytest.raises(RuntimeError, match=rf"^call setup\(\) before {loader.__name__}\(\)$"):
            loader()


def _datamodule(path: Path, **kwargs) -> TextDataModule:
    dm = TextDataModule(path, **{"block_size": 16, "batch_size": 4, "val_fraction": 0.2, **kwargs})
    dm.setup("fit")
    return dm


def test_training_blocks_are_shifted_contiguous_and_in_the_head(ramp_file: Path):
    dm = _datamodule(ramp_file, train_blocks=40)
    assert len(dm.train_tokens) == 4000
    assert len(dm.val_tokens) == len(dm.test_tokens) == 500
    batches = epoch_batches(dm, 0)
    assert len(batches) == 10
    for x, y in batches:
        assert x.shape == (4, 16)
        _assert_contiguous(x, y)
    offsets = list(dm.train_dataloader().sampler)
    assert len(offsets) == 40
    assert max(offsets) + 16 + 1 <= len(dm.train_tokens)  # y never reads into validation
    # Default: about one pass over the head.
    assert len(list(_datamodule(ramp_file).train_dataloader().sampler)) == 4000 // 16


def test_training_blocks_deterministic_per_rng_seed_and_epoch(ramp_file: Path):
    def firsts(rng_seed: int, epoch: int) -> torch.Tensor:
        dm = _datamodule(ramp_file, train_blocks=32, rng_seed=rng_seed)
        return torch.cat([x[:, 0] for x, _ in epoch_batches(dm, epoch)])

    assert torch.equal(firsts(0, 0), firsts(0, 0))
    assert torch.equal(firsts(0, 1), firsts(0, 1))
    assert not torch.equal(firsts(0, 0), firsts(1, 0))
    assert not torch.equal(firsts(0, 0), firsts(0, 1))
    assert not torch.equal(firsts(0, 1), firsts(1, 0))  # seeds mixed, not added


@pytest.mark.parametrize(("loader", "part"), [("val_dataloader", "val_tokens"),
                                              ("test_dataloader", "test_tokens")])
def test_evaluation_blocks_contiguous_in_order_and_capped(ramp_file: Path, loader: str,
                                                          part: str):
    dm = _datamodule(ramp_file)
    xs, ys = zip(*getattr(dm, loader)(), strict=True)
    x, y = torch.cat(xs), torch.cat(ys)
    tokens = getattr(dm, part)
    n = (500 - 1) // 16
    assert x.shape == (n, 16)
    assert torch.equal(x.flatten(), tokens[: n * 16].long())
    assert torch.equal(y.flatten(), tokens[1 : n * 16 + 1].long())
    assert torch.equal(torch.cat(next(zip(*getattr(dm, loader)(), strict=True))), x)  # repeatable
    capped = _datamodule(ramp_file, val_blocks=3)
    assert torch.equal(torch.cat([b[0] for b in getattr(capped, loader)()]), x[[0, 10, 20]])


def test_validation_and_test_splits_are_disjoint_halves_of_the_tail(ramp_file: Path):
    dm = _datamodule(ramp_file)
    assert bytes(torch.cat([dm.train_tokens, dm.val_tokens, dm.test_tokens]).tolist()) == (
        ramp_file.read_bytes())
    val_x = torch.cat([b[0] for b in dm.val_dataloader()])
    test_x = torch.cat([b[0] for b in dm.test_dataloader()])
    assert not torch.equal(val_x, test_x) and val_x[0, 0] == 4000 % PERIOD


def test_too_short_text_names_block_size(tmp_path: Path):
    path = tmp_path / "short.txt"
    path.write_text("x" * 100)
    pattern = (r"^text file '.*short\.txt' is too short for block_size=16: its validation split "
               r"holds 10 of its 100 bytes and one block needs 17; use a smaller block_size")
    with pytest.raises(DataError, match=pattern):
        _datamodule(path, val_fraction=0.2)
    path.write_text("x" * 200)
    with pytest.raises(DataError, match="its training head holds 10 of its 200 bytes"):
        _datamodule(path, val_fraction=0.95)


# ---------------------------------------------------------------------------------- download


@pytest.fixture
def served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, serve_folder
) -> tuple[bytes, str]:
    """Serve a fixture text as TinyStories on 127.0.0.1 (URL and digest patched in)."""
    www = tmp_path / "www"
    www.mkdir()
    payload = ("Once upon a time there was a tiny story. " * 40).encode()
    (www / TINYSTORIES_VALID_NAME).write_bytes(payload)
    digest = hashlib.sha256(payload).hexdigest()
    url = f"{serve_folder(www)}/{TINYSTORIES_VALID_NAME}"
    monkeypatch.setattr(text, "TINYSTORIES_VALID_URL", url)
    monkeypatch.setattr(text, "TINYSTORIES_VALID_SHA256", digest)
    return payload, digest


def test_download_through_the_datamodule(served: tuple[bytes, str], tmp_path: Path):
    payload, _ = served
    dest = tmp_path / "dl"
    dm = TextDataModule(download=True, data_dir=dest, block_size=16, batch_size=4)
    dm.prepare_data()
    assert [p.name for p in dest.iterdir()] == [TINYSTORIES_VALID_NAME]  # no temp leftovers
    dm.setup("fit")
    assert bytes(torch.cat([dm.train_tokens, dm.val_tokens, dm.test_tokens]).tolist()) == payload


def test_download_skips_a_verified_file_and_replaces_a_damaged_one(
    served: tuple[bytes, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    payload, _ = served
    target = download_tinystories(tmp_path, progress=False)
    good_url = text.TINYSTORIES_VALID_URL
    monkeypatch.setattr(text, "TINYSTORIES_VALID_URL", "http://127.0.0.1:9/gone.txt")
    assert download_tinystories(tmp_path, progress=False) == target  # no network needed
    target.write_bytes(b"damaged")
    monkeypatch.setattr(text, "TINYSTORIES_VALID_URL", good_url)
    download_tinystories(tmp_path, progress=False)
    assert target.read_bytes() == payload


def test_download_checksum_mismatch_leaves_nothing(
    served: tuple[bytes, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    wrong = "0" * 64
    monkeypatch.setattr(text, "TINYSTORIES_VALID_SHA256", wrong)
    dest = tmp_path / "dl"
    with pytest.raises(DataError) as err:
        download_tinystories(dest, progress=False)
    message = one_line_message(err)
    assert "SHA-256 mismatch" in message and wrong in message and "path=" in message
    assert list(dest.iterdir()) == []


def test_offline_and_absent_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(text, "TINYSTORIES_VALID_URL", "http://127.0.0.1:9/TinyStories-valid.txt")
    dest = tmp_path / "dl"
    dm = TextDataModule(download=True, data_dir=dest)
    with pytest.raises(DataError) as err:
        dm.prepare_data()
    message = one_line_message(err)
    assert str(dest) in message and "path=" in message and TINYSTORIES_VALID_NAME in message
    assert list(dest.iterdir()) == []
    with pytest.raises(DataError, match="call prepare_data"):
        dm.setup("fit")


# ------------------------------------------------------------------------------ TensorLoader


def _loader(rng_seed: int = 0, **kwargs) -> TextTensorLoader:
    tokens = torch.tensor([i % PERIOD for i in range(3000)], dtype=torch.uint8)
    return TextTensorLoader(tokens, block_size=16, batch_size=8, rng_seed=rng_seed, **kwargs)


def _firsts(loader: TextTensorLoader) -> torch.Tensor:
    return torch.cat([x[:, 0] for x, _ in loader])


def test_tensor_loader_batches_are_shifted_contiguous_blocks():
    loader = _loader()
    assert len(loader) == (3000 // 16) // 8
    batches = list(loader)
    assert len(batches) == len(loader)
    for x, y in batches:
        assert x.shape == (8, 16) and x.is_contiguous() and y.is_contiguous()
        _assert_contiguous(x, y)
    assert len(list(_loader(n_blocks=20))) == 2


def test_tensor_loader_determinism_and_reseed():
    a, b, c = _loader(0), _loader(0), _loader(1)
    first = _firsts(a)
    assert torch.equal(first, _firsts(b))
    assert not torch.equal(first, _firsts(c))
    second = _firsts(a)
    assert not torch.equal(first, second)  # a new epoch, new blocks
    a.reseed(0)
    assert torch.equal(_firsts(a), first)
    c.reseed(0)
    assert torch.equal(_firsts(c), first)
    # An epoch abandoned after one batch does not shift the next epoch.
    d = _loader(0)
    next(iter(d))
    assert torch.equal(_firsts(d), second)


def test_tensor_loader_bad_arguments():
    tokens = torch.zeros(100, dtype=torch.uint8)
    with pytest.raises(ValueError, match="fewer than batch_size=8"):
        TextTensorLoader(tokens, block_size=16, batch_size=8)
    with pytest.raises(ValueError, match="must be a uint8 \\[N\\] tensor"):
        TextTensorLoader(tokens.long(), block_size=4, batch_size=2)


def test_training_offsets_stream_is_pinned():
    # Drawn before the sampler moved onto EpochSeededSampler; a change here breaks replays.
    sampler = text._RandomBlockSampler(num_offsets=1000, num_blocks=30, rng_seed=0)
    sampler.set_epoch(1)
    assert len(sampler) == 30
    assert list(sampler)[:8] == [164, 578, 435, 282, 883, 946, 236, 184]
    other = text._RandomBlockSampler(num_offsets=1000, num_blocks=30, rng_seed=7)
    other.set_epoch(3)
    assert list(other)[:8] == [881, 554, 752, 727, 195, 284, 980, 907]
