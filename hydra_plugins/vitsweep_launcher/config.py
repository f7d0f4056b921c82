"""Structured config for `hydra/launcher=vectorized`, registered with Hydra's ConfigStore.

Hydra's plugin scan imports every module under the `hydra_plugins` namespace, so importing this file
registers the launcher; the pool and the stacked engine load only when a multirun uses it.
"""

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore


@dataclass
class VectorizedLauncherConf:
    _target_: str = "hydra_plugins.vitsweep_launcher.launcher.VectorizedLauncher"
    # Worker processes pulling jobs as they free up. null = one per CPU core, or one per visible GPU when the
    # jobs train on CUDA; each takes cores // n_procs torch threads, on CUDA too (cores are shared out among the
    # vitsweep sweeper's n_workers). Never more than the jobs.
    n_procs: int | None = None
    # Train jobs that differ only in member keys (seed, label_noise, optimizer.lr, optimizer.weight_decay)
    # as one stacked model (torch.func.vmap): auto = on CUDA only (on CPU it measured no faster),
    # always = wherever the model can stack, never = one job at a time.
    stack: str = "auto"
    max_members: int = 16  # most jobs trained as one stacked model
    # How CPU workers start: auto = forked from a fork server that imports torch once (where the platform has
    # one; spawn elsewhere), forkserver, or spawn (each worker a fresh interpreter: for a library that is not
    # safe to fork). Workers on CUDA are always spawned.
    start_method: str = "auto"


def register() -> None:
    ConfigStore.instance().store(
        group="hydra/launcher", name="vectorized", node=VectorizedLauncherConf, provider="vitsweep"
    )


register()
