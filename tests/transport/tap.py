"""A TCP forwarder for tests: a man in the middle that records both directions and can change the client's bytes.

:class:`Tap` listens on 127.0.0.1 and forwards every connection it accepts to ``(host,
port)``. It records each connection's bytes (``Flow.up``: client to server, ``Flow.down``:
back). ``hold_after`` holds a connection's client bytes past that offset instead of
forwarding them: the test then sends what it wants in their place (:meth:`Flow.release`:
changed, repeated, reordered or cut). ``flip_at`` flips one byte of the first connection's
client bytes on the way.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


class Flow:
    """One forwarded connection: what it carried each way."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self.up = bytearray()  # client -> server, as the client sent it
        self.down = bytearray()  # server -> client
        self.held = bytearray()  # client bytes held back (hold_after)
        self.lock = threading.Lock()

    def release(self, change: Callable[[bytes], bytes] = bytes) -> None:
        """Send the held client bytes to the server, changed by ``change``."""
        with self.lock:
            data, self.held = bytes(self.held), bytearray()
        self.server.sendall(change(data))

    def close(self) -> None:
        for sock in (self.client, self.server):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


class Tap:
    """Forward connections to ``(host, port)``, recording them (see the module's docstring).

    Args:
        host, port: where connections go.
        hold_after: hold every connection's client bytes after this many (None: forward all).
        flip_at: flip the byte at this offset of the first connection's client bytes (None: none).
    """

    def __init__(self, host: str, port: int, hold_after: int | None = None, flip_at: int | None = None) -> None:
        self.target = (host, port)
        self.hold_after = hold_after
        self.flip_at = flip_at
        self.flows: list[Flow] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="tap-accept").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            flow = Flow(client, server)
            first = not self.flows
            self.flows.append(flow)
            threading.Thread(target=self._pump_up, args=(flow, first), daemon=True, name="tap-up").start()
            threading.Thread(target=self._pump_down, args=(flow,), daemon=True, name="tap-down").start()

    def _pump_up(self, flow: Flow, first: bool) -> None:
        while True:
            try:
                data = bytearray(flow.client.recv(1 << 16))
            except OSError:
                data = bytearray()
            if not data:
                try:
                    flow.server.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            at = len(flow.up)
            flow.up += data
            if first and self.flip_at is not None and at <= self.flip_at < at + len(data):
                data[self.flip_at - at] ^= 0x01
            if self.hold_after is not None and at + len(data) > self.hold_after:
                keep = max(self.hold_after - at, 0)
                with flow.lock:
                    flow.held += data[keep:]
                data = data[:keep]
            try:
                flow.server.sendall(data)
            except OSError:
                return

    @staticmethod
    def _pump_down(flow: Flow) -> None:
        while True:
            try:
                data = flow.server.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                try:
                    flow.client.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            flow.down += data
            try:
                flow.client.sendall(data)
            except OSError:
                return

    def captured(self) -> bytes:
        """Every byte every connection carried, both ways."""
        return b"".join(bytes(f.up) + bytes(f.down) for f in self.flows)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for flow in self.flows:
            flow.close()
