"""benchmarks/eager_memfrac_read.py on small archives built here: it prices each round's read steps against the
planner's 60.55 ms and names the pre-registered outcome the four rounds' order carries."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from benchmarks.eager_memfrac_read import main


def _archive(d: Path, step_ms: list[float], arms: str = "ABAB", n: int = 130, oom_round: int | None = None,
             probe_slow_us: float = 9.0) -> Path:
    """Rounds in `arms` order, round k's decode steps all at step_ms[k] (600 running), a launch probe tick every
    100 ms at 9 us a launch (probe_slow_us while a step is >= 88 ms)."""
    files: dict[str, str] = {}
    events, t = [], 1000.0
    for k, arm in enumerate(arms):
        events.append({"t": t - 0.1, "event": f"round {k} {arm} begins: 600 x 160 out"})
        lines, probe = [], []
        for i in range(1, n + 2):
            line = {"i": i, "m": "d", "bs": 600, "t0": round(t, 4), "c0": 3, "c1": 3, "anc": 0, "wall": step_ms[k] - 5,
                    "cpu": step_ms[k] - 6, "gpu": step_ms[k] - 6, "g0": 0.1, "g1": 0.5}
            if i > 1:
                line.update({"per": step_ms[k], "it_cpu": step_ms[k] - 1, "rq": 0.0, "gc": [0, 0, 0, 0.0, 0.0, 0.0],
                             "mem": [0, 0, 0]})
            lines.append(line)
            probe.append({"t": round(t + step_ms[k] / 2e3, 4), "loop_wall_ms": 1.5, "loop_cpu_ms": 1.5,
                          "launch_us": probe_slow_us if step_ms[k] >= 88 else 9.0, "sync_ms": 0.1, "steal": 0})
            t += step_ms[k] / 1e3
        events.append({"t": t + 0.5, "event": f"round {k} {arm} ends (exit 0)"})
        files[f"steps-r{k}.jsonl"] = "\n".join(json.dumps(x) for x in lines)
        files[f"launch-r{k}.jsonl"] = "\n".join(json.dumps(x) for x in probe)
        files[f"r{k}.log"] = "torch.OutOfMemoryError: CUDA out of memory.\n" if k == oom_round else "Decode batch\n"
        files[f"r{k}.json"] = json.dumps({"ready_after_s": 80.0})
        t += 100.0
    files["events.jsonl"] = "\n".join(json.dumps(e) for e in events)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"memfrac/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (d / "memfrac.tar.xz").write_bytes(buf.getvalue())
    return d


@pytest.mark.parametrize("steps, named", [
    ([61.0, 95.0, 63.0, 98.0], "MEM explains"),
    ([95.0, 61.0, 98.0, 63.0], "MEM inverted"),
    ([60.0, 62.0, 75.0, 78.0], "TIME drift"),
    ([60.0, 66.0, 64.0, 61.0], "NOT EXPLAINED"),
])
def test_the_rounds_order_names_the_outcome(tmp_path, steps, named) -> None:
    out = tmp_path / "read.json"
    assert main([str(_archive(tmp_path, steps)), "--json", str(out)]) == 0
    read = json.loads(out.read_text())
    assert read["outcome"].startswith(named), read["outcome"]
    assert [r["arm"] for r in read["rounds"]] == ["A", "B", "A", "B"]
    assert read["rounds"][0]["steps"] == 127 and read["rounds"][0]["price"] == pytest.approx(steps[0] / 60.55, abs=1e-3)


def test_an_oom_in_an_a_round_and_too_few_rounds_are_named(tmp_path) -> None:
    out = tmp_path / "read.json"
    main([str(_archive(tmp_path, [61.0, 95.0, 63.0, 98.0], oom_round=2)), "--json", str(out)])
    assert json.loads(out.read_text())["outcome"].startswith("A-OOM")
    main([str(_archive(tmp_path, [61.0, 95.0, 63.0], arms="ABA")), "--json", str(out)])
    assert json.loads(out.read_text())["outcome"].startswith("INCOMPLETE: 2 A and 1 B")


def test_the_launch_probe_beside_slow_steps_names_host_wide_or_per_vcpu(tmp_path) -> None:
    out = tmp_path / "read.json"
    main([str(_archive(tmp_path, [61.0, 95.0, 63.0, 98.0], probe_slow_us=9.0)), "--json", str(out)])
    assert json.loads(out.read_text())["probe"]["outcome"].startswith("PER-VCPU")
    main([str(_archive(tmp_path, [61.0, 95.0, 63.0, 98.0], probe_slow_us=14.0)), "--json", str(out)])
    assert json.loads(out.read_text())["probe"]["outcome"].startswith("LAUNCH PATH")


def test_a_folder_without_the_archive_is_refused_naming_it(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert "memfrac.tar.xz not found" in capsys.readouterr().err


def test_the_committed_output_is_what_the_reader_prints_from_the_committed_raw(capsys) -> None:
    raw = Path(__file__).resolve().parents[1] / "benchmarks/results/2026-11-28-eager-memfrac-h100"
    assert main([str(raw / "call4-ab")]) == 0
    assert capsys.readouterr().out == (raw / "output.txt").read_text()
