"""One way for a child process to stop once the process that started it is gone (killed, even with SIGKILL).

Used by the sweeper's worker processes, the launcher's pool workers and the DICOM decode workers. It needs only the
standard library, so any of them may import it.
"""

import logging
import os
import select
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

    def wait() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)

    return _watch(wait, parent, grace_s, on_gone, name)


def watch_process(pid: int, grace_s: float | None = None, on_gone: Callable[[], None] | None = None,
                  poll_s: float = 1.0, name: str = "vitsweep-parent-watch") -> threading.Thread:
    """``watch_parent`` for a process that started this one through another (a fork server's children): waits
    until process ``pid`` has ended (a zombie counts as ended), on a pidfd where Linux has one, else by polling."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd (not Linux >= 5.3), or no such process (gone already)
        fd = None

    def wait() -> None:
        if fd is not None:
            select.select([fd], [], [])  # readable once the process has ended
            return
        while alive(pid):
            time.sleep(poll_s)

    return _watch(wait, pid, grace_s, on_gone, name)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _watch(wait: Callable[[], None], parent: int, grace_s: float | None, on_gone: Callable[[], None] | None,
           name: str) -> threading.Thread:
    def watch() -> None:
        wait()
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
