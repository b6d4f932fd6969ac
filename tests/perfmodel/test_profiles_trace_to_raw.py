"""The shipped profiles hold their raw calibration files' numbers, nothing else (issue 25: every parameter of
the mechanisms traces to a calibration file): decode points and memory outcomes as `perfmodel.from_raw` reads the raw
file, prefill forwards as `perfmodel.prefill_log` times them from the committed server log, routing counts as the
probe's routing.json holds them. A hand edit of a profile, or a raw file replaced under it, fails here."""

from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path

import pytest

from orchestrator.compressed import read_text
from orchestrator.perfmodel.from_raw import profile_from_raw
from orchestrator.perfmodel.prefill_log import forwards

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "orchestrator/perfmodel/profiles"
PROBE = ROOT / "benchmarks/results/2026-11-26-dummy-routing-h200"
H100_RUN = ROOT / "benchmarks/results/2026-11-24-calibration-h100-r1shaped"
LEASE8 = ROOT / "benchmarks/results/2026-11-27-lease8-r1-layers-h100"
LEASE12 = ROOT / "benchmarks/results/2026-11-27-lease12-h100"
LEASE11_LAYERS = ROOT / "benchmarks/results/2026-11-27-lease11-h200x2/call6-serve-layers/layers.tar"

# profile -> (raw file, its run whose server log timed the prefill forwards, that log: a file or (tarball, member))
SHIPPED = {
    "h200-r1-shaped-6l-fp8-sglang0.5.17.json": (
        PROBE / "call2/calibration-dummy-graphs.json.xz", "dummy-graphs", PROBE / "call2/server-dummy-graphs-dummy-graphs.log.xz"),
    "h200-r1-shaped-6l-fp8-random-gates-sglang0.5.17.json": (PROBE / "call1/calibration-random-graphs.json.xz", None, None),
    "h100-r1-shaped-6l-fp8-sglang0.5.17.json": (
        H100_RUN / "calibration-r1s6.json.xz", "cold-default", (H100_RUN / "logs-r1.tar.xz", "r1/server-r1s6-cold-default.log")),
    # lease 8's layer-count profiles (purpose layer-count: they split the fixed time, calibrate no server)
    **{f"h100-r1-shaped-{n}l-fp8-sglang0.5.17-lease8.json": (LEASE8 / f"calibration-r1s{n}-lease8.json.xz", None, None)
       for n in (4, 5, 6)},
    # lease 11's Qwen3-shaped layer counts on one H200 host (in the call's layers.tar, one GPU each)
    "h200-qwen3-shaped-6l-fp8-sglang0.5.17-lease11.json": ((LEASE11_LAYERS, "gpu0/calibration-q3l6-lease11.json"), None, None),
    "h200-qwen3-shaped-12l-fp8-sglang0.5.17-lease11.json": ((LEASE11_LAYERS, "gpu1/calibration-q3l12-lease11.json"), None, None),
    # lease 12's on one H100 host (one call each)
    **{f"h100-qwen3-shaped-{n}l-fp8-sglang0.5.17-lease12.json": (LEASE12 / call / f"calibration-q3l{n}-lease11.json", None, None)
       for n, call in ((6, "call3-probe"), (12, "call4-probe12"))},
}


def _profile(name: str) -> dict:
    return json.loads((PROFILES / name).read_text())


def _raw(where: Path | tuple[Path, str]) -> dict:
    """A raw calibration file: committed as is, or a member of a call's uncompressed tarball."""
    if isinstance(where, Path):  # committed as is or xz-compressed
        return json.loads(read_text(where))
    tarball, member = where
    with tarfile.open(tarball) as tar:
        handle = tar.extractfile(member)
        assert handle is not None, member
        return json.loads(handle.read())


