"""The generated job scripts run under a batch system on the two-host lab (network namespaces node-a, node-b,
client), and bring back a VALID bench.

Slurm is real: Debian's slurmctld on the client host and one slurmd per node host, each in its own UTS and
network namespace (hostname = node name; its own spool and pid files), `AuthType=auth/none` (Debian's package
ships it), no GPU gres; the script goes in with `sbatch`. PBS cannot be installed here (no Debian package,
OpenPBS needs its own server): its script runs on node-a with the PBS_* variables a job gets, and a stand-in
for `pbsdsh -n INDEX` that runs the command in the lab host of that PBS_NODEFILE line.

The daemons and the job's processes enter a host with `nsenter --net` (not `ip netns exec`, which remounts /sys
without /sys/fs/cgroup, where slurmd refuses to start).
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from orchestrator.cluster.netns.lab import NETNS_DIR, NetnsLab
from orchestrator.cluster.netns.leftovers import cleanup_leftovers
from orchestrator.cluster.ports import free_port
from orchestrator.config import dump_config, load_config
from tests.multihost.benchjob import engine_urls
from tests.support import sim_config, wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(420)]
REPO = Path(__file__).resolve().parents[2]
NODES = ("node-a", "node-b")
NUM_PROMPTS = 24


def _enter(lab: NetnsLab, role: str) -> list[str]:
    return ["nsenter", f"--net={NETNS_DIR / lab.hosts[role].netns}"]


def _job_config(tmp_path: Path, name: str, overrides: dict | None = None) -> Path:
    """A 1P1D sim bench: engines on their node's address, KV by NIXL over TCP on eth0 (as tests/multihost)."""
    cfg = sim_config({
        "name": name,
        "transfer.ucx.net_devices": "eth0",
        "transfer.ucx.tls": "tcp",
        "router.host": "0.0.0.0",  # the router runs on the driver's node, the head
        "benchmark.num_prompts": NUM_PROMPTS,
        "benchmark.fixed_output_len": 16,
        "benchmark.deadline_s": 240,
        **(overrides or {}),
    })
    path = tmp_path / f"{name}.yaml"
    path.write_text(dump_config(cfg))
    return path


