"""A loopback TCP proxy that breaks connections: under a share of the requests it
resets the connection (RST, both sides) after a random number of bytes of that
exchange, so faults land anywhere: before a request is sent, halfway through an
upload, after the server committed it but before the reply arrived, in the middle
of a listing page. `set_down(True)` resets every connection, open or new (an outage).
`cut_reply`, if given, is asked about every request (its first bytes: the request
line) and may name how many bytes of the reply pass before the reset: faults aimed
at one blob's downloads, say, cut mid-body. `stall`, if given, is asked the same and
may answer True: that request is never passed on and gets no reply (a storage stall:
the client waits for its read timeout). `answer`, if given, may return a whole HTTP
reply for a request: the proxy sends that instead of passing the request on (Azure's
answers Azurite does not give: a 403 for one blob, a container gone mid-run).

Per request, not per connection: HTTP clients keep connections alive, so a whole
run may use a handful of them. A new request is the client sending after the
server did (HTTP/1.1 clients here do not pipeline).

One thread with a selector: a socket is only closed by the thread that reads it
(closing a socket another thread is blocked on does not send the RST until that
read returns, which leaves the client waiting for its read timeout).
"""

from __future__ import annotations

import random
import selectors
import socket
import struct
import threading
from typing import Callable


def _reset(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
    except OSError:
        pass
    sock.close()


class _Link:
    def __init__(self, client: socket.socket, server: socket.socket):
        self.client, self.server = client, server
        self.budget: int | None = None  # bytes of this exchange (both ways) before the reset; None: never
        self.reply_budget: int | None = None  # bytes of the reply before the reset (cut_reply); None: never
        self.last_from_client = False
        self.stalled = False  # this exchange goes nowhere (FaultProxy.stall)
        self.half_closed: set[socket.socket] = set()

    def peer(self, sock: socket.socket) -> socket.socket:
        return self.server if sock is self.client else self.client


class FaultProxy:
    def __init__(self, target_port: int, reset_share: float, seed: int = 0, max_bytes: int = 16_000,
                 cut_reply: Callable[[bytes], int | None] | None = None,
                 stall: Callable[[bytes], bool] | None = None,
                 answer: Callable[[bytes], bytes | None] | None = None):
        self.target_port = target_port
        self.cut_reply = cut_reply
        self.stall = stall
        self.answer = answer
        self.reset_share = reset_share
        self.max_bytes = max_bytes
        self.random = random.Random(seed)
        self.connections = 0
        self.requests = 0
        self.resets = 0  # connections this proxy reset on purpose
        self.bytes_to_client = 0  # what the server sent back: the bytes a client read
        self.down = False
        self._links: dict[socket.socket, _Link] = {}
        self._selector = selectors.DefaultSelector()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self._selector.register(self.listener, selectors.EVENT_READ)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def set_down(self, down: bool) -> None:
        """While down, every connection (open or new) is reset."""
        self.down = down

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                if self.down:
                    for link in {id(v): v for v in self._links.values()}.values():
                        self._close(link, injected=True)
                for key, _ in self._selector.select(timeout=0.05):
                    sock = key.fileobj
                    if sock is self.listener:
                        self._accept()
                    elif sock in self._links:
                        self._forward(self._links[sock], sock)
        finally:
            for link in {id(v): v for v in self._links.values()}.values():
                self._close(link, injected=False)
            self._selector.close()
            self.listener.close()

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
        except BlockingIOError:
            return
        self.connections += 1
        if self.down:
            self.resets += 1
            _reset(client)
            return
        try:
            server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
        except OSError:
            _reset(client)
            return
        for sock in (client, server):
            sock.settimeout(10)  # sends: loopback peers read promptly
        link = _Link(client, server)
        self._links[client] = self._links[server] = link
        self._selector.register(client, selectors.EVENT_READ)
        self._selector.register(server, selectors.EVENT_READ)

    def _forward(self, link: _Link, src: socket.socket) -> None:
        dst = link.peer(src)
        try:
            data = src.recv(65536)
        except OSError:
            self._close(link, injected=False)
            return
        if not data:  # this side is done sending: pass the FIN on
            self._selector.unregister(src)
            link.half_closed.add(src)
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            if len(link.half_closed) == 2:
                self._close(link, injected=False)
            return
        from_client = src is link.client
        if not from_client:
            self.bytes_to_client += len(data)
        if from_client and not link.last_from_client:  # a new request
            self.requests += 1
            hit = self.random.random() < self.reset_share
            link.budget = self.random.randint(0, self.max_bytes) if hit else None
            link.reply_budget = self.cut_reply(data) if self.cut_reply else None
            link.stalled = bool(self.stall and self.stall(data))
            reply = self.answer(data) if self.answer else None
            if reply is not None:  # the request (headers only: GETs) goes no further
                try:
                    src.sendall(reply)
                except OSError:
                    self._close(link, injected=False)
                return  # last_from_client stays False: the next bytes are a new request
        link.last_from_client = from_client
        if link.stalled:
            return
        reset = link.budget is not None and len(data) >= link.budget
        if link.budget is not None:
            data = data[: link.budget]
            link.budget -= len(data)
        if not from_client and link.reply_budget is not None:
            reset = reset or len(data) >= link.reply_budget
            data = data[: link.reply_budget]
            link.reply_budget -= len(data)
        try:
            dst.sendall(data)
        except OSError:
            self._close(link, injected=False)
            return
        if reset:
            self._close(link, injected=True)

    def _close(self, link: _Link, injected: bool) -> None:
        if link.client not in self._links:
            return
        self.resets += injected
        for sock in (link.client, link.server):
            del self._links[sock]
            if sock not in link.half_closed:
                self._selector.unregister(sock)
            if injected:
                _reset(sock)
            else:
                sock.close()
