"""What the two extrapolations of the one-GPU fixed time to 61 layers do to the back-test (docs/fidelity.md, "Fixed
costs traced": what remains). The calibrated in-node decode path charges its profile's whole fixed time per layer
(layer_s x layers); the roofline splits it into the GPU's per-step floor and 44 us per layer. Here, for this run only,
the calibrated path takes the split too: layer_s - step / (profile layers) + step / (target layers), identical at the
profile's own layer count. Prints each full-run row before and after. A sensitivity, nothing is changed or fitted.

  python3 benchmarks/manifest.py record --out benchmarks/results/<date>-floor-split-sensitivity -- \
      .venv/bin/python benchmarks/floor_split_sensitivity.py
"""

from __future__ import annotations

from dataclasses import replace

from orchestrator.perfmodel import costmodel
from orchestrator.perfmodel.gpus import gpu_spec
from orchestrator.plan.backtest.predict import run_backtest

_find = costmodel.find_calibration


def _split_floor(gpu, arch, quantization, profiles=None, load_format="dummy", attention_tp=1, ep=1):
    cal = _find(gpu, arch, quantization, profiles, load_format, attention_tp, ep)
    if cal is None or cal.decode is None or cal.layers == arch.num_hidden_layers:
        return cal
    step = gpu_spec(cal.gpu).step_overhead_s
    layer_s = cal.decode.layer_s - step / cal.layers + step / arch.num_hidden_layers
    return replace(cal, decode=replace(cal.decode, layer_s=layer_s))


def main() -> None:
    before = {r.id: r for r in run_backtest()}
    costmodel.find_calibration = _split_floor
    after = {r.id: r for r in run_backtest()}
    print(f"{'row':58s} {'sample':6s} {'measured':>9s} {'per-layer (now)':>16s} {'split floor':>12s}")
    for rid, a in after.items():
        b = before[rid]
        if b.kind == "throughput" and b.scope == "run" and abs(float(a.predicted) / float(b.predicted) - 1) > 0.001:
            print(f"{rid:58s} {b.sample:6s} {float(b.measured):9,.0f} {float(b.error or 0):+15.1%} {float(a.error or 0):+11.1%}")
    for label, rows in (("now", before), ("split", after)):
        full = [r for r in rows.values() if r.kind == "throughput" and r.scope == "run" and r.sample == "out"]
        mape = sum(abs(float(r.error or 0)) for r in full) / len(full)
        print(f"out-of-sample full runs MAPE ({label}): {mape:.1%} over {len(full)}")


if __name__ == "__main__":
    main()
