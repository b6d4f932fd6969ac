"""Compile caches of real SGLang servers: one persistent directory per node, and whether a launch finds them warm.

argv of one server -> launch_shape (the flags that decide which kernels get compiled) -> shape id -> marker file
`<cache dir>/prepared/<shape id>.json` on the server's node, written once a server of that shape was ready.

SGLang compiles kernels the first time a server starts with a given shape: DeepGEMM GEMMs (its precompile
step; SGLang's docs say up to ~10 minutes cold), Triton and FlashInfer JIT modules, CUDA's PTX cache. Measured
on one H200 with an R1-shaped model: 149 s to ready on a fresh machine, 47-53 s on a second start. Every
server we launch points these caches at `engine.sglang.compile_cache_dir` (`cache_env`), so a second start of
the same shape is warm; `pd-orchestrator prepare` does that first start outside the timed run.

A launch is `warm` when its node holds the marker of its shape and the marker's SGLang version matches (when
both are known), else `cold`. Ports, hosts, GPU ids and node ranks change between launches but not the
kernels, so they are not part of the shape.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

CacheState = Literal["warm", "cold"]

# environment variable -> subdirectory of the cache directory (SGLang 0.5.17 and the libraries it JIT-compiles with)
CACHE_DIRS: dict[str, str] = {
    "TRITON_CACHE_DIR": "triton",
    "SGLANG_DG_CACHE_DIR": "deep_gemm",  # SGLang's name; it sets DeepGEMM's own variable from it
    "DG_JIT_CACHE_DIR": "deep_gemm",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "TORCH_EXTENSIONS_DIR": "torch_extensions",
    "CUDA_CACHE_PATH": "cuda",
    "SGLANG_JIT_CACHE_ROOT": "sglang",  # newer SGLang: one root for torch.compile and DeepGEMM
}
# flags whose values differ between two launches of the same shape
VOLATILE_FLAGS = frozenset({
    "--host", "--port", "--base-gpu-id", "--disaggregation-bootstrap-port", "--dist-init-addr", "--node-rank",
    "--nccl-port",
})
LAUNCH_MODULE = "sglang.launch_server"
MARKER_DIR = "prepared"


def cache_dir(configured: str) -> Path:
    """The cache directory on this node (`~` is this node's home)."""
    return Path(configured).expanduser()


def cache_env(configured: str) -> dict[str, str]:
    """Environment that points every compile cache of a server at `configured` (created when missing)."""
    root = cache_dir(configured)
    env = {}
    for var, sub in CACHE_DIRS.items():
        try:
            (root / sub).mkdir(parents=True, exist_ok=True)
        except OSError:  # the libraries create it themselves or say why; prepare checks it is writable
            pass
        env[var] = str(root / sub)
    return env


def launch_shape(argv: Sequence[str]) -> list[str]:
    """The flags after `-m sglang.launch_server` that decide the compiled kernels (volatile ones dropped).

    A wrapper in front (dist_store.py ... --) and the interpreter are not part of the shape.
    """
    args = list(argv)
    if LAUNCH_MODULE not in args:
        raise ValueError(f"not an SGLang launch (no '-m {LAUNCH_MODULE}'): {' '.join(args[:6])} ...")
    args = args[args.index(LAUNCH_MODULE) + 1 :]
    shape: list[str] = []
    i = 0
    while i < len(args):
        flag = args[i].split("=", 1)[0]
        has_value = "=" not in args[i] and i + 1 < len(args) and not args[i + 1].startswith("--")
        if flag not in VOLATILE_FLAGS:
            shape.extend(args[i : i + (2 if has_value else 1)])
        i += 2 if has_value else 1
    return shape


def shape_id(argv: Sequence[str], gpu: str) -> str:
    """A short stable id of (launch shape, GPU type)."""
    blob = json.dumps({"shape": launch_shape(argv), "gpu": gpu}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def marker_path(configured: str, argv: Sequence[str], gpu: str) -> Path:
    return cache_dir(configured) / MARKER_DIR / f"{shape_id(argv, gpu)}.json"


def read_marker(configured: str, argv: Sequence[str], gpu: str) -> dict | None:
    try:
        return json.loads(marker_path(configured, argv, gpu).read_text())
    except (OSError, ValueError):
        return None


def cache_state(configured: str, argv: Sequence[str], gpu: str, sglang_version: str | None = None) -> CacheState:
    """`warm` when this node's cache holds a ready server of this shape (and SGLang version, when known)."""
    marker = read_marker(configured, argv, gpu)
    if marker is None:
        return "cold"
    if sglang_version and marker.get("sglang_version") and marker["sglang_version"] != sglang_version:
        return "cold"
    return "warm"


def record_warm(configured: str, argv: Sequence[str], gpu: str, ready_s: float | None,
                sglang_version: str | None = None, cache_state_before: str | None = None) -> Path:
    """Write this shape's marker on this node: a server of it became ready with this cache directory."""
    path = marker_path(configured, argv, gpu)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "shape": launch_shape(argv),
        "gpu": gpu,
        "sglang_version": sglang_version,
        "ready_s": ready_s,
        "cache_state_before": cache_state_before,
        "host": socket.gethostname(),
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(path)
    return path


def sglang_version(python: str, timeout_s: float = 30.0) -> str | None:
    """SGLang's version in `python`'s environment (engine.sglang.python), None when it cannot be read."""
    code = "import importlib.metadata as m; print(m.version('sglang'))"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None

