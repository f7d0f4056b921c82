"""The last module a CPU pool's fork server imports (``pool.FORK_SERVER_PRELOAD``): it makes that process end
without the interpreter's teardown.

The fork server (multiprocessing's ``forkserver``) has torch loaded, holds the launching process's output, and
ends when the launching process does; its teardown took 1.7-1.9 s on a loaded 2-core CPU, and whoever reads the
sweep's output to its end (a shell pipe, ``subprocess.run``) waited for it. It serves no job and has nothing to
save. Only the fork server's preload registers the exit: Hydra's plugin scan imports this module in every Hydra
process, where it does nothing.
"""

import atexit
import os
import sys


def _imported_by_the_fork_server() -> bool:
    import multiprocessing.forkserver as fs

    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is fs.main.__code__:
            return True
        frame = frame.f_back
    return False


if _imported_by_the_fork_server():
    # registered after torch's own exit handlers, so it runs before them (last in, first out): they clean up
    # after work this process never does. Forked workers inherit it and run it last, after their own handlers
    # (``pool.exit_without_teardown`` does the same for spawned ones).
    atexit.register(os._exit, 0)
