"""manifest.json of a results folder: write one, run a command under one, or check every folder has one.

    python3 benchmarks/manifest.py write  --out DIR --command "bash benchmarks/device_pd.sh call1" [--append]
    python3 benchmarks/manifest.py record --out DIR [--stdout output.txt] -- .venv/bin/python benchmarks/ordering.py ...
    python3 benchmarks/manifest.py check  [DIR ...]          (default: every benchmarks/results/*/)

A manifest holds {command, git_commit, git_dirty, machine, gpu, packages, started_at} (orchestrator/provenance.py).
`record` writes it, runs the command (its stdout also copied to DIR/--stdout), then adds finished_at and exit_code.
On a machine whose checkout has no .git (a lent GPU), pass the commit: PDO_GIT_COMMIT=<sha> PDO_GIT_DIRTY=0|1.
Stdlib only (runs on bare GPU machines).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.provenance import folder_problems, update_manifest, utc_now, write_manifest  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def result_folders(root: Path = RESULTS) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir())


def record(out: Path, argv: list[str], stdout_name: str | None) -> int:
    write_manifest(out, shlex.join(argv))
    if stdout_name:
        with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc, open(out / stdout_name, "w") as copy:
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                copy.write(line)
        code = proc.returncode
    else:
        code = subprocess.run(argv).returncode
    update_manifest(out, finished_at=utc_now(), exit_code=code)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="write DIR/manifest.json for a run starting now")
    w.add_argument("--out", type=Path, required=True)
    w.add_argument("--command", required=True, help="the command line the run is started with")
    w.add_argument("--append", action="store_true", help="keep an existing manifest, add this command to it")
    r = sub.add_parser("record", help="write the manifest, run the command, record its exit")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--stdout", default="output.txt", help="copy of the command's stdout in DIR ('' = none)")
    r.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    c = sub.add_parser("check", help="every results folder has a complete manifest.json")
    c.add_argument("folders", nargs="*", type=Path)
    args = parser.parse_args(argv)

    if args.cmd == "write":
        print(write_manifest(args.out, args.command, append=args.append))
        return 0
    if args.cmd == "record":
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not command:
            parser.error("record: give the command after --")
        return record(args.out, command, args.stdout or None)
    problems = [p for folder in (args.folders or result_folders()) for p in folder_problems(folder)]
    for problem in problems:
        print(problem)
    if problems:
        print("fix: python3 benchmarks/manifest.py write --out DIR --command '...' (or add the missing keys by hand; "
              "for an old run whose commit cannot be known, git_commit 'unknown (reconstructed)')")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
