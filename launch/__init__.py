"""Launchers: several local processes simulating hosts (`launch.local`), SLURM and Cloud TPU VM recipes."""
