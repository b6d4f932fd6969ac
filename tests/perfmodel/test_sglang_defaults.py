"""SGLang 0.5.17's default mem_fraction_static, predicted from a launch's command line, against the raw engine logs.

Every server start under benchmarks/results printed its resolved ServerArgs (`mem_fraction_static=...`). The starts
that left the flag unset are the calibration harness's "-default" runs, whose command lines travel with their logs
(calibration-*.json inside the same archive: common_flags + the run's flags). Each is predicted through the planner's
own path (the command line read as a ServerSpec, the cost model resolving SGLang's defaults on that GPU's memory as
nvidia-smi reported it) and must equal what SGLang logged. Every other start set the flag (two decimals); a start with
a three-decimal value that no command line accounts for fails the completeness check, so a new raw log of a default
has to join this table.
"""

from __future__ import annotations

import argparse
import json
import re
import tarfile
import tempfile
from functools import cache
from pathlib import Path

import pytest

from orchestrator.compressed import read_text
from orchestrator.config.model_presets import ModelArchitecture
from orchestrator.config.server_spec import add_spec_args, spec_from_args
from orchestrator.perfmodel import sglang_defaults as sgd
from orchestrator.perfmodel.costmodel import EngineCostModel, build_cost_model

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
LOGGED = re.compile(r"server_args=ServerArgs\(.*?[ (]mem_fraction_static=([0-9.]+)")

# (archive, log member): logged, and what the planner predicted before SGLang's MLA prefill-graph reserve was dropped
# (1.5 GiB it adds only while a prefill graph is still on: an MLA model's is switched off first). All on one H100
# (81,559 MiB), TP1, aggregated; every H200, TP2, PP2, PD-role and Qwen3-shaped start in the raw logs set the flag.
DEFAULT_STARTS = {
    ("2026-11-24-calibration-h100-r1shaped/logs-r1.tar.xz", "r1/server-r1s6-cold-default.log"): (0.835, 0.816),
    ("2026-11-24-calibration-h100-r1shaped/logs-r1.tar.xz", "r1/server-r1s6-warm-default.log"): (0.835, 0.816),
    ("2026-11-24-calibration-h100-r1shaped/logs-r1-defaults-oom.tar.xz", "r1/server-r1s6-cold-default.log"): (0.835, 0.816),
    ("2026-11-24-calibration-h100-r1shaped/logs-r1-defaults-oom.tar.xz", "r1/server-r1s6-warm-default.log"): (0.835, 0.816),
    ("2026-11-24-calibration-h100-v2lite/logs-v2lite.tar.xz", "v2lite/server-v2lite-cold-default.log"): (0.835, 0.816),
    ("2026-11-24-calibration-h100-v2lite/logs-v2lite.tar.xz", "v2lite/server-v2lite-warm-default.log"): (0.835, 0.816),
    # lease 22's (R1-shaped 4 / 8 / 12 layers on one H200, up to three starts a count; records beside the archives)
    **{(f"2026-11-27-lease22-h200/{call}/layer-probe.tar.xz", f"./r1s{n}/server-r1s{n}-{tag}-start{k}.log"): (0.907, 0.896)
       for call, tag, starts in (("call3-probe", "lease22", ((4, 1), (4, 2), (4, 3), (12, 1))),
                                 ("call4-probe", "lease22c4", ((12, 1), (12, 2), (12, 3), (4, 1), (4, 2), (4, 3), (8, 1), (8, 2))))
       for n, k in starts},
    # hcapdeep's (R1-shaped 14 layers, each out of memory while loading, then 4 layers cold, on one H200)
    **{("2026-11-28-capture-deep-h200/call3-probe/layer-probe.tar.xz", f"./r1s{n}/server-r1s{n}-capdeep-start{k}.log"): (0.907, 0.896)
       for n, k in ((14, 1), (14, 2), (14, 3), (4, 1))},
    # lease 8's layer counts (R1-shaped 3-6 layers on one H100; their records beside the archives)
    **{(f"2026-11-27-lease8-r1-layers-h100/{call}/layer-probe.tar.xz", f"./r1s{n}/server-r1s{n}-lease8-layers.log"):
       (0.835, 0.816) for call, counts in (("call2", (4, 6)), ("call3", (5, 3))) for n in counts},
    # lease 20's (R1-shaped 4 / 7 / 10 layers on one H200, two starts a count; records beside the archives)
    **{(f"2026-11-27-lease20-h200/{call}/layer-probe.tar.xz", f"./r1s{n}/server-r1s{n}-{tag}-start{k}.log"): (0.907, 0.896)
       for call, tag, counts in (("call3-probe", "lease20", ((4, 1), (4, 2), (10, 1))),
                                 ("call4-probe", "lease20c4", ((10, 1), (10, 2), (4, 1), (4, 2), (7, 1), (7, 2))))
       for n, k in counts},
}


