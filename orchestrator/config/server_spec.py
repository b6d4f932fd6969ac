"""ServerSpec: one SGLang server's settings, resolved once from (config, role, group), written as SGLang's command line
and read back from it.

(RunConfig, role, WorkerGroup) -> server_spec() -> ServerSpec -> to_sglang_argv()  (real launch_server)
                                                             -> to_sim_argv()     (the same + sim-only flags)
simulated server: argv -> add_spec_args / spec_from_args -> the same ServerSpec -> cost model

Every knob is declared once, as a field with its SGLang flag and the config fields it comes from (first one set
wins); None means SGLang's own default for engine.sglang.version, which the cost model resolves
(perfmodel/sglang_defaults.py). Adding a knob: a WorkerGroup (or engine.sglang) field plus one `knob(...)` here
(`knob` and the parallel-shape group live in spec_knobs.py: WorkerGroup reads that group for its GPU counts).
"""

from __future__ import annotations

import argparse
import typing
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import TYPE_CHECKING, Any

from orchestrator.config.sglang_versions import PINNED_SGLANG, RELEASES, release_for
from orchestrator.config.spec_knobs import Parallelism, knob
from orchestrator.records import Role

if TYPE_CHECKING:
    from orchestrator.config.layout import WorkerGroup
    from orchestrator.config.schema import RunConfig

MODE_OF_ROLE = {"prefill": "prefill", "decode": "decode", "aggregated": "null"}  # --disaggregation-mode
# --kv-cache-dtype -> bytes per KV element (auto keeps the model's dtype: bf16 for the MLA latent of DeepSeek FP8 checkpoints)
KV_DTYPE_BYTES = {"auto": 2, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}


@dataclass(frozen=True)
class Memory:
    mem_fraction_static: float | None = knob(
        "--mem-fraction-static", "group.mem_fraction_static", "engine.sglang.mem_fraction_static")
    kv_cache_dtype: str = knob("--kv-cache-dtype", "engine.sglang.kv_cache_dtype", default="auto")
    page_size: int = knob("--page-size", "engine.sglang.page_size", default=1)
    max_total_tokens: int | None = knob(
        "--max-total-tokens", "group.max_total_tokens", "engine.sglang.max_total_tokens")

    @property
    def kv_dtype_bytes(self) -> int:
        """Bytes per KV element the pool stores (and a decode step reads) under this --kv-cache-dtype."""
        if self.kv_cache_dtype not in KV_DTYPE_BYTES:
            raise ValueError(f"engine.sglang.kv_cache_dtype={self.kv_cache_dtype!r} has no known element size; "
                             f"use one of {sorted(KV_DTYPE_BYTES)}")
        return KV_DTYPE_BYTES[self.kv_cache_dtype]


@dataclass(frozen=True)
class Batching:
    max_running_requests: int | None = knob("--max-running-requests", "group.max_running_requests")
    chunked_prefill_size: int | None = knob("--chunked-prefill-size", "group.chunked_prefill_size")
    cuda_graph_max_bs: int | None = knob(  # 0.5.17 name; --cuda-graph-max-bs is its deprecated alias (0.4.x's name)
        "--cuda-graph-max-bs-decode", "group.cuda_graph_max_bs", aliases=("--cuda-graph-max-bs",))
    disable_cuda_graph: bool = knob("--disable-cuda-graph", "group.disable_cuda_graph", default=False)
    disable_prefill_cuda_graph: bool = knob(
        "--disable-prefill-cuda-graph", "group.disable_prefill_cuda_graph", default=False)
    enable_two_batch_overlap: bool = knob("--enable-two-batch-overlap", "group.enable_two_batch_overlap", default=False)


@dataclass(frozen=True)
class SpeculativeDecoding:
    """The checkpoint's MTP layer as draft (NEXTN); algorithm None = off."""

    algorithm: str | None = knob("--speculative-algorithm", "group.speculative.algorithm")
    num_steps: int | None = knob("--speculative-num-steps", "group.speculative.num_steps")
    eagle_topk: int | None = knob("--speculative-eagle-topk", "group.speculative.eagle_topk")
    num_draft_tokens: int | None = knob("--speculative-num-draft-tokens", "group.speculative.num_draft_tokens")
    accept_length: float | None = knob(  # a cost-model assumption, not an SGLang flag
        "--speculative-accept-length", "group.speculative.accept_length", sim_only=True)


