"""A batch job script (Slurm or PBS) that brings up the labelled 2-node Ray cluster and runs the work.

RunConfig + JobOptions -> render(...) -> bash text, from the template orchestrator/data/jobscript/job.sh.tmpl
(sections: settings, nodes, clean-up, Ray bring-up, prepare, work, collect). The scheduler decides only the
resource lines, where the allocation's nodes and ids come from, and how one process is launched on one node
(`srun`, `pbsdsh` or `mpirun`); everything else is the same script. What runs on the nodes at job time is
orchestrator.cluster.batch (fabric IP, waiting for the nodes, the Ray job's real verdict).
"""

from __future__ import annotations

import math
import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from orchestrator.config import ConfigError, RunConfig, dump_config

TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "jobscript" / "job.sh.tmpl"
SCHEDULERS = ("slurm", "pbs")
PBS_LAUNCHERS = ("pbsdsh", "mpirun")
DEFAULT_MARGIN_S = 900.0  # walltime beyond the deadline: Ray bring-up, prepare (cold compile caches), collect


class JobScriptError(ConfigError):
    """A jobscript option or config that cannot make a job; the message names the option and the fix."""

    def __init__(self, problem: str):
        super().__init__("jobscript", [problem])


@dataclass(frozen=True)
class JobOptions:
    scheduler: str
    then: str = "bench"
    iface: str = "auto"
    margin_s: float = DEFAULT_MARGIN_S
    gpus_per_node: int | None = None  # None: cluster.gpus_per_node for real engines, 0 (no request) for the sim
    cpus_per_node: int | None = None
    partition: str | None = None  # Slurm partition / PBS queue
    account: str | None = None
    launcher: str | None = None  # PBS: pbsdsh (default) or mpirun; Slurm: srun
    ray_port: int = 6379
    dashboard_port: int = 8265
    bringup_timeout_s: float = 300.0
    run_subdir: str = "pdo-runs"
    python: str = field(default_factory=lambda: sys.executable)
    python_in_submit_dir: bool = False  # a bundle: PDO_PYTHON defaults to $SUBMIT_DIR/.venv (build/install.sh)
    generated_by: str = ""


# ---- the work after `prepare`: one entry per --then value ----------------------------------------------


def _bench_work(cfg: RunConfig) -> str:
    """`bench` as a Ray job; its verdict is the driver's exit code (0 = VALID), read through the job API, since
    `ray job submit` itself exits 1 for any failure and 0 for a job it merely saw end."""
    return """\
  SUBMISSION_ID=pdo-$JOB_ID-bench-$(date +%s)
  "$PDO_RAY" job submit --address "$DASHBOARD" --submission-id "$SUBMISSION_ID" -- \\
    "$PDO_PYTHON" -m orchestrator bench --config "$RUN_DIR/config.yaml" --result-dir "$RUN_DIR/runs" 2>&1 | tee "$RUN_DIR/logs/bench.log"
  log "ray job submit exited ${PIPESTATUS[0]}; the job's own verdict:"
  "$PDO_PYTHON" -m orchestrator.cluster.batch job-status --dashboard "$DASHBOARD" --id "$SUBMISSION_ID" \\
    | tee "$RUN_DIR/logs/job-status.log"
  WORK_RC=${PIPESTATUS[0]}"""


# `serve+goodput` joins as one more entry: `serve --detach` on the head, then `goodput --url` (the contest's AIPerf
# command) against its gateway, `serve down`, the verdict from goodput's exit code.
WORKS: dict[str, Callable[[RunConfig], str]] = {"bench": _bench_work}
SERVE_BY_HAND = ("in a job script of your own: `pd-orchestrator serve --config X --detach` on the Ray head, then "
                 "`pd-orchestrator goodput --config X --url <its gateway>` (the contest's AIPerf command), then "
                 "`pd-orchestrator serve down` (docs/serving.md)")
PLANNED_WORKS = {"serve+goodput": "not available yet: `pd-orchestrator serve` and `goodput` exist, their job step "
                 f"does not; run them {SERVE_BY_HAND}"}


# ---- what differs per scheduler -------------------------------------------------------------------------


def wall_deadline_s(cfg: RunConfig) -> float:
    """benchmark.deadline_s in wall seconds (a simulated engine's times are scaled by engine.sim.time_scale)."""
    return cfg.benchmark.deadline_s * (cfg.engine.sim.time_scale if cfg.simulated else 1.0)


def walltime(cfg: RunConfig, margin_s: float) -> str:
    """HH:MM:SS of the deadline plus the bring-up margin, rounded up to a whole minute."""
    minutes = math.ceil((wall_deadline_s(cfg) + margin_s) / 60)
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