def _jobscript(config: Path, scheduler: str, *extra: str) -> str:
    done = subprocess.run([sys.executable, "-m", "orchestrator", "jobscript", "--scheduler", scheduler,
                           "--config", str(config), "--cpus-per-node", "4", *extra],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _others_on_node(lab: NetnsLab, role: str, keep: set[int]) -> list[str]:
    """Command lines of processes on host `role` other than `keep` (the scheduler's daemons)."""
    out = []
    for pid in lab.pids(role):
        if pid in keep:
            continue
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
        except OSError:
            pass
    return out


def _check_run_dir(run_dir: Path, lab: NetnsLab, job_output: str, iface: str = "eth0") -> dict:
    """What every scheduler's job must leave: a VALID result copied, the nodes as Ray saw them, timings, logs."""
    a, b = lab.hosts["node-a"].ip, lab.hosts["node-b"].ip
    assert (run_dir / "result.json").is_file(), f"no result.json in {run_dir}:\n{job_output[-4000:]}"
    doc = json.loads((run_dir / "result.json").read_text())
    assert doc["verdict"] == "VALID", (doc.get("reason"), job_output[-3000:])
    assert doc["counts"]["completed"] == NUM_PROMPTS
    # Ray's own view: the head on node-a labelled prefill, the worker on node-b labelled decode; an address
    # exists only inside its own namespace, so each raylet ran there
    nodes = {n["ip"]: n["labels"].get("role") for n in doc["metadata"]["nodes"]}
    assert nodes == {a: "prefill", b: "decode"}, nodes
    workers = {w["role"]: w["node_ip"] for w in doc["metadata"]["workers"]}
    assert workers == {"prefill": a, "decode": b}
    timings = json.loads((run_dir / "timings.json").read_text())
    assert timings["head_ip"] == a and timings["prepare_exit"] == 0 and timings["work_exit"] == 0
    assert timings["ray_bringup_s"] > 0 and timings["prepare_s"] > 0 and timings["work_s"] > 0
    assert (run_dir / "report" / "report.html").is_file() and "VALID" in (run_dir / "report.txt").read_text()
    assert f"ip {a} ({iface}), role=prefill" in (run_dir / "logs/ray-head.log").read_text()
    assert f"ip {b} ({iface}), role=decode" in (run_dir / "logs/ray-worker.log").read_text()
    # each node's engine log came back from that node's Ray session
    engine_logs = {p.name for p in (run_dir / "logs").rglob("pd-engines/*/*.log")}
    assert any(n.startswith("prefill") for n in engine_logs) and any(n.startswith("decode") for n in engine_logs), \
        engine_logs
    assert not (run_dir / "ray-token").exists(), "the Ray token outlived the job"
    return timings


# ---- Slurm ------------------------------------------------------------------------------------------------

SLURM_CONF = """\
ClusterName=pdolab
SlurmctldHost=pdo-ctl({ctl_ip})
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/ctld-state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
NodeName=node-a NodeAddr={a} CPUs=4 RealMemory=1000 State=UNKNOWN
NodeName=node-b NodeAddr={b} CPUs=4 RealMemory=1000 State=UNKNOWN
PartitionName=lab Nodes=node-a,node-b Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="module")
def slurm_lab():
    """A fresh lab with slurmctld on the client and slurmd on node-a and node-b; yields (lab, env, slurmd pids)."""
    if not shutil.which("slurmctld") or not shutil.which("slurmd") or not shutil.which("sbatch"):
        missing = "Slurm is not installed: apt-get install slurm-wlm (scripts/dev-setup.sh does, as root)"
        if os.environ.get("PDO_REQUIRE_NETNS") == "1":  # CI (.ci/run) runs as root: dev-setup installed it
            pytest.fail(missing)
        pytest.skip(missing)
    cleanup_leftovers()
    state = Path(tempfile.mkdtemp(prefix="pdo-slurm-", dir="/tmp"))
    with NetnsLab() as lab:
        conf = state / "slurm.conf"
        conf.write_text(SLURM_CONF.format(d=state, ctl_ip=lab.hosts["client"].ip, a=lab.hosts["node-a"].ip,
                                          b=lab.hosts["node-b"].ip))
        for sub in ("ctld-state", "spool-node-a", "spool-node-b"):
            (state / sub).mkdir()
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_")}, "SLURM_CONF": str(conf)}

        def daemon(role: str, hostname: str, argv: list[str]) -> subprocess.Popen:
            proc = subprocess.Popen([*_enter(lab, role), "unshare", "--uts", "sh", "-c",
                                     f'hostname {hostname} && exec "$@"', "pdo-daemon", *argv], env=env,
                                    start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            lab.started.append(proc)
            return proc

        daemon("client", "pdo-ctl", ["slurmctld", "-D", "-i", "-f", str(conf)])
        slurmds = {role: daemon(role, role, ["slurmd", "-D", "-N", role, "-f", str(conf)]) for role in NODES}

        def idle() -> bool:
            done = lab.run("client", ["sinfo", "-h", "-N", "-o", "%N %t"], env=env, timeout_s=30)
            return done.stdout.split().count("idle") == 2

        try:
            wait_until(idle, 60, poll_s=0.5, what="both slurmd nodes idle in sinfo")
        except AssertionError as exc:
            logs = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(state.glob("*.log")))
            raise AssertionError(f"{exc}\n{logs}") from None
        yield lab, env, {role: p.pid for role, p in slurmds.items()}, state
    shutil.rmtree(state, ignore_errors=True)


def _sbatch(lab: NetnsLab, env: dict, tmp_path: Path, name: str,
            overrides: dict | None = None) -> tuple[str, Path, Path]:
    """Submit the generated script for a fresh config from the client host: (job id, submit dir, Ray tmp)."""
    submit_dir = tmp_path / "submit"
    submit_dir.mkdir()
    script = submit_dir / "job.sh"
    script.write_text(_jobscript(_job_config(tmp_path, name, overrides), "slurm", "--iface", "eth0"))
    ray_tmp = Path(tempfile.mkdtemp(prefix="pdo-sl-", dir="/tmp"))  # short: Ray's socket paths must fit
    done = subprocess.run([*_enter(lab, "client"), "sbatch", "--parsable", str(script)],
                          env={**env, "PDO_RAY_TMP": str(ray_tmp)}, cwd=submit_dir, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0], submit_dir, ray_tmp


def _job_state(lab: NetnsLab, env: dict, job_id: str) -> str | None:
    show = lab.run("client", ["scontrol", "show", "job", job_id], env=env, timeout_s=30).stdout
    return dict(word.split("=", 1) for word in show.split() if "=" in word).get("JobState")


def _ended(lab: NetnsLab, env: dict, job_id: str) -> str | None:
    state = _job_state(lab, env, job_id)
    return state if state not in (None, "PENDING", "RUNNING", "CONFIGURING", "COMPLETING") else None


def _job_output(submit_dir: Path, name: str, job_id: str) -> str:
    path = submit_dir / f"pdo-pdo-{name}-{job_id}.out"
    return path.read_text() if path.exists() else f"(no {path.name})"


def _nodes_left_with_slurmd_only(lab: NetnsLab, slurmds: dict[str, int]) -> None:
    for role in NODES:
        wait_until(lambda role=role: not _others_on_node(lab, role, {slurmds[role]}), 60, poll_s=0.5,
                   what=f"{role} running nothing but slurmd (left: {_others_on_node(lab, role, {slurmds[role]})})")


@pytest.mark.slurm
def test_sbatch_of_the_generated_script_runs_a_valid_bench_across_the_hosts(slurm_lab, tmp_path):
    lab, env, slurmds, state = slurm_lab
    job_id, submit_dir, ray_tmp = _sbatch(lab, env, tmp_path, "slurmjob")
    try:
        job_state = wait_until(lambda: _ended(lab, env, job_id), 360, poll_s=1, what=f"Slurm job {job_id} to end")
    finally:
        output = _job_output(submit_dir, "slurmjob", job_id)
        print(f"SLURM job {job_id} output (tail):\n{output[-2500:]}")
    assert job_state == "COMPLETED", f"{job_state}:\n{output[-4000:]}"
    timings = _check_run_dir(submit_dir / "pdo-runs" / job_id, lab, output)
    print(f"SLURM timings: {timings}")
    assert "Ray bring-up:" in output and "prepare:" in output and "stopping Ray on every node" in output
    _nodes_left_with_slurmd_only(lab, slurmds)  # Ray stopped on every node
    shutil.rmtree(ray_tmp, ignore_errors=True)


CANCEL_PROMPTS = 160


DECODE_COUNTS = ("sglang:num_requests_total", "sglang:num_running_reqs", "sglang:num_aborted_requests_total")


def _decode_counts(lab: NetnsLab) -> dict[str, int]:
    """The decode engine's own counts (DECODE_COUNTS: finished, running now, aborted) from its /metrics; 0 while it
    does not answer."""
    counts = dict.fromkeys(DECODE_COUNTS, 0)
    for url in engine_urls(lab, "node-b"):
        try:
            text = lab.call("client", lambda url=url: httpx.get(url + "/metrics", timeout=2).text)
        except httpx.HTTPError:
            continue
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in counts:
                counts[name] += int(float(line.rsplit(" ", 1)[1]))
    return counts


@pytest.mark.slurm
def test_scancel_mid_bench_keeps_what_finished_collects_the_logs_and_stops_ray_on_every_node(slurm_lab, tmp_path):
    """The job cancelled while prompts are in flight (as a user's scancel or the walltime would): the batch script's
    trap runs at once (its bench is a background step), stops the bench through Ray (the driver's soft stop), keeps
    the prompts that finished and fails the ones in flight with the reason, collects every node's logs (each node
    after its own SIGTERM: Slurm starts no new step in a cancelled job), and leaves nothing running on either host."""
    lab, env, slurmds, state = slurm_lab
    job_id, submit_dir, ray_tmp = _sbatch(lab, env, tmp_path, "canceljob", {
        # slowed x20 (as tests/multihost/benchjob.py): ~20 s of measured run, 8 prompts in flight at a time
        "benchmark.num_prompts": CANCEL_PROMPTS, "benchmark.fixed_output_len": 64, "benchmark.max_in_flight": 8,
        "engine.sim.time_scale": 20.0, "benchmark.deadline_s": 8})
    run_dir = submit_dir / "pdo-runs" / job_id
    try:
        def in_flight() -> tuple[int, int] | None:  # a few prompts done, others running on the decode engine
            assert not _ended(lab, env, job_id), _job_output(submit_dir, "canceljob", job_id)[-3000:]
            done, running, aborted = _decode_counts(lab).values()
            return (done, running) if done >= 4 and running > 0 and not aborted else None

        done_before, running = wait_until(in_flight, 300, poll_s=0.5, what=f"job {job_id}'s bench with prompts in flight")
        assert done_before < CANCEL_PROMPTS - running
        lab.run("client", ["scancel", job_id], env=env, timeout_s=30)
        cancelled_at = time.time()
        aborted = 0  # the decode engine's own count of requests aborted in flight, read until the engine is gone

        def ended() -> str | None:
            nonlocal aborted
            aborted = max(aborted, _decode_counts(lab)["sglang:num_aborted_requests_total"])
            return _ended(lab, env, job_id)

        job_state = wait_until(ended, 120, poll_s=0.2, what=f"job {job_id} to end")
        ended_s = time.time() - cancelled_at
    finally:
        output = _job_output(submit_dir, "canceljob", job_id)
        print(f"SLURM cancelled job {job_id} output (tail):\n{output[-3000:]}")
    assert job_state == "CANCELLED", job_state
    # the trap ran at once (its line within 3 s of scancel, to the second) and the clean-up finished before
    # Slurm's KillWait (30 s) SIGKILL: its last line is there
    trapped = next(line for line in output.splitlines() if "SIGTERM: stopping the job" in line)
    stamp = datetime.datetime.strptime(trapped.split("]")[0].removeprefix("[pdo "), "%H:%M:%S").time()
    trapped_at = datetime.datetime.combine(datetime.datetime.now(datetime.timezone.utc).date(), stamp,
                                           tzinfo=datetime.timezone.utc).timestamp()
    assert -1.5 <= trapped_at - cancelled_at <= 3, (trapped, cancelled_at)
    assert f"exit 143; run directory {run_dir}" in output and ended_s < 30, (ended_s, output[-3000:])
    # the result: every prompt that finished before the cancel, and the ones in flight failed with the reason
    doc = json.loads((run_dir / "result.json").read_text())
    assert doc["verdict"] == "INVALID" and doc["reason"] == "interrupted during measured run: received SIGTERM", \
        doc["reason"]
    completed, failed = doc["counts"]["completed"], doc["counts"]["failed"]
    assert done_before <= completed < CANCEL_PROMPTS and completed + failed == CANCEL_PROMPTS, doc["counts"]
    failures = [r for r in doc["results"] if r["status"] != "ok"]
    assert len(failures) == failed and all(r["error"] for r in failures), failures[:3]
    # the stop hit requests in flight: the decode engine aborted them (the router's soft stop), and result.json tells
    # them apart from the prompts never sent (at most max_in_flight = 8 were in flight)
    why = "interrupted during measured run: received SIGTERM"
    errors = collections.Counter(r["error"] for r in failures)
    assert set(errors) == {f"cut off in flight: {why}", f"never sent: {why}"}, errors
    assert 0 < aborted <= errors[f"cut off in flight: {why}"] <= 8, (aborted, errors)
    timings = json.loads((run_dir / "timings.json").read_text())
    assert timings["stopped_by"] == "SIGTERM" and timings["work_exit"] == 143 and timings["prepare_exit"] == 0
    # after a signal the job leaves the HTML report to the bench driver's own (its run folder), and each node's logs
    # to that node
    assert list(run_dir.glob("runs/*/report.html")) and not (run_dir / "report").exists()
    # each node collected its engine and Ray logs after its own SIGTERM
    engine_logs = {p.name for p in (run_dir / "logs").rglob("pd-engines/*/*.log")}
    assert any(n.startswith("prefill") for n in engine_logs) and any(n.startswith("decode") for n in engine_logs), \
        engine_logs
    for log in ("ray-head.log", "ray-worker.log"):
        assert "collected the logs" in (run_dir / "logs" / log).read_text(), log
    _nodes_left_with_slurmd_only(lab, slurmds)
    assert not (run_dir / "ray-token").exists()
    shutil.rmtree(ray_tmp, ignore_errors=True)


# ---- PBS: the script's logic, with a stand-in for pbsdsh ----------------------------------------------------

PBSDSH_STANDIN = """\
#!/bin/bash
# Stand-in for PBS's `pbsdsh -n INDEX -- CMD...`: runs CMD on the lab host named on line INDEX of PBS_NODEFILE,
# the way pbsdsh runs it on that node of the job (and records where it ran).
set -euo pipefail
[ "$1" = -n ] && [ "$3" = -- ] || { echo "pbsdsh stand-in: only -n INDEX -- CMD" >&2; exit 2; }
index=$2; shift 3
host=$(sed -n "$((index + 1))p" "$PBS_NODEFILE")
netns=$(cat "$PDO_TEST_NETNS_MAP/$host")
exec nsenter --net="/run/netns/$netns" /bin/bash -c \
  'echo "$(ip netns identify) $*" >> "$PDO_TEST_PBSDSH_LOG"; exec "$@"' pbsdsh-task "$@"
"""


def _pbs_job(lab: NetnsLab, tmp_path: Path, script_text: str, ray_tmp: Path,
             job_env: dict | None = None) -> tuple[list[str], dict, Path, Path]:
    """How the mother superior (node-a) runs a generated PBS script, with the PBS_* variables of job 4242 and the
    pbsdsh stand-in: (its command, its environment, its submit dir, the stand-in's log of tasks)."""
    submit_dir = tmp_path / "submit"
    submit_dir.mkdir()
    script = submit_dir / "job.sh"
    script.write_text(script_text)
    bin_dir, netns_map = tmp_path / "bin", tmp_path / "netns-map"
    bin_dir.mkdir()
    netns_map.mkdir()
    (bin_dir / "pbsdsh").write_text(PBSDSH_STANDIN)
    (bin_dir / "pbsdsh").chmod(0o755)
    for role in NODES:
        (netns_map / role).write_text(lab.hosts[role].netns)
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("node-a\nnode-b\n")
    pbsdsh_log = tmp_path / "pbsdsh.log"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SLURM_"))},
           "PATH": f"{bin_dir}:{os.environ['PATH']}", "PBS_JOBID": "4242.pbs-lab", "PBS_O_WORKDIR": str(submit_dir),
           "PBS_NODEFILE": str(nodefile), "PDO_RAY_TMP": str(ray_tmp), "PDO_TEST_NETNS_MAP": str(netns_map),
           "PDO_TEST_PBSDSH_LOG": str(pbsdsh_log), **(job_env or {})}
    # the mother superior (first node of the job) runs the script
    return [*_enter(lab, "node-a"), "bash", str(script)], env, submit_dir, pbsdsh_log


def _run_pbs_job(lab: NetnsLab, tmp_path: Path, script_text: str, ray_tmp: Path,
                 job_env: dict | None = None) -> tuple[subprocess.CompletedProcess, Path, list[str]]:
    """Run a generated PBS script to its end (_pbs_job): (the run, its submit dir, the pbsdsh tasks as 'netns command'
    lines)."""
    cmd, env, submit_dir, pbsdsh_log = _pbs_job(lab, tmp_path, script_text, ray_tmp, job_env)
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=360)
    tasks = pbsdsh_log.read_text().splitlines() if pbsdsh_log.exists() else []
    return done, submit_dir, tasks


def _nodes_left_with_nothing(lab: NetnsLab) -> None:
    for role in NODES:
        wait_until(lambda role=role: not _others_on_node(lab, role, set()), 30,
                   what=f"{role} running nothing (left: {_others_on_node(lab, role, set())})")


def test_pbs_script_starts_each_raylet_on_its_own_node_and_runs_a_valid_bench(tmp_path):
    cleanup_leftovers()
    ray_tmp = Path(tempfile.mkdtemp(prefix="pdo-pb-", dir="/tmp"))
    with NetnsLab() as lab:
        # --iface auto: eth0 in the lab
        done, submit_dir, tasks = _run_pbs_job(lab, tmp_path, _jobscript(_job_config(tmp_path, "pbsjob"), "pbs"),
                                               ray_tmp)
        output = done.stdout + done.stderr
        print(f"PBS job output (tail):\n{output[-2500:]}")
        assert done.returncode == 0, output[-4000:]
        timings = _check_run_dir(submit_dir / "pdo-runs" / "4242", lab, output, iface="auto")
        print(f"PBS timings: {timings}")
        # every task went through pbsdsh -n: the head's raylet in node-a's namespace, the worker's in node-b's
        where: dict[str, list[str]] = {line.split()[0]: [] for line in tasks}
        for line in tasks:
            where[line.split()[0]].append(line)
        assert any(" head" in t for t in where[lab.hosts["node-a"].netns]), tasks
        assert any(" worker " in t for t in where[lab.hosts["node-b"].netns]), tasks
        assert not any(" worker " in t for t in where[lab.hosts["node-a"].netns]), tasks
        _nodes_left_with_nothing(lab)
    shutil.rmtree(ray_tmp, ignore_errors=True)


PBS_KILL_DELAY_S = 10  # OpenPBS's (and Torque's) default kill_delay


def _qdel_once_in_flight(lab: NetnsLab, tmp_path: Path, script: str, ray_tmp: Path,
                         job_env: dict | None = None) -> tuple[int, str, Path]:
    """Run a generated PBS script as MoM does (the job's own session) until the decode engine shows prompts finished
    and some running, then qdel it as MoM carries it out: SIGTERM to the session, SIGKILL to what is left of it
    PBS_KILL_DELAY_S later. Requires the job's trap line within 3 s of the SIGTERM. (the decode engine's finished count
    at the SIGTERM, the job's output, its run directory)."""
    cmd, env, submit_dir, _ = _pbs_job(lab, tmp_path, script, ray_tmp, job_env)
    out = tmp_path / "job.out"
    with out.open("w") as sink:  # the job's session: what PBS signals
        job = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        def in_flight() -> tuple[int, int] | None:
            assert job.poll() is None, out.read_text()[-3000:]
            done, running, aborted = _decode_counts(lab).values()
            return (done, running) if done >= 4 and running > 0 and not aborted else None

        done_before, _ = wait_until(in_flight, 300, poll_s=0.5, what="the PBS job with prompts in flight")
        os.killpg(job.pid, signal.SIGTERM)
        qdel_at = time.time()
        with contextlib.suppress(subprocess.TimeoutExpired):
            job.wait(timeout=PBS_KILL_DELAY_S)
        ended_s = time.time() - qdel_at
        time.sleep(max(0.0, qdel_at + PBS_KILL_DELAY_S - time.time()))  # PBS's clock, not a synchronisation
        with contextlib.suppress(ProcessLookupError):  # what is left of the job's processes (node.sh on a node)
            os.killpg(job.pid, signal.SIGKILL)
        rc = job.wait(timeout=30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=30)
        output = out.read_text()
        print(f"PBS qdel'd job output (tail):\n{output[-3000:]}")
    print(f"PBS qdel: SIGTERM at {datetime.datetime.fromtimestamp(qdel_at).strftime('%H:%M:%S.%f')}; the job script "
          f"ended {ended_s:.1f} s after it (rc {rc}; the SIGKILL came at {PBS_KILL_DELAY_S} s)")
    trapped = next(line for line in output.splitlines() if "SIGTERM: stopping the job" in line)
    stamp = datetime.datetime.strptime(trapped.split("]")[0].removeprefix("[pdo "), "%H:%M:%S").time()
    trapped_at = datetime.datetime.combine(datetime.datetime.now(datetime.timezone.utc).date(), stamp,
                                           tzinfo=datetime.timezone.utc).timestamp()
    assert -1.5 <= trapped_at - qdel_at <= 3, (trapped, qdel_at)
    return done_before, output, submit_dir / "pdo-runs" / "4242"


def test_pbs_qdel_mid_bench_keeps_what_finished_and_stops_ray_on_every_node_within_the_kill_delay(tmp_path):
    """qdel as PBS's MoM carries it out, without a PBS server (none is packaged for Debian: no openpbs or torque
    package here): SIGTERM to every process of the job (the script's session, whose pbsdsh tasks run node.sh on each
    node), then SIGKILL to what is left PBS_KILL_DELAY_S later. As with scancel: the trap runs at once, the bench keeps
    what finished and tells the rest apart, and Ray is stopped on both nodes, all before the SIGKILL (the steps' and
    Ray's own sessions are not the job's: a SIGKILL would not reach them)."""
    cleanup_leftovers()
    ray_tmp = Path(tempfile.mkdtemp(prefix="pdo-pq-", dir="/tmp"))
    with NetnsLab() as lab:
        script = _jobscript(_job_config(tmp_path, "qdeljob", {
            "benchmark.num_prompts": CANCEL_PROMPTS, "benchmark.fixed_output_len": 64, "benchmark.max_in_flight": 8,
            "engine.sim.time_scale": 20.0, "benchmark.deadline_s": 8}), "pbs")
        done_before, output, run_dir = _qdel_once_in_flight(lab, tmp_path, script, ray_tmp)
        doc = json.loads((run_dir / "result.json").read_text())
        why = "interrupted during measured run: received SIGTERM"
        assert doc["verdict"] == "INVALID" and doc["reason"] == why, doc["reason"]
        completed, failed = doc["counts"]["completed"], doc["counts"]["failed"]
        assert done_before <= completed < CANCEL_PROMPTS and completed + failed == CANCEL_PROMPTS, doc["counts"]
        errors = collections.Counter(r["error"] for r in doc["results"] if r["status"] != "ok")
        assert set(errors) == {f"cut off in flight: {why}", f"never sent: {why}"}, errors
        assert 0 < errors[f"cut off in flight: {why}"] <= 8, errors
        # the clean-up wrote the job's record before the SIGKILL
        assert json.loads((run_dir / "timings.json").read_text())["stopped_by"] == "SIGTERM"
        assert not (run_dir / "ray-token").exists()
        # each node stopped its Ray after its own SIGTERM, and nothing of the job is left on either host
        for log in ("ray-head.log", "ray-worker.log"):
            assert "stopped Ray session" in (run_dir / "logs" / log).read_text(), log
        _nodes_left_with_nothing(lab)
    shutil.rmtree(ray_tmp, ignore_errors=True)


# ---- the 2026 contest's job: serve, the closed-loop AIPerf goodput, serve down ------------------------------

GOODPUT_N = 4


def _serving_config(tmp_path: Path, name: str, *overrides: str) -> Path:
    """The 2026 preset cut to one prefill and one decode TP4 server (sim, time scale 0.05) and a 6 s closed loop at
    N = 4; the gateway keyed by $PDO_TEST_GATEWAY_KEY."""
    cfg = load_config(REPO / "configs" / "qwen3-pd-2026.yaml", [
        f"name={name}", "rules=null", "layout.prefill.0.count=1", "layout.decode.0.count=1",
        "engine.sim.startup_s=0", "engine.sim.time_scale=0.05", "transfer.ucx.net_devices=eth0",
        "transfer.ucx.tls=tcp", f"router.port={free_port()}", "router.api_key_env=PDO_TEST_GATEWAY_KEY",
        f"benchmark.concurrency=[{GOODPUT_N}]", "benchmark.input_tokens=256", "benchmark.output_tokens=16",
        "benchmark.warmup_s=0", "benchmark.window_s=6", "benchmark.grace_s=10", "benchmark.deadline_s=300",
        *overrides])
    path = tmp_path / f"{name}.yaml"
    path.write_text(dump_config(cfg))
    return path


def test_pbs_serve_goodput_job_measures_every_request_and_leaves_nothing_running(tmp_path):
    """The contest's deliverable as a user submits it: `jobscript --then serve+goodput`, run as PBS runs it. The job
    brings up Ray on both hosts, starts serve (its ready line: every PD pair warmed), runs the real AIPerf closed loop
    against the gateway with the key from the job's environment, stops serve with `serve down`, and leaves goodput's
    result with every request's record (completed, or failed with its reason), serve's and the engines' logs, and no
    process on either host."""
    cleanup_leftovers()
    ray_tmp = Path(tempfile.mkdtemp(prefix="pdo-pg-", dir="/tmp"))
    with NetnsLab() as lab:
        script = _jobscript(_serving_config(tmp_path, "servejob"), "pbs", "--then", "serve+goodput")
        done, submit_dir, _ = _run_pbs_job(lab, tmp_path, script, ray_tmp, {
            "PDO_TEST_GATEWAY_KEY": "job-key-4242", "PDO_GOODPUT_ARGS": "--num-dataset-entries 64"})
        output = done.stdout + done.stderr
        print(f"PBS serve+goodput job output (tail):\n{output[-3000:]}")
        run_dir = submit_dir / "pdo-runs" / "4242"
        assert done.returncode == 0, output[-5000:]
        report = json.loads((run_dir / "goodput.json").read_text())
        (row,) = report["rows"]
        assert row["concurrency"] == GOODPUT_N and row["requests"] > 0 and row["errors"] == 0, row
        # AIPerf's per-request records: each one completed (its output tokens, as AIPerf's Qwen tokenizer counts the
        # text, and its latency), or failed with its reason
        records = [json.loads(line) for line in (run_dir / "goodput" / f"c{GOODPUT_N}" / "profile_export.jsonl")
                   .read_text().splitlines() if line.strip()]
        assert len(records) >= row["requests"], (len(records), row)
        for record in records:
            error = record.get("error")
            if error:
                assert error.get("message"), record
            else:
                metrics = record["metrics"]
                assert metrics["output_sequence_length"]["value"] > 0 and metrics["request_latency"]["value"] > 0, \
                    record
        timings = json.loads((run_dir / "timings.json").read_text())
        assert timings["work"] == "serve+goodput" and timings["work_exit"] == 0, timings
        assert timings["serve_exit"] == 0 and timings["serve_down_exit"] == 0 and timings["serve_ready_s"] > 0
        serve_log = (run_dir / "serve" / "servejob.log").read_text()
        assert "ready: OpenAI gateway" in serve_log and "serve: stopped" in serve_log, serve_log[-2000:]
        assert "drained: no request in flight" in (run_dir / "logs" / "serve-down.log").read_text()
        assert not (run_dir / "serve" / "servejob.json").exists(), "serve's state file outlived the service"
        engine_logs = {p.name for p in (run_dir / "logs").rglob("pd-engines/*/*.log")}
        assert any(n.startswith("prefill") for n in engine_logs) and any(n.startswith("decode") for n in engine_logs), \
            engine_logs
        assert not (run_dir / "ray-token").exists() and not (run_dir / "api-key").exists()
        assert "job-key-4242" not in output + script
        _nodes_left_with_nothing(lab)  # serve, its engines and both raylets are gone
    shutil.rmtree(ray_tmp, ignore_errors=True)


def test_pbs_qdel_mid_goodput_keeps_every_finished_request_and_stops_ray_on_every_node_within_the_kill_delay(tmp_path):
    """qdel (as MoM carries it out: SIGTERM to the job's session, SIGKILL 10 s later) while the 2026 job's AIPerf closed
    loop has requests in flight. goodput has AIPerf cancel its run, so AIPerf's per-request records keep every request
    that finished and mark the cut-off ones with their error; the job writes goodput.json and timings.json, stops Ray
    on both nodes and ends before the SIGKILL. (Before: AIPerf died on the SIGTERM with no record, and `serve down`'s
    teardown ran past the SIGKILL: no timings.json, the job's last line never came.)"""
    cleanup_leftovers()
    ray_tmp = Path(tempfile.mkdtemp(prefix="pdo-pgq-", dir="/tmp"))
    with NetnsLab() as lab:
        script = _jobscript(_serving_config(tmp_path, "qdelserve", "benchmark.window_s=120",
                                            "benchmark.output_tokens=64", "engine.sim.time_scale=1.0"),
                            "pbs", "--then", "serve+goodput")
        done_before, output, run_dir = _qdel_once_in_flight(lab, tmp_path, script, ray_tmp, {
            "PDO_TEST_GATEWAY_KEY": "job-key-4242", "PDO_GOODPUT_ARGS": "--num-dataset-entries 64"})
        written = {name: datetime.datetime.fromtimestamp((run_dir / name).stat().st_mtime).strftime("%H:%M:%S.%f")
                   for name in ("goodput/c4/profile_export.jsonl", "goodput.json", "timings.json", "pids/work-stopped")
                   if (run_dir / name).exists()}
        print(f"PBS qdel of serve+goodput: written at {written}")
        assert "exit 143; run directory" in output, "the job's clean-up did not end before the SIGKILL"
        report = json.loads((run_dir / "goodput.json").read_text())
        stopped = report["stopped"]
        print(f"goodput.json's stopped: {stopped}")
        assert report["rows"] == [] and report["not_run"] == [GOODPUT_N], report
        assert stopped["concurrency"] == GOODPUT_N and stopped["reason"] == "received SIGTERM", stopped
        # AIPerf's records: every request the decode engine had finished at the SIGTERM (but the serve's one pair
        # warm-up) completed, each failed one with its error; the ones its cancel cut off counted (at most the N)
        records = [json.loads(line) for line in (run_dir / "goodput" / f"c{GOODPUT_N}" / "profile_export.jsonl")
                   .read_text().splitlines() if line.strip()]
        completed = [r for r in records if not r.get("error")]
        failed = [r["error"] for r in records if r.get("error")]
        assert len(completed) >= done_before - 1, (len(completed), done_before)
        assert all(r["metrics"]["output_sequence_length"]["value"] > 0 for r in completed)
        assert all(e.get("message") for e in failed), failed
        assert (stopped["completed"], stopped["failed"]) == (len(completed), len(failed)), stopped
        assert 0 < stopped["cut_off_in_flight"] <= GOODPUT_N, stopped
        timings = json.loads((run_dir / "timings.json").read_text())
        assert timings["stopped_by"] == "SIGTERM" and timings["work"] == "serve+goodput", timings
        assert not (run_dir / "ray-token").exists() and not (run_dir / "api-key").exists()
        for log in ("ray-head.log", "ray-worker.log"):
            assert "stopped Ray session" in (run_dir / "logs" / log).read_text(), log
        _nodes_left_with_nothing(lab)  # serve, its engines and both raylets are gone
    shutil.rmtree(ray_tmp, ignore_errors=True)
