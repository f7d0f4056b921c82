"""One way for a child process to stop once the process that started it is gone (killed, even with SIGKILL).

Used by the sweeper's worker processes, the launcher's pool workers and the DICOM decode workers. It needs only the
standard library, so any of them may import it.
"""

import logging
import os
import signal
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


def watch_parent(parent: int, grace_s: float | None = None, on_gone: Callable[[], None] | None = None,
                 poll_s: float = 1.0, name: str = "vitsweep-parent-watch") -> threading.Thread:
    """Start a daemon thread that waits until ``parent`` is no longer this process's parent, then calls ``on_gone``.

    With ``grace_s``, it then sends this process SIGTERM, so that its own handlers stop it cleanly (a run saves its
    checkpoint, a sweep worker hands its trials back), and ends it with ``os._exit(143)`` if it is still alive
    ``grace_s`` later: a handler that hung, or an exit waiting on some other thread, cannot keep an orphan alive.
    Without ``grace_s`` (a process with nothing to save) it ends the process at once.

    ``parent`` is the parent's pid as the parent gave it: a child still starting when its parent died has been
    re-parented already, so its own ``os.getppid()`` would name the new parent and never change.
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        if on_gone is not None:
            on_gone()
        if grace_s is not None:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(grace_s)
            log.error(f"process {os.getpid()} still runs {grace_s:.0f} s after its parent {parent} went and it was "
                      "sent SIGTERM; ending it now")
        os._exit(128 + signal.SIGTERM)

    thread = threading.Thread(target=watch, name=name, daemon=True)
    thread.start()
    return thread
