"""Accuracy gate run before a benchmark: stop when the engine's outputs are wrong.

Two checks, chosen by `AccuracyGateSpec.mode` (auto picks by engine and weights):
- token-match (dummy weights, the sim): greedy outputs of a fixed prompt set must equal a reference
  token for token. The reference is an aggregated server's URL, a stored reference file, or (sim only)
  an aggregated sim server started here for the purpose.
- bpb (real weights): bits-per-byte of a fixed text, from the server's prompt logprobs
  (`return_logprob`, `logprob_start_len=0`), within a tolerance of a stored baseline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator, Literal

import aiohttp
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.cluster.ports import free_port

REFERENCE_KIND = "pd-orchestrator/token-reference/v1"
BASELINE_KIND = "pd-orchestrator/bpb-baseline/v1"

# Token ids drawn from this range exist in every DeepSeek vocabulary we serve (V2-Lite: 102,400).
_PROMPT_ID_RANGE = (100, 30_000)

# Fixed text for bits-per-byte. Plain prose written for this project, so the baseline is ours to keep.
BPB_TEXT = (
    "The harbour town woke slowly. Fishing boats came back before sunrise, their decks wet and their "
    "crews quiet, and the first bakery opened its shutters while the street lamps were still lit. By "
    "seven the market square was full: farmers from the valley sold apples, cheese and bread, a man "
    "repaired bicycles under the clock tower, and children ran between the stalls on their way to "
    "school. The ferry to the island left every hour on the hour. In winter it carried mostly mail and "
    "a few workers; in summer it was crowded with visitors who wanted to see the lighthouse, the old "
    "monastery and the cliffs where sea birds nested by the thousand.\n\n"
    "Most people in the town had two jobs. The teacher kept bees, the harbour master painted "
    "watercolours of the bay and sold them to tourists, and the pharmacist ran the small cinema on "
    "Friday nights. Nobody found this unusual. The town was too small for anyone to do only one "
    "thing, and too far from the city for anyone to expect help from outside. When the storm of the "
    "previous autumn had torn the roof off the school, the parents rebuilt it in three weekends, and "
    "the carpenter refused to be paid for more than the wood.\n\n"
    "Water, electricity and the internet arrived by the same road along the coast. When that road was "
    "closed by a landslide, the town learned again how to count its supplies: how many litres of fuel "
    "were left for the generator, how many days of flour the bakery had, how long the clinic could run "
    "on its batteries. The answers were written on a blackboard outside the town hall and updated "
    "every evening, and the numbers were read with more attention than any newspaper."
)


class AccuracyGateSpec(BaseModel):
    """How the gate runs; built from command-line flags (pydantic: it is an edge)."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["auto", "token-match", "bpb", "off"] = Field(
        "auto", description="auto = bpb for sglang with real weights, else token-match."
    )
    reference: str | None = Field(
        None, description="token-match: an aggregated server URL (http://…) or a stored reference JSON file."
    )
    baseline: str | None = Field(None, description="bpb: stored baseline JSON file.")
    tolerance: float = Field(0.02, ge=0, description="bpb: allowed relative deviation from the baseline.")
    num_prompts: int = Field(8, ge=1, description="token-match: size of the fixed prompt set.")
    max_new_tokens: int = Field(32, ge=1, description="token-match: greedy tokens compared per prompt.")
    seed: int = Field(2025, description="token-match: seed of the fixed prompt set.")
    timeout_s: float = Field(300.0, gt=0, description="Per-request timeout of the gate's requests.")


@dataclass
class GateResult:
    """Outcome of one gate run; `detail` is the one line a user reads."""

    mode: str
    passed: bool
    detail: str
    metrics: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


class AccuracyGateError(RuntimeError):
    """The gate could not run (missing reference or baseline, unreachable server), as opposed to failing."""


def fixed_prompt_set(num_prompts: int, seed: int) -> list[list[int]]:
    """Deterministic prompts as token ids, 16..256 tokens long; the same on every machine."""
    rng = np.random.RandomState(seed)
    lo, hi = _PROMPT_ID_RANGE
    return [rng.randint(lo, hi, size=int(rng.randint(16, 257))).tolist() for _ in range(num_prompts)]


async def _post_all(url: str, bodies: list[dict], timeout_s: float, headers: dict[str, str]) -> list[dict]:
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def post(body: dict) -> dict:
            async with session.post(url + "/generate", json=body, headers=headers) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise AccuracyGateError(f"{url}/generate answered HTTP {resp.status}: {text[:300]}")
                return json.loads(text)

        try:
            return list(await asyncio.gather(*(post(b) for b in bodies)))
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise AccuracyGateError(f"{url}/generate failed: {type(exc).__name__}: {exc}") from None


