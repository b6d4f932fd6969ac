"""Start 2 sims, run the in-process dispatcher batch N times (for py-spy)."""
import asyncio, os, sys, time, signal
sys.path.insert(0, "/tmp/p")
import harness
root = sys.argv[1]; n = int(sys.argv[2]); c = int(sys.argv[3])
pp, dp, boot = harness.free_port(), harness.free_port(), harness.free_port()
procs = [harness.sim(root, "prefill", pp, boot), harness.sim(root, "decode", dp, 8998)]
try:
    harness.wait_http(f"http://127.0.0.1:{pp}/health", procs[0]); harness.wait_http(f"http://127.0.0.1:{dp}/health", procs[1])
    c0 = harness._self_cpu()
    el, lat = asyncio.run(harness.direct(pp, dp, boot, n, c, 4))
    print(f"direct {n/el:.1f} req/s cpu ms/req {(harness._self_cpu()-c0)/n*1e3:.2f}")
finally:
    for p in procs: os.killpg(p.pid, signal.SIGTERM)
