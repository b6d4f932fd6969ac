"""Config loading: YAML file + `--set KEY.PATH=VALUE` overrides -> RunConfig, with one-line errors per problem."""

from __future__ import annotations

import copy
import difflib
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from orchestrator.config.schema import RunConfig
from orchestrator.config.server_spec import spec_problems


class ConfigError(ValueError):
    """A config problem, one line per problem, each naming the field, the bad value and the fix."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {p}" for p in problems))


def _keys_at(loc: tuple) -> list[str]:
    """The field names of the config section at `loc` (list indexes skipped); [] where loc is not a section."""
    model: Any = RunConfig
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        model = field.annotation
        while typing.get_args(model):  # list[WorkerGroup], WorkerGroup | None -> WorkerGroup
            model = next((a for a in typing.get_args(model) if hasattr(a, "model_fields")), None)
            if model is None:
                return []
    return list(getattr(model, "model_fields", {}))


def _format_pydantic_errors(err: ValidationError) -> list[str]:
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "(top level)"
        kind = e["type"]
        value = e.get("input")
        if kind == "extra_forbidden":
            close = difflib.get_close_matches(str(e["loc"][-1]), _keys_at(e["loc"][:-1]), n=1)
            lines.append(f"{path}: unknown key; " + (f"did you mean {close[0]}?" if close else
                                                     "remove it or check its spelling"))
            continue
        if kind == "missing":
            lines.append(f"{path}: required field is missing")
            continue
        msg = e["msg"].removeprefix("Value error, ")
        if kind == "value_error" and (not e["loc"] or msg.startswith(path + ".")):
            lines.extend(msg.split("\n"))  # cross-section checks already name their field path, one line each
            continue
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        lines.append(f"{path}: {msg} (got {shown})")
    return lines


APPEND = "+"  # `--set layout.prefill.+={count: 1, tp: 4}` appends an item to a list


def parse_override(text: str) -> tuple[list[str], Any]:
    """'layout.prefill.0.count=2' -> (['layout','prefill','0','count'], 2); value parsed as YAML."""
    if "=" not in text:
        raise ConfigError("--set", [f"{text!r}: expected KEY.PATH=VALUE, e.g. layout.prefill.0.count=2"])
    key, raw = text.split("=", 1)
    return key.strip().split("."), yaml.safe_load(raw)


class OverridePathError(ValueError):
    """A --set path that does not name a place in the config; the message says what is there and the fix."""


def _append_hint(where: str) -> str:
    example = "{count: 1, tp: 4}" if where.startswith("layout.") else "VALUE"
    return f"append one with --set '{where}.{APPEND}={example}'"


def _check_known_key(section: list[str], key: str) -> None:
    """Refuse `key` where the config section at `section` is a model without that field, naming the nearest one."""
    known = _keys_at(tuple(int(p) if p.isdigit() else p for p in section))
    if known and key not in known:
        close = difflib.get_close_matches(key, known, n=1)
        raise OverridePathError(".".join([*section, key]) + ": unknown key; "
                                + (f"did you mean {close[0]}?" if close else "remove it or check its spelling"))


def apply_override(data: dict, path: list[str], value: Any) -> None:
    """Set data[path] = value; a list takes an index (the next free one appends) or `+` (append)."""
    node: Any = data
    for i, part in enumerate(path):
        where = ".".join(path[:i])
        last = i == len(path) - 1
        if isinstance(node, list):
            if part == APPEND and last:
                node.append(value)
                return
            if not part.isdigit():
                raise OverridePathError(f"{where} is a list: name an item by its index (0..{len(node) - 1}) "
                                        f"or {_append_hint(where)}")
            idx = int(part)
            if idx > len(node) or (idx == len(node) and not last):
                have = f"{len(node)} item(s), index 0..{len(node) - 1}" if node else "no items"
                raise OverridePathError(f"{where} has {have}, so {where}.{idx} does not exist; {_append_hint(where)}, "
                                        f"then set its fields with {where}.{len(node)}.KEY=VALUE")
            if last:
                node[idx:idx + 1] = [value]
                return
            node = node[idx]
        elif isinstance(node, dict):
            if last:
                node[part] = value
                return
            if node.get(part) is None:
                indexed = path[i + 1].isdigit() or path[i + 1] == APPEND
                if indexed:  # else an empty list would blame the index of a misspelt key (pydantic names a section)
                    _check_known_key(path[:i], part)
                node[part] = [] if indexed else {}
            node = node[part]
        else:
            raise OverridePathError(f"{where} is a value ({node!r}), not a section; set {where}=VALUE")


INPUT_PATHS = (("model", "path"), ("benchmark", "dataset_path"))  # the files a config names for reading


def _anchor_input_paths(data: dict, base: Path) -> None:
    """Each relative input path of `data` (INPUT_PATHS) taken from `base` instead of the working directory."""
    for section, key in INPUT_PATHS:
        node = data.get(section)
        if not isinstance(node, dict):
            continue
        value = node.get(key)
        if isinstance(value, str) and value and not value.startswith("~") and not Path(value).is_absolute():
            node[key] = str(base / value)


def load_config(path: str | Path, overrides: list[str] | None = None, paths_from: Path | None = None) -> RunConfig:
    """Read, override and validate a config file; raises ConfigError listing every problem. A relative model.path or
    benchmark.dataset_path is the user's, taken from the working directory (as SGLang's --model-path is); with
    `paths_from`, from that folder: the back-test reads the repository's own configs, which name them from the
    repository root, from whatever directory `plan` runs in."""
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
        except OverridePathError as exc:
            raise ConfigError("--set", [f"{ov!r}: {exc}"]) from None
    if paths_from is not None:
        _anchor_input_paths(data, paths_from)
    return config_from_dict(data, source)


def config_from_dict(data: dict, source: str = "<config>") -> RunConfig:
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(source, _format_pydantic_errors(err)) from None
    if problems := spec_problems(cfg):  # an extra_args flag repeating a typed field; a knob this SGLang lacks
        raise ConfigError(source, problems)
    return cfg


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
