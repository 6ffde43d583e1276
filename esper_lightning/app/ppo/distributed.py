"""Data-parallel PPO (DD-PPO) on Lightning Fabric: launching the processes.

``esper-lightning ppo --strategy ddp --devices N --num_nodes M`` runs N x M processes. Fabric
starts them (``ddp``: N copies of the command on this machine; ``ddp_spawn`` / ``ddp_fork``:
from this process) or, under torchrun or SLURM, finds them started and joins them. Each process
(a rank, `app.ppo.ranks.Ranks`) drives its own env pool of ``envs / world`` envs on its own device;
env ``k`` of rank ``r`` is global env ``r * envs / world + k``, whose episode and
action-sampling seeds are those of env ``r * envs / world + k`` of a one-process run. Ranks meet
only in the PPO update (`rl.ppo.ppo_update` with `Ranks.all_reduce`) and to gather the round's
statistics for rank 0 (`app.ppo.metrics.merge_stats`), which logs and writes the checkpoint
(docs/scaling.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import lightning as L
from lightning.fabric import Fabric

from esper_lightning.app.config import PPORunConfig
from esper_lightning.app.ppo.metrics import RoundStats
from esper_lightning.app.ppo.paths import refuse_overwrite
from esper_lightning.app.ppo.ranks import Ranks
from esper_lightning.app.ppo.trainer import PPOTrainer


def launch_ppo(config: PPORunConfig, command: Sequence[str] = ()) -> list[RoundStats] | None:
    """Run ``config`` on ``config.world_size`` processes; returns rank 0's per-round stats in
    the process that called it when Fabric started the others from here (ddp_spawn, ddp_fork)
    or in rank 0 (ddp, torchrun, SLURM), None in every other rank.

    Example:
        >>> launch_ppo(load_config("smoke", overrides={"strategy": "ddp", "devices": ["2"],
        ...                                             "minibatch_envs": 2}))  # doctest: +SKIP
    """
    refuse_overwrite(config)  # once, here, before any rank starts (each would refuse alike)
    fabric = L.Fabric(accelerator="cuda" if config.device == "cuda" else "cpu",
                      strategy=config.strategy, devices=config.world_size // config.num_nodes,
                      num_nodes=config.num_nodes)
    return fabric.launch(_train_rank, config, list(command))


def _train_rank(fabric: Fabric, config: PPORunConfig, command: Sequence[str] = ()
                ) -> list[RoundStats] | None:
    ranks = Ranks.from_fabric(fabric)
    with fabric.rank_zero_first(local=True):  # one data download per machine, then the rest
        trainer = PPOTrainer(config, ranks, command)
    history = trainer.train()
    return history if ranks.is_zero else None