def greedy_outputs(
    url: str, prompts: list[list[int]], max_new_tokens: int, timeout_s: float = 300.0, headers: dict | None = None
) -> list[list[int]]:
    """Greedy output ids for each prompt (non-streaming `/generate`, ignore_eos so lengths are fixed)."""
    bodies = [
        {
            "input_ids": p,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
        }
        for p in prompts
    ]
    answers = asyncio.run(_post_all(url.rstrip("/"), bodies, timeout_s, headers or {}))
    return [list(a.get("output_ids") or []) for a in answers]


def compare_outputs(expected: list[list[int]], got: list[list[int]]) -> GateResult:
    """Token-for-token equality; the detail names the first differing prompt and position."""
    mismatched = 0
    first: str | None = None
    for i, (want, have) in enumerate(zip(expected, got, strict=True)):
        if want == have:
            continue
        mismatched += 1
        if first is None:
            pos = next((k for k, (a, b) in enumerate(zip(want, have)) if a != b), min(len(want), len(have)))
            first = (
                f"prompt {i} differs at output token {pos} "
                f"(expected {want[pos:pos + 4]}…, got {have[pos:pos + 4]}…; lengths {len(want)}/{len(have)})"
            )
    metrics = {"prompts": len(expected), "mismatched_prompts": mismatched}
    if mismatched:
        return GateResult("token-match", False, f"{mismatched}/{len(expected)} prompts differ; {first}", metrics)
    return GateResult("token-match", True, f"all {len(expected)} prompts match token for token", metrics)


def record_reference(url: str, path: str | Path, spec: AccuracyGateSpec, headers: dict | None = None) -> dict:
    """Store the greedy outputs of `url` (an aggregated server) as the token-match reference file."""
    prompts = fixed_prompt_set(spec.num_prompts, spec.seed)
    outputs = greedy_outputs(url, prompts, spec.max_new_tokens, spec.timeout_s, headers)
    record = {
        "kind": REFERENCE_KIND,
        "source_url": url,
        "seed": spec.seed,
        "max_new_tokens": spec.max_new_tokens,
        "prompts": prompts,
        "outputs": outputs,
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record))
    return record


def load_reference(path: str | Path) -> dict:
    """Read a token-match reference file; errors name the file and how to make one."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise AccuracyGateError(
            f"accuracy reference {path}: cannot read it ({exc}); record one with "
            f"`pd-orchestrator accuracy record-reference --url <aggregated server> --out {path}`"
        ) from None
    if record.get("kind") != REFERENCE_KIND or len(record.get("prompts", [])) != len(record.get("outputs", [])):
        raise AccuracyGateError(
            f"accuracy reference {path}: not a {REFERENCE_KIND} file with equal-length prompts/outputs"
        )
    return record


def check_token_match(url: str, reference: dict, spec: AccuracyGateSpec, headers: dict | None = None) -> GateResult:
    """Compare `url`'s greedy outputs with a reference record's outputs on the record's prompts."""
    got = greedy_outputs(url, reference["prompts"], reference["max_new_tokens"], spec.timeout_s, headers)
    result = compare_outputs(reference["outputs"], got)
    result.metrics["reference"] = reference.get("source_url") or reference.get("path")
    return result


def bits_per_byte(url: str, text: str = BPB_TEXT, timeout_s: float = 300.0, headers: dict | None = None) -> float:
    """Bits per UTF-8 byte of `text` under the served model, from its prompt-token logprobs."""
    body = {
        "text": text,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 1},
        "return_logprob": True,
        "logprob_start_len": 0,
    }
    (answer,) = asyncio.run(_post_all(url.rstrip("/"), [body], timeout_s, headers or {}))
    entries = answer.get("meta_info", {}).get("input_token_logprobs")
    if not entries:
        raise AccuracyGateError(f"{url} returned no meta_info.input_token_logprobs; does it support return_logprob?")
    # Each entry is [logprob, token_id, text?]; the first token has no logprob (nothing precedes it).
    nats = -sum(float(e[0]) for e in entries if e and e[0] is not None)
    return nats / math.log(2) / len(text.encode("utf-8"))


def record_baseline(url: str, path: str | Path, headers: dict | None = None) -> dict:
    """Store bits-per-byte of the fixed text, measured on a trusted (e.g. aggregated) deployment."""
    record = {
        "kind": BASELINE_KIND,
        "source_url": url,
        "text_bytes": len(BPB_TEXT.encode()),
        "bpb": bits_per_byte(url, headers=headers),
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record, indent=2))
    return record


