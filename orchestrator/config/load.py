"""Config loading: YAML file + `--set KEY.PATH=VALUE` overrides -> RunConfig, with one-line errors per problem."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from orchestrator.config.schema import RunConfig


class ConfigError(ValueError):
    """A config problem, one line per problem, each naming the field, the bad value and the fix."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


def _format_pydantic_errors(err: ValidationError) -> list[str]:
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "(top level)"
        kind = e["type"]
        value = e.get("input")
        if kind == "extra_forbidden":
            lines.append(f"{path}: unknown key; remove it or check its spelling")
            continue
        if kind == "missing":
            lines.append(f"{path}: required field is missing")
            continue
        msg = e["msg"].removeprefix("Value error, ")
        if kind == "value_error" and not e["loc"]:
            lines.append(msg)  # cross-section checks already name their field path
            continue
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        lines.append(f"{path}: {msg} (got {shown})")
    return lines


def parse_override(text: str) -> tuple[list[str], Any]:
    """'layout.prefill.0.count=2' -> (['layout','prefill','0','count'], 2); value parsed as YAML."""
    if "=" not in text:
        raise ConfigError("--set", [f"{text!r}: expected KEY.PATH=VALUE, e.g. layout.prefill.0.count=2"])
    key, raw = text.split("=", 1)
    return key.strip().split("."), yaml.safe_load(raw)


def apply_override(data: dict, path: list[str], value: Any) -> None:
    node: Any = data
    for i, part in enumerate(path[:-1]):
        nxt = path[i + 1]
        if isinstance(node, list):
            node = node[int(part)]
            continue
        if part not in node or node[part] is None:
            node[part] = [] if nxt.isdigit() else {}
        node = node[part]
    last = path[-1]
    if isinstance(node, list):
        idx = int(last)
        while len(node) <= idx:
            node.append({})
        node[idx] = value
    else:
        node[last] = value


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read, override and validate a config file; raises ConfigError listing every problem."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(source, [f"cannot read config file: {exc.strerror}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(source, [f"not valid YAML: {exc}".replace("\n", " ")]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, [f"top level must be a mapping of sections, got {type(data).__name__}"])
    data = copy.deepcopy(data)
    for ov in overrides or []:
        keys, value = parse_override(ov)
        try:
            apply_override(data, keys, value)
        except (ValueError, IndexError, TypeError, KeyError):
            raise ConfigError("--set", [f"{ov!r}: path {'.'.join(keys)} does not exist"]) from None
    return config_from_dict(data, source)


def config_from_dict(data: dict, source: str = "<config>") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(source, _format_pydantic_errors(err)) from None


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
