"""The driver of h200-1128c-callback_overhead_steps.log (the GPU loan of 2026-11-28).

Run from the checkout with ``PYTHONPATH=.``: plain against callback fits of
`bench_callback_overhead.py` on the GPU, at 16 and 63 steps per epoch (generated fixtures of 2,000
and 8,000 training images), 2 and 6 epochs, 5 interleaved repeats, medians.
"""

import statistics
import sys

sys.path.insert(0, "benchmarks")
import bench_callback_overhead as bench

from esper_lightning.data import write_cifar10_fixture

for n_train in (2000, 8000):
    data_dir = str(write_cifar10_fixture(f"/tmp/fixture{n_train}", n_train, 500))
    bench.fit_seconds("plain", data_dir, 1, 128, "gpu")  # warm-up
    for epochs in (2, 6):
        times = {config: [] for config in ("plain", "callback")}
        for _ in range(5):
            for config, runs in times.items():
                runs.append(bench.fit_seconds(config, data_dir, epochs, 128, "gpu"))
        m = {config: statistics.median(runs) for config, runs in times.items()}
        print(f"RESULT train {n_train} ({-(-n_train // 128)} steps/epoch) epochs {epochs}: "
              f"plain {m['plain']:.3f} s callback {m['callback']:.3f} s ratio "
              f"{m['callback'] / m['plain']:.3f} extra {m['callback'] - m['plain']:.3f} s",
              flush=True)
