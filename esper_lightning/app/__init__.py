"""The application: the PPO trainer over the Fabric env pool, its checkpoints, config and CLI.

Nothing outside this package imports it: controllers use `esper_lightning.rl` only.
"""
