"""``esper-lightning ppo``: a controller learned with PPO over the Fabric env pool.

`trainer` runs the rounds (`PPOTrainer`); `learner` is one policy and what belongs to it;
`checkpoint` saves and resumes a run exactly; `metrics` turns a round into TensorBoard scalars;
`distributed` launches DD-PPO and `ranks` says where one process stands.
"""
