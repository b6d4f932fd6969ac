"""ServerSpec: every knob survives spec -> argv -> the simulated server's parse; a typed knob has one value (an
extra_args repeat is a config error naming both); the SGLang version decides flag names and defaults."""

from __future__ import annotations

import argparse
from importlib import metadata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.cli import main
from orchestrator.config import ConfigError, config_from_dict, load_config
from orchestrator.config.server_spec import LEAF_TYPES, LEAVES, MODE_OF_ROLE, build_spec, server_spec
from orchestrator.config.sglang_versions import PINNED_SGLANG
from orchestrator.engines.base import WorkerPlacement
from orchestrator.engines.sglang.launch import SglangBackend
from orchestrator.engines.sim.settings import add_server_args, settings_from_args
from orchestrator.plan.memory.defaults_text import sglang_defaults_text

NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True)


def _values(path: tuple[str, ...], field) -> st.SearchStrategy:
    kind = LEAF_TYPES[path]
    if path == ("pd", "role"):
        return st.sampled_from(sorted(MODE_OF_ROLE))
    if path == ("sglang_version",):
        return st.sampled_from(["0.5.17", "0.6.2", "1.0.0"])  # 0.4.10 lacks two flags: its own test below
    if kind is bool:
        return st.booleans()
    if kind is int:
        some = st.integers(1, 1 << 20)
    elif kind is float:
        some = st.floats(1e-3, 1e4, allow_nan=False, allow_infinity=False)
    else:
        some = NAMES
    return st.one_of(st.none(), some) if field.default is None else some


SPECS = st.fixed_dictionaries({path: _values(path, f) for path, f in LEAVES}).map(build_spec)


def sim_parse(argv: list[str]):
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    return settings_from_args(parser.parse_args(argv)).spec


@settings(max_examples=300, deadline=None)
@given(SPECS)
def test_every_field_survives_argv_and_the_simulated_servers_parse(spec) -> None:
    assert sim_parse(spec.to_sim_argv()) == spec


def test_the_property_covers_every_field() -> None:
    """A new knob is a field with a flag: the generator above and the parser both come from LEAVES."""
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    known = {opt for action in parser._actions for opt in action.option_strings}
    assert {f.metadata["flag"] for _, f in LEAVES} <= known
    assert len(LEAVES) >= 30


def _pd(extra_prefill: list[str] | None = None, engine_extra: list[str] | None = None, **sglang) -> dict:
    return {
        "engine": {"kind": "sglang", "sglang": {"extra_args": engine_extra or [], **sglang}},
        "layout": {"mode": "pd", "prefill": [{"tp": 8, "extra_args": extra_prefill or []}], "decode": [{"tp": 8}]},
    }


TYPED = [(path, f) for path, f in LEAVES if f.metadata["source"] or not f.metadata["sim_only"]]


@pytest.mark.parametrize("where", ["group", "engine"])
@pytest.mark.parametrize("path,flag", [(p, flag) for p, f in TYPED for flag in (f.metadata["flag"], *f.metadata["aliases"])])
def test_an_extra_args_repeat_of_every_typed_field_is_an_error_naming_both(where, path, flag) -> None:
    value = [] if LEAF_TYPES[path] is bool else ["2"]
    args = [flag, *value]
    data = _pd(extra_prefill=args) if where == "group" else _pd(engine_extra=args)
    with pytest.raises(ConfigError) as err:
        config_from_dict(data)
    (line,) = err.value.problems
    assert flag in line and "repeats the typed field" in line
    field = dict(LEAVES)[path]
    named = [s.split(".")[-1] for s in field.metadata["source"]] or ["layout.mode", "transfer.backend"]
    assert any(n in line for n in named), line


def test_the_pipeline_example_is_one_line_naming_the_group_the_flag_and_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict(_pd(extra_prefill=["--pp-size", "2"]))
    assert str(err.value).splitlines() == [
        "<config>: layout.prefill.0.extra_args: --pp-size 2 repeats the typed field layout.prefill.0.pp; "
        "set it there and drop --pp-size here"
    ]


def test_a_knob_is_one_field_plus_its_flag_two_batch_overlap() -> None:
    """--enable-two-batch-overlap was added as a WorkerGroup field and one knob() line: it reaches the real argv,
    the simulated server's spec, and its extra_args repeat is an error, with no other code."""
    data = _pd()
    data["layout"]["decode"][0].update(enable_two_batch_overlap=True, moe_a2a_backend="deepep", ep=8)
    cfg = config_from_dict(data)
    spec = server_spec(cfg, "decode", cfg.layout.decode[0])
    assert "--enable-two-batch-overlap" in spec.to_sglang_argv()
    assert sim_parse(spec.to_sim_argv()).batching.enable_two_batch_overlap
    with pytest.raises(ConfigError, match="layout.prefill.0.enable_two_batch_overlap"):
        config_from_dict(_pd(extra_prefill=["--enable-two-batch-overlap"]))


