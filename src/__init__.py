"""vitsweep: Vision Transformer vs CNN studies driven by Hydra configs."""
