"""Keep-alive HTTP/1.1 client for the engine legs: `EngineClient.post(url, path, body) -> EngineAnswer`.

`dispatcher -> EngineClient -> pooled _Connection (asyncio.Protocol + httptools parser) -> engine /generate`.
One POST, the whole answer in one buffer, the time of its first body bytes kept (the TTFT of a stream); with a
LegStamps, also when the request's bytes were handed to the socket and when the answer's first bytes came back.
Why not aiohttp's ClientSession for these two legs per request: building its ClientRequest/ClientResponse
and stream reader was about half of the dispatcher's Python time (docs/performance.md "Router overhead");
this does only what the legs need on the parser uvicorn uses (httptools). Aborts, health probes and relayed
streams stay on aiohttp.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable, cast
from urllib.parse import urlsplit

import httptools

# uvicorn (SGLang's server) closes a connection idle for 5 s; a connection idle longer than this is not reused.
MAX_IDLE_S = 4.0
MAX_IDLE_PER_HOST = 1024


class EngineConnectionError(ConnectionError):
    """No answer: connect refused, connection lost before the answer ended, or an unreadable HTTP answer."""


@dataclass
class EngineAnswer:
    """A whole HTTP answer: status, body, and when its first body bytes arrived (time.monotonic())."""

    status: int
    body: bytes
    first_body_at: float | None = None


@dataclass(slots=True)
class LegStamps:
    """One leg's router-side times (time.monotonic()): its POST handed to the socket, its answer's first bytes read.

    For a streamed SGLang answer the first bytes are the response head, which its HTTP front writes as the handler
    starts streaming; for a JSON answer they come with the whole answer."""

    posted: float | None = None
    first_byte: float | None = None


class _Connection(asyncio.Protocol):
    """One keep-alive connection; at most one request at a time (no pipelining)."""

    def __init__(self, client: "EngineClient", key: tuple[str, int]):
        self.client = client
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self._reset(None, None, None)

    def _reset(self, waiter: asyncio.Future | None, on_first_body: Callable[[], None] | None,
               stamps: LegStamps | None) -> None:
        self.waiter = waiter
        self.on_first_body = on_first_body
        self.stamps = stamps
        self.received = False  # any bytes of this answer yet
        self.status = 0
        self.chunks: list[bytes] = []
        self.first_body_at: float | None = None
        self.keep_alive = False
        self.framed = False  # Content-Length or chunked: the end is known without the connection closing

    # -- asyncio.Protocol --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # create_connection's: a stream transport

    def data_received(self, data: bytes) -> None:
        if not self.received and self.stamps is not None:
            self.stamps.first_byte = time.monotonic()
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(EngineConnectionError(f"unreadable HTTP answer: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.client._forget(self)
        if self.waiter is not None and not self.waiter.done():
            if self.status and not self.framed:  # an answer delimited by the connection's end
                self._complete(keep_alive=False)
            else:
                self._fail(EngineConnectionError(f"connection lost before the answer ended ({exc or 'closed by the server'})"))

    # -- httptools callbacks --

    def on_header(self, name: bytes, value: bytes) -> None:
        lname = name.lower()
        if lname == b"content-length" or (lname == b"transfer-encoding" and b"chunked" in value.lower()):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.first_body_at is None:
            self.first_body_at = time.monotonic()
            if self.on_first_body is not None:
                self.on_first_body()
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self._complete(self.parser.should_keep_alive())

    # -- request/answer --

    def _complete(self, keep_alive: bool) -> None:
        self.keep_alive = keep_alive
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(EngineAnswer(self.status, b"".join(self.chunks), self.first_body_at))

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    async def request(self, head: bytes, body: bytes, on_first_body: Callable[[], None] | None,
                      stamps: LegStamps | None = None) -> EngineAnswer:
        waiter = asyncio.get_running_loop().create_future()
        self._reset(waiter, on_first_body, stamps)
        assert self.transport is not None
        self.transport.write(head + body)  # written to the socket now unless its buffer is full
        if stamps is not None:
            stamps.posted = time.monotonic()
        return await waiter


class EngineClient:
    """Pooled keep-alive connections per engine (host, port); one instance per event loop."""

    def __init__(self, max_idle_s: float = MAX_IDLE_S, max_idle_per_host: int = MAX_IDLE_PER_HOST):
        self.max_idle_s = max_idle_s
        self.max_idle_per_host = max_idle_per_host
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._targets: dict[str, tuple[tuple[str, int], bytes]] = {}  # base url -> (host, port), Host header

    def _target(self, url: str) -> tuple[tuple[str, int], bytes]:
        target = self._targets.get(url)
        if target is None:
            parts = urlsplit(url)
            if parts.scheme != "http" or not parts.hostname:
                raise ValueError(f"engine url {url!r}: EngineClient speaks plain http://host:port only")
            port = parts.port or 80
            target = self._targets[url] = ((parts.hostname, port), f"{parts.hostname}:{port}".encode())
        return target

    async def post(self, url: str, path: str, body: bytes, on_first_body: Callable[[], None] | None = None,
                   stamps: LegStamps | None = None) -> EngineAnswer:
        """POST `body` (JSON) to url + path and read the whole answer. Cancelling closes the connection
        (the engine sees the client go away). Raises EngineConnectionError when no whole answer came.
        `stamps` gets the send's and the answer's first bytes' times as they happen (kept when the leg fails)."""
        key, host = self._target(url)
        head = (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: " + host +
                b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        conn, reused = self._idle_connection(key), True
        if conn is None:
            conn, reused = await self._connect(key), False
        try:
            try:
                answer = await conn.request(head, body, on_first_body, stamps)
            except EngineConnectionError:
                if not reused or conn.received:
                    raise
                # The engine closed this idle connection as we sent on it (nothing came back): the request
                # was not read, so send it once more on a new connection.
                conn = await self._connect(key)
                answer = await conn.request(head, body, on_first_body, stamps)
        except BaseException:
            conn.close()
            raise
        self._release(conn)
        return answer

    def _idle_connection(self, key: tuple[str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        oldest_ok = time.monotonic() - self.max_idle_s
        while idle:
            conn = idle.pop()  # most recently used first: the least likely to have been closed
            if not conn.closed and conn.idle_since >= oldest_ok:
                return conn
            conn.close()
        return None

    async def _connect(self, key: tuple[str, int]) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(lambda: _Connection(self, key), *key)
        except OSError as exc:
            raise EngineConnectionError(f"cannot connect to {key[0]}:{key[1]}: {exc}") from None
        self._open.add(conn)
        return conn

    def _release(self, conn: _Connection) -> None:
        conn.waiter = None
        conn.on_first_body = None
        conn.stamps = None
        idle = self._idle.setdefault(conn.key, [])
        if conn.closed or not conn.keep_alive or len(idle) >= self.max_idle_per_host:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def _forget(self, conn: _Connection) -> None:
        self._open.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    async def close(self) -> None:
        """Close every connection (idle or in use)."""
        for conn in list(self._open):
            conn.close()
        self._idle.clear()
