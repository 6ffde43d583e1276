"""CUDA-only checks of the env pool: per-env streams and per-env GradScalers (skipped on CPU)."""

import pytest
import torch

from esper_lightning.core.actions import Action, LifecycleOp
from esper_lightning.core.lifecycle import GateConfig
from esper_lightning.core.seeding import SeedingConfig
from esper_lightning.data import load_cifar10
from esper_lightning.envs import EnvPool, EnvSpec

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("precision", ["16-mixed", "bf16-mixed"])
def test_each_env_has_its_own_stream_and_scaler(cifar_dir, precision):
    spec = EnvSpec(slots=("r0c1",), batch_size=16, precision=precision,
                   seeding=SeedingConfig(gate_config=GateConfig(min_training_epochs=0)))
    data = load_cifar10(cifar_dir, True), load_cifar10(cifar_dir, False)
    pool = EnvPool(spec, *data, ["cuda", "cuda"], cuda_streams=True)
    streams = [env.stream for env in pool.envs]
    assert all(isinstance(s, torch.cuda.Stream) for s in streams) and streams[0] != streams[1]
    scalers = [getattr(env.fabric.strategy.precision, "scaler", None) for env in pool.envs]
    if precision == "16-mixed":
        assert all(s is not None for s in scalers) and scalers[0] is not scalers[1]
    else:
        assert scalers == [None, None]  # bf16 needs no loss scaling
    pool.reset([1, 2])
    germinate = Action(LifecycleOp.GERMINATE, 0, blueprint="conv_light")
    for actions in ([germinate, germinate], [Action(LifecycleOp.ADVANCE, 0)] * 2,
                    [Action(LifecycleOp.ADVANCE, 0)] * 2, [Action(), Action()]):
        observations = [step.observation for step in pool.step(actions)]
    for obs in observations:
        assert obs.rollback_reason is None and obs.train_loss is not None
        assert obs.report.slots[0].alpha > 0


def test_no_stream_by_default_on_cuda(cifar_dir):
    spec = EnvSpec(slots=("r0c1",), batch_size=16)
    data = load_cifar10(cifar_dir, True), load_cifar10(cifar_dir, False)
    pool = EnvPool(spec, *data, ["cuda"])
    assert pool.envs[0].stream is None and pool.envs[0].device.type == "cuda"
    pool.reset([1])
    assert pool.step([Action()])[0].observation.train_loss is not None