@dataclass(frozen=True)
class PdTimeouts:
    """SGLang's PD waits in wall seconds (defaults = SGLang 0.5.17's); one set for the sim and real SGLang (which
    reads them from SGLANG_DISAGGREGATION_* variables, see engines/sglang/launch.py build_env)."""

    waiting_timeout_s: float = knob("--waiting-timeout-s", default=300.0, sim_only=True)  # decode: KV complete
    bootstrap_timeout_s: float = knob("--bootstrap-timeout-s", default=300.0, sim_only=True)  # prefill: KV indices
    heartbeat_interval_s: float = knob("--heartbeat-interval-s", default=5.0, sim_only=True)  # decode -> prefill
    # a prefill is dead after interval x failures (~10 s: the router assumes it)
    heartbeat_max_failures: int = knob("--heartbeat-max-failures", default=2, sim_only=True)
    bootstrap_retries: int = knob("--bootstrap-retries", default=15, sim_only=True)  # decode: GET /route attempts
    bootstrap_retry_interval_s: float = knob("--bootstrap-retry-interval-s", default=1.0, sim_only=True)

    @classmethod
    def for_deadline(cls, deadline_s: float) -> "PdTimeouts":
        """A stuck transfer fails while the run's deadline still allows a retry: a quarter of the run's
        budget, within [30 s, SGLang's 300 s default] (105 s for the 420 s run)."""
        wait = float(int(min(300, max(30, deadline_s / 4))))
        return cls(waiting_timeout_s=wait, bootstrap_timeout_s=wait)


@dataclass(frozen=True)
class Disaggregation:
    role: Role = knob(  # prefill | decode | aggregated (SGLang's mode null)
        "--disaggregation-mode", default="aggregated", aliases=("--mode",), unwritten="aggregated")
    transfer_backend: str | None = knob("--disaggregation-transfer-backend")  # PD servers only
    timeouts: PdTimeouts = PdTimeouts()


@dataclass(frozen=True)
class ServerSpec:
    """One server's SGLang settings; None = SGLang's default for `sglang_version`."""

    sglang_version: str = knob("--sglang-version", "engine.sglang.version", default=PINNED_SGLANG, sim_only=True)
    load_format: str | None = knob("--load-format", "engine.sglang.load_format")
    attention_backend: str | None = knob(
        "--attention-backend", "group.attention_backend", "engine.sglang.attention_backend")
    triton_split_tile_size: int | None = knob(
        "--triton-attention-split-tile-size", "engine.sglang.triton_attention_split_tile_size")
    parallel: Parallelism = Parallelism()
    memory: Memory = Memory()
    batching: Batching = Batching()
    speculative: SpeculativeDecoding = SpeculativeDecoding()
    pd: Disaggregation = Disaggregation()

    @property
    def role(self) -> Role:
        return self.pd.role

    def to_sglang_argv(self) -> list[str]:
        """SGLang launch_server flags of every set knob, in this release's spelling."""
        release = release_for(self.sglang_version)
        argv: list[str] = []
        for path, f in LEAVES:
            value = _get(self, path)
            if f.metadata["sim_only"] or value is None or value is False or value == f.metadata["unwritten"]:
                continue
            flag = f.metadata["flag"]
            if flag in release.missing_flags:
                raise ValueError(f"{'.'.join(path)}={value!r}: SGLang {self.sglang_version} has no {flag}; "
                                 f"unset it or set engine.sglang.version to a release that has it")
            argv.append(release.renamed_flags.get(flag, flag))
            if value is not True:
                argv.append(_text(path, value))
        return argv

    def to_sim_argv(self) -> list[str]:
        """The simulated server's flags: the real server's, then the sim-only ones (version, PD waits, ...)."""
        argv = self.to_sglang_argv()
        for path, f in LEAVES:
            value = _get(self, path)
            if f.metadata["sim_only"] and value is not None:
                argv += [f.metadata["flag"], _text(path, value)]
        return argv


