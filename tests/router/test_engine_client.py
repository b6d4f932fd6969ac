"""EngineClient, the engine legs' keep-alive HTTP/1.1 client: reuse, resend on a closed idle connection,
chunked and unframed answers, the first body bytes' time, failures and cancellation.

The servers are real servers on loopback: aiohttp's for well-behaved answers, raw asyncio ones for what a
well-behaved server does not do on cue (close a kept-alive connection as the next request arrives, die in
the middle of an answer, never answer).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp import web

from orchestrator.cluster.ports import free_port
from orchestrator.router.dispatch.engine_client import EngineClient, EngineConnectionError


class CountingServer:
    """aiohttp server: /json answers its body back, /sse streams three chunked events, the second only once
    `second_event` is set."""

    def __init__(self):
        self.connections: set[int] = set()
        self.bodies: list[bytes] = []
        self.url = ""
        self.second_event = asyncio.Event()  # /sse holds its second event until this is set
        self.second_event.set()

    async def start(self) -> "CountingServer":
        app = web.Application()
        app.router.add_post("/json", self.json)
        app.router.add_post("/sse", self.sse)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        return self

    def _seen(self, request: web.Request) -> None:
        self.connections.add(id(request.transport))

    async def json(self, request: web.Request) -> web.Response:
        self._seen(request)
        body = await request.read()
        self.bodies.append(body)
        assert request.headers["Content-Type"] == "application/json"
        return web.Response(body=b'{"echo":' + body + b"}", content_type="application/json")

    async def sse(self, request: web.Request) -> web.StreamResponse:
        self._seen(request)
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)  # chunked: no Content-Length
        await resp.write(b'data: {"n": 1}\n\n')
        await self.second_event.wait()
        await resp.write(b'data: {"n": 2}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def stop(self) -> None:
        await self._runner.cleanup()


@pytest.fixture
async def server():
    s = await CountingServer().start()
    yield s
    await s.stop()


async def test_sequential_posts_reuse_one_connection_and_each_gets_its_own_answer(server):
    client = EngineClient()
    answers = [await client.post(server.url, "/json", b'{"i":%d}' % i) for i in range(5)]
    assert [a.body for a in answers] == [b'{"echo":{"i":%d}}' % i for i in range(5)]
    assert all(a.status == 200 for a in answers)
    assert len(server.connections) == 1
    await client.close()


async def test_concurrent_posts_open_one_connection_each_then_reuse_them(server):
    client = EngineClient()
    for _ in range(3):
        await asyncio.gather(*(client.post(server.url, "/json", b"[%d]" % i) for i in range(4)))
    assert len(server.bodies) == 12
    assert len(server.connections) == 4
    await client.close()


async def test_a_chunked_stream_arrives_whole_and_its_first_bytes_time_is_kept(server):
    """The server sends the rest only after the client said it has the first bytes: a client that reported them
    late (at the end of the answer) would never get the rest, and `first_body_at` must be that moment's time."""
    client = EngineClient()
    server.second_event.clear()
    first: list[float] = []

    def on_first_body() -> None:
        first.append(time.monotonic())
        server.second_event.set()

    sent = time.monotonic()
    answer = await asyncio.wait_for(client.post(server.url, "/sse", b"{}", on_first_body=on_first_body), 30)
    done = time.monotonic()
    assert answer.body == b'data: {"n": 1}\n\ndata: {"n": 2}\n\ndata: [DONE]\n\n'
    assert len(first) == 1 and sent <= answer.first_body_at <= first[0] <= done
    await client.close()


async def test_an_idle_connection_older_than_max_idle_is_not_reused(server):
    client = EngineClient(max_idle_s=0.05)
    await client.post(server.url, "/json", b"1")
    await asyncio.sleep(0.1)
    await client.post(server.url, "/json", b"2")
    assert len(server.connections) == 2
    await client.close()


async def raw_server(handle) -> tuple[str, asyncio.AbstractServer]:
    """A raw TCP server calling `handle(reader, writer, n)` for the n-th connection (from 0)."""
    count = [0]

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = count[0]
        count[0] += 1
        try:
            await handle(reader, writer, n)
        finally:
            writer.close()

    srv = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    return f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}", srv


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    return await reader.readexactly(length)


OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


async def test_a_request_on_a_kept_alive_connection_the_server_closes_unanswered_is_sent_again_once():
    requests_seen: list[tuple[int, bytes]] = []

    async def handle(reader, writer, n):
        if n == 0:  # answer one request, then close as the next one arrives, reading nothing more
            requests_seen.append((n, await read_request(reader)))
            writer.write(OK)
            await reader.read(1)
            return
        while True:
            requests_seen.append((n, await read_request(reader)))
            writer.write(OK)

    url, srv = await raw_server(handle)
    client = EngineClient()
    assert (await client.post(url, "/generate", b"first")).status == 200
    assert (await client.post(url, "/generate", b"second")).body == b"{}"
    assert requests_seen == [(0, b"first"), (1, b"second")]
    srv.close()
    await client.close()


async def test_a_server_dying_in_the_middle_of_an_answer_is_an_error_and_not_sent_again():
    connections = [0]

    async def handle(reader, writer, n):
        connections[0] += 1
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"half\":")
        await writer.drain()

    url, srv = await raw_server(handle)
    client = EngineClient()
    with pytest.raises(EngineConnectionError, match="connection lost before the answer ended"):
        await client.post(url, "/generate", b"{}")
    assert connections[0] == 1
    srv.close()
    await client.close()


async def test_an_answer_ended_by_closing_the_connection_is_whole():
    async def handle(reader, writer, n):
        await read_request(reader)
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\r\nbusy, try later")
        await writer.drain()

    url, srv = await raw_server(handle)
    client = EngineClient()
    answer = await client.post(url, "/generate", b"{}")
    assert (answer.status, answer.body) == (503, b"busy, try later")
    srv.close()
    await client.close()


async def test_nothing_listening_is_a_connection_error_naming_the_address():
    client = EngineClient()
    port = free_port()
    with pytest.raises(EngineConnectionError, match=f"cannot connect to 127.0.0.1:{port}"):
        await client.post(f"http://127.0.0.1:{port}", "/generate", b"{}")


async def test_a_cancelled_post_closes_its_connection_so_the_engine_sees_the_client_go_away():
    closed = asyncio.Event()

    async def handle(reader, writer, n):
        await read_request(reader)
        assert await reader.read(1) == b""  # the client went away without an answer
        closed.set()

    url, srv = await raw_server(handle)
    client = EngineClient()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await client.post(url, "/generate", b"{}")
    await asyncio.wait_for(closed.wait(), 5)
    srv.close()
    await client.close()


def test_only_plain_http_urls_are_accepted():
    with pytest.raises(ValueError, match="plain http://host:port only"):
        asyncio.run(EngineClient().post("https://127.0.0.1:1", "/generate", b"{}"))
