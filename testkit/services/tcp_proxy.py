"""A loopback TCP proxy in front of the lab's sshd that injects connection faults.

SSH is encrypted, so the proxy cannot see commands. It injects faults by watching the real
cluster instead: a ``trigger`` (e.g. "the node now shows DRAIN") is checked before each chunk
from the server is forwarded. Once it fires, the proxy either cuts every open connection
(``cut``), or stops forwarding server data while keeping the sockets open (``stall``) so the
client hangs mid-command until it is killed. Either way the client never sees the reply to the
command that changed the node. After a cut, new connections pass through; a stall lasts.

``refuse_first=n`` closes the first n connections right after accepting them (a flapping network).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from enum import StrEnum

__all__ = ["Fault", "FaultProxy"]


class Fault(StrEnum):
    CUT = "cut"
    """Close both sides of every connection, dropping the pending server reply."""
    STALL = "stall"
    """Swallow all further server data; sockets stay open (the client blocks)."""


class FaultProxy:
    """Forward ``127.0.0.1:<port>`` to ``127.0.0.1:<target_port>`` with at most one fault."""

    def __init__(self, target_port: int, *, trigger: Callable[[], bool] | None = None,
                 fault: Fault = Fault.CUT, refuse_first: int = 0) -> None:
        self.target_port = target_port
        self.trigger = trigger
        self.fault = fault
        self.refuse_first = refuse_first
        self.fired = threading.Event()
        self.accepted = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._stopping = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> FaultProxy:
        thread = threading.Thread(target=self._accept_loop, name="fault-proxy", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._close_all()
        self._listener.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            if self.accepted <= self.refuse_first:
                client.close()
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            client.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            for src, dst, from_server in ((client, server, False), (server, client, True)):
                thread = threading.Thread(target=self._pump, args=(src, dst, from_server), daemon=True)
                thread.start()
                self._threads.append(thread)

    def _pump(self, src: socket.socket, dst: socket.socket, from_server: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if from_server and self._should_fault():
                    if self.fault is Fault.CUT:
                        self._close_all()
                        return
                    continue  # STALL: swallow server data for good
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _should_fault(self) -> bool:
        if self.trigger is None:
            return False
        if self.fired.is_set():
            # After a cut, new connections pass through; a stall swallows server data for good.
            return self.fault is Fault.STALL
        if self.trigger():
            self.fired.set()
            return True
        return False

    def _close_all(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
