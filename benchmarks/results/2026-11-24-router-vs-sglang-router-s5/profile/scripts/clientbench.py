"""Client CPU per POST /generate (stream and not) to one aggregated zero-cost sim: aiohttp default, tuned, EngineClient."""
import asyncio, sys, time, os, orjson
sys.path.insert(0, "/tmp/p5"); sys.path.insert(0, os.environ.get("CODE_ROOT", "/work/main"))
import sims, uvloop, aiohttp
from orchestrator.router.engine_client import EngineClient
n = int(sys.argv[1]); c = int(sys.argv[2])
port = sims.free_port()
proc = sims.sim("null", port, sims.free_port())
sims.wait_http(f"http://127.0.0.1:{port}/health", proc)
url = f"http://127.0.0.1:{port}"
def body(stream): return orjson.dumps({"input_ids": list(range(1, 65)), "sampling_params": {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}, "stream": stream, "rid": os.urandom(8).hex()})
H = {"Content-Type": "application/json"}
async def run(kind, stream):
    if kind == "aiohttp":
        s = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=2048, limit_per_host=0), timeout=aiohttp.ClientTimeout(total=None))
        async def post(b):
            async with s.post(url + "/generate", data=b, headers=H) as r:
                return await r.read()
    elif kind == "aiohttp-tuned":
        s = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=4), timeout=aiohttp.ClientTimeout(total=None),
                                  cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False, skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent"))
        async def post(b):
            async with s.post(url + "/generate", data=b, headers=H) as r:
                return await r.read()
    else:
        s = EngineClient()
        async def post(b):
            a = await s.post(url, "/generate", b)
            assert a.status == 200
            return a.body
    left = [n]
    async def worker():
        while left[0] > 0:
            left[0] -= 1
            out = await post(body(stream))
            assert b"meta_info" in out, out[:200]
    await asyncio.gather(*(worker() for _ in range(c)))  # warm
    left[0] = n
    c0, s0, t0 = sims.self_cpu(), sims.cpu(proc.pid), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(c)))
    r = ((sims.self_cpu() - c0) / n * 1e3, (sims.cpu(proc.pid) - s0) / n * 1e3, n / (time.perf_counter() - t0))
    await s.close()
    return r
async def main():
    for rnd in range(3):
        for kind in ("aiohttp", "aiohttp-tuned", "engine"):
            for stream in (False, True):
                r = await run(kind, stream)
                print(f"{kind:14s} stream={stream!s:5s} client {r[0]:.3f} ms/req  engine {r[1]:.2f}  {r[2]:.0f} req/s", flush=True)
try:
    uvloop.run(main())
finally:
    sims.stop([proc]); print("load", os.getloadavg())
