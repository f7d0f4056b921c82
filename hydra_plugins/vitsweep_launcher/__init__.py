"""Hydra launcher plugin `hydra/launcher=vectorized`: a pool of worker processes, with stacked members
(see config.py for its keys)."""
