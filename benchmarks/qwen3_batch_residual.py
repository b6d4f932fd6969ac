"""What the Qwen3-shaped decode step misses as the batch grows (issue 25, hqbatch): measured step - the model's step, per
point, after the layer-count split, read against batch, context and layer count.

    .venv/bin/python benchmarks/qwen3_batch_residual.py

1. The layer-count grids (graphed decode, batch 1-256 at 256-token prompts, each point twice: the median) of one H100
   (lease 12) and one H200 (lease 11) at 6 and 12 layers: the residual r(L, B) at each count, and its split by the two
   counts into a per-step part and a per-layer part, r(L, B) = s(B) + L x l(B) (two equations, two unknowns per batch).
2. Lease 3's lone 6-layer H100 grid (another host), batch 1-256 at contexts 256 / 1,024 / 4,096: the residual against
   context at each batch, and the measured step's growth from 1,024 to 4,096 against the model's (its KV read).
3. Candidate terms, each priced from a calibration file or the model's own constants (nothing fitted here), as the
   per-layer residual it would leave at batch 16 / 64 / 128 / 256 beside the measured per-layer part of (1):
   (a) the attention projections and router as their own kernels at the measured FP8 GEMM share of peak (the prefill
       shares the Qwen3 shape borrows: calibration_lookup._lend_prefill_shares), each its own roofline
       max(FLOPs at that share, bytes at 80 % of HBM), beside the step's one max today;
   (b) the routed experts' FLOPs (tokens x top 8 x one expert) at the same share, added to their read (no overlap);
   (c) the attention projections' FP8 weights read once per 64-row block of the batch: SGLang 0.5.17's triton block-FP8
       GEMM with its default config (BLOCK_SIZE_M 64: kernels/ops/quantization/fp8_kernel.py; every probe log prints
       "Using default W8A8 Block FP8 kernel config") runs cdiv(batch, 64) row blocks, each streaming the weight tiles of
       its columns; priced as if none of the repeats hit L2 (an upper bound).
4. The two-H200 closed loop (a GPU per role, dummy weights, chat prompts): the decode server's own `Decode batch` lines
   in the serve archives of leases 2, 5 and 11; per pair of consecutive lines whose #running-req differ by at most one,
   the interval's step = mean #running-req / gen throughput, binned by that batch (context 4,100 per request: ISL 4,000
   + half of OSL 200; the lines' #token also counts KV preallocated for requests in transfer); beside the model's step
   with the closed loop's routing (one greedy chain: at most two routing tokens, weights.decode_routing_tokens) and with
   uniform routing (every request its own token, as the grids of (1) ran).
"""

from __future__ import annotations

import io
import json
import re
import statistics
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.compressed import read_text  # noqa: E402
from benchmarks.qwen3_layer_count import PROBE_SERVER, QWEN3, measured_points, model_step_s  # noqa: E402
from orchestrator.config import load_config  # noqa: E402
from orchestrator.perfmodel.costmodel import build_cost_model, cost_model_for  # noqa: E402
from orchestrator.perfmodel.server.forward import WEIGHT_READ_EFFICIENCY  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
LEASE11_LAYERS = RESULTS / "2026-11-27-lease11-h200x2/call6-serve-layers/layers.tar"
GRIDS: dict[str, dict[int, tuple[Path | None, Path | str]]] = {  # GPU -> layers -> (archive or None, raw path)
    "H100-SXM": {6: (None, RESULTS / "2026-11-27-lease12-h100/call3-probe/calibration-q3l6-lease11.json"),
                 12: (None, RESULTS / "2026-11-27-lease12-h100/call4-probe12/calibration-q3l12-lease11.json")},
    "H200": {6: (LEASE11_LAYERS, "gpu0/calibration-q3l6-lease11.json"),
             12: (LEASE11_LAYERS, "gpu1/calibration-q3l12-lease11.json")},
}
LONE_H100 = RESULTS / "2026-11-26-two-gpu-lease3-h100x2/call6-qwen3-probe/calibration-qwen3-l6.json.xz"
SERVES = {  # the two-H200 closed loop's serve archives (decode-0-0.log inside)
    "lease 2": RESULTS / "2026-11-26-two-gpu-lease2-h200x2/call4-pd-serve/serve.tar.xz",
    "lease 5": RESULTS / "2026-11-26-two-gpu-lease5-h200x2/call4-qwen3-prepare-serve/prepare-serve.tar.xz",
    "lease 11": RESULTS / "2026-11-27-lease11-h200x2/call6-serve-layers/serve.tar.xz",
}
SERVE_CONFIG = "configs/device-h200x2-qwen3-serve.yaml"
CONTEXT_PER_REQUEST = 4100
DECODE_LINE = re.compile(r"Decode batch, #running-req: (\d+),.*cuda graph: True, gen throughput \(token/s\): ([\d.]+)")
CANDIDATE_BATCHES = (16, 64, 128, 256)


