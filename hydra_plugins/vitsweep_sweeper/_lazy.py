"""Lazy re-exports for the public modules (``search_space``, ``storage``, ``study``).

Hydra's plugin scan imports every module of ``hydra_plugins`` whose name has no leading underscore, in every Hydra
process (each single run, a multirun's launching process, each launcher worker). Re-exported eagerly, these three
loaded Optuna there (0.15-0.2 s of a 2-core CPU, ahead of the launcher's set-up, which starts its workers); now their
underscore module, and Optuna, load at the first name a caller reads.
"""

import importlib
from collections.abc import Callable


def reexport(name: str, target: str) -> Callable[[str], object]:
    """A module ``__getattr__`` for module ``name`` that reads from ``target`` (relative to its package) on first
    use. No ``__dir__``: the scan lists each module's members (``inspect.getmembers``), which would load it."""
    package = name.rpartition(".")[0]

    def __getattr__(attr: str) -> object:
        module = importlib.import_module(target, package)
        try:
            return getattr(module, attr)
        except AttributeError:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}") from None

    return __getattr__
