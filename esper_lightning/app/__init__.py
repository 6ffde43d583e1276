"""The application: the ``esper-lightning`` commands, one subpackage each.

`ppo` learns a controller, `compare` judges controllers on paired episodes, `frontier` measures
growth against the compute-optimal frontier; `cli` dispatches to them, `config` and `task` are
the settings they share. Nothing outside this package imports it: controllers use
`esper_lightning.rl` only.
"""