def raw_of(source: tuple[Path | None, Path | str]) -> dict:
    archive, path = source
    if archive is None:
        return json.loads(read_text(path))
    with tarfile.open(archive) as tar:
        stream = tar.extractfile(str(path))
        assert stream is not None
        return json.load(stream)


def grid_residuals(gpu: str) -> dict[tuple[int, int], tuple[float, float]]:
    """(layers, batch) -> (measured s, model s): the median over a point's repeats, the model at their median KV."""
    out = {}
    for layers, source in GRIDS[gpu].items():
        by_batch: dict[int, list[tuple[int, float]]] = {}
        for batch, kv, step in measured_points(raw_of(source)):
            by_batch.setdefault(batch, []).append((kv, step))
        for batch, seen in by_batch.items():
            kv = int(statistics.median(k for k, _ in seen))
            out[(layers, batch)] = (statistics.median(s for _, s in seen), model_step_s(layers, batch, kv, gpu))
    return out


def split_by_layers(res: dict[tuple[int, int], tuple[float, float]]) -> dict[int, tuple[float, float]]:
    """batch -> (per-step, per-layer) parts of the residual, from its values at the two layer counts."""
    (lo, hi) = sorted({layers for layers, _ in res})
    out = {}
    for batch in sorted({b for _, b in res}):
        r_lo, r_hi = (res[(lo, batch)][0] - res[(lo, batch)][1]), (res[(hi, batch)][0] - res[(hi, batch)][1])
        per_layer = (r_hi - r_lo) / (hi - lo)
        out[batch] = (r_lo - lo * per_layer, per_layer)
    return out


def section_grids() -> dict[str, dict[int, tuple[float, float]]]:
    print("1. The layer-count grids: measured - model (ms), and its per-step / per-layer parts from the two counts")
    splits = {}
    for gpu in GRIDS:
        res = grid_residuals(gpu)
        split = split_by_layers(res)
        splits[gpu] = split
        print(f"  {gpu}")
        print(f"  {'batch':>5} {'6L meas':>8} {'6L model':>8} {'6L r':>7} {'12L meas':>8} {'12L model':>9} {'12L r':>7}"
              f" {'per step r':>10} {'per layer r us':>14}")
        for batch, (per_step, per_layer) in split.items():
            (m6, p6), (m12, p12) = res[(6, batch)], res[(12, batch)]
            print(f"  {batch:>5} {m6 * 1e3:>8.3f} {p6 * 1e3:>8.3f} {(m6 - p6) * 1e3:>+7.3f} {m12 * 1e3:>8.3f} {p12 * 1e3:>9.3f}"
                  f" {(m12 - p12) * 1e3:>+7.3f} {per_step * 1e3:>+10.3f} {per_layer * 1e6:>+14.1f}")
    print()
    return splits


def section_context() -> None:
    print(f"2. Lease 3's lone 6-layer H100 grid ({LONE_H100.relative_to(ROOT)}): measured - model (ms) by context")
    rows = json.loads(read_text(LONE_H100))["runs"][0]["decode"]
    by: dict[tuple[int, int], tuple[float, float]] = {}
    for row in rows:
        if row.get("step_ms_median") and row.get("cuda_graph"):
            batch = int(row.get("running_batch") or row["batch_size"])
            step = model_step_s(6, batch, int(row["kv_tokens_median"]), "H100-SXM")
            by[(row["context_tokens"], batch)] = (row["step_ms_median"] / 1e3, step)
    contexts = sorted({c for c, _ in by})
    print(f"  {'batch':>5} " + " ".join(f"{'r @' + str(c):>9}" for c in contexts)
          + f" {'meas 1024->4096':>15} {'model 1024->4096':>16}")
    for batch in sorted({b for _, b in by}):
        cells = [f"{(by[(c, batch)][0] - by[(c, batch)][1]) * 1e3:>+9.3f}" if (c, batch) in by else f"{'':>9}" for c in contexts]
        grow = ""
        if (1024, batch) in by and (4096, batch) in by:
            grow = (f" {(by[(4096, batch)][0] - by[(1024, batch)][0]) * 1e3:>+15.3f}"
                    f" {(by[(4096, batch)][1] - by[(1024, batch)][1]) * 1e3:>+16.3f}")
        print(f"  {batch:>5} " + " ".join(cells) + grow)
    print("  (batch 256 at context 256 logged a median KV of 7,202 tokens: that point did not run as planned)")
    print()


