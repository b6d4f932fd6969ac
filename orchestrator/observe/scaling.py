"""Scaling analysis: throughput against GPU count and layout, measured where real runs exist, simulated otherwise.

measured rows: every VALID real-engine bench result.json under the given folders (also as result.json.xz or
    inside *.tar.xz archives there), one row per run id, labelled with where it came from
simulated rows: each config's layout and the same layout scaled to other node counts, timed by the cost
    model (plan.simulation.simulate) on the config's ShareGPT batch, labelled "simulated"
-> one table (text, markdown, JSON) + scaling.png: total tok/s against GPUs, measured filled, simulated hollow

Usage: pd-orchestrator scaling [--results DIR ...] [--configs A.yaml ...] [--nodes 1 2 4] [--out DIR]
"""

from __future__ import annotations

import json
import math
import tarfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from orchestrator.compressed import read_text
from orchestrator.tables import markdown_table, text_table

MEASURED = "measured"
SIMULATED = "simulated"


@dataclass
class ScalingRow:
    """One point of the analysis; `source` says whether it was measured on GPUs or simulated."""

    source: str  # MEASURED | SIMULATED
    model: str  # e.g. "DeepSeek-R1 fp8"
    gpu: str
    gpus: int
    nodes: int
    layout: str
    total_tok_s: float = math.nan
    output_tok_s: float = math.nan
    duration_s: float = math.nan
    ttft_p50_s: float = math.nan
    prompts: int = 0
    origin: str = ""  # result path, or config (and the scaling applied)
    note: str = ""

    @property
    def per_gpu_tok_s(self) -> float:
        return self.total_tok_s / self.gpus if self.gpus else math.nan

    @property
    def plotted(self) -> bool:
        return not math.isnan(self.total_tok_s)

    def to_dict(self) -> dict:
        return {**asdict(self), "per_gpu_tok_s": self.per_gpu_tok_s}


# ---- measured -----------------------------------------------------------------------------------


def _result_documents(root: Path) -> Iterator[tuple[str, dict]]:
    """(origin, document) of every result.json below root, also xz-compressed or inside .tar.xz/.tar.gz/.tar archives."""
    paths = [root] if root.is_file() else sorted(root.rglob("*"))
    for path in paths:
        if path.name in ("result.json", "result.json.xz"):
            try:
                yield str(path), json.loads(read_text(path))
            except (OSError, ValueError):
                continue
        elif path.name.endswith((".tar.xz", ".tar.gz", ".tar")):
            try:
                with tarfile.open(path) as tar:
                    for member in tar.getmembers():
                        if member.isfile() and member.name.endswith("/result.json"):
                            raw = tar.extractfile(member)
                            if raw is not None:
                                try:
                                    yield f"{path}:{member.name}", json.loads(raw.read())
                                except ValueError:
                                    continue
            except (OSError, tarfile.TarError):
                continue


def _model_label(config: dict) -> str:
    model = config.get("model") or {}
    name = model.get("preset") or model.get("name") or Path(str(model.get("path") or "model")).name
    return f"{name} {model.get('quantization') or ''}".strip()


