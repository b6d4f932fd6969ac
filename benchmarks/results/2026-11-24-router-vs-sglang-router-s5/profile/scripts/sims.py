"""Start 2 zero-cost sims (prefill, decode); helpers for scratch harnesses."""
import os, signal, socket, subprocess, sys, time, urllib.request
ROOT = os.environ.get("CODE_ROOT", "/work/main")
PY = "/work/main/.venv/bin/python"

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def wait_http(url, proc, t=60):
    end = time.time() + t
    while time.time() < end:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: process exited {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200: return
        except OSError: pass
        time.sleep(0.2)
    raise SystemExit(f"{url} not up")

def sim(role, port, boot):
    argv = [PY, "-m", "orchestrator.engines.sim.server", "--host", "127.0.0.1", "--port", str(port),
            "--disaggregation-mode", role, "--disaggregation-bootstrap-port", str(boot),
            "--served-model-name", "DeepSeek-V2-Lite", "--tp-size", "1", "--profile", "cpu-fast", "--time-scale", "0.0001",
            "--kv-transfer", "auto", "--sim-node", f"127.0.0.1/{role}", "--startup-s", "0.0",
            "--model-path", f"{ROOT}/models/deepseek-v2-lite"]
    env = dict(os.environ, PYTHONPATH=ROOT, UCX_NET_DEVICES="lo")
    return subprocess.Popen(argv, env=env, stdout=open(f"/tmp/p5/sim-{role}.log", "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=ROOT)

def start():
    pp, dp, boot = free_port(), free_port(), free_port()
    procs = [sim("prefill", pp, boot), sim("decode", dp, free_port())]
    wait_http(f"http://127.0.0.1:{pp}/health", procs[0]); wait_http(f"http://127.0.0.1:{dp}/health", procs[1])
    return pp, dp, boot, procs

def stop(procs):
    for p in procs:
        try: os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError: pass
    for p in procs:
        try: p.wait(10)
        except subprocess.TimeoutExpired: os.killpg(p.pid, signal.SIGKILL)

def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

def self_cpu():
    t = os.times(); return t.user + t.system
