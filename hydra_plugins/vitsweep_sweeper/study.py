"""Public face of ``_study.py`` (study-level helpers: samplers, pruners, grid order, results file, attribute names).

Hydra's plugin scan re-executes every module of ``hydra_plugins`` whose name has no leading underscore
(``hydra/core/plugins.py``), which would redefine its classes and reset its state on each scan; the
implementation therefore lives in the underscore module, and re-executing this re-export binds the same
objects again.
"""
from ._study import *  # noqa: F401,F403