def measured_rows(roots: Iterable[str | Path]) -> list[ScalingRow]:
    """One row per VALID real-engine run (sim-engine runs are CPU measurements, not GPU throughput)."""
    from orchestrator.observe.report import LatencySummary

    rows: dict[str, ScalingRow] = {}
    for root in roots:
        for origin, doc in _result_documents(Path(root)):
            meta = doc.get("metadata") or {}
            summary = doc.get("summary") or {}
            if doc.get("verdict") != "VALID" or meta.get("simulated", True) or not summary.get("duration_s"):
                continue
            run_id = str(doc.get("run_id") or origin)
            if run_id in rows:
                continue  # the same run copied into two places
            config = meta.get("config") or {}
            workers = meta.get("workers") or []
            nodes = meta.get("nodes") or []
            gpus = sum(len(w.get("gpu_ids") or ()) for w in workers) or int(sum(n.get("gpus", 0) for n in nodes))
            gpu = next((n.get("gpu_type") for n in nodes if n.get("gpu_type")), None) or \
                (config.get("cluster") or {}).get("gpu", "?")
            ttft = LatencySummary.from_results(doc.get("results") or []).get("ttft", "p50")
            rows[run_id] = ScalingRow(
                source=MEASURED, model=_model_label(config), gpu=str(gpu), gpus=int(gpus),
                nodes=len(nodes) or int((config.get("cluster") or {}).get("num_nodes", 1)),
                layout=str(meta.get("layout", "")), total_tok_s=float(summary["total_throughput"]),
                output_tok_s=float(summary["output_throughput"]), duration_s=float(summary["duration_s"]),
                ttft_p50_s=math.nan if ttft is None else ttft, origin=origin,
                prompts=int((doc.get("counts") or {}).get("completed", summary.get("successful_requests", 0))),
            )
    return sorted(rows.values(), key=lambda r: (r.model, r.gpu, r.gpus, r.layout))


# ---- simulated ----------------------------------------------------------------------------------


def layout_gpus(cfg) -> int:
    return sum(g.gpus_per_server * g.count for _, _, g in cfg.layout.groups())


def scaled(cfg, nodes: int):
    """cfg's layout on `nodes` nodes: every group's server count scaled by nodes / cluster.num_nodes;
    None where that is not a whole number of servers."""
    from orchestrator.config import RunConfig

    base = cfg.cluster.num_nodes
    if nodes == base:
        return cfg
    data = cfg.model_dump(mode="json")
    data["cluster"]["num_nodes"] = nodes
    for role in ("prefill", "decode", "aggregated"):
        for group in data["layout"][role]:
            count = group["count"] * nodes / base
            if count < 1 or count != int(count) or group.get("nnodes", 1) > nodes:
                return None
            group["count"] = int(count)
    return RunConfig.model_validate(data)


def simulated_rows(config_paths: Sequence[str | Path], node_counts: Sequence[int] = (1, 2, 4),
                   synthetic: bool = False) -> list[ScalingRow]:
    """Each config at each node count (where its layout scales to it), on the first config's batch."""
    from orchestrator.config import load_config
    from orchestrator.plan.memory.preflight import check_layout_fits
    from orchestrator.plan.simulation.simulate import SimulationError, batch_shapes, simulate_run

    configs = [(Path(p), load_config(p)) for p in config_paths]
    if not configs:
        return []
    batch, _ = batch_shapes(configs[0][1], synthetic=synthetic)
    rows = []
    seen: dict[tuple, ScalingRow] = {}
    for path, base in configs:
        for nodes in sorted(set(node_counts) | {base.cluster.num_nodes}):
            cfg = scaled(base, nodes)
            if cfg is None:
                continue
            key = (cfg.layout.model_dump_json(exclude={"name"}), _model_label(cfg.model_dump(mode="json")),
                   cfg.cluster.gpu)
            if key in seen:  # e.g. default.yaml and h100-1p1d-tp8.yaml time the same layout
                seen[key].note = "; ".join(filter(None, [seen[key].note, f"same as {path}"]))
                continue
            note = "" if nodes == base.cluster.num_nodes else f"{path.stem} scaled to {nodes} node(s)"
            row = ScalingRow(source=SIMULATED, model=_model_label(cfg.model_dump(mode="json")), gpu=cfg.cluster.gpu,
                             gpus=layout_gpus(cfg), nodes=nodes, layout=cfg.layout.describe(), origin=str(path),
                             note=note, prompts=len(batch))
            seen[key] = row
            memory = check_layout_fits(cfg, batch, suggest=False)
            if not memory.fits:
                row.note = "; ".join(filter(None, [note, "does not fit in GPU memory"]))
                rows.append(row)
                continue
            try:
                run = simulate_run(cfg, batch)
            except SimulationError as exc:
                row.note = "; ".join(filter(None, [note, str(exc)]))
                rows.append(row)
                continue
            row.total_tok_s, row.output_tok_s = run.total_throughput, run.output_throughput
            row.duration_s, row.ttft_p50_s = run.duration_s, run.ttft_p(50)
            rows.append(row)
    return rows


