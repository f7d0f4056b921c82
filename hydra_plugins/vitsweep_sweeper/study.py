"""Public face of ``_study.py`` (study-level helpers: samplers, pruners, grid order, results file, attribute names).

Hydra's plugin scan re-executes every module of ``hydra_plugins`` whose name has no leading underscore
(``hydra/core/plugins.py``), which would redefine its classes and reset its state on each scan; the
implementation therefore lives in the underscore module, and re-executing this re-export binds the same
objects again. The names load on first use (``_lazy.py``): the scan does not load Optuna.
"""
from ._lazy import reexport

__getattr__ = reexport(__name__, "._study")
