"""Config: presets validate, overrides swap the PD ratio, and every malformed config gets one clear line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.config import ConfigError, RunConfig, config_from_dict, dump_config, load_config
from tests.support import log_case

ROOT = Path(__file__).resolve().parents[2]
PRESETS = sorted((ROOT / "configs").glob("*.yaml"))
MINIMAL = {"layout": {"mode": "pd", "prefill": [{"tp": 8}], "decode": [{"tp": 8}]}}


def write(tmp_path: Path, data) -> Path:
    p = tmp_path / "run.yaml"
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_every_shipped_preset_validates_and_round_trips(path: Path) -> None:
    cfg = load_config(path)
    again = config_from_dict(yaml.safe_load(dump_config(cfg)))
    assert again == cfg


def test_default_preset_is_the_embedded_simulated_two_node_layout() -> None:
    cfg = load_config(ROOT / "configs/default.yaml")
    assert cfg.cluster.is_local and cfg.engine.kind == "sim"
    assert cfg.benchmark.num_prompts == 1000 and cfg.benchmark.seed == 2025
    assert cfg.benchmark.deadline_s == 420
    assert cfg.cluster.gpu == "H100-SXM" and cfg.model.preset == "DeepSeek-R1"


def test_override_swaps_pd_ratio_without_editing_the_file() -> None:
    cfg = load_config(ROOT / "configs/default.yaml", ["layout.prefill.0.count=2", "layout.decode.0.tp=4"])
    assert cfg.layout.prefill[0].count == 2
    assert cfg.layout.decode[0].tp == 4
    assert cfg.layout.describe() == "2PxTP8/1DxTP4"


def test_override_can_add_a_second_group() -> None:
    cfg = load_config(ROOT / "configs/default.yaml", ["layout.decode.1={count: 1, tp: 4}"])
    assert [g.tp for g in cfg.layout.decode] == [8, 4]


# (config fragment merged into MINIMAL, expected field path in the one-line error)
MALFORMED = [
    ({"benchmark": {"num_prompts": "many"}}, "benchmark.num_prompts"),
    ({"benchmark": {"num_prompts": 0}}, "benchmark.num_prompts"),
    ({"benchmark": {"deadline_s": -5}}, "benchmark.deadline_s"),
    ({"benchmark": {"fixed_output_len": 2}}, "benchmark.fixed_output_len"),
    ({"benchmark": {"warmup": {"policy": "always"}}}, "benchmark.warmup.policy"),
    ({"benchmark": {"seeds": 1}}, "benchmark.seeds"),
    ({"clustr": {}}, "clustr"),
    ({"cluster": {"gpu": "A100"}}, "cluster.gpu"),
    ({"cluster": {"gpus_per_node": 0}}, "cluster.gpus_per_node"),
    ({"model": {"preset": "Llama-3"}}, "model"),
    ({"model": {"quantization": "int3"}}, "model.quantization"),
    ({"engine": {"kind": "vllm"}}, "engine.kind"),
    ({"engine": {"sim": {"time_scale": 0}}}, "engine.sim.time_scale"),
    ({"engine": {"sglang": {"mem_fraction_static": 1.5}}}, "engine.sglang.mem_fraction_static"),
    ({"layout": {"mode": "pd", "prefill": [{"tp": 8}], "decode": []}}, "layout"),
    ({"layout": {"mode": "pd", "prefill": [{"tp": 0}], "decode": [{"tp": 8}]}}, "layout.prefill.0.tp"),
    ({"layout": {"mode": "pd", "prefill": [{"tp": 8, "gpus": 3}], "decode": [{"tp": 8}]}}, "layout.prefill.0.gpus"),
    ({"layout": {"mode": "pd", "prefill": [{"tp": 16}], "decode": [{"tp": 8}]}}, "layout.prefill.0"),
    ({"layout": {"mode": "aggregated", "aggregated": [{"tp": 16, "nnodes": 3}]}}, "layout.aggregated.0.nnodes"),
    ({"layout": {"mode": "mixed", "prefill": [{}], "decode": [{}]}}, "layout.mode"),
    ({"transfer": {"backend": "mooncake"}}, "transfer.backend"),
    ({"transfer": {"bootstrap_port": 70000}}, "transfer.bootstrap_port"),
    ({"transfer": {"ucx": {"ib_gpu_direct_rdma": "maybe"}}}, "transfer.ucx.ib_gpu_direct_rdma"),
    ({"router": {"policy": "cache_aware"}}, "router.policy"),
    ({"router": {"port": "eighty"}}, "router.port"),
    ({"metrics": {"exporter_port": -1}}, "metrics.exporter_port"),
]


@pytest.mark.parametrize("fragment,field", MALFORMED, ids=[f for _, f in MALFORMED])
def test_malformed_config_names_the_field(tmp_path: Path, fragment: dict, field: str) -> None:
    data = {**MINIMAL, **fragment}
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, data))
    lines = str(err.value).splitlines()
    assert any(f": {field}" in line or f": {field}:" in line for line in lines), lines
    assert all(line.startswith(str(tmp_path)) for line in lines)
    log_case("bad input: config table", "named the field")



UNPARSEABLE = [("layout: [unclosed", "not valid YAML"), ("- a\n- b\n", "top level must be a mapping"), ("", "layout")]


@pytest.mark.parametrize("text,needle", UNPARSEABLE)
def test_unparseable_files_get_one_clear_line(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    assert needle in str(err.value)
    log_case("bad input: config file", "one clear line")


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml")


def test_bad_override_names_the_path() -> None:
    with pytest.raises(ConfigError, match="layout.prefill.7.count"):
        load_config(ROOT / "configs/default.yaml", ["layout.prefill.7.count=2"])
    with pytest.raises(ConfigError, match="KEY.PATH=VALUE"):
        load_config(ROOT / "configs/default.yaml", ["layout.prefill.0.count"])


@pytest.mark.parametrize("override", ["layout.prefil.0.count=2", "layout.prefil.+={count: 1, tp: 4}"])
def test_a_misspelt_list_key_is_named_with_the_nearest_one_not_blamed_on_its_index(override: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "configs/default.yaml", [override])
    assert "layout.prefil: unknown key; did you mean prefill?" in str(err.value)
    assert "append" not in str(err.value)  # no advice to append to a section that does not exist


def test_several_problems_are_each_reported(tmp_path: Path) -> None:
    data = {**MINIMAL, "benchmark": {"num_prompts": -1, "seed": "x"}, "bogus": 1}
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, data))
    text = str(err.value)
    for field in ("benchmark.num_prompts", "benchmark.seed", "bogus"):
        assert field in text


@settings(max_examples=60, deadline=None)
@given(
    section=st.sampled_from(["cluster", "model", "engine", "benchmark", "router", "metrics", "transfer"]),
    key=st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=3, max_size=12),
    value=st.one_of(st.integers(), st.text(max_size=5), st.booleans(), st.none()),
)
def test_unknown_keys_are_always_rejected_with_their_path(section: str, key: str, value) -> None:
    known = set(RunConfig.model_fields[section].annotation.model_fields)
    if key in known:
        return
    with pytest.raises(ConfigError) as err:
        config_from_dict({**MINIMAL, section: {key: value}})
    assert f"{section}.{key}: unknown key" in str(err.value)
    log_case("bad input: config unknown keys (generated)", "rejected with their path")


def test_cli_validate_prints_one_line_per_problem(tmp_path: Path) -> None:
    bad = write(tmp_path, {**MINIMAL, "benchmark": {"num_prompts": 0}, "router": {"policy": "x"}})
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "config", "validate", str(bad)],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and "benchmark.num_prompts" in proc.stderr and "router.policy" in proc.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "orchestrator", "config", "validate", str(ROOT / "configs/default.yaml")],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert ok.returncode == 0 and "OK" in ok.stdout


def test_relative_input_paths_are_the_users_unless_a_folder_is_named(tmp_path: Path, monkeypatch) -> None:
    """A user's relative model.path / dataset_path stays as written (taken from the working directory, as SGLang's
    --model-path is); the back-test names the repository root for the repository's own configs, overrides included."""
    path = write(tmp_path, {**MINIMAL, "model": {"preset": None, "path": "models/deepseek-v2-lite"},
                            "benchmark": {"dataset_path": "~/sharegpt.json"}})
    monkeypatch.chdir(tmp_path)
    users = load_config(path)
    assert users.model.path == "models/deepseek-v2-lite" and users.benchmark.dataset_path == "~/sharegpt.json"
    anchored = load_config(path, ["benchmark.dataset_path=data/sharegpt.json"], paths_from=ROOT)
    assert anchored.model.path == str(ROOT / "models/deepseek-v2-lite")
    assert anchored.benchmark.dataset_path == str(ROOT / "data/sharegpt.json")
    assert anchored.model.architecture().name == "deepseek-v2-lite"  # read from the repository, not from tmp_path
    absolute = load_config(path, [f"model.path={tmp_path}", "benchmark.dataset_path=~/s.json"], paths_from=ROOT)
    assert absolute.model.path == str(tmp_path) and absolute.benchmark.dataset_path == "~/s.json"
