"""Data: CIFAR-10 and byte-level text, each with its on-disk format and download, a
LightningDataModule and a device-resident loader for the RL environments.

Example:
    >>> import tempfile
    >>> from esper_lightning.data import CIFAR10DataModule, TensorLoader, write_cifar10_fixture
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     root = write_cifar10_fixture(tmp)  # a tiny stand-in; download=True fetches the real one
    ...     dm = CIFAR10DataModule(root, batch_size=16)  # for a Trainer
    ...     loader = TensorLoader.from_cifar10(root, train=True, batch_size=16)  # for the envs
    ...     len(loader), next(iter(loader))[0].shape
    (4, torch.Size([16, 3, 32, 32]))
"""

from esper_lightning.data.cifar10 import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    download_cifar10,
    load_cifar10,
    load_cifar10_subset,
)
from esper_lightning.data.datamodule import CIFAR10DataModule
from esper_lightning.data.files import DataError, default_data_dir
from esper_lightning.data.fixture import write_cifar10_fixture
from esper_lightning.data.tensor_loader import TensorLoader
from esper_lightning.data.text import (
    HELD_OUT_FRACTION,
    TINYSTORIES_VALID_SHA256,
    TINYSTORIES_VALID_URL,
    ByteTokenizer,
    TextDataModule,
    TextSplits,
    TextTensorLoader,
    download_tinystories,
    find_text_file,
    load_text_tokens,
    split_text,
    split_tokens,
    validation_blocks,
)

__all__ = [
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "HELD_OUT_FRACTION",
    "TINYSTORIES_VALID_SHA256",
    "TINYSTORIES_VALID_URL",
    "ByteTokenizer",
    "CIFAR10DataModule",
    "DataError",
    "TensorLoader",
    "TextDataModule",
    "TextSplits",
    "TextTensorLoader",
    "default_data_dir",
    "download_cifar10",
    "download_tinystories",
    "find_text_file",
    "load_cifar10",
    "load_cifar10_subset",
    "load_text_tokens",
    "split_text",
    "split_tokens",
    "validation_blocks",
    "write_cifar10_fixture",
]
