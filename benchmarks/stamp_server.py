"""A near-zero-cost SGLang `/generate` stand-in that stamps when each request reached it (router burst benchmark).

    .venv/bin/python benchmarks/stamp_server.py --port P [--step-s 0.02]

One asyncio process, httptools parser, no framework. A request's first token goes out the moment its body is read
(an instant prefill; with `--prefill` that token ends the answer, as a PD prefill's does); then every `--step-s` one
decode step gives every running request one more token, until its `max_new_tokens`. A streamed `/generate` gets an
SSE event per token with SGLang 0.5.17's default cumulative `output_ids` (no `--incremental-streaming-output`), the
last one with finish_reason length, then `data: [DONE]`; a non-stream body gets the last event as JSON. `GET /health` and `POST /abort_request` answer 200 `{}`. `GET /stamps`
returns and clears, per request, `[key, arrived, first_sent, last_sent]` (time.time(); key = the prompt's first token
id, which the benchmark makes the request's index). The server's own work per request is microseconds, so it never
paces a burst: what a client sees later than `first_sent` was held on the client's side.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httptools
import orjson


class _Stamps:
    def __init__(self) -> None:
        self.rows: list[list] = []


class _Conn(asyncio.Protocol):
    def __init__(self, engine: "_Engine", stamps: _Stamps):
        self.engine, self.stamps = engine, stamps
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set by connection_made, first
        self.body: list[bytes] = []
        self.url = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # create_server's: a stream transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        arrived = time.time()
        body, self.body = b"".join(self.body), []
        if self.url == b"/generate":
            self.engine.tasks.add(task := asyncio.ensure_future(self.generate(orjson.loads(body), arrived)))
            task.add_done_callback(self.engine.tasks.discard)
        elif self.url == b"/stamps":
            rows, self.stamps.rows = self.stamps.rows, []
            self._send_whole(orjson.dumps(rows))
        else:  # /health, /abort_request, anything else: 200 {}
            self._send_whole(b"{}")

    def _send_whole(self, payload: bytes) -> None:
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(payload)).encode() + b"\r\n\r\n" + payload)

    async def generate(self, body: dict, arrived: float) -> None:
        ids = body.get("input_ids") or [0]
        params = body.get("sampling_params") or {}
        n_out = 1 if self.engine.prefill_only else int(params.get("max_new_tokens") or 1)
        run = _Run(self, body, ids, n_out, [ids[0], arrived, None, None])
        self.stamps.rows.append(run.row)
        if not body.get("stream"):
            await self.engine.finish(run)
            self._send_whole(orjson.dumps(run.event(last=True)))
            run.row[2] = run.row[3] = time.time()
            return
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                             + _chunk(run.event(last=run.n == run.n_out)))
        run.row[2] = time.time()
        if run.n < run.n_out:
            await self.engine.finish(run)
        done = b"data: [DONE]\n\n"
        self.transport.write(f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n")
        run.row[3] = time.time()


def _chunk(payload: dict) -> bytes:
    data = b"data: " + orjson.dumps(payload) + b"\n\n"
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class _Run:
    """One request being decoded: a token per engine step, SGLang's default cumulative `output_ids` per event."""

    def __init__(self, conn: "_Conn", body: dict, ids: list, n_out: int, row: list):
        self.conn, self.body, self.ids, self.n_out, self.row = conn, body, ids, max(1, n_out), row
        self.n = 1  # the prefill's token, sent on arrival
        self.done: asyncio.Future = asyncio.get_running_loop().create_future()

    def event(self, last: bool) -> dict:
        reason = {"type": "length", "length": self.n_out} if last else None
        return {"output_ids": list(range(10_000, 10_000 + self.n)), "meta_info": {
            "id": self.body.get("rid"), "prompt_tokens": len(self.ids), "completion_tokens": self.n,
            "finish_reason": reason}}


class _Engine:
    """Every `step_s`, one more token for every running request (streams get an event each): a decode batch."""

    def __init__(self, step_s: float, prefill_only: bool = False):
        self.step_s = step_s
        self.prefill_only = prefill_only  # a PD prefill: its answer ends with the first token
        self.running: list[_Run] = []
        self.ticker: asyncio.Task | None = None
        self.tasks: set[asyncio.Task] = set()  # requests being answered (held: the loop keeps weak references)

    async def finish(self, run: _Run) -> None:
        self.running.append(run)
        if self.ticker is None or self.ticker.done():
            self.ticker = asyncio.ensure_future(self._tick())
        await run.done

    async def _tick(self) -> None:
        next_at = time.monotonic()
        while self.running:
            next_at += self.step_s
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            still = []
            for run in self.running:
                run.n += 1
                last = run.n >= run.n_out
                if run.body.get("stream") and not last:
                    run.conn.transport.write(_chunk(run.event(last=False)))
                if last:
                    if run.body.get("stream"):
                        run.conn.transport.write(_chunk(run.event(last=True)))
                    run.done.set_result(None)
                else:
                    still.append(run)
            self.running = still


async def serve(args: argparse.Namespace) -> None:
    stamps, engine = _Stamps(), _Engine(args.step_s, args.prefill)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Conn(engine, stamps), args.host, args.port, backlog=4096)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--prefill", action="store_true", help="answer with the first token only (a PD prefill)")
    parser.add_argument("--step-s", type=float, default=0.02, help="seconds per decode step (a token for every request)")
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
