"""Connection handling of the reward server: a fixed pool of worker threads behind a bounded queue, reads
under idle and whole-request deadlines, and JSON replies that close and drain a connection after an early
error.

Plain HTTP/1.1 plumbing that knows nothing of rewards: ``rewards.server`` subclasses ``PooledJSONHandler``
with its routes (``POST /score``, ``GET /health``) and serves it with ``PooledHTTPServer``; every bound
comes from ``rewards.server.ServerLimits``.
"""
from __future__ import annotations

import io
import json
import queue
import select
import socket
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rewards.server import ServerLimits


class DeadlineReader(io.RawIOBase):
    """Raw reader of a connection's socket that enforces the idle and whole-request timeouts, and reports end
    of stream when the connection has no request under way, has idled ``yield_idle_s`` and others wait for a
    worker (so idle keep-alive and half-open connections give their worker up)."""

    def __init__(self, sock: socket.socket, limits: ServerLimits, others_waiting):
        self.sock, self.limits, self.others_waiting = sock, limits, others_waiting
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)
        self.start()

    def start(self) -> None:
        """A new request may begin: its whole-request deadline starts now."""
        self.began = time.monotonic()
        self.deadline, self.received, self.timed_out = self.began + self.limits.read_timeout_s, 0, False

    def readable(self) -> bool:
        return True

    def _wait(self) -> bool:
        """True once the socket has data; False to give the worker up; TimeoutError past a timeout."""
        idle_until = time.monotonic() + self.limits.idle_timeout_s
        while True:
            now = time.monotonic()
            if not self.received and now - self.began >= self.limits.yield_idle_s and self.others_waiting():
                return False
            until = min(idle_until, self.deadline)
            if now >= until:
                self.timed_out = True
                raise TimeoutError("no data within the idle timeout or the request deadline")
            if self.received:  # mid-request: wait for data until a timeout
                slice_s = until - now
            else:  # between requests: look at the queue every 50 ms once yield_idle_s has passed
                slice_s = min(until, max(self.began + self.limits.yield_idle_s, now + 0.05)) - now
            if self.poller.poll(slice_s * 1000):
                return True

    def readinto(self, buf) -> int:
        if not self._wait():
            return 0
        n = self.sock.recv_into(buf)
        self.received += n
        return n


class PooledHTTPServer(HTTPServer):
    """HTTPServer whose connections are served by ``workers`` threads from a bounded queue; a connection that
    finds the queue full gets an immediate 503 (``Retry-After: 1``)."""

    def __init__(self, address, handler, limits: ServerLimits):
        self.request_queue_size = limits.backlog  # listen(backlog); socketserver's default is 5
        super().__init__(address, handler)
        self.pending: queue.Queue = queue.Queue()  # bounded in process_request, so stop() can always enqueue
        self.max_pending = limits.pending
        self.workers = [threading.Thread(target=self._work, daemon=True, name=f"reward-http-{i}")
                        for i in range(limits.workers)]
        for t in self.workers:
            t.start()

    def process_request(self, request, client_address) -> None:
        if self.pending.qsize() < self.max_pending:  # the accept loop is the only producer: no race
            self.pending.put((request, client_address))
        else:
            reason = "server busy: every worker is serving and the queue is full"
            body = json.dumps({"error": reason}).encode()
            try:
                request.settimeout(1.0)
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                                % (len(body), body))
            except OSError:
                pass
            self.shutdown_request(request)

    def _work(self) -> None:
        while (item := self.pending.get()) is not None:
            request, client_address = item
            try:
                self.finish_request(request, client_address)
            except Exception:  # noqa: BLE001 - one connection's failure must not kill the worker
                self.handle_error(request, client_address)
            finally:
                self.shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        err = sys.exc_info()[1]
        if not isinstance(err, (ConnectionError, TimeoutError)):  # a peer hanging up is not news
            print(f"reward server: {client_address}: {type(err).__name__}: {err}", file=sys.stderr)

    def server_close(self, join_s: float = 5.0) -> None:
        """Close the socket, drop the queued connections, and wait up to ``join_s`` for the workers to finish the
        connection each holds: a daemon thread still inside the reward (torch, C++) when the interpreter exits
        aborts the process ("terminate called without an active exception")."""
        super().server_close()
        while True:
            try:
                item = self.pending.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                self.shutdown_request(item[0])
        for _ in self.workers:
            self.pending.put(None)
        deadline = time.monotonic() + join_s
        for t in self.workers:
            t.join(max(0.0, deadline - time.monotonic()))