def test_untyped_flags_pass_through_to_the_real_argv() -> None:
    cfg = config_from_dict(_pd(extra_prefill=["--enable-dp-lm-head"], engine_extra=["--sampling-backend", "pytorch"]))
    placement = WorkerPlacement(role="prefill", group_index=0, replica_index=0, host="127.0.0.1",
                                advertise_host="127.0.0.1", port=30000, gpu_ids=tuple(range(8)))
    argv = SglangBackend().build_launch(cfg, cfg.layout.prefill[0], placement).argv
    assert argv[-3:] == ["--enable-dp-lm-head", "--sampling-backend", "pytorch"]
    assert argv.count("--pp-size") == 1


def test_the_version_decides_flag_names_and_missing_flags_are_config_errors() -> None:
    cfg = config_from_dict({**_pd(version="0.4.10"), "layout": {"mode": "aggregated", "aggregated": [
        {"tp": 8, "cuda_graph_max_bs": 256}]}})
    argv = server_spec(cfg, "aggregated", cfg.layout.aggregated[0]).to_sglang_argv()
    assert argv[argv.index("--cuda-graph-max-bs") + 1] == "256" and "--cuda-graph-max-bs-decode" not in argv
    with pytest.raises(ConfigError, match=r"layout.prefill.0: batching.disable_prefill_cuda_graph=True: SGLang 0.4.10 "
                                          r"has no --disable-prefill-cuda-graph"):
        config_from_dict({**_pd(version="0.4.10"), "layout": {"mode": "pd", "decode": [{"tp": 8}],
                                                              "prefill": [{"tp": 8, "disable_prefill_cuda_graph": True}]}})
    with pytest.raises(ConfigError, match=r"engine.sglang.version: SGLang 0.3.9 is older than"):
        config_from_dict(_pd(version="0.3.9"))
    with pytest.raises(ConfigError, match=r"engine.sglang.version"):
        config_from_dict(_pd(version="latest"))


def test_the_spec_is_resolved_from_group_then_engine_then_sglang_default() -> None:
    cfg = config_from_dict({**_pd(mem_fraction_static=0.8, attention_backend="triton", page_size=64,
                                  kv_cache_dtype="fp8_e4m3"),
                            "layout": {"mode": "pd", "prefill": [{"tp": 4, "mem_fraction_static": 0.7}],
                                       "decode": [{"tp": 8, "dp": 8, "dp_attention": True, "ep": 8}]}})
    pre = server_spec(cfg, "prefill", cfg.layout.prefill[0])
    dec = server_spec(cfg, "decode", cfg.layout.decode[0])
    assert (pre.memory.mem_fraction_static, dec.memory.mem_fraction_static) == (0.7, 0.8)
    assert pre.memory.page_size == dec.memory.page_size == 64 and dec.attention_backend == "triton"
    assert (dec.parallel.dp, dec.parallel.dp_attention, dec.parallel.ep) == (8, True, 8)
    assert pre.batching.chunked_prefill_size is None  # SGLang's default for the version: the cost model's business
    assert dec.pd.timeouts.waiting_timeout_s == 105 and dec.role == "decode" and dec.pd.transfer_backend == "nixl"


def test_config_show_and_plan_take_the_sglang_version(capsys) -> None:
    assert main(["config", "show", "configs/default.yaml", "--set", "engine.sglang.version=0.4.10"]) == 0
    assert "version: 0.4.10" in capsys.readouterr().out
    shown = {}
    for version in ("0.4.10", "0.5.17"):
        cfg = load_config("configs/h100-agg-tp16.yaml", [f"engine.sglang.version={version}"])
        shown[version] = sglang_defaults_text(cfg)
    # SGLang 0.4.10 captures decode graphs up to 160 on an 80 GB GPU, 0.5.17 up to 512 at tp >= 4
    assert "SGLang 0.4.10 defaults (engine.sglang.version)" in shown["0.4.10"]
    assert "cuda_graph_max_bs 160" in shown["0.4.10"] and "cuda_graph_max_bs 512" in shown["0.5.17"]
    set_flags = load_config("configs/h100-agg-tp16.yaml", ["layout.aggregated.0.cuda_graph_max_bs=64"])
    assert "cuda_graph_max_bs" not in sglang_defaults_text(set_flags)  # a flag that is set is no default


def test_the_version_defaults_to_the_installed_sglang_else_the_pinned_one() -> None:
    try:
        installed = metadata.version("sglang")
    except metadata.PackageNotFoundError:
        installed = PINNED_SGLANG
    assert load_config("configs/default.yaml").engine.sglang.version == installed
