"""Which prefill and which decode sglang-router picks per request in PD mode, with the flags the organisers' 2026
reference deployment gave it (none: its default policy), against two prefills and two decodes on loopback.

    .venv/bin/python benchmarks/sglang_router_pd_pairing.py [--concurrency 1,16] [--requests 40,200] \\
        [--policy-args "" "--policy round_robin" "--policy random"]

The workers are tiny aiohttp servers that answer what the router asks at registration and any chat completion, and
record which of them got each request's `bootstrap_room` (the router sends one room to both legs, so the room names
the pair). Prompts are chat messages of ~3,000 words, each opening with its own random hex word as AIPerf's
`--cache-bust first_turn_prefix` does, so no two share a prefix. With `--log-level debug` appended, the router's log
(under --log-dir) says which branch of its policy chose. Per run it prints the pair counts and the sequence of
(prefill, decode) indices in arrival order; `--policy round_robin` and `--policy random` are the probe's controls.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import random
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from aiohttp import ClientSession, web

PORTS = {"prefill-0": 18411, "prefill-1": 18412, "decode-0": 18421, "decode-1": 18422}
ROUTER_PORT = 18400
WORDS = "the quick brown fox jumps over lazy dogs while the river flows past old stone walls".split()


def worker_app(name: str, model_dir: str, seen: list[tuple[str, int]]) -> web.Application:
    """One fake SGLang worker: health, server/model info naming a local model folder (no hub lookup), chat."""
    role = name.split("-")[0]

    async def ok(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def info(_request: web.Request) -> web.Response:
        return web.json_response({"model_path": model_dir, "tokenizer_path": model_dir, "is_generation": True,
                                  "disaggregation_mode": role, "dp_size": 1, "tp_size": 1,
                                  "internal_states": [{"last_gen_throughput": 0.0}]})

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append((name, body["bootstrap_room"]))
        return web.json_response({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                               "finish_reason": "stop"}],
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    app = web.Application()
    for path in ("/health", "/health_generate"):
        app.router.add_get(path, ok)
    for path in ("/server_info", "/get_server_info", "/model_info", "/get_model_info"):
        app.router.add_get(path, info)
    app.router.add_post("/v1/chat/completions", chat)
    return app


def router_command(policy_args: list[str]) -> list[str]:
    prefills = [a for name, port in PORTS.items() if name.startswith("prefill")
                for a in ("--prefill", f"http://127.0.0.1:{port}", str(9000 + int(name[-1])))]
    decodes = [a for name, port in PORTS.items() if name.startswith("decode")
               for a in ("--decode", f"http://127.0.0.1:{port}")]
    return [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation", *prefills, *decodes,
            "--host", "127.0.0.1", "--port", str(ROUTER_PORT), "--prometheus-port", str(ROUTER_PORT + 9), *policy_args]


async def one_run(policy_args: list[str], concurrency: int, requests: int, seed: int, log_path: Path) -> dict:
    seen: list[tuple[str, int]] = []
    model_dir = tempfile.mkdtemp(prefix="pd-pairing-model-")
    runners = []
    for name, port in PORTS.items():
        runner = web.AppRunner(worker_app(name, model_dir, seen), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
    with log_path.open("w") as log:
        router = await asyncio.create_subprocess_exec(*router_command(policy_args), stdout=log,
                                                      stderr=subprocess.STDOUT)
    try:
        async with ClientSession() as session:
            for _ in range(300):  # ready in ~1 s
                try:
                    async with session.get(f"http://127.0.0.1:{ROUTER_PORT}/health") as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                await asyncio.sleep(0.1)
            rng = random.Random(seed)
            prompts = [f"{rng.getrandbits(64):016x} " + " ".join(rng.choice(WORDS) for _ in range(3000))
                       for _ in range(requests)]
            slots = asyncio.Semaphore(concurrency)

            async def send(text: str) -> None:
                async with slots, session.post(f"http://127.0.0.1:{ROUTER_PORT}/v1/chat/completions",
                                               json={"model": "m", "max_tokens": 4,
                                                     "messages": [{"role": "user", "content": text}]}) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"router answered {r.status}")

            await asyncio.gather(*(send(p) for p in prompts))
    finally:
        router.terminate()
        await asyncio.wait_for(router.wait(), 10)
        for runner in runners:
            await runner.cleanup()
    decode_of = {room: name for name, room in seen if name.startswith("decode")}
    pairs = [(name, decode_of[room]) for name, room in seen if name.startswith("prefill")]
    log_text = await asyncio.to_thread(log_path.read_text)
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in log_text.splitlines()]
    branch = [line for line in lines if "using random worker selection" in line]
    started = next((line[line.index("| policy:"):] for line in lines if "| policy:" in line), None)
    return {"router_args": shlex.join(policy_args) or "(none: the organisers' flags)", "concurrency": concurrency,
            "requests": requests, "pairs": dict(sorted(collections.Counter(f"{p}+{d}" for p, d in pairs).items())),
            "sequence": " ".join(f"{p[-1]}{d[-1]}" for p, d in pairs),
            "router_policy_at_start": started, "log_lines_random_worker_selection": len(branch),
            "first_such_line": branch[0][branch[0].index("smg::"):] if branch else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", default="1,16", help="comma-separated, paired with --requests")
    parser.add_argument("--requests", default="40,200")
    parser.add_argument("--policy-args", nargs="+", default=["", "--policy round_robin", "--policy random"],
                        help="router flags per variant ('' = none, as the organisers' script); append "
                             "'--log-level debug' to see the policy's branch in its log")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--log-dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)  # the router's HTTP/2 probes of the fake workers
    points = list(zip((int(c) for c in args.concurrency.split(",")), (int(n) for n in args.requests.split(","))))
    for i, variant in enumerate(args.policy_args):
        for concurrency, requests in points:
            log = Path(args.log_dir) / f"sglang-router-pd-pairing-{i}-{concurrency}.log"
            print(json.dumps(asyncio.run(one_run(shlex.split(variant), concurrency, requests, args.seed, log))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