def candidate_terms(gpu: str) -> tuple[str, dict[str, dict[int, float]]]:
    """(how they were priced, candidate -> batch -> per-layer seconds) on `gpu`, each from the model's constants and the
    measured FP8 GEMM share the Qwen3 shape borrows; (b) relative to B = 64, the others absolute."""
    model = build_cost_model(replace(QWEN3, num_hidden_layers=6), gpu, "fp8", **PROBE_SERVER)
    cal, p, arch = model.calibration, model.params, model.arch
    assert cal is not None and cal.efficiency_prefill is not None
    share, peak, hbm = cal.efficiency_prefill, model._peak_flops(), model.gpu.hbm_tb_s * 1e12
    dense = (p.attention + p.router) / arch.num_hidden_layers  # parameters per layer outside the experts
    dense_read = dense * model.format.dense_bytes / (hbm * WEIGHT_READ_EFFICIENCY)
    projection_read = p.attention / arch.num_hidden_layers * model.format.dense_bytes / (hbm * WEIGHT_READ_EFFICIENCY)
    expert_flops = {b: 2 * b * arch.num_experts_per_tok * p.one_expert_per_layer / (peak * share) for b in (64, *CANDIDATE_BATCHES)}
    terms = {
        "(a) projections, own roofline": {b: max(0.0, 2 * b * dense / (peak * share) - dense_read) for b in CANDIDATE_BATCHES},
        "(b) expert FLOPs added, relative to B=64": {b: expert_flops[b] - expert_flops[64] for b in CANDIDATE_BATCHES},
        "(c) projections re-read per 64-row block": {b: (-(-b // 64) - 1) * projection_read for b in CANDIDATE_BATCHES},
    }
    how = (f"FP8 GEMM share {share:.3f} of {peak / 1e12:,.0f} TFLOP/s ({cal.prefill_lender}); attention + router "
           f"{dense / 1e6:.1f} M parameters a layer, read in {dense_read * 1e6:.1f} us")
    return how, terms


def section_candidates(splits: dict[str, dict[int, tuple[float, float]]]) -> None:
    print("3. Candidate terms as the per-layer residual each would leave (us per layer), beside the measured per-layer part")
    for gpu, split in splits.items():
        how, terms = candidate_terms(gpu)
        print(f"  {gpu}: {how}")
        print(f"  {'':<44}" + " ".join(f"{'B=' + str(b):>8}" for b in CANDIDATE_BATCHES))
        print(f"  {'measured per-layer part':<44}" + " ".join(f"{split[b][1] * 1e6:>+8.1f}" for b in CANDIDATE_BATCHES))
        print(f"  {'measured, relative to B=64':<44}" + " ".join(f"{(split[b][1] - split[64][1]) * 1e6:>+8.1f}"
                                                           for b in CANDIDATE_BATCHES))
        for name, per_batch in terms.items():
            print(f"  {name:<44}" + " ".join(f"{per_batch[b] * 1e6:>+8.1f}" for b in CANDIDATE_BATCHES))
    print()


def serve_steps(archive: Path) -> dict[int, list[float]]:
    """Rounded mean batch -> steps (s) of the decode server's intervals whose two lines differ by at most one request."""
    out: dict[int, list[float]] = {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            stream = tar.extractfile(member)
            if stream is None or Path(member.name).name != "decode-0-0.log":
                continue
            previous = None
            for line in io.TextIOWrapper(stream, encoding="utf-8", errors="replace"):
                m = DECODE_LINE.search(line)
                if not m:
                    continue
                running, throughput = int(m.group(1)), float(m.group(2))
                if previous is not None and abs(previous - running) <= 1 and throughput > 10:
                    batch = (previous + running) / 2
                    out.setdefault(round(batch), []).append(batch / throughput)
                previous = running
    return out


def section_closed_loop() -> None:
    print(f"4. The two-H200 closed loop's in-loop decode step ({SERVE_CONFIG}, decode server's lines), ms")
    cfg = load_config(ROOT / SERVE_CONFIG, paths_from=ROOT)
    _, _, group = next(g for g in cfg.layout.groups() if g[0] == "decode")
    model = cost_model_for(cfg, "decode", group)
    print(f"  {'run':>8} {'batch':>5} {'intervals':>9} {'step':>6} {'model, 2 tokens':>15} {'model, uniform':>14}"
          f" {'step - 2 tokens':>15} {'share of the gap':>16}")
    for label, archive in SERVES.items():
        for batch, steps in sorted(serve_steps(archive).items()):
            if len(steps) < 5 or batch < 2:
                continue
            step = statistics.median(steps)
            two = model.decode_step_s(batch, batch * CONTEXT_PER_REQUEST, ["chat"] * batch)
            uniform = model.decode_step_s(batch, batch * CONTEXT_PER_REQUEST)
            gap = f"{(step - two) / (uniform - two):>16.2f}" if uniform > two else f"{'':>16}"
            print(f"  {label:>8} {batch:>5} {len(steps):>9} {step * 1e3:>6.2f} {two * 1e3:>15.2f} {uniform * 1e3:>14.2f}"
                  f" {(step - two) * 1e3:>+15.2f} {gap}")
    print("  (share of the gap: where the step sits between the two routings, 0 = two tokens, 1 = uniform)")


def main() -> int:
    splits = section_grids()
    section_context()
    section_candidates(splits)
    section_closed_loop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
