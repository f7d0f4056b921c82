"""Signals in a sweep's worker: SIGTERM handed on as a clean stop that hands the running trials back, and a guard
for writes that a signal must not cut halfway."""

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


class StopSignal:
    """SIGTERM to a worker running trials (where no run's own handler has it: the trainer's, in-process) stops
    it as Ctrl-C does, so it hands its running trials back (fails them, enqueues their retries) before it
    exits, instead of dying with them RUNNING. The first SIGTERM counts, later ones are ignored. While the
    launcher runs a batch (`armed`) it raises SystemExit(143) at once; elsewhere (claiming, telling a
    trial: `deferred`) it is noted, and raised at the next safe point."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._armed = False

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            return
        self.signum = signum
        if self._armed:
            self._armed = False
            raise SystemExit(128 + signum)

    def check(self) -> None:
        if self.signum is not None:
            raise SystemExit(128 + self.signum)

    @contextlib.contextmanager
    def installed(self) -> Iterator["StopSignal"]:
        if threading.current_thread() is not threading.main_thread() \
                or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            yield self
            return
        signal.signal(signal.SIGTERM, self._handle)
        try:
            yield self
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        self.check()
        self._armed = True
        try:
            yield
        finally:
            self._armed = False

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        was, self._armed = self._armed, False
        try:
            yield
        finally:
            self._armed = was
        if was:
            self.check()


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    """SIGINT and SIGTERM ignored inside (main thread only): writes that must not be cut halfway."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
