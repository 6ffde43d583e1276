"""Lightning's own cost per training step, and the step time at which a fit's tax is 5 %.

    python benchmarks/bench_lightning_step.py --repeats 5

`bench_fit_tax.py` finds `examples/grow_gpt.py`'s fit about 1.2x a bare loop, all of it
Lightning's (the growth callbacks' share is below what it resolves). This script measures that
share alone, on a step so small (a 16 -> 1 linear layer, batch 8) that nearly all of a fit's time
is the loop around it, in four fresh subprocesses per repeat, interleaved (the order rotates each
repeat so machine noise hits all alike), one torch thread each:

* ``bare``: a hand-written loop (forward, ``zero_grad``, backward, AdamW step) over a
  ``DataLoader``;
* ``trainer``: a plain `lightning.Trainer` over the same module and loader (no logger, no
  checkpoint, no progress bar, no model summary: the loop and its hooks alone);
* ``log``: as ``trainer``, the module's ``training_step`` also calling
  ``self.log("train_loss", loss, prog_bar=True)`` every step, as `examples/grow_gpt.py` and the
  Lightning docs do;
* ``log+bs``: as ``log`` with ``batch_size=`` passed, which spares Lightning inferring it.

Each child times its own steps by process CPU time (`time.process_time`, which other jobs on a
shared machine disturb far less than the wall clock). Printed: each mode's CPU ms per step
(median over repeats), its overhead over ``bare`` (ms per step, median of the repeats' paired
differences), and the step time ``t`` a model must take for that overhead to be at most 5 % of
it (``t = overhead / 0.05``): a fit whose bare step takes ``t`` runs at 1.05x a bare loop.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

MODES = ("bare", "trainer", "log", "log+bs")
#: The fit tax the issue allows (a fit at most this many times a bare loop of the same work).
TARGET = 1.05


def child(mode: str, steps: int) -> float:
    """One fit of ``steps`` steps in ``mode``; its CPU seconds per step."""
    import lightning as L
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    x, y = torch.randn(steps, 8, 16), torch.randn(steps, 8, 1)
    data = torch.utils.data.TensorDataset(x, y)
    loader = torch.utils.data.DataLoader(data, batch_size=None)  # each item one [8, 16] batch

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(16, 1)

        def training_step(self, batch, batch_idx):
            loss = nn.functional.mse_loss(self.net(batch[0]), batch[1])
            if mode == "log":
                self.log("train_loss", loss, prog_bar=True)
            elif mode == "log+bs":
                self.log("train_loss", loss, prog_bar=True, batch_size=8)
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    module = Tiny()
    if mode == "bare":
        optimizer = module.configure_optimizers()
        start = time.process_time()
        for batch_idx, batch in enumerate(loader):
            loss = module.training_step(batch, batch_idx)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return (time.process_time() - start) / steps
    trainer = L.Trainer(max_steps=steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu", devices=1)
    start = time.process_time()
    trainer.fit(module, loader)
    assert trainer.global_step == steps, trainer.global_step  # the same work as the bare loop
    return (time.process_time() - start) / steps


def run_child(mode: str, steps: int) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, __file__, "--child", mode, "--steps", str(steps)],
                         capture_output=True, text=True, env=env, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000, help="training steps per fit")
    parser.add_argument("--repeats", type=int, default=5, help="rounds of the four fits")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(child(args.child, args.steps))
        return
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for repeat in range(args.repeats):
        order = MODES[repeat % len(MODES):] + MODES[:repeat % len(MODES)]
        for mode in order:
            times[mode].append(run_child(mode, args.steps))
        print(f"repeat {repeat}: " + ", ".join(f"{m} {times[m][-1] * 1e3:.3f} ms" for m in MODES),
              flush=True)
    print(f"\n{args.steps} steps a fit, {args.repeats} repeats, CPU ms per step (median):")
    print(f"{'mode':<8} {'ms/step':>8} {'overhead':>9} {'step for ' + str(TARGET) + 'x':>14}")
    for mode in MODES:
        extra = statistics.median(t - b for t, b in zip(times[mode], times["bare"], strict=True))
        need = f"{extra * 1e3 / (TARGET - 1):.1f} ms" if mode != "bare" else ""
        print(f"{mode:<8} {statistics.median(times[mode]) * 1e3:8.3f} {extra * 1e3:9.3f} "
              f"{need:>14}")


if __name__ == "__main__":
    main()