@cache
def _archives() -> dict[str, dict[str, str]]:
    """Every text member of every .tar.xz under benchmarks/results (archive path relative to it -> member -> text)."""
    found: dict[str, dict[str, str]] = {}
    for path in sorted(RESULTS.rglob("*.tar.xz")):
        with tarfile.open(path) as archive:
            members = {m.name: archive.extractfile(m) for m in archive.getmembers() if m.isfile()}
            found[str(path.relative_to(RESULTS))] = {
                name: f.read().decode(errors="replace") for name, f in members.items() if f is not None
            }
    return found


def _logged_fractions() -> dict[tuple[str, str], float]:
    """(archive or plain log, member) -> the mem_fraction_static each server start logged."""
    logged = {}
    for archive, members in _archives().items():
        for name, text in members.items():
            for value in LOGGED.findall(text):
                logged[(archive, name)] = float(value)
    for path in sorted([*RESULTS.rglob("*.log"), *RESULTS.rglob("*.log.xz")]):  # large logs are committed compressed
        for value in LOGGED.findall(read_text(path, errors="replace")):
            logged[(str(path.relative_to(RESULTS)), "")] = float(value)
    return logged


@cache
def _calibration_launches() -> dict[tuple[str, str], tuple[dict, list[str]]]:
    """(archive, log member) -> (the archive's calibration record, the command line's flags) for every calibration run
    whose server log is in the same archive."""
    launches = {}
    for archive, members in _archives().items():
        for name, text in members.items():
            if not re.search(r"/calibration-[^/]*\.json$", name):
                continue
            record = json.loads(text)
            for run in record.get("runs", []):
                log = f"{name.rsplit('/', 1)[0]}/server-{record['name']}-{run['variant']}.log"
                if log in members:
                    launches[(archive, log)] = (record, [*record.get("common_flags", []), *run.get("flags", [])])
        # an archive of server logs alone (scripts/device/layer_probe.sh): its records lie beside it, in its results folder
        if not any(re.search(r"/calibration-[^/]*\.json$", name) for name in members):
            folder = (RESULTS / archive).parent
            records = {p for f in (folder, folder.parent) for p in (*f.glob("calibration-*.json"), *f.glob("calibration-*.json.xz"))}
            for path in sorted(records):
                record = json.loads(read_text(path))
                for run in record.get("runs", []) if record.get("schema") == "pdo-calibration-raw/1" else []:
                    log = next((m for m in members if m.endswith(f"/server-{record['name']}-{run['variant']}.log")), None)
                    if log is not None:
                        launches[(archive, log)] = (record, [*record.get("common_flags", []), *run.get("flags", [])])
    return launches


def _unset_launches() -> dict[tuple[str, str], tuple[dict, list[str]]]:
    """The calibration runs that left --mem-fraction-static unset."""
    return {start: launch for start, launch in _calibration_launches().items() if "--mem-fraction-static" not in launch[1]}


def _model(record: dict, argv: list[str], gpu_memory_gb: float | None = None) -> EngineCostModel:
    """The planner's server for that command line: its ServerSpec, the model's config, on the record's GPU."""
    parser = argparse.ArgumentParser()
    add_spec_args(parser)
    parser.add_argument("--context-length", type=int)
    args, _ = parser.parse_known_args(argv)
    config = record["model"]["config"]
    arch = _arch_of(json.dumps(config, sort_keys=True))
    gpu = "H200" if "H200" in record["gpu"]["name"] else "H100-SXM"
    quantization = "fp8" if (config.get("quantization_config") or {}).get("quant_method") == "fp8" else "bf16"
    return build_cost_model(arch, gpu, quantization, gpu_memory_gb=gpu_memory_gb, calibrated=False,
                            spec=spec_from_args(args), context_length=args.context_length)


def _predicted(record: dict, argv: list[str]) -> float:
    """The planner's default for that command line on the GPU's memory as nvidia-smi reported it."""
    model = _model(record, argv, gpu_memory_gb=record["gpu"]["memory_total_mib"] / 1024)
    assert model.mem_fraction_static is not None
    return model.mem_fraction_static


