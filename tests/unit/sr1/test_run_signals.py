"""`sr1 run` / `sr1 launch` stop in order on Ctrl-C and on `kill`, even when started with SIGINT ignored (a shell's
background command: `nohup sr1 run &`)."""

from __future__ import annotations

import signal

import pytest

from sr1.run import _interrupt_on_sigterm


def test_sigint_and_sigterm_interrupt_the_run_even_if_sigint_was_ignored():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _interrupt_on_sigterm()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGTERM)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
