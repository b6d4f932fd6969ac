"""Prefill forwards of a calibration run, read from its SGLang server log: which requests each chunked prefill
batch held (new and already-cached tokens of each) and how long it took.

calibration raw JSON (its decode / context points: k prompts of L tokens at once, in order) + the server log's
"Prefill batch" lines -> PrefillPoint per forward (source "server-log").

- Timing: SGLang 0.5.17 prints "input throughput (token/s)" = this batch's new tokens / the time since the
  previous prefill line (scheduler_components/metrics_reporter.py, report_prefill_stats), so tokens / throughput
  is the gap between two prefill lines. A gap is one forward only when that batch was waiting behind the
  previous one (the previous line shows queued requests or pending tokens, or the batch continues a chunked
  request); the first batch of a point and batches formed while requests were still arriving are left out.
- Composition: a point's prompts all have L tokens and are chunked in arrival order, so each batch's requests
  follow from the running token count: a request split by --chunked-prefill-size continues in the next batch
  on top of its own earlier chunk (cached tokens). The log's #new-seq is checked against it.

Run: python -m orchestrator.perfmodel.prefill_log RAW.json SERVER.log[.xz] --variant NAME --profile PROFILE.json
(adds the forwards to the profile's prefill points, replacing earlier server-log points; benchmarks/results/ stores
large server logs xz-compressed).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from orchestrator.compressed import read_text
from orchestrator.perfmodel.profile import CalibrationProfile, PrefillPoint

_LINE = re.compile(
    r"Prefill batch.*?#new-seq: (\d+), #new-token: (\d+), #cached-token: \d+.*?#queue-req: (\d+), "
    r"#pending-token: (\d+).*?input throughput \(token/s\): ([\d.]+)"
)


def prefill_lines(log_text: str) -> list[tuple[int, int, int, int, float]]:
    """(new seqs, new tokens, queued requests, pending tokens, input throughput) of every prefill line."""
    return [(int(a), int(b), int(c), int(d), float(e)) for a, b, c, d, e in _LINE.findall(log_text)]


def _points(run: dict) -> list[dict]:
    order = [k for k in run.get("measure") or ["decode", "context"] if k in ("decode", "context")]
    rows = [row for key in order for row in run.get(key) or []]
    return [r for r in rows if not r.get("skipped") and r.get("prefill_batches")]


def _segments(lines: list, points: list[dict]) -> list[tuple[dict, list]]:
    """Each point's own prefill lines: the next run of `prefill_batches` lines whose tokens sum to what the
    harness logged for the point (lines of other measurements in between are skipped)."""
    out, pos = [], 0
    for point in points:
        n, want = point["prefill_batches"], point["prefill_tokens_logged"]
        start = next((s for s in range(pos, len(lines) - n + 1) if sum(x[1] for x in lines[s:s + n]) == want), None)
        if start is None:
            raise ValueError(f"point B={point['batch_size']} C={point['context_tokens']}: no {n} prefill lines "
                             f"summing to {want} tokens after line {pos}")
        out.append((point, lines[start:start + n]))
        pos = start + n
    return out


def _compose(batch_tokens: list[int], requests: int, length: int) -> list[list[tuple[int, int]]]:
    done, current, batches = [0] * requests, 0, []
    for tokens in batch_tokens:
        batch = []
        while tokens > 0 and current < requests:
            take = min(tokens, length - done[current])
            batch.append((take, done[current]))
            done[current] += take
            tokens -= take
            if done[current] == length:
                current += 1
        batches.append(batch)
    return batches


def forwards(raw: dict, log_text: str, variant: str) -> list[PrefillPoint]:
    """The timed prefill forwards of one calibration run (`variant`) from its server log."""
    run = next((r for r in raw.get("runs", []) if r.get("variant") == variant), None)
    if run is None:
        raise ValueError(f"--variant {variant!r}: not a run of this raw file")
    out = []
    for point, seg in _segments(prefill_lines(log_text), _points(run)):
        batches = _compose([x[1] for x in seg], point["batch_size"], point["context_tokens"])
        for i in range(1, len(seg)):
            seqs, tokens, _, _, throughput = seg[i]
            _, _, queued_before, pending_before, _ = seg[i - 1]
            continues = bool(batches[i]) and batches[i][0][1] > 0
            if throughput <= 0 or len(batches[i]) != seqs or not (queued_before or pending_before or continues):
                continue
            out.append(PrefillPoint(
                new_tokens=tokens, requests=seqs, cached_tokens=sum(c for _, c in batches[i]),
                time_s=round(tokens / throughput, 6), per_request=[[n, c] for n, c in batches[i]], source="server-log",
            ))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", help="calibration-<name>.json of the run (or its committed .json.xz)")
    ap.add_argument("log", help="that run's SGLang server log")
    ap.add_argument("--variant", required=True, help="the run (raw runs[].variant) the log belongs to")
    ap.add_argument("--profile", required=True, help="profile JSON whose prefill points get the forwards")
    args = ap.parse_args(argv)
    try:
        points = forwards(json.loads(read_text(args.raw)), read_text(args.log, errors="replace"), args.variant)
        profile = CalibrationProfile.model_validate_json(Path(args.profile).read_text())
    except (OSError, ValueError, KeyError) as exc:
        print(f"prefill_log: {exc}", file=sys.stderr)
        return 2
    kept = [p for p in profile.prefill if p.source != "server-log"]
    profile = profile.model_copy(update={"prefill": kept + points})
    Path(args.profile).write_text(profile.model_dump_json(indent=1, exclude_none=True) + "\n")
    print(f"wrote {args.profile}: {len(points)} prefill forwards from {args.log} ({len(kept)} other prefill points kept)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
