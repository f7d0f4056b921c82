"""Clean stops on SIGTERM/SIGINT: the handlers that ask a run's loop to stop after its current step, and the
exception a stopped run ends with."""
from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)


class RunInterrupted(SystemExit):
    """SIGTERM or SIGINT stopped the run after a checkpoint and its ``interrupted`` summary were written.
    A ``SystemExit`` with code 128 + signal number, so a job process exits non-zero; ``summary`` holds it."""

    def __init__(self, signum: int, summary: dict[str, Any]):
        super().__init__(128 + signum)
        self.signum, self.summary = signum, summary

    def __reduce__(self):  # a pool worker sends it back pickled; the default would call __init__(code) alone
        return type(self), (self.signum, self.summary)


def stop_in_flight() -> bool:
    """Whether the exception on its way out (``sys.exc_info``, in an ``except`` or ``finally`` clause) is a stop:
    SIGTERM/SIGINT's ``RunInterrupted``, or a Ctrl-C's ``KeyboardInterrupt`` raised wherever it came. A tracker run
    it ends ends ``KILLED``, as one an ``interrupted`` summary ends; any other exception ends it ``FAILED``."""
    return isinstance(sys.exc_info()[1], (RunInterrupted, KeyboardInterrupt))


class StopSignal:
    """SIGTERM/SIGINT handlers that ask the loop to stop after the current step (a second SIGINT raises
    KeyboardInterrupt at once). Installed only in the main thread; elsewhere the default handlers stay.

    They stay installed until the run's final checkpoint and summary are written: a second SIGTERM there (a sweep's
    launcher hands a stop on to its workers, which the signal has often reached already) met the default handler
    and ended the process mid-save. A signal the run did not stop for (it came as the run ended for another
    reason) is handed on to the handler that was there before, once the block ends without an exception: the
    process was asked to stop, and a worker must not start its next job. A sweep's retry of such a run finds it
    done under ``trainer.checkpoint=true`` (every study's setting); without checkpoints it trains again, as any
    stopped run without checkpoints does."""

    def __init__(self):
        self.signum: int | None = None

    def _handle(self, signum, frame):  # only sets a flag: the loop logs and stops at the next step's end
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopSignal]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        old = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield self
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
        if self.signum is not None:  # the block ended normally: its run did not stop for the signal
            log.warning("%s came as the run ended: its records are whole; the signal goes on to this process",
                        signal.Signals(self.signum).name)
            signal.raise_signal(self.signum)
