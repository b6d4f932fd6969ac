"""Search results as the user gets them: the ranking table, runnable config files, and `plan --search`'s output.

SearchResult (search.py) -> ranking_table (one row per config + why it beats the next) | write_top_configs (the
best compliant configs inside the deadline as RunConfig YAML, headed by their prediction and what rules still
need) | print_search (both, for cli/plan/finite.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import yaml

from orchestrator.config import RunConfig, config_from_dict
from orchestrator.plan.backtest.band import EAGER_STRETCH_SHARE, ErrorBand, eager_class
from orchestrator.plan.deadline import INVALID
from orchestrator.plan.candidate import Candidate
from orchestrator.plan.search import SearchResult, search
from orchestrator.plan.simulation.servers import priced_pairing_search_note
from orchestrator.plan.simulation.simulate import LABEL



def _band_cell(band: ErrorBand | None, eager_share: float) -> str:
    """The back-test band of a prediction's class (eager decode stretch or not), e.g. '±25% eager'."""
    name = eager_class(eager_share)
    of_class = band.of_class(name) if band else None
    return f"±{of_class.mape:.0%} {name}" if of_class else f"- {name}"


def ranking_table(candidates: Sequence[Candidate], gpu: str, limit: int | None = None,
                  band: ErrorBand | None = None) -> str:
    """One row per candidate: layout + knobs, memory, simulated throughput, times, deadline, the back-test band of
    its class (eager decode stretch or not), why it beats the next."""
    rows = [
        f"{'#':>3} {'layout + knobs':<58} {'memory':<20} {'out tok/s':>9} {'run s':>6} {'TTFT p50 s':>10} "
        f"{'start s':>7} {'total s':>7}  {'deadline':<8}  {'band':<12}  ({LABEL}, {gpu})"
    ]
    shown = list(candidates)[:limit] if limit else list(candidates)
    for rank, c in enumerate(shown, 1):
        name = c.name if len(c.name) <= 58 else c.name[:55] + "..."
        if c.budget is None:
            worst = max(c.memory.groups, key=lambda g: g.weights_gb)
            rows.append(f"{rank:>3} {name:<58} {c.memory.verdict:<20} (weights {worst.weights_gb:.0f} GB/GPU)")
            continue
        run = c.budget.run
        rows.append(
            f"{rank:>3} {name:<58} {c.memory.verdict:<20} {run.output_throughput:>9,.0f} {run.duration_s:>6.1f} "
            f"{run.ttft_p(50):>10.2f} {c.budget.startup_s:>7.1f} {c.budget.total_s:>7.1f}  {c.budget.verdict:<8}  "
            f"{_band_cell(band, run.eager_share)}"
        )
        if c.equivalents:
            rows.append(f"{'':>4}same prediction with: {', '.join(c.equivalents[:4])}"
                        + (f" (+{len(c.equivalents) - 4})" if len(c.equivalents) > 4 else ""))
        if c.why:
            rows.append(f"{'':>4}beats #{rank + 1}: {c.why}")
    if limit and len(candidates) > limit:
        rows.append(f"... {len(candidates) - limit} more")
    return "\n".join(rows)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def write_top_configs(
    cfg: RunConfig, candidates: Sequence[Candidate], top: int, write_dir: str | Path, gpu: str
) -> list[Path]:
    """Write the best `top` fitting, compliant candidates as RunConfig YAML files; return their paths."""
    out_dir = Path(write_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    chosen = [c for c in candidates if c.writable and c.simulated.verdict != INVALID][:top]
    for rank, c in enumerate(chosen, 1):
        name = f"{cfg.name}-plan{rank}-{_slug(c.name)}"[:120]
        full = c.config.model_dump(mode="json")
        data = c.config.model_dump(mode="json", exclude_defaults=True)
        data["name"] = name
        if c.rules is not None:
            data["rules"] = c.rules.profile
        # spelled out even where they equal a default: what the prediction assumed
        for section, keys in (("cluster", ("gpu", "gpus_per_node", "num_nodes")), ("model", ("preset", "quantization")),
                              ("benchmark", ("num_prompts", "seed", "deadline_s"))):
            data[section] = {**{k: full[section][k] for k in keys}, **data.get(section, {})}
        data.setdefault("engine", {}).setdefault("sglang", {})["load_format"] = full["engine"]["sglang"]["load_format"]
        data["layout"] = c.layout  # keep the layout literal even where it equals a default
        data = {k: data[k] for k in RunConfig.model_fields if k in data}  # the schema's section order
        config_from_dict(data, name)  # what we write must load
        compliance = "" if c.rules is None else f"; rules {c.rules.profile}: {c.rules.verdict}"
        still = [] if c.rules is None else [f"# rules {c.rules.profile} still needs: {v.line()}\n" for v in c.rules.violations]
        header = (
            f"# Written by `pd-orchestrator plan --search`, rank {rank} on {gpu} ({LABEL}): {c.name}: "
            f"{c.simulated.run.output_throughput:,.0f} output tok/s, run {c.simulated.run.duration_s:.0f} s, "
            f"total {c.simulated.total_s:.0f} s of {c.simulated.deadline_s:.0f} s -> {c.simulated.verdict}; "
            f"memory {c.memory.verdict}{compliance}.\n"
        )
        if c.why:
            header += f"# Beats the next layout in the ranking: {c.why}\n"
        header += "".join(still)
        path = out_dir / f"{name}.yaml"
        path.write_text(header + yaml.safe_dump(data, sort_keys=False))
        written.append(path)
    return written


def missing_mode_note(cfg: RunConfig, found: SearchResult) -> str | None:
    """Why the ranking holds no layout of the config's own mode (pd or aggregated), e.g. every PD layout pruned
    by memory once the rules set the checkpoint's precision; None when one is ranked."""
    mode = cfg.layout.mode
    if any(c.config.layout.mode == mode and c.budget is not None for c in found.ranked):
        return None
    name = "PD" if mode == "pd" else "aggregated"
    pruned = [c for c in found.ranked if c.config.layout.mode == mode and c.budget is None]
    if not pruned:
        return f"no {name} layout in the ranking: none of this cluster's {name} layouts is compliant"
    lightest = min(pruned, key=lambda c: max(g.weights_gb for g in c.memory.groups))
    why = next(f"{g.where}: {g.reason}" for g in lightest.memory.groups if g.verdict != "fits")
    precision = [n for n in found.notes if n.startswith("model.quantization")]
    because = f", after rules {found.rules} set {precision[0]}" if precision else ""
    return (f"no {name} layout in the ranking: all {len(pruned)} do not fit in memory{because}; the lightest, "
            f"{lightest.name}: {why}")


def add_search_args(parser) -> None:
    """`plan`'s search options besides --search/--top/--write-dir: rules, how many layouts to tune, rows shown."""
    parser.add_argument(
        "--rules", help="competition rules profile (name or YAML path; default: the config's `rules`), e.g. "
        "apac-hpcai-2025: plan states the verdict; --search proposes only compliant layouts; `none`: no rules",
    )
    parser.add_argument("--tune-top", type=int, default=4, help="how many of the best layouts get their knobs tuned")
    parser.add_argument("--show", type=int, default=None,
                        help="rows of the search ranking to print (0 = all; default: --top, else 25)")


def print_search(
    cfg: RunConfig, batch: Sequence[tuple[int, int]], gpu: str, *, rules: str | None = None, top: int = 3,
    write_dir: str | None = None, tune_top: int = 4, show: int = 25, disk_gb_s: float = 2.0, jit_cached: bool = True,
    band: ErrorBand | None = None,
) -> bool:
    """Run the search and print it as `plan --search` does (each row with `band`'s figure for its class); True when
    some layout fits inside the deadline."""
    import time

    from orchestrator.rules import load_profile, profile_name

    name = profile_name(rules, cfg.rules)
    profile = load_profile(name) if name else None
    started_cpu_s = time.process_time()  # one process: the search forks no workers
    found = search(cfg, batch, gpu=gpu, disk_gb_s=disk_gb_s, jit_cached=jit_cached, rules=profile, tune_top=tune_top)
    cluster = f"{cfg.cluster.num_nodes}x{cfg.cluster.gpus_per_node} {gpu}"
    scope = f", rules {found.rules}: only compliant configs" if found.rules else ""
    print(
        f"search on {cluster}{scope}: {found.layouts} layouts, {found.evaluated} configs evaluated "
        f"({found.pruned_memory} pruned by memory before simulation, {found.not_compliant} not compliant), knobs "
        f"tuned on the best {tune_top}; ranked: inside the deadline, then run time (= output tok/s on this batch), "
        f"then fewest changes, then total time; {time.process_time() - started_cpu_s:.1f} s of CPU"
    )
    for note in found.notes:
        print(f"  rules {found.rules} sets {note}")
    for v in found.standing:
        print(f"  rules {found.rules}: every layout still needs (the search cannot change it): {v.line()}")
    print(ranking_table(found.ranked, gpu, limit=show or None, band=band))
    if band is not None:
        print(f"(band: the back-test's out-of-sample error of each row's class: eager = its prediction runs more than "
              f"{EAGER_STRETCH_SHARE:.0%} of its decode steps past its largest CUDA graph; graphed = not)")
    if pairing := priced_pairing_search_note([c.config for c in found.ranked if c.budget is not None]):
        print(f"  {pairing}")
    missing = missing_mode_note(cfg, found)
    if missing:
        print(missing)
    if not found.proposals:
        print("no layout fits inside the deadline" + (f" under rules {found.rules}" if found.rules else ""))
    if write_dir:
        paths = write_top_configs(cfg, found.ranked, top, write_dir, gpu)
        print("\nwrote: " + (", ".join(str(p) for p in paths) or "nothing (no layout fits)"))
    return bool(found.proposals)
