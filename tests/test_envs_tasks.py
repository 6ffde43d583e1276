"""Tasks of the env pool: CIFAR-10 and the byte-level language model, and an lm env pool."""

import pytest
import torch
import torch.nn.functional as F

from esper_lightning.core.actions import Action, LifecycleOp
from esper_lightning.core.divergence import GovernorConfig
from esper_lightning.core.lifecycle import GateConfig, SeedStage
from esper_lightning.core.seeding import SeedingConfig
from esper_lightning.data import DataError, load_cifar10
from esper_lightning.data.tensor_loader import normalize
from esper_lightning.envs import EnvPool, EnvSpec
from esper_lightning.envs.task_specs import task_class
from esper_lightning.envs.tasks import (
    VAL_BATCH,
    VAL_BLOCKS,
    CifarTask,
    TextTask,
)
from esper_lightning.hosts import CifarCNNHost, GPTHost

CPU = torch.device("cpu")
LM = TextTask(block_size=32, train_blocks=48, val_blocks=20)
LM_SPEC = EnvSpec(task=LM, host_preset="tiny", slots=("r0c0", "r0c1"), batch_size=16,
                  host_lr=1e-3, episode_length=4,
                  seeding=SeedingConfig(gate_config=GateConfig(min_training_epochs=1)),
                  governor=GovernorConfig(num_classes=256))
GERMINATE_LORA = Action(LifecycleOp.GERMINATE, 1, blueprint="lora")
ADVANCE = Action(LifecycleOp.ADVANCE, 1)


def test_registry_and_one_line_errors():
    assert task_class("lm") is TextTask and task_class("cifar") is CifarTask
    assert (CifarTask.topology, CifarTask.num_classes) == ("cnn", 10)
    assert (TextTask.topology, TextTask.num_classes) == ("transformer", 256)
    assert TextTask.slot_ids("tiny") == ("r0c0", "r0c1")
    assert CifarTask.slot_ids("baseline")[:3] == CifarTask.default_slots
    assert "lora" in TextTask.blueprints() and "conv_light" not in TextTask.blueprints()
    with pytest.raises(ValueError, match="unknown host_preset 'baseline' for task 'lm'; "
                                         "accepted: tiny, small, medium"):
        TextTask.slot_ids("baseline")
    with pytest.raises(ValueError, match=r"block_size 256 exceeds the 'tiny' host's block_size "
                                         r"128; accepted: 1\.\.128"):
        TextTask(block_size=256).make_host("tiny", ("r0c0",), 1e-3)
    with pytest.raises(ValueError, match="train_blocks must be"):
        TextTask(train_blocks=0)
    with pytest.raises(ValueError, match="unknown host_preset 'tiny' for task 'cifar'"):
        EnvSpec(host_preset="tiny")


def test_an_epoch_without_a_batch_is_one_line(text_file, cifar_dir):
    train, _ = CifarTask(train_subset=10).load(cifar_dir)
    with pytest.raises(DataError, match="the training split holds 10 images, fewer than "
                                        "batch_size=11: an epoch would train on no batch"):
        CifarTask().check_train_split(train, 11)
    CifarTask().check_train_split(train, 10)  # one batch: accepted
    tokens, _ = LM.load(text_file)
    blocks = len(tokens) // LM.block_size
    with pytest.raises(DataError, match=f"gives an epoch no batch: n_blocks={blocks} is fewer "
                                        f"than batch_size={blocks + 1}"):
        TextTask(block_size=32).check_train_split(tokens, blocks + 1)
    TextTask(block_size=32).check_train_split(tokens, blocks)


def test_text_task_reads_a_file_or_its_folder_and_splits_head_and_validation(text_file):
    train, val = LM.load(text_file)
    test = LM.load_test(text_file)
    assert len(test) >= len(val) and not torch.equal(test[:len(val)], val)
    assert train.dtype == val.dtype == torch.uint8
    raw = torch.tensor(list(text_file.read_bytes()), dtype=torch.uint8)
    held_out = len(raw) // 10  # validation, then the test split the envs never read
    assert torch.equal(torch.cat([train, val]), raw[:len(train) + len(val)])
    assert len(train) == len(raw) - held_out and len(val) == held_out // 2
    same = LM.load(text_file.parent)
    assert torch.equal(same[0], train) and torch.equal(same[1], val)
    with pytest.raises(DataError, match="not found"):
        LM.load(text_file.parent / "missing.txt")


