"""Train the morphogenesis controller with PPO over a pool of CIFAR-10 host models.

    python examples/cifar_ppo.py --preset smoke --data-dir ../shared/data/cifar10-subset
    tensorboard --logdir runs

A thin wrapper around ``esper-lightning ppo``: every flag of that command works here. Presets:
``smoke`` (a minute or two on 2 CPU cores, proves the loop), ``cpu`` (real learning on a CIFAR-10
subset in about an hour on 2 cores), ``gpu`` (full CIFAR-10 on a CUDA device). Without
``--data-dir`` the data comes from ``$ESPER_DATA_DIR`` (add ``--download`` to fetch it).
"""

import sys

from esper_lightning.app.cli import main

if __name__ == "__main__":
    sys.exit(main(["ppo", *sys.argv[1:]]))