def _log_text(where: Path | tuple[Path, str]) -> str:
    if isinstance(where, Path):  # a committed log, xz-compressed where it is large
        return read_text(where, errors="replace")
    tarball, member = where
    with tarfile.open(tarball, "r:xz") as tar:
        handle = tar.extractfile(member)
        assert handle is not None, member
        return io.TextIOWrapper(handle, errors="replace").read()


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_a_shipped_profile_s_decode_points_and_memory_are_its_raw_file_s(name: str) -> None:
    profile, (raw_path, _, _) = _profile(name), SHIPPED[name]
    committed = raw_path if isinstance(raw_path, Path) else raw_path[0]
    assert committed.relative_to(ROOT).as_posix().startswith(profile["raw"].rstrip("/") + "/"), profile["raw"]
    rebuilt = profile_from_raw(_raw(raw_path), profile["raw"], profile["command"])
    rebuilt_json = json.loads(rebuilt.model_dump_json(exclude_none=True))
    assert profile["decode"] and rebuilt_json["decode"] == profile["decode"]
    # the layer shape is the raw file's config.json; the profile's name and routing tag are its converter's labels
    labels = ("name", "routing")
    assert {k: v for k, v in rebuilt_json["model"].items() if k not in labels} == \
        {k: v for k, v in profile["model"].items() if k not in labels}
    assert rebuilt_json["prefill"] == [p for p in profile["prefill"] if p.get("source") != "server-log"]
    # the H200 probe's start-ups and memory are not a calibration (its notes say why): dropped, never invented
    assert profile.get("memory", []) in ([], rebuilt_json.get("memory", []))


@pytest.mark.parametrize("name", [n for n, (_, variant, _) in SHIPPED.items() if variant])
def test_a_shipped_profile_s_prefill_forwards_are_the_ones_its_server_log_timed(name: str) -> None:
    profile, (raw_path, variant, log) = _profile(name), SHIPPED[name]
    timed = [json.loads(p.model_dump_json(exclude_none=True))
             for p in forwards(_raw(raw_path), _log_text(log), variant)]
    assert timed and timed == [p for p in profile["prefill"] if p.get("source") == "server-log"]


def test_the_h100_cold_start_s_first_graph_capture_added_by_hand_is_the_log_s_progress_bar() -> None:
    """The one hand edit (the profile's notes say so): the first of 36 graph sizes took 88.99 s with empty caches."""
    profile = _profile("h100-r1-shaped-6l-fp8-sglang0.5.17.json")
    cold = next(s for s in profile["startup"] if s.get("first_graph_capture_s") is not None)
    log = _log_text(SHIPPED["h100-r1-shaped-6l-fp8-sglang0.5.17.json"][2])
    seconds = re.search(r"\| 1/(\d+) \[[\d:]+<[\d:]+, ([\d.]+)s/it\]", log)
    assert seconds is not None
    assert (cold["graph_batch_sizes"], cold["first_graph_capture_s"]) == (int(seconds[1]), float(seconds[2]))


def test_the_routing_counts_are_the_probe_s_summary() -> None:
    summary = json.loads((PROBE / "routing.json").read_text())
    gates = {"dummy": summary["dummy-eager-count"], "random": summary["random-eager-count"]}
    expected = [{"tokens": int(t), "distinct_experts": float(x["mean"]), "gate": gate, "calls": x["calls"]}
                for gate, counts in gates.items() for t, x in counts.items()]
    dummy_profile = _profile("h200-r1-shaped-6l-fp8-sglang0.5.17.json")["routing"]
    random_profile = _profile("h200-r1-shaped-6l-fp8-random-gates-sglang0.5.17.json")["routing"]
    assert sorted(dummy_profile, key=str) == sorted(expected, key=str)
    assert sorted(random_profile, key=str) == sorted((e for e in expected if e["gate"] == "random"), key=str)


def test_the_v2_lite_profile_is_what_its_generator_reads_from_the_device_logs() -> None:
    """Re-running benchmarks/backtest/profile_from_device_logs.py over raw.tar.xz and startup-times.json writes the
    committed V2-Lite H200 profile byte for byte, the cold start's first graph size included: read from its log's
    capture progress bar by the function tests/plan/test_plan_deadline.py checks it with (nothing added by hand)."""
    from benchmarks.backtest import profile_from_device_logs as gen
    from benchmarks.qwen3_startup_phases import first_size

    profile = gen.build_profile()
    assert gen.render(profile) == gen.OUT.read_text()
    assert profile["decode"] and profile["prefill"] and profile["transfer"] and profile["page_size_effects"]
    (cold,) = [s for s in profile["startup"] if s.get("first_graph_capture_s") is not None]
    assert cold["caches"] == "cold" and first_size(gen.cold_log()[1]) == (36, cold["first_graph_capture_s"])
    assert 0 < cold["first_graph_capture_s"] < cold["graph_capture_s"]


