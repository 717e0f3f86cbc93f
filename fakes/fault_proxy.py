"""A TCP proxy on the loopback whose traffic a test controls: network faults without killing either side.

    with FaultProxy(("127.0.0.1", redis_port)) as proxy:
        client = redis.Redis(port=proxy.port)          # the client talks to the server through the proxy
        proxy.blackhole()                              # bytes go nowhere, both ways; every socket stays open
        proxy.restore()                                # what was held is delivered now (a partition that heals)
        proxy.drop()                                   # every connection is closed; new ones are closed at once
        proxy.delay(0.5)                               # every chunk waits 0.5 s before it is forwarded

Each fault applies to every connection, or with `who=` only to those whose label matches: `label(peer)` names the
client of a connection when it is accepted (`process_role` names the sr1 process behind a loopback peer, so one
proxy in front of Redis can cut the generators and leave the learner alone). `held[label]` counts the connections
that had traffic held back by a black hole (bytes, not a connection's end), `dropped[label]` those a drop closed:
proof that a fault met live traffic.

A black hole is the nasty case: the client's connection stays open and its request unanswered, so a client
without a socket timeout waits forever. The proxy stops reading, so what the client sent sits in the kernel's
buffers, as packets a partition holds back do; when the fault ends the proxy forwards it, even if the client gave
up meanwhile. A command sent during a cut may therefore run on the server after the client retried it: what a
lost reply does to a retry is exactly what the test sees.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

PASS, DROP, DELAY, BLACKHOLE = "pass", "drop", "delay", "blackhole"
_POLL_S = 0.05


@dataclass(frozen=True)
class Fault:
    mode: str = PASS
    delay_s: float = 0.0


class _Link:
    """One client connection and its upstream connection, pumped both ways by two threads."""

    def __init__(self, proxy: FaultProxy, client: socket.socket, upstream: socket.socket, label: str):
        self.proxy, self.client, self.upstream, self.label = proxy, client, upstream, label
        self.closed = threading.Event()
        self.holding = False  # traffic of this connection is held back by the black hole in force
        self.threads = [
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True),
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True),
        ]
        for sock in (client, upstream):
            sock.settimeout(_POLL_S)
        for thread in self.threads:
            thread.start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        held = b""  # read, not forwarded yet: forwarded only once the fault in force allows it
        while not self.closed.is_set():
            if held:
                fault = self.proxy.fault_for(self.label)
                if fault.mode == DELAY:
                    time.sleep(fault.delay_s)
                with self.proxy.gate:  # a fault set while we looked is in force before anything is sent
                    fault = self.proxy.fault_for(self.label)
                    if fault.mode in (PASS, DELAY):
                        try:
                            dst.sendall(held)
                        except OSError:
                            self.close(reset=True)
                            return
                        if src is self.client:
                            self.proxy.count("forwarded", self.label)
                        held = b""
                        continue
            fault = self.proxy.fault_for(self.label)
            if fault.mode == DROP:
                self.close(reset=True)
                return
            if fault.mode == BLACKHOLE:  # read nothing: the sender's bytes wait in the kernel's buffers
                if not self.holding and select.select([src], [], [], 0)[0] and _has_bytes(src):
                    self.holding = True
                    self.proxy.count("held", self.label)
                time.sleep(_POLL_S)
                continue
            self.holding = False
            try:
                held = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                self.close(reset=True)
                return
            if not held:  # the sender closed its side: pass the end on, keep the other direction open
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                return

    def close(self, reset: bool = False) -> None:
        """Close both sockets (with `reset`: an RST, as a dropped connection looks to its ends)."""
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.upstream):
            _close(sock, reset)


class FaultProxy:
    """Forwards 127.0.0.1:`port` to `upstream` (an address, or a callable giving it at each new connection)."""

    def __init__(
        self,
        upstream: tuple[str, int] | Callable[[], tuple[str, int]],
        *,
        port: int = 0,
        label: Callable[[tuple[str, int]], str] | None = None,
    ):
        self._upstream = upstream
        self._label = label
        self._faults: dict[str | None, Fault] = {None: Fault()}  # None: every connection without its own
        self._lock = threading.Lock()
        self.gate = threading.Lock()  # held while a fault changes and while a chunk is forwarded
        self._links: list[_Link] = []
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", port))
        self._listener.settimeout(_POLL_S)
        self.port = self._listener.getsockname()[1]
        self.accepted = 0
        self.refused = 0  # connections closed at once because their client was cut (DROP)
        self.held: Counter[str] = Counter()  # label -> connections whose traffic a black hole held back
        self.dropped: Counter[str] = Counter()  # label -> connections a drop closed
        self.forwarded: Counter[str] = Counter()  # label -> chunks its clients sent that were passed on
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)

    def url(self, scheme: str = "redis", path: str = "/0") -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    # -- faults -----------------------------------------------------------------------------------------------

    def count(self, what: str, label: str) -> None:
        with self._lock:
            getattr(self, what)[label] += 1

    def fault_for(self, label: str) -> Fault:
        with self._lock:
            return self._faults.get(label, self._faults[None])

    def _set(self, fault: Fault, who: str | None) -> None:
        with self.gate, self._lock:
            if who is None:
                self._faults = {None: fault}
            else:
                self._faults[who] = fault
            links = list(self._links)
        if fault.mode == DROP:
            for link in links:
                if (who is None or link.label == who) and not link.closed.is_set():
                    link.close(reset=True)
                    self.count("dropped", link.label)

    def restore(self, who: str | None = None) -> None:
        """Traffic passes again (a held-back request is delivered now)."""
        self._set(Fault(), who)

    def drop(self, who: str | None = None) -> None:
        """Close every connection (RST) and every new one as soon as it is accepted."""
        self._set(Fault(DROP), who)

    def delay(self, seconds: float, who: str | None = None) -> None:
        """Forward every chunk `seconds` late."""
        self._set(Fault(DELAY, seconds), who)

    def blackhole(self, who: str | None = None) -> None:
        """Accept and keep every connection open, forward nothing either way until `restore`."""
        self._set(Fault(BLACKHOLE), who)

    # -- life -------------------------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, peer = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            label = self._label(peer) if self._label is not None else "client"
            if self.fault_for(label).mode == DROP:
                self.refused += 1
                _close(client, reset=True)
                continue
            try:
                upstream = self._upstream() if callable(self._upstream) else self._upstream
                server = socket.create_connection(upstream, timeout=5.0)
            except (
                OSError,
                ValueError,
            ):  # the server is down or not known yet: the client sees a closed connection
                client.close()
                continue
            with self._lock:
                self._links = [link for link in self._links if not link.closed.is_set()]
                self._links.append(_Link(self, client, server, label))
                self.accepted += 1

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()
        self._thread.join(timeout=5)
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.close()
            for thread in link.threads:
                thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _has_bytes(sock: socket.socket) -> bool:
    """Whether a readable `sock` holds bytes, not just its end: an idle pooled connection that its client (or the
    server) closes during a black hole is readable too, and held back no traffic."""
    try:
        return bool(sock.recv(1, socket.MSG_PEEK))
    except OSError:  # reset, or gone: no traffic either
        return False


def _close(sock: socket.socket, reset: bool) -> None:
    """Close `sock`; with `reset`, with an RST (SO_LINGER 0), as a connection a network dropped looks to its end."""
    with contextlib.suppress(OSError):
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


def process_role(peer: tuple[str, int], modules: dict[str, str]) -> str:
    """Which process holds the loopback socket `peer` (the client end of a connection the proxy accepted): the role
    of `modules` (role -> the module its command line runs, as `{"learner": "learner.main"}`) it runs, else
    "other"."""
    import psutil

    for conn in psutil.net_connections(kind="tcp"):
        if conn.laddr and (conn.laddr.ip, conn.laddr.port) == peer and conn.pid is not None:
            try:
                argv = psutil.Process(conn.pid).cmdline()
            except psutil.Error:
                return "other"
            # the module as a whole argument (`-m learner.main`), not inside an override of another command line
            return next((role for role, module in modules.items() if module in argv), "other")
    return "other"
