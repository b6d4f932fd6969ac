"""Deploy; per-thread CPU of the replica: idle for 10 s, then during a batch cell and an http cell."""
import asyncio, os, sys, time, collections
ROOT = os.environ.get("CODE_ROOT", "/work/main")
sys.path.insert(0, ROOT); sys.path.insert(0, ROOT + "/benchmarks")
import router_vs_sglang_router as rv
def threads(pid):
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            raw = open(f"/proc/{pid}/task/{tid}/stat").read()
        except FileNotFoundError:
            continue
        name = raw[raw.index("(") + 1:raw.rindex(")")]
        f = raw.rsplit(")", 1)[1].split()
        out[(tid, name)] = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    return out
def delta(a, b, n):
    d = collections.Counter()
    for k, v in b.items():
        d[k[1]] += v - a.get(k, 0)
    return {k: round(v / n * 1e3, 3) for k, v in d.most_common() if v > 0}
paths = sys.argv[1].split(",") if len(sys.argv) > 1 else ["batch", "http"]
with rv.paths.deployed_router("p5t") as bench:
    pids = rv.router_pids(bench)
    pid = pids["ours"][0]
    for p in paths:
        rv.run_cell(bench, p, 64, 32, 4, pids)
    a = threads(pid); time.sleep(10); b = threads(pid)
    print("idle ms per second:", {k: v for k, v in delta(a, b, 10).items()})
    for rnd in range(2):
        for p in paths:
            for c in (32, 128):
                a = threads(pid); t = time.time()
                row = rv.run_cell(bench, p, 600, c, 4, pids)
                el = time.time() - t
                b = threads(pid)
                print(f"{p} c={c} {row['req_s']} req/s, {el:.1f}s, router {row['router_cpu_ms_per_request']} ms/req; per thread ms/req:", delta(a, b, 600), "load", row["load1_before"], flush=True)
