"""Attention maps of a trained ViT run: per image and per class, rollout, mean distance, position similarity.

    python -m src.attention RUN_DIR [--images 8] [--per-class 100] [--per-head] [--out DIR]

The tool lives beside the trainer, not in ``analysis/``: it rebuilds the run's model from the
checkpoint (``src.models`` through ``model_cfg``) and its test images from the run's dataset config
(``src.data.build_data``), and ``analysis/`` reads run directories only. Its numbers also go to
``attention.npz`` in the output folder, a plain file that analysis code may read.

Modules: ``maps`` (pure tensor functions), ``plots`` (figures), ``tool`` (loading a run, the CLI).
"""