def test_the_prefill_log_command_rewrites_the_shipped_forwards_from_the_compressed_log(tmp_path: Path) -> None:
    from orchestrator.perfmodel.prefill_log import main

    name = "h200-r1-shaped-6l-fp8-sglang0.5.17.json"
    raw, variant, log = SHIPPED[name]
    assert isinstance(raw, Path) and isinstance(log, Path) and log.suffix == ".xz"  # as the notes' command, .xz added
    copy = tmp_path / name
    copy.write_text((PROFILES / name).read_text())
    assert main([str(raw), str(log), "--variant", str(variant), "--profile", str(copy)]) == 0
    assert json.loads(copy.read_text())["prefill"] == _profile(name)["prefill"]


# what a profile's raw/command/notes name: a repo-rooted file or folder, or a raw file relative to its raw folder; a name
# right after an archive's (`logs-r1.tar.xz r1/x.log`, `layers.tar: gpu0/x.json`, `tar xJf a.tar.xz -C /tmp r1/x.log`) is a
# member of that archive
_AFTER_ARCHIVE = re.compile(r":?\s+(?:-C \S+\s+)?")
_REPO_ROOTS = ("benchmarks/", "scripts/", "orchestrator/", "configs/", "models/")
_NAMED = re.compile(r"(?<![\w./<-])((?:%s)(?:[\w.-]+/)*[\w.-]*|(?:[\w.-]+/)*[\w.-]+\.(?:json|log|txt|tar|xz)\b)"
                    % "|".join(_REPO_ROOTS))


def _named_files(profile: dict) -> list[tuple[str, str | None]]:
    """(path, archive member or None) for every file the profile's own text names."""
    named: list[tuple[str, str | None]] = []
    for text in [profile.get("raw", ""), profile.get("command", ""), *profile.get("notes", [])]:
        matches = list(_NAMED.finditer(text))
        for i, m in enumerate(matches):
            previous = matches[i - 1] if i else None
            if (previous and previous[1].endswith((".tar", ".tar.xz"))
                    and _AFTER_ARCHIVE.fullmatch(text, previous.end(), m.start())):
                named[-1] = (named[-1][0], m[1])
            elif not m[1].startswith("/"):
                named.append((m[1], None))
    return named


@pytest.mark.parametrize("name", sorted(p.name for p in PROFILES.glob("*.json")))
def test_every_raw_file_a_profile_names_is_in_the_tree(name: str) -> None:
    """Its notes' commands and sources name files as committed (`.json.xz`, not the `.json` the device wrote), so they
    run and open as written; an archive member named after its archive is in that archive."""
    profile = _profile(name)
    raw_dir = ROOT / profile["raw"]
    named = _named_files(profile)
    assert named, name
    for path, member in named:
        where = ROOT / path if path.startswith(_REPO_ROOTS) else raw_dir / path
        assert where.exists(), f"{name} names {path}: no {where.relative_to(ROOT)}"
        if member is not None:
            with tarfile.open(where) as tar:
                assert member in tar.getnames(), f"{name} names {member} in {path}: not a member"


@pytest.mark.parametrize("name", sorted(p.name for p in PROFILES.glob("*-lease*.json")))
def test_a_lease_s_profile_is_named_for_that_lease_only(name: str) -> None:
    """The lease in the file name is the one in the profile's and its model's names (lease 12's H100 counts were
    once named lease11, layer_probe.sh's label for its Qwen3 servers)."""
    (lease,) = re.findall(r"-(lease\d+)\.json$", name)
    profile = _profile(name)
    for label in (profile["name"], profile["model"]["name"]):
        assert re.findall(r"lease\d+", label) == [lease], (name, label)
