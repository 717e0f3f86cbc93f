"""The learner's stop flag: set by SIGTERM/SIGINT, read between steps by every part of the loop."""

from __future__ import annotations

import signal
import threading


class StopFlag:
    """Set by SIGTERM/SIGINT: the learner finishes the current step, checkpoints and exits 0."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self, *_args) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def install(self) -> StopFlag:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.set)
            signal.signal(signal.SIGINT, self.set)
        return self