def drain(sock: socket.socket, seconds: float, max_bytes: int) -> None:
    """Half-close ``sock`` and read and drop what the peer still sends, for at most ``seconds`` and
    ``max_bytes``."""
    deadline, got = time.monotonic() + seconds, 0
    try:
        sock.shutdown(socket.SHUT_WR)
        while got < max_bytes and (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            chunk = sock.recv(1 << 16)
            if not chunk:
                return
            got += len(chunk)
    except OSError:
        pass


class PooledJSONHandler(BaseHTTPRequestHandler):
    """Keep-alive HTTP/1.1 handler for a ``PooledHTTPServer``: reads through a ``DeadlineReader`` (408 when a
    request is not received in time), replies JSON, and after an early error closes the connection and drains
    what the client still sends. Subclasses set ``limits``, ``timeout`` and ``usage`` and add the ``do_*``
    routes."""

    protocol_version = "HTTP/1.1"
    limits: ServerLimits
    usage = "use GET or POST"  # the hint in a 405 reply; subclasses name their routes

    def setup(self):
        super().setup()
        self.rfile.close()
        self.reader = DeadlineReader(self.connection, self.limits, lambda: self.server.pending.qsize() > 0)
        self.rfile = io.BufferedReader(self.reader)
        self.replied, self.linger = False, False
        self.requestline, self.request_version = "", "HTTP/1.1"  # for a reply before any request line

    def handle_one_request(self):
        self.reader.start()
        self.replied = False
        super().handle_one_request()
        if self.reader.timed_out and self.reader.received and not self.replied:
            idle_s, request_s = self.limits.idle_timeout_s, self.limits.read_timeout_s
            self._error(408, f"request not received within the timeouts (idle {idle_s} s, "
                             f"whole request {request_s} s)", close=True)

    def finish(self):
        super().finish()
        if self.linger:  # let the client finish sending, so it reads our reply instead of a reset
            drain(self.connection, self.limits.linger_s, self.limits.max_bytes)

    def log_message(self, fmt, *args):  # quiet by default; errors still reach the client
        pass

    def _send(self, code: int, body: bytes, close: bool = False) -> None:
        self.connection.settimeout(self.limits.idle_timeout_s)
        self.replied = True
        if not self.request_version.startswith("HTTP/1."):  # garbage parsed as HTTP/0.9 still gets a status
            self.request_version = "HTTP/1.1"
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if code == 405:
            self.send_header("Allow", "GET, POST")
        if close or self.server.pending.qsize():  # keep-alive only while no connection waits for a worker
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def error_body(self, reason: str) -> dict:
        """The JSON object of an error reply; subclasses add what identifies the service."""
        return {"error": reason}

    def _error(self, code: int, reason: str, close: bool = False) -> None:
        self._send(code, json.dumps(self.error_body(reason)).encode(), close)

    def _refuse(self, code: int, reason: str) -> None:
        """An error before the body was read: reply, close, and drain what the client still sends."""
        self.linger = True
        self._error(code, reason, close=True)

    def send_error(self, code, message=None, explain=None):  # http.server's own parse errors, as JSON
        if code == HTTPStatus.NOT_IMPLEMENTED:
            code, message = 405, f"method {self.command!r} not allowed; {self.usage}"
        self._refuse(int(code), message or HTTPStatus(code).phrase)

    def _content_length(self) -> int | None:
        """The request's one valid Content-Length up to ``limits.max_bytes``; None after a 411/400/413."""
        values = self.headers.get_all("Content-Length") or []
        if not values:
            return self._refuse(411, "Content-Length header required")
        if len(set(values)) > 1 or not (values[0].isascii() and values[0].strip().isdigit()):
            return self._refuse(400, f"Content-Length must be one non-negative decimal integer, got {values}")
        length = int(values[0])
        if length > self.limits.max_bytes:
            return self._refuse(413, f"body of {length} bytes exceeds the limit of {self.limits.max_bytes}")
        return length

    def _read_body(self, length: int) -> bytes | None:
        """The ``length``-byte body; None after a 408 (not received in time) or 400 (body ended early)."""
        try:
            body = self.rfile.read(length)
        except TimeoutError:
            got = self.reader.received
            idle_s, request_s = self.limits.idle_timeout_s, self.limits.read_timeout_s
            return self._error(408, f"body not received in time ({got} bytes of headers and body read; "
                                    f"idle {idle_s} s, request {request_s} s)", close=True)
        if len(body) < length:
            return self._error(400, f"body ended after {len(body)} of {length} bytes", close=True)
        return body

    def read_request_body(self) -> bytes | None:
        """The request body after checking its Content-Length; None once an error has been replied."""
        length = self._content_length()
        return None if length is None else self._read_body(length)