def test_text_batches_count_blocks_and_the_loss_every_token(text_file):
    train, val = LM.load(text_file)
    loader = LM.train_loader(train, 16, CPU)
    batches = list(loader)
    assert len(loader) == len(batches) == 48 // 16
    x, y = batches[0]
    assert x.shape == y.shape == (16, 32) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one token
    loader.reseed(7)
    again = next(iter(loader))
    loader.reseed(7)
    assert torch.equal(next(iter(loader))[0], again[0])

    val_batches = LM.validation_batches(val, CPU)
    assert [len(b[0]) for b in val_batches] == [20] and VAL_BLOCKS >= 20  # one forward
    assert torch.equal(val_batches[0][0].flatten()[:64], val[:64].long())
    logits = torch.randn(2, 5, 256, generator=torch.Generator().manual_seed(0))
    targets = torch.randint(0, 256, (2, 5), generator=torch.Generator().manual_seed(1))
    per_token = F.cross_entropy(logits.reshape(10, 256), targets.reshape(10), reduction="none")
    torch.testing.assert_close(LM.loss(logits, targets), per_token.mean())


def test_cifar_task_keeps_the_image_pipeline(cifar_dir):
    task = CifarTask(train_subset=48, val_subset=15)
    (train_x, train_y), (_, val_y) = task.load(cifar_dir, rng_seed=3)
    assert len(train_y) == 48 and len(val_y) == 15 and train_x.dtype == torch.uint8
    # Validation and test are the two halves of the official test batch (40 images here).
    test_x, test_y = task.load_test(cifar_dir)
    everything = load_cifar10(cifar_dir, False)
    assert torch.equal(test_y, everything[1][20:]) and torch.equal(test_x, everything[0][20:])
    assert len(CifarTask().load(cifar_dir)[1][1]) == 20
    batches = task.validation_batches(load_cifar10(cifar_dir, False), CPU)
    images, labels = load_cifar10(cifar_dir, False)
    assert sum(len(b[1]) for b in batches) == len(labels) and len(batches[0][1]) <= VAL_BATCH
    torch.testing.assert_close(torch.cat([b[0] for b in batches]), normalize(images))
    assert isinstance(task.make_host("baseline", ("r0c1",), 0.01), CifarCNNHost)
    logits, y = torch.randn(4, 10), torch.tensor([0, 1, 2, 3])
    assert torch.equal(task.loss(logits, y), F.cross_entropy(logits, y))


def _numbers(observations):
    return [(o.report.val_accuracy, o.report.val_loss, o.train_loss,
             tuple((s.stage, s.alpha) for s in o.report.slots)) for o in observations]


def test_lm_pool_grows_a_transformer_seed_deterministically(text_file):
    data = LM.load(text_file)
    pool = EnvPool(LM_SPEC, *data, ["cpu"])
    script = [GERMINATE_LORA, ADVANCE, ADVANCE]
    runs = []
    for _ in range(2):
        observations = pool.reset([11])
        runs.append(_numbers(observations + [pool.step([a])[0].observation for a in script]))
    assert runs[0] == runs[1]
    env = pool.envs[0]
    assert isinstance(env.host, GPTHost) and env.engine.topology == "transformer"
    assert env.engine.slots["r0c1"].stage == SeedStage.BLENDING
    assert env.engine.slots["r0c1"].state.blueprint == "lora"
    first_loss = runs[0][0][1]
    assert 0 < first_loss < 6.0 and runs[0][-1][1] < first_loss  # per-token loss, learning
    assert len(env.val_batches) == 1 and env.val_batches[0][0].shape == (20, 32)
