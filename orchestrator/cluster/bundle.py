"""A contest submission folder around a job script: how to build the environment, how to run, where results go,
and the rules verdict — the layout both contests (APAC HPC-AI 2025, 2026) ask a team to hand in.

    DIR/README.md             what is where, and the two commands (build, submit)
    DIR/build/requirements.lock   `pip freeze` of the interpreter the script names (this project left out)
    DIR/build/pd-orchestrator-src.tar.gz   this project's source as it was when the script was made
    DIR/build/install.sh      a venv from the lock file + that source (no other downloads of ours)
    DIR/build/environment.txt Python, platform, Ray/SGLang versions, git commit (and whether it had local edits)
    DIR/run/job.sh, DIR/run/config.yaml   the job script and its config
    DIR/results/              the job writes results/<job id>/ here (result.json, report/, logs/, timings.json)
    DIR/rules/verdict.txt, verdict.json   the config against its rules profile (orchestrator/rules)
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config import RunConfig, dump_config
from orchestrator.rules import verdict_for

REPO = Path(__file__).resolve().parents[2]
SOURCE_PATHS = ("orchestrator", "deployments", "configs", "pyproject.toml", "README.md")
OWN_DISTRIBUTIONS = ("pd-orchestrator", "pd_orchestrator")

INSTALL_SH = """\
#!/bin/bash
# Rebuild the environment this submission ran with: a venv from requirements.lock, then pd-orchestrator's own
# source (pd-orchestrator-src.tar.gz, the commit in environment.txt) without further dependencies.
# Usage: bash build/install.sh [VENV_DIR]   (default: ./.venv next to build/)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${1:-$HERE/../.venv}
SRC=$HERE/../src
PY=${PYTHON:-python3}
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -r "$HERE/requirements.lock"
mkdir -p "$SRC" && tar -xzf "$HERE/pd-orchestrator-src.tar.gz" -C "$SRC"
"$VENV/bin/pip" install --no-deps -e "$SRC"
"$VENV/bin/python" -c "import orchestrator, ray; print('pd-orchestrator environment ok, ray', ray.__version__)"
echo "now, from the submission folder: sbatch run/job.sh (or qsub run/job.sh); another venv: PDO_PYTHON=..."
"""


@dataclass
class Bundle:
    root: Path
    files: list[Path]
    rules_line: str

    def summary(self) -> str:
        rows = "\n".join(f"  {p.relative_to(self.root)}" for p in self.files)
        return f"submission folder {self.root}:\n{rows}\n{self.rules_line}"


def pip_freeze(python: str) -> list[str]:
    """`pip freeze` of `python`, without this project's own line (an editable path that means nothing elsewhere)."""
    done = subprocess.run([python, "-m", "pip", "freeze", "--all"], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"`{python} -m pip freeze` failed: {done.stderr.strip()[-500:]}")
    keep = []
    for line in done.stdout.splitlines():
        name = line.split("==")[0].split(" @ ")[0].strip().lower()
        if line.startswith(("-e ", "# Editable")) or name in OWN_DISTRIBUTIONS:
            continue
        keep.append(line)
    return keep


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    return done.stdout.strip() if done.returncode == 0 else ""


def source_files() -> list[str]:
    """This project's installable files as they are now: tracked and new (not ignored) ones under SOURCE_PATHS."""
    done = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *SOURCE_PATHS],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"`git ls-files` in {REPO} failed: {done.stderr.strip()}")
    return sorted(f for f in done.stdout.splitlines() if (REPO / f).is_file())


def write_source_archive(path: Path) -> None:
    """The source the job runs, local edits included (environment.txt says whether there were any)."""
    with tarfile.open(path, "w:gz") as tar:
        for rel in source_files():
            tar.add(REPO / rel, arcname=rel, recursive=False)


def environment_lines(python: str) -> list[str]:
    probe = ("import platform, importlib.metadata as m\n"
             "def v(n):\n    try: return m.version(n)\n    except m.PackageNotFoundError: return 'not installed'\n"
             "print(f'python {platform.python_version()} ({platform.python_implementation()})')\n"
             "for n in ('ray', 'sglang', 'nixl', 'torch'): print(f'{n} {v(n)}')")
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    sha = _git("rev-parse", "HEAD") or "unknown"
    dirty = _git("status", "--porcelain", "--", *SOURCE_PATHS)
    return [f"interpreter {python}", *done.stdout.splitlines(), f"platform {platform.platform()}",
            f"pd-orchestrator commit {sha}" + (" with local edits (the source archive has them)" if dirty else "")]


def write_bundle(root: Path, cfg: RunConfig, script: str, scheduler: str, python: str | None = None,
                 rules: str | None = None) -> Bundle:
    python = python or sys.executable
    root = root.resolve()
    for sub in ("build", "run", "results", "rules"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    files: list[Path] = []

    def write(rel: str, text: str, mode: int = 0o644) -> None:
        path = root / rel
        path.write_text(text)
        path.chmod(mode)
        files.append(path)

    write("build/requirements.lock", "\n".join(pip_freeze(python)) + "\n")
    archive = root / "build" / "pd-orchestrator-src.tar.gz"
    write_source_archive(archive)
    files.append(archive)
    write("build/install.sh", INSTALL_SH, 0o755)
    write("build/environment.txt", "\n".join(environment_lines(python)) + "\n")
    write("run/job.sh", script, 0o755)
    write("run/config.yaml", dump_config(cfg))
    write("results/README.md", "The job writes `results/<job id>/` here: result.json, report/ (report.html), "
          "report.txt, logs/ (Ray, prepare, the work, engine logs of each node), timings.json.\n")
    verdict = verdict_for(cfg, rules)
    if verdict is None:
        rules_line = "rules: none named (set `rules:` in the config or pass --rules)"
        payload: dict = {"profile": None, "verdict": "no rules profile named"}
    else:
        rules_line, payload = verdict.summary(), verdict.to_dict()
    write("rules/verdict.txt", rules_line + "\n")
    write("rules/verdict.json", json.dumps(payload, indent=1, default=str) + "\n")
    submit = "sbatch run/job.sh" if scheduler == "slurm" else "qsub run/job.sh"  # from this folder: its .venv
    write("README.md", f"""# Submission: {cfg.name}

| folder | what |
|---|---|
| build/ | `install.sh` rebuilds the environment: `requirements.lock` (pip freeze) + `pd-orchestrator-src.tar.gz`; `environment.txt` |
| run/ | `job.sh` ({scheduler}) and the `config.yaml` it embeds |
| results/ | what each job wrote: `results/<job id>/result.json`, `report/`, `logs/`, `timings.json` |
| rules/ | `verdict.txt`: {rules_line.splitlines()[0]} |

```bash
bash build/install.sh                      # once, on the cluster's shared filesystem
{submit}          # from this folder (it runs ./.venv): results land in results/<job id>/
```
""")
    return Bundle(root, files, rules_line)
