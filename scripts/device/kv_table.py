"""Markdown table of a `calibrate pd` run, one row per sender mode (medians over its loads).

    python3 scripts/device/kv_table.py benchmarks/results/2026-11-24-kv-transfer-h100-s5/calibration-pd-call1.json.xz ...

A committed run is stored xz-compressed (`X.json.xz`); the row is named by the file `calibrate pd` wrote (`X.json`).

Per mode: loads, wall s (mean), output tok/s (mean), SGLang's kv_transfer_latency_ms (mean of the loads' means),
and the median over loads of each load's p50 / p90 (ms) of the per-request parts (orchestrator/calibrate/kvtimeline.py).
"""

from __future__ import annotations

import json
import lzma
import sys

PARTS = [("computed_to_seen", "KV computed -> decode sees"), ("send_delay", "computed -> enqueued"),
         ("ready_to_seen", "enqueued -> decode sees"), ("queue", "queue"), ("worker", "NIXL (post+wait)"),
         ("decode_notice", "decode notice"), ("prefill_notice", "prefill notice")]


def rows(path: str) -> list[str]:
    with (lzma.open if path.endswith(".xz") else open)(path, "rt") as raw:
        d = json.load(raw)
    out = []
    for page in d["pages"]:
        for mode, r in (page.get("by_mode") or {}).items():
            sg = [x for x in r["sglang_kv_latency_ms_mean"] if x is not None]
            cells = [f"{r.get(p + '_p50_median')} / {r.get(p + '_p90_median')}" for p, _ in PARTS]
            out.append(f"| {path.rsplit('/', 1)[-1].removesuffix('.xz')} | {mode} | {r['loads']} | {r['wall_s_mean']:.2f} | "
                       f"{r['output_tok_s_mean']:.0f} | {sum(sg) / len(sg):.0f} | " + " | ".join(cells) + " |")
    return out


def main(paths: list[str]) -> None:
    print("| run | mode | loads | wall s | out tok/s | SGLang kv_transfer_latency_ms | "
          + " | ".join(f"{label} p50 / p90" for _, label in PARTS) + " |")
    print("|" + "---|" * (6 + len(PARTS)))
    for p in paths:
        print("\n".join(rows(p)))


if __name__ == "__main__":
    main(sys.argv[1:])
