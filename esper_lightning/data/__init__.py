"""CIFAR-10 data: on-disk format and download, a LightningDataModule, a device-resident loader.

Example:
    >>> from esper_lightning.data import CIFAR10DataModule, TensorLoader
    >>> dm = CIFAR10DataModule("~/data", download=True, batch_size=256)
    >>> loader = TensorLoader.from_cifar10("~/data", train=True, batch_size=256, device="cuda")
"""

from esper_lightning.data.cifar10 import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    DataError,
    default_data_dir,
    download_cifar10,
    load_cifar10,
    load_cifar10_subset,
)
from esper_lightning.data.datamodule import CIFAR10DataModule
from esper_lightning.data.fixture import write_cifar10_fixture
from esper_lightning.data.tensor_loader import TensorLoader

__all__ = [
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "CIFAR10DataModule",
    "DataError",
    "TensorLoader",
    "default_data_dir",
    "download_cifar10",
    "load_cifar10",
    "load_cifar10_subset",
    "write_cifar10_fixture",
]