def _job_name(cfg: RunConfig, limit: int) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"pdo-{cfg.name}")[:limit]


def _slurm_resources(cfg: RunConfig, opts: JobOptions, gpus: int) -> list[str]:
    lines = [f"--job-name={_job_name(cfg, 64)}", "--nodes=2", "--ntasks-per-node=1", "--exclusive",
             f"--time={walltime(cfg, opts.margin_s)}", "--output=pdo-%x-%j.out"]
    if gpus:
        lines.insert(3, f"--gpus-per-node={gpus}")
    if opts.cpus_per_node:
        lines.insert(3, f"--cpus-per-task={opts.cpus_per_node}")
    lines += [f"--partition={opts.partition}"] * bool(opts.partition) + [f"--account={opts.account}"] * bool(opts.account)
    return [f"#SBATCH {line}" for line in lines]


def _pbs_resources(cfg: RunConfig, opts: JobOptions, gpus: int) -> list[str]:
    chunk = "select=2" + (f":ncpus={opts.cpus_per_node}" if opts.cpus_per_node else "") + (
        f":ngpus={gpus}" if gpus else "") + ":mpiprocs=1"
    lines = [f"-N {_job_name(cfg, 15)}", f"-l {chunk}", "-l place=scatter:excl",
             f"-l walltime={walltime(cfg, opts.margin_s)}", "-j oe"]
    lines += [f"-q {opts.partition}"] * bool(opts.partition) + [f"-A {opts.account}"] * bool(opts.account)
    return [f"#PBS {line}" for line in lines]


SLURM_ENV = """\
SUBMIT_DIR=${SLURM_SUBMIT_DIR:-$PWD}
JOB_ID=${SLURM_JOB_ID:?not inside a Slurm job: submit this script with sbatch}"""

PBS_ENV = """\
SUBMIT_DIR=${PBS_O_WORKDIR:-$PWD}
JOB_ID=${PBS_JOBID:?not inside a PBS job: submit this script with qsub}
JOB_ID=${JOB_ID%%.*}                            # 1234.server -> 1234
cd "$SUBMIT_DIR" || exit 1"""

SLURM_NODES = 'mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")'

# PBS_NODEFILE has one line per MPI rank (mpiprocs=1: one per node); pbsdsh -n counts those lines.
PBS_NODES = """\
mapfile -t _LINES < "${PBS_NODEFILE:?not inside a PBS job: PBS_NODEFILE is unset}"
NODES=(); NODE_INDEX=()
for i in "${!_LINES[@]}"; do
  case " ${NODES[*]} " in *" ${_LINES[$i]} "*) ;; *) NODES+=("${_LINES[$i]}"); NODE_INDEX+=("$i") ;; esac
done"""

# Every launcher runs CMD through the same wrapper, so the output lands in LOGFILE on any scheduler
# (pbsdsh and mpirun give no per-task output file of their own).
_WRAP = """/bin/bash -c 'log=$1; shift; exec "$@" > "$log" 2>&1' pdo-launch "$logfile" "$@\""""

LAUNCHERS = {
    "srun": f"""\
launch_on() {{
  local index=$1 node=$2 logfile=$3; shift 3
  srun --overlap --nodes=1 --ntasks=1 --nodelist="$node" --kill-on-bad-exit=0 {_WRAP} &
  STARTED+=($!)
}}""",
    "pbsdsh": f"""\
PDO_PBSDSH=${{PDO_PBSDSH:-pbsdsh}}
launch_on() {{
  local index=$1 node=$2 logfile=$3; shift 3
  "$PDO_PBSDSH" -n "${{NODE_INDEX[$index]}}" -- {_WRAP} &
  STARTED+=($!)
}}""",
    "mpirun": f"""\
PDO_MPIRUN=${{PDO_MPIRUN:-mpirun}}
launch_on() {{
  local index=$1 node=$2 logfile=$3; shift 3
  "$PDO_MPIRUN" -np 1 --host "$node" {_WRAP} &
  STARTED+=($!)
}}""",
}


def _launcher(opts: JobOptions) -> str:
    if opts.scheduler == "slurm":
        if opts.launcher not in (None, "srun"):
            raise JobScriptError(f"--launcher {opts.launcher}: Slurm jobs launch with srun; drop --launcher")
        return "srun"
    launcher = opts.launcher or "pbsdsh"
    if launcher not in PBS_LAUNCHERS:
        raise JobScriptError(f"--launcher {launcher}: PBS jobs launch with one of {', '.join(PBS_LAUNCHERS)}")
    return launcher