def check_bpb(url: str, baseline_path: str | Path, tolerance: float, headers: dict | None = None) -> GateResult:
    """bpb of `url` must be within `tolerance` (relative) of the stored baseline."""
    try:
        baseline = json.loads(Path(baseline_path).read_text())
        want = float(baseline["bpb"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise AccuracyGateError(
            f"accuracy baseline {baseline_path}: cannot read a 'bpb' value ({exc}); record one with "
            f"`pd-orchestrator accuracy record-baseline --url <trusted server> --out {baseline_path}`"
        ) from None
    got = bits_per_byte(url, headers=headers)
    deviation = abs(got - want) / max(abs(want), 1e-12)
    metrics = {"bpb": got, "baseline_bpb": want, "relative_deviation": deviation, "tolerance": tolerance}
    passed = deviation <= tolerance
    verdict = "within" if passed else "outside"
    detail = f"bpb {got:.4f} vs baseline {want:.4f}: {deviation:.2%} {verdict} {tolerance:.2%}"
    return GateResult("bpb", passed, detail, metrics)


def resolve_mode(spec: AccuracyGateSpec, cfg) -> str:
    """auto → bpb for SGLang with real weights (load_format null), token-match otherwise."""
    if spec.mode != "auto":
        return spec.mode
    if cfg is not None and not cfg.simulated and cfg.engine.sglang.load_format is None:
        return "bpb"
    return "token-match"


@contextlib.contextmanager
def local_sim_reference(cfg) -> Iterator[str]:
    """An aggregated (null-mode) sim server on loopback, as the token-match reference for sim deployments."""
    from orchestrator.engines.base import EngineProcess, WorkerPlacement
    from orchestrator.engines.registry import backend_for

    # Shaped like the deployment's last group (decode or aggregated) so the model fits as it does there;
    # outputs depend only on the prompt, so the shape changes nothing else. No simulated model load.
    _, _, shape = cfg.layout.groups()[-1]
    group = shape.model_copy(update={"count": 1, "name": "accuracy-reference", "extra_args": []})
    ref_cfg = cfg.model_copy(update={"engine": cfg.engine.model_copy(update={
        "sim": cfg.engine.sim.model_copy(update={"startup_s": 0.0, "faults": {}})})})
    placement = WorkerPlacement(
        role="aggregated", group_index=0, replica_index=0, host="127.0.0.1", advertise_host="127.0.0.1",
        port=free_port(),
    )
    launch = backend_for(ref_cfg).build_launch(ref_cfg, group, placement)
    with tempfile.TemporaryDirectory(prefix="accuracy-ref-") as tmp:
        proc = EngineProcess(launch, Path(tmp) / "reference.log")
        proc.start()
        try:
            proc.wait_healthy(timeout_s=120)
            yield launch.url
        finally:
            proc.stop()


def run_gate(spec: AccuracyGateSpec, url: str, cfg=None, headers: dict | None = None) -> GateResult:
    """Run the configured check against `url`; raises AccuracyGateError when it cannot run at all."""
    mode = resolve_mode(spec, cfg)
    if mode == "off":
        return GateResult("off", True, "accuracy gate disabled (--accuracy off)")
    if mode == "bpb":
        if not spec.baseline:
            raise AccuracyGateError("accuracy gate bpb needs --accuracy-baseline FILE (see `accuracy record-baseline`)")
        return check_bpb(url, spec.baseline, spec.tolerance, headers)
    reference = spec.reference
    if reference and reference.startswith(("http://", "https://")):
        prompts = fixed_prompt_set(spec.num_prompts, spec.seed)
        expected = greedy_outputs(reference, prompts, spec.max_new_tokens, spec.timeout_s, headers)
        record = {"prompts": prompts, "outputs": expected, "max_new_tokens": spec.max_new_tokens,
                  "source_url": reference}
        return check_token_match(url, record, spec, headers)
    if reference:
        record = load_reference(reference)
        record.setdefault("path", reference)
        return check_token_match(url, record, spec, headers)
    if cfg is not None and cfg.simulated:
        with local_sim_reference(cfg) as ref_url:
            prompts = fixed_prompt_set(spec.num_prompts, spec.seed)
            expected = greedy_outputs(ref_url, prompts, spec.max_new_tokens, spec.timeout_s)
        record = {"prompts": prompts, "outputs": expected, "max_new_tokens": spec.max_new_tokens,
                  "source_url": "local aggregated sim server"}
        return check_token_match(url, record, spec, headers)
    raise AccuracyGateError(
        "accuracy gate token-match needs --accuracy-reference: an aggregated server URL or a file from "
        "`pd-orchestrator accuracy record-reference`; or pass --accuracy off"
    )


