"""Hydra sweeper plugin `hydra/sweeper=vitsweep` (Optuna 5); see config.py for its keys."""