def _groups(cls: type, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in fields(cls):
        if is_dataclass(hints[f.name]):
            out += _groups(hints[f.name], prefix + (f.name,))
        else:
            out.append((prefix + (f.name,), f))
    return out


LEAVES = _groups(ServerSpec)  # (path, dataclass field) of every knob, in argv order


def _leaf_type(path: tuple[str, ...]) -> type:
    cls: Any = ServerSpec
    for part in path[:-1]:
        cls = typing.get_type_hints(cls)[part]
    hint = typing.get_type_hints(cls)[path[-1]]
    if typing.get_origin(hint) is typing.Literal:
        return str
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


LEAF_TYPES = {path: _leaf_type(path) for path, _ in LEAVES}


def _get(spec: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        spec = getattr(spec, part)
    return spec


def _text(path: tuple[str, ...], value: Any) -> str:
    if path == ("pd", "role"):
        return MODE_OF_ROLE[value]
    return repr(value) if isinstance(value, float) else str(value)


def build_spec(values: dict[tuple[str, ...], Any]) -> ServerSpec:
    """A ServerSpec from {path: value} (missing paths keep their defaults)."""

    def make(cls: Any, prefix: tuple[str, ...]) -> Any:
        kwargs = {}
        for name, hint in typing.get_type_hints(cls).items():
            path = prefix + (name,)
            if is_dataclass(hint):
                kwargs[name] = make(hint, path)
            elif path in values:
                kwargs[name] = values[path]
        return cls(**kwargs)

    return make(ServerSpec, ())


# ----- from a config -------------------------------------------------------------------------------------------
def _read(cfg: RunConfig, group: WorkerGroup, source: str) -> Any:
    head, *rest = source.split(".")
    node: Any = group if head == "group" else cfg.engine
    for part in rest:
        if node is None:
            return None
        node = getattr(node, part)
    return node


def server_spec(cfg: RunConfig, role: Role, group: WorkerGroup, timeouts: PdTimeouts | None = None) -> ServerSpec:
    """The settings of every server of `group` in `role`; PD waits sized from the run's deadline unless given."""
    values: dict[tuple[str, ...], Any] = {}
    for path, f in LEAVES:
        for source in f.metadata["source"]:
            value = _read(cfg, group, source)
            if value is not None:
                values[path] = value
                break
    values[("pd", "role")] = role
    if role != "aggregated":
        values[("pd", "transfer_backend")] = cfg.transfer.backend
    spec = build_spec(values)
    return replace(spec, pd=replace(spec.pd, timeouts=timeouts or PdTimeouts.for_deadline(cfg.benchmark.deadline_s)))


# ----- config checks -------------------------------------------------------------------------------------------
def _flag_owners() -> dict[str, tuple[tuple[str, ...], Any]]:
    owners = {}
    renamed = {new: old for release in RELEASES.values() for old, new in release.renamed_flags.items()}
    for path, f in LEAVES:
        for flag in (f.metadata["flag"], *f.metadata["aliases"]):
            owners[flag] = (path, f)
    for new, old in renamed.items():
        owners.setdefault(new, owners[old])
    return owners


def _field_to_use(f: Any, path: tuple[str, ...], where: str) -> str:
    if path == ("pd", "role"):
        return "layout.mode and the group's list (layout.prefill / decode / aggregated)"
    if path == ("pd", "transfer_backend"):
        return "transfer.backend"
    return " or ".join(s.replace("group.", f"{where}.", 1) for s in f.metadata["source"])


def spec_problems(cfg: RunConfig) -> list[str]:
    """One line per extra_args flag that repeats a typed field (naming both), and per knob this SGLang lacks."""
    try:
        release_for(cfg.engine.sglang.version)
    except ValueError as exc:
        return [f"engine.sglang.version: {exc}"]
    owners = _flag_owners()
    problems = []
    places = [("engine.sglang.extra_args", "layout.<role>.<i>", cfg.engine.sglang.extra_args)]
    places += [(f"layout.{role}.{i}.extra_args", f"layout.{role}.{i}", g.extra_args) for role, i, g in cfg.layout.groups()]
    for where, group_path, args in places:
        for k, arg in enumerate(args):
            flag, _, value = arg.partition("=")
            if flag not in owners or (owners[flag][1].metadata["sim_only"] and not owners[flag][1].metadata["source"]):
                continue
            path, f = owners[flag]
            if not value and LEAF_TYPES[path] is not bool and k + 1 < len(args):
                value = args[k + 1]
            use = _field_to_use(f, path, group_path)
            shown = f"{flag} {value}".strip()
            problems.append(f"{where}: {shown} repeats the typed field {use}; set it there and drop {flag} here")
    if problems:
        return problems
    for role, i, group in cfg.layout.groups():
        try:
            server_spec(cfg, role, group).to_sglang_argv()
        except ValueError as exc:
            problems.append(f"layout.{role}.{i}: {exc}")
    return problems


# ----- the simulated server's command line ---------------------------------------------------------------------
def _positive(kind: type, flag: str):
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag}={text!r}: not a {kind.__name__}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{flag}={text}: must be > 0")
        return value

    return parse


def add_spec_args(parser: argparse.ArgumentParser) -> None:
    """Every knob's flag (and its spellings), SGLang's group and the sim-only one; absent flags keep the default."""
    sglang = parser.add_argument_group("SGLang flags (ServerSpec)")
    sim = parser.add_argument_group("simulator flags of the ServerSpec")
    for path, f in LEAVES:
        target = sim if f.metadata["sim_only"] else sglang
        dest = "spec__" + "__".join(path)
        flags = [f.metadata["flag"], *f.metadata["aliases"]]
        kind = LEAF_TYPES[path]
        if kind is bool:
            target.add_argument(*flags, dest=dest, action="store_true", default=argparse.SUPPRESS)
        elif path == ("pd", "role"):
            target.add_argument(*flags, dest=dest, choices=sorted(MODE_OF_ROLE.values()), default=argparse.SUPPRESS)
        elif kind in (int, float):
            target.add_argument(*flags, dest=dest, type=_positive(kind, f.metadata["flag"]), default=argparse.SUPPRESS)
        else:
            target.add_argument(*flags, dest=dest, default=argparse.SUPPRESS)


def spec_from_args(args: argparse.Namespace) -> ServerSpec:
    """The ServerSpec a command line written by to_sim_argv (or by hand) describes."""
    role_of_mode = {mode: role for role, mode in MODE_OF_ROLE.items()}
    values = {}
    for path, _ in LEAVES:
        dest = "spec__" + "__".join(path)
        if hasattr(args, dest):
            value = getattr(args, dest)
            values[path] = role_of_mode[value] if path == ("pd", "role") else value
    return build_spec(values)