def check(cfg: RunConfig, opts: JobOptions) -> None:
    """One-line errors for what cannot make a job (before any text is written)."""
    if opts.scheduler not in SCHEDULERS:
        raise JobScriptError(f"--scheduler {opts.scheduler}: choose one of {', '.join(SCHEDULERS)}")
    if opts.then not in WORKS:
        why = PLANNED_WORKS.get(opts.then, f"choose one of {', '.join(WORKS)}")
        raise JobScriptError(f"--then {opts.then}: {why}")
    if opts.then == "bench" and cfg.benchmark.kind == "closed_loop":
        raise JobScriptError(f"--then bench: benchmark.kind=closed_loop, which bench refuses (it runs a prompt "
                             "batch), so the job would fail after Ray bring-up and prepare; measure the closed loop "
                             f"{SERVE_BY_HAND}, or set benchmark.kind: batch")
    if cfg.cluster.num_nodes != 2:
        raise JobScriptError(f"cluster.num_nodes={cfg.cluster.num_nodes}: the job script brings up 2 nodes "
                             "(a prefill node as the Ray head and a decode node); set cluster.num_nodes: 2")
    if not re.fullmatch(r"[A-Za-z0-9_.:-]+", opts.iface):
        raise JobScriptError(f"--iface {opts.iface!r}: an interface name such as ib0, eth0 or auto")


def _gpus(cfg: RunConfig, opts: JobOptions) -> int:
    if opts.gpus_per_node is not None:
        return opts.gpus_per_node
    return 0 if cfg.simulated else cfg.cluster.gpus_per_node


def render(cfg: RunConfig, opts: JobOptions, git_sha: str | None = None) -> str:
    """The job script's text for `cfg` (its resolved config embedded verbatim)."""
    check(cfg, opts)
    gpus = _gpus(cfg, opts)
    launcher = _launcher(opts)
    slurm = opts.scheduler == "slurm"
    resources = (_slurm_resources if slurm else _pbs_resources)(cfg, opts, gpus)
    # every driver of the job runs on the head with RAY_ADDRESS set (by the script, or by Ray inside the job)
    job_cfg = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"address": "auto"})})
    config_yaml = dump_config(job_cfg).rstrip("\n")
    if re.search(r"^PDO_CONFIG$", config_yaml, re.M):
        raise JobScriptError("the config contains a line 'PDO_CONFIG', the job script's heredoc marker; rename it")
    roles = cfg.cluster.roles
    values = {
        "RESOURCE_LINES": "\n".join(resources),
        "GENERATED_BY": opts.generated_by or f"--scheduler {opts.scheduler} --then {opts.then}",
        "GENERATED_AT": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "GIT_SHA": git_sha or "unknown",
        "LABEL_KEY": shlex.quote(roles.label_key),
        "HEAD_ROLE": shlex.quote(roles.prefill),
        "WORKER_ROLE": shlex.quote(roles.decode),
        "LAUNCHER": launcher,
        "WORK_NAME": opts.then,
        "RUN_DIR_DOC": f"$SUBMIT_DIR/{opts.run_subdir}/<job id>",
        "PYTHON": '"$SUBMIT_DIR/.venv/bin/python"' if opts.python_in_submit_dir else shlex.quote(opts.python),
        "IFACE": shlex.quote(opts.iface),
        "RAY_PORT": str(opts.ray_port),
        "DASHBOARD_PORT": str(opts.dashboard_port),
        "BRINGUP_TIMEOUT_S": f"{opts.bringup_timeout_s:.0f}",
        "NUM_GPUS": str(cfg.cluster.gpus_per_node),
        "NUM_CPUS": str(opts.cpus_per_node or ""),
        "SCHEDULER_ENV": SLURM_ENV if slurm else PBS_ENV,
        "RUN_SUBDIR": shlex.quote(opts.run_subdir),
        "CONFIG_YAML": config_yaml,
        "NODE_LIST": SLURM_NODES if slurm else PBS_NODES,
        "LAUNCH": LAUNCHERS[launcher],
        "WORK": WORKS[opts.then](cfg),
    }
    text = TEMPLATE.read_text()
    # the config goes in last: its text is data, never scanned for placeholders
    for key, value in values.items():
        if key != "CONFIG_YAML":
            text = text.replace(f"@@{key}@@", value)
    left = sorted(set(re.findall(r"@@([A-Z_]+)@@", text)) - {"CONFIG_YAML"})
    if left:
        raise AssertionError(f"job script template placeholders without a value: {left}")
    return text.replace("@@CONFIG_YAML@@", config_yaml)
