"""The last module a CPU pool's fork server imports (``pool.FORK_SERVER_PRELOAD``): it makes that process end
without the interpreter's teardown and outlive a SIGTERM, and it freezes what the preload loaded and turns the
garbage collector back on (``_preload_first`` turned it off).

The fork server (multiprocessing's ``forkserver``) has torch loaded, holds the launching process's output, and
ends when the launching process does; its teardown took 1.7-1.9 s on a loaded 2-core CPU, and whoever reads the
sweep's output to its end (a shell pipe, ``subprocess.run``) waited for it. It serves no job and has nothing to
save. Only the fork server's preload registers the exit: Hydra's plugin scan imports this module in every Hydra
process (and runs it again in every worker), where it does nothing.
"""

import atexit
import gc
import os
import signal
import sys


def _imported_by_the_fork_server() -> bool:
    """True in the fork server's preload only. A worker it forks runs inside the server's ``main`` too, under
    ``_serve_one``, and imports this module again: Hydra's plugin scan (at ``Singleton.set_state`` in each worker)
    re-runs every module of ``hydra_plugins``. Registered there again, the exit would run before the worker's own
    last handler (``_worker.exit_without_teardown``: logging's shutdown, the streams' flush), and what a job's exit
    handlers logged or printed was lost (tests/test_launcher.py)."""
    import multiprocessing.forkserver as fs

    serve_one = getattr(fs, "_serve_one", None)  # private: where it is missing, never register (only slower)
    if serve_one is None:
        return False
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is serve_one.__code__:
            return False
        if frame.f_code is fs.main.__code__:
            return True
        frame = frame.f_back
    return False


if _imported_by_the_fork_server():
    # registered after torch's own exit handlers, so it runs before them (last in, first out): they clean up
    # after work this process never does. Forked workers inherit it and run it last, after their own handlers
    # (``_worker.exit_without_teardown`` does the same for spawned ones).
    atexit.register(os._exit, 0)
    # SIGTERM to every process of the sweep at once (`timeout`, Slurm's scancel, a preemption) killed the server:
    # its workers' exit sentinels are its pipes, so the launcher's wait for the stopping workers ended at once and
    # the sweeper handed their trials back while the runs were still saving (tests/test_sweep_resume.py). CPython's
    # server already ignores SIGINT for the same reason; it ends with the launching process (its alive pipe). Its
    # direct children (the pool's workers) take the disposition back the moment they are forked, before any start-up
    # work, so a SIGTERM to a starting worker still ends it; children that workers fork themselves are left alone.
    _before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _server = os.getpid()
    os.register_at_fork(after_in_child=lambda: os.getppid() == _server and signal.signal(signal.SIGTERM, _before))

_first = sys.modules.get("hydra_plugins.vitsweep_launcher._preload_first")
if _first is not None and _first.__dict__.pop("collector_off", False):  # the preload's end, in the fork server
    # the preloaded modules' objects (torch's: about 330,000) live as long as the process: out of the collector's
    # reach, a worker's full collection took 1 ms instead of 150 ms, and the Hydra plugin scan each worker runs at
    # its start 0.07 s instead of 0.22 s (docs/benchmarks/README.md). Python's gc docs advise it before forking
    gc.freeze()
    gc.enable()
