"""SGLang releases the orchestrator knows, one table each: the flag names that differ from 0.5.17's, the flags the
release lacks, and where its GPU-dependent defaults come from.

engine.sglang.version -> SglangRelease (the newest known release at or below it). The defaults that depend on the
GPU, TP and role (chunked prefill, CUDA-graph sizes, mem fraction, max running) are functions of the release in
perfmodel/sglang_defaults.py, read from the same two releases' server_args.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import metadata

PINNED_SGLANG = "0.5.17"  # pyproject's `sglang` extra


@dataclass(frozen=True)
class SglangRelease:
    """One SGLang release's launch_server command line, relative to 0.5.17's flag names."""

    version: str
    renamed_flags: dict[str, str] = field(default_factory=dict)  # 0.5.17 name -> this release's
    missing_flags: frozenset[str] = frozenset()  # 0.5.17 flags this release rejects
    defaults_note: str = ""  # what plan says about this release's defaults


RELEASES = {
    "0.4.10": SglangRelease(
        "0.4.10",  # the published 2 x 8 H100 runs (back-test rows)
        renamed_flags={"--cuda-graph-max-bs-decode": "--cuda-graph-max-bs"},
        missing_flags=frozenset({"--moe-a2a-backend", "--disable-prefill-cuda-graph"}),
        defaults_note="decode graphs [1,2,4,8]+16..160 step 8 (to 256 above 90 GiB); mem fraction = 1 - (9.5 or 12 GiB "
        "+ tp*pp/2 GiB) / GPU memory; chunked prefill 8192 from 35 GiB",
    ),
    "0.5.17": SglangRelease(
        "0.5.17",
        defaults_note="decode graphs up to 256 (tp < 4) or 512 (tp >= 4) on 60-160 GiB GPUs; mem fraction from "
        "activation + graph reserves (>= 10 GiB above 60 GiB); chunked prefill 4096 from 35 GiB, 8192 from 60 GiB",
    ),
}


def version_tuple(version: str) -> tuple[int, ...]:
    """'0.5.17' -> (0, 5, 17); bad text -> ValueError naming it."""
    try:
        return tuple(int(x) for x in version.split(".")[:3])
    except ValueError:
        raise ValueError(f"sglang version {version!r} is not like '0.5.17'") from None


def release_for(version: str) -> SglangRelease:
    """The table of `version`: the newest known release at or below it; ValueError below the oldest."""
    known = sorted(RELEASES, key=version_tuple)
    at_or_below = [v for v in known if version_tuple(v) <= version_tuple(version)]
    if not at_or_below:
        raise ValueError(f"SGLang {version} is older than the oldest release whose defaults are known ({known[0]}); "
                         f"use one of {known} or newer")
    return RELEASES[at_or_below[-1]]


def installed_sglang_version() -> str:
    """The sglang installed next to the orchestrator, else the pinned release."""
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return PINNED_SGLANG
