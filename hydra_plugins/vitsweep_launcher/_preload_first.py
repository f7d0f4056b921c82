"""The first module a CPU pool's fork server imports (``pool.FORK_SERVER_PRELOAD``): the garbage collector stays
off while the fork server imports torch, whose 330,000 objects live as long as it does and which every collection
walked again (the preload took about 2.4 s with the collector on, 2.0 s off, on a 2-core CPU; it is the launch's
critical path). ``fork_server.py``, the last module of the preload, freezes them and turns the collector back on.

Hydra's plugin scan imports every module of ``hydra_plugins`` in every process, except those whose name starts
with an underscore: only the fork server's preload imports this one.
"""

import gc

gc.disable()
collector_off = True  # fork_server.py turns it back on, once