@cache
def _arch_of(config_json: str) -> ModelArchitecture:
    """The architecture of the HF config the calibration record carries (read as the planner reads a model folder)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model" / "config.json"
        path.parent.mkdir()
        path.write_text(config_json)
        return ModelArchitecture.from_hf_config(path)


def test_the_default_starts_are_the_calibration_runs_that_left_the_flag_unset() -> None:
    assert set(_unset_launches()) == set(DEFAULT_STARTS)


@pytest.mark.parametrize("start", sorted(DEFAULT_STARTS), ids=lambda s: f"{Path(s[0]).parent.name}:{Path(s[1]).name}")
def test_the_predicted_default_is_the_one_sglang_logged(start: tuple[str, str]) -> None:
    logged, before = DEFAULT_STARTS[start]
    assert _logged_fractions()[start] == logged
    record, argv = _unset_launches()[start]
    assert _predicted(record, argv) == pytest.approx(logged, abs=1e-9)
    assert before != logged  # the 1.5 GiB MLA prefill-graph reserve put it 0.019 low (1.5 GiB of 79.6)


def test_every_three_decimal_fraction_in_the_raw_logs_is_a_default_this_table_checks() -> None:
    # flags are given with two decimals; SGLang rounds its own default to three
    unexplained = {start: value for start, value in _logged_fractions().items()
                   if round(value, 2) != value and start not in DEFAULT_STARTS}
    assert not unexplained, f"a server start logged a default mem_fraction_static; add it to DEFAULT_STARTS: {unexplained}"


def test_a_gqa_model_reserves_8_mib_per_prefill_graph_and_an_mla_model_none() -> None:
    # No raw log has a GQA start with the flag unset (the Qwen3-shaped ones set 0.85 / 0.92), so this is the source's
    # rule (server_args.py reserve_for_graph_mb): a breakable prefill graph per size of
    # _generate_prefill_cuda_graph_batch_sizes up to the chunk (58 sizes to 8192), 8 MiB each, on one H100, TP1
    assert len(sgd.prefill_graph_batch_sizes(8192)) == 58 and len(sgd.prefill_graph_batch_sizes(2048)) == 42
    base = 512 + 8192 * 1.5 + 1024 / 8 + 256 * 2  # floor + activations + tp*pp/8 GiB + 2 MiB x decode graph max
    gqa = sgd.MemFractionInputs(81559, mla=False)
    assert sgd.mem_fraction_static_default("0.5.17", gqa) == round((81559 - base - 58 * 8) / 81559, 3) == 0.830
    assert sgd.mem_fraction_static_default("0.5.17", sgd.MemFractionInputs(81559, mla=True)) == 0.835
    capped = sgd.MemFractionInputs(81559, mla=False, max_total_tokens=2048)  # prefill graphs stop at the KV cap
    assert sgd.mem_fraction_static_default("0.5.17", capped) == round((81559 - base - 42 * 8) / 81559, 3)
    for off in (sgd.MemFractionInputs(81559, mla=False, prefill_graphs=False),  # --disable-prefill-cuda-graph
                sgd.MemFractionInputs(81559, mla=False, role="decode", max_running_requests=64)):  # PD decode: none
        assert sgd.mem_fraction_static_default("0.5.17", off) >= 0.835
    qwen3 = ModelArchitecture.from_hf_config(RESULTS.parents[1] / "models/qwen3-235b-a22b-fp8-l6/config.json")
    model = build_cost_model(qwen3, "H100-SXM", "fp8", gpu_memory_gb=81559 / 1024, calibrated=False)
    assert model.mem_fraction_static == 0.830  # the cost model passes the architecture's attention kind through


KV_LOGGED = re.compile(r"KV Cache is allocated\..*?KV size: ([0-9.]+) GB")


def _starts_logging(line: re.Pattern[str]) -> list[tuple[tuple[str, str], EngineCostModel, int | None, re.Match[str]]]:
    """Every calibration start whose log has `line`, once per pipeline stage (a PP rank tags its lines "PPk]"):
    ((archive, log), the planner's model of its command line, the stage (None without PP), the line's match)."""
    found = []
    for start, (record, argv) in _calibration_launches().items():
        model = _model(record, argv)
        text = _archives()[start[0]][start[1]]
        for stage in model.pipeline_stages():
            lines = text if stage is None else "\n".join(x for x in text.splitlines() if f" PP{stage}]" in x)
            logged = line.search(lines)
            if logged is not None:
                found.append((start, model, stage, logged))
    return found


def test_the_kv_pool_is_the_fraction_of_the_memory_free_at_weight_load_in_every_calibration_log() -> None:
    # SGLang 0.5.17 (kv_cache_configurator.py _profile_available_bytes): KV = free after the weights - pre-load free x
    # (1 - fraction), i.e. fraction x "Load weight begin. avail mem" - weights. The planner's pool (nominal GPU memory,
    # less what gpus.py says is held at load) for each calibration command line, against the KV size SGLang logged
    # (GiB): H100 and H200, TP1, TP2, DP-attention 2, V2-Lite BF16 and R1-shaped FP8, fractions 0.70 and the default.
    # What is left is the weights (test_the_planner_s_weights_are_what_every_calibration_log_loaded).
    # PP 2 per stage (since hpp): every stage's budget is the heaviest stage's, the tokens the PP minimum, each stage's
    # pool those tokens of its own layers (the R1-shaped 3 dense / 3 MoE: 62.69 GiB logged on both, the planner 62.78)
    starts = _starts_logging(KV_LOGGED)
    for start, model, stage, logged in starts:
        pool = model.kv_pool_bytes_per_gpu() if stage is None else model.stage_pool_bytes(stage)
        assert pool / 2**30 == pytest.approx(float(logged.group(1)), rel=0.03), (start, stage)
    assert len(starts) >= 28  # 2026-11-27: 24 lines of starts without PP (some logs in two archives) + 2 PP 2 starts x 2


WEIGHTS_LOGGED = re.compile(r"Load weight end\..*?mem usage=([0-9.]+) GB")


def test_the_planner_s_weights_are_what_every_calibration_log_loaded() -> None:
    # SGLang's "Load weight end ... mem usage" (GiB: the drop in free memory over the load) against the planner's
    # weights per GPU, every calibration start and every PP stage's own (SGLang's layer split: the R1-shaped 6 layers at
    # PP 2 load 3.59 GiB on the stage of the 3 dense layers + embedding, 34.11 on the 3 MoE layers + lm_head). Since hmem3
    # (2026-11-26) the planner counts the absorbed-MLA bf16 copies of kv_b_proj (w_kc / w_vc, 0.19 GiB for the
    # R1-shaped 6 layers at TP 1, 0.10 for V2-Lite); what is left is under 0.3 GiB (0.26 R1-shaped TP 1, 0.11 V2-Lite)
    # and not a parameter: the load's temporaries and kernel modules, which the drop in free memory also counts.
    # Lease 14's Qwen3 at TP 4 x EP 4 (12, 48, 94 layers) is the exception, a measured miss kept in view, not a wider
    # bound: SGLang loaded ~4 MiB a layer more than the planner counts (0.15 / 0.28 / 0.48 GiB); about 0.9 MiB of it is
    # the router gate, which SGLang keeps replicated in bf16 (qwen3_moe.py: ReplicatedLinear, no quant config) where the
    # planner counts it at 1 byte and split by TP; the rest is not identified (docs/fidelity.md, "Lease 14"). Lease 19
    # (lease16-h200x4: the same 94-layer server with FA3, another host) must repeat lease 14's 94-layer miss, not move it
    starts = _starts_logging(WEIGHTS_LOGGED)
    per_layer, repeats = [], []
    for start, model, stage, logged in starts:
        weights = model.weights_bytes_per_gpu() if stage is None else model.stage_weights_bytes()[stage]
        short_gib = float(logged.group(1)) - weights / 2**30
        if start[0].startswith("2026-11-27-lease14-"):
            per_layer.append((model.arch.num_hidden_layers, short_gib))
            continue
        if start[0].startswith("2026-11-27-lease16-h200x4/"):
            repeats.append(short_gib)
            continue
        if start[1].startswith("./r1s7/server-r1s7-lease20c4-"):  # a measured miss kept in view, not a wider bound:
            # lease 20's 7-layer R1-shaped starts on H200 logged 48.48 GiB, 0.300 over (4 layers 0.113, 10 layers 0.218:
            # not per layer, the load's temporaries); pinned so it cannot grow unseen
            assert short_gib == pytest.approx(0.3001, abs=5e-4), (start, short_gib)
            continue
        assert 0 <= short_gib < 0.3, (start, stage, short_gib)
    assert len(starts) >= 30  # 26 without PP + the 2 PP 2 starts' 2 stages each
    (l0, s0), *_, (l1, s1) = sorted(per_layer)
    assert len(per_layer) == 3 and 3.5 < (s1 - s0) / (l1 - l0) * 1024 < 4.5 and 0 <= s0 - l0 * (s1 - s0) / (l1 - l0) < 0.3
    assert len(repeats) == 1 and abs(repeats[0] - s1) < 0.02, (repeats, s1)
