"""A stored result: result.json (also xz-compressed, or inside a raw tar archive) -> the lines `bench` printed for it.

`pd-orchestrator report --result R` uses it to show runs made before the latency lines existed, e.g. the
2xH200 runs in benchmarks/results/*/raw.tar.xz.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from orchestrator.compressed import read_text
from orchestrator.observe.report import (
    LatencySummary,
    PhaseTime,
    RunVerdict,
    ThroughputSummary,
    our_lines,
    result_block,
)


def read_result(spec: str | Path, bench: bool = True) -> dict:
    """A result.json, its xz-compressed copy (`result.json.xz`: how benchmarks/results/ stores the large ones), or one
    inside a tar archive as `ARCHIVE.tar.xz:member/path/result.json`.

    bench: it must be a bench result (the `summary` and per-prompt `results` that render_result needs)."""
    path = Path(spec)
    if not path.exists() and ":" in str(spec):
        archive, member = str(spec).rsplit(":", 1)
        if not Path(archive).is_file():
            raise ValueError(f"--result {spec}: no file {archive}; pass a result.json or ARCHIVE:member")
        try:
            with tarfile.open(archive) as tar:
                raw = tar.extractfile(member.lstrip("./"))
                if raw is None:
                    raise KeyError(member)
                text = raw.read().decode()
        except KeyError:
            raise ValueError(f"--result {spec}: {archive} has no member {member}; list them with `tar tf {archive}`") from None
    else:
        try:
            text = read_text(path)
        except OSError as exc:
            raise ValueError(f"--result {spec}: cannot read it ({getattr(exc, 'strerror', None) or exc}); "
                             "pass runs/<run id>/result.json") from None
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"--result {spec}: not JSON ({exc}); pass a result.json written by bench") from None
    if not isinstance(document, dict):
        raise ValueError(f"--result {spec}: not a JSON object; pass a result.json written by bench")
    if bench and not (isinstance(document.get("summary"), dict) and isinstance(document.get("results"), list)):
        raise ValueError(f"--result {spec}: not a bench result (needs 'summary' and 'results'); pass a result.json written by bench")
    return document


def _engine_label(document: dict) -> str:
    if document.get("engine_label"):
        return str(document["engine_label"])
    meta = document.get("metadata") or {}
    model = ((meta.get("config") or {}).get("model") or {})
    name = model.get("name") or model.get("preset") or Path(str(model.get("path") or "model")).name
    if meta.get("simulated"):
        return f"sim [SIMULATED, {name}]"
    return f"{meta.get('engine') or 'engine'} ({name})"


def render_result(document: dict) -> str:
    """The printed result of an existing result.json: SGLang's block, then our lines with the latencies."""
    s = document["summary"]
    summary = ThroughputSummary(
        backend=str(s.get("backend", "engine")),
        successful_requests=int(s["successful_requests"]),
        duration_s=float(s["duration_s"]),
        total_input_tokens=int(s["total_input_tokens"]),
        total_output_tokens=int(s["total_output_tokens"]),
        last_gen_throughput=float(s.get("last_gen_throughput", 0.0)),
    )
    counts = document.get("counts") or {}
    meta = document.get("metadata") or {}
    note = None
    if float(meta.get("time_scale", 1.0) or 1.0) != 1.0:
        note = f"(times in simulated seconds: wall / time_scale {float(meta['time_scale']):g})"
    verdict = RunVerdict(
        engine=_engine_label(document),
        layout=str(meta.get("layout", "")),
        deadline_s=float(document.get("deadline_s") or 0.0),
        total_s=float(document.get("total_s") or 0.0),
        phases=[PhaseTime(p["name"], float(p["start_s"]), float(p["end_s"])) for p in document.get("phases") or []],
        num_prompts=int(counts.get("num_prompts", len(document["results"]))),
        completed=int(counts.get("completed", 0)),
        failed=int(counts.get("failed", 0)),
        reason=document.get("reason"),
        time_note=note,
        failure_reasons=dict(document.get("failure_reasons") or {}),
    )
    return result_block(summary) + "\n" + our_lines(verdict, LatencySummary.from_results(document["results"]),
                                                    (document.get("metadata") or {}).get("rules"))
