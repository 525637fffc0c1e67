"""Reinforcement learning on gputrain's parts: environments stepped as tensors on the training
device (`envs/`), and PPO (CleanRL's ppo.py and ppo_continuous_action.py) as a loop that reuses the
config, device placement, checkpoints, run directory, metrics and run record of supervised training."""