# ---- output -------------------------------------------------------------------------------------

COLUMNS = ("source", "model", "gpu", "gpus", "nodes", "layout", "prompts", "total tok/s", "tok/s/GPU", "output tok/s",
           "run s", "TTFT p50 s", "from")


REPO = str(Path(__file__).resolve().parents[2]) + "/"


def _cells(r: ScalingRow) -> list[str]:
    def num(v: float, spec: str) -> str:
        return "-" if math.isnan(v) else format(v, spec)

    origin = r.origin.removeprefix(REPO)
    origin = origin if not r.note else f"{origin} ({r.note.replace(REPO, '')})"
    return [r.source, r.model, r.gpu, str(r.gpus), str(r.nodes), r.layout, str(r.prompts), num(r.total_tok_s, ",.0f"),
            num(r.per_gpu_tok_s, ",.0f"), num(r.output_tok_s, ",.0f"), num(r.duration_s, ".1f"),
            num(r.ttft_p50_s, ".2f"), origin]


def _order(rows: Sequence[ScalingRow]) -> list[ScalingRow]:
    return sorted(rows, key=lambda r: (r.model, r.gpu, r.gpus, r.source != MEASURED, r.layout))


def table(rows: Sequence[ScalingRow]) -> str:
    return text_table(COLUMNS, [_cells(r) for r in _order(rows)])


def markdown(rows: Sequence[ScalingRow]) -> str:
    return markdown_table(COLUMNS, [_cells(r) for r in _order(rows)])


def plot(rows: Sequence[ScalingRow], path: Path) -> None:
    """Total tok/s against GPUs, one panel per model; colour per GPU type, measured filled, simulated hollow."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [r for r in rows if r.plotted]
    models = sorted({r.model for r in points}) or ["(nothing to plot)"]
    gpus = sorted({r.gpu for r in points})
    colours = dict(zip(gpus, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 5), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in points if r.model == model]
        for gpu in gpus:
            for source, marker in ((MEASURED, "o"), (SIMULATED, "s")):
                pts = [r for r in mine if r.gpu == gpu and r.source == source]
                if not pts:
                    continue
                ax.scatter([r.gpus for r in pts], [r.total_tok_s for r in pts], s=60, marker=marker,
                           facecolors=colours[gpu] if source == MEASURED else "none", edgecolors=colours[gpu],
                           label=f"{gpu}, {source}")
                for r in pts:
                    ax.annotate(r.layout, (r.gpus, r.total_tok_s), textcoords="offset points", xytext=(5, 3),
                                fontsize=6, color=colours[gpu])
        if mine:
            ticks = sorted({r.gpus for r in mine})
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.set_xlim(min(ticks) / 1.5, max(ticks) * 2)
            ax.set_ylim(0, max(r.total_tok_s for r in mine) * 1.15)
            ax.legend(fontsize=7, loc="lower right")
        else:
            ax.text(0.5, 0.5, "no measured runs and no simulated layouts", ha="center", transform=ax.transAxes)
        ax.set_title(model, fontsize=10)
        ax.set_xlabel("GPUs")
        ax.set_ylabel("total token throughput (tok/s)")
        ax.grid(True, alpha=0.3)
    fig.suptitle("Throughput against GPU count and layout (filled circles: measured on GPUs; hollow squares: "
                 "simulated by the cost model)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(rows: Sequence[ScalingRow], out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"png": out / "scaling.png", "md": out / "scaling.md", "json": out / "scaling.json"}
    plot(rows, paths["png"])
    paths["md"].write_text(markdown(rows) + "\n")
    paths["json"].write_text(json.dumps([r.to_dict() for r in _order(rows)], indent=2) + "\n")
    return paths
