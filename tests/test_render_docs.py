"""The generated regions of README.md and docs/ say what their sources say now (benchmarks/render_docs.py).

A model change that moves a figure, or a raw file replaced under a page, fails here until the page is
regenerated with `.venv/bin/python benchmarks/render_docs.py` and the diff committed.
"""

from __future__ import annotations

import difflib

import pytest

from benchmarks import render_docs


def test_committed_docs_are_what_their_sources_render_now() -> None:
    changed = render_docs.differences()
    diff = "".join(
        line
        for page, (committed, rendered) in changed.items()
        for line in difflib.unified_diff(committed.splitlines(True), rendered.splitlines(True),
                                         f"{page.name} (committed)", f"{page.name} (rendered now)", n=1)
    )
    assert not changed, (f"{len(changed)} page(s) differ from what their sources render now; regenerate with "
                         f"`{render_docs.FIX}` and commit the diff:\n{diff[:6000]}")


def test_every_renderer_has_a_region_and_every_region_a_renderer() -> None:
    used = {m["name"] for page in render_docs.PAGES for m in render_docs.REGION.finditer(page.read_text())}
    assert used == set(render_docs.RENDERERS), (sorted(used - set(render_docs.RENDERERS)),
                                                sorted(set(render_docs.RENDERERS) - used))


def test_only_the_region_changes(monkeypatch) -> None:
    monkeypatch.setitem(render_docs.RENDERERS, "demo", lambda: "| a | 2 |")
    page = "intro 1\n<!-- render:demo -->\n| a | 1 |\n<!-- /render:demo -->\nafter 1\n"
    assert render_docs.render_page(page, {}) == "intro 1\n<!-- render:demo -->\n| a | 2 |\n<!-- /render:demo -->\nafter 1\n"


@pytest.mark.parametrize("page, complaint", [
    ("<!-- render:demo -->\nno end\n", "unclosed"),
    ("<!-- render:nothing-renders-this -->\nx\n<!-- /render:nothing-renders-this -->\n", "no such renderer"),
])
def test_a_broken_region_is_an_error_not_a_silent_pass(page: str, complaint: str) -> None:
    with pytest.raises((KeyError, ValueError), match=complaint):
        render_docs.render_page(page, {})


def test_volatile_text_is_normalised() -> None:
    text = f"{render_docs.ROOT}/configs/x.yaml, 0.2 s of CPU  \n"
    assert render_docs.normalise(text) == "configs/x.yaml, … s of CPU"


def test_planning_examples_are_what_the_planner_prints_now() -> None:
    """docs/planning.md renders its examples from recorded raw files; the ones cheap to recompute (plan without
    --search, compare: seconds) must still be what the tool prints, or a planner change would leave the page's
    figures silently stale. The four searches are not recomputed here (minutes of CPU on the CI box)."""
    drift = render_docs.planning_drift()
    diff = "".join(
        line
        for name, (recorded, now) in drift.items()
        for line in difflib.unified_diff(recorded.splitlines(True), now.splitlines(True),
                                         f"{name}.txt (recorded)", f"{name} (printed now)", n=0)
    )
    assert not drift, ("the planner now prints other figures than benchmarks/results/"
                       f"{render_docs.PLANNING_EXAMPLES}/ holds: re-run its run.sh (as its manifest.json says), then "
                       f"`{render_docs.FIX}`, and update docs/planning.md's prose around the changed figures:\n{diff[:6000]}")


BEST_OUTPUT = """error band: ±21% on out-of-sample runs (MAPE of 20 full runs never fitted on; worst +50%); single-server points
  by the prediction's class (each row's range uses its own): eager ±23% over 15 out-of-sample runs with eager decode stretches (worst +50%); graphed ±13% over 5 out-of-sample runs without eager decode stretches (worst +19%)
 # layout + knobs                                             total tok/s      band (class) vs 10,848  run s total s  deadline  eager steps
 1 agg 1AxTP8xPP2DP2-attn                                          20,858   18,387-24,097       1.92x   48.7     286  VALID     0% (graphed, ±13%)
 2 agg 1AxTP8xPP2 mem=0.92                                         15,641   12,703-20,347       1.44x   64.9     302  VALID     7% (eager, ±23%)
TP16 as shipped on the same batch: 8,804 total tok/s
"""


def _best_folder(tmp_path, monkeypatch, output: str) -> None:
    folder = tmp_path / render_docs.BEST_COMPLIANT
    folder.mkdir()
    (folder / "output.txt").write_text(output)
    (folder / "manifest.json").write_text('{"git_commit": "3fbbb3d0114b5bce5946af080d2fd55db2cbc2c5"}')
    monkeypatch.setattr(render_docs, "RESULTS", tmp_path)


def test_the_best_compliant_sentence_quotes_the_top_row_with_its_own_class_band_and_the_whole_band(tmp_path,
                                                                                                   monkeypatch) -> None:
    _best_folder(tmp_path, monkeypatch, BEST_OUTPUT)
    text = render_docs.best_compliant_h100()
    assert "`agg 1AxTP8xPP2DP2-attn`, **20,858 total tok/s**, 18,387-24,097" in text
    assert "(±13 % over 5 runs without eager decode stretches, worst +19 %)" in text  # graphed: the top row's class
    assert "×1.92 the published best 10,848" in text and "±21 % over 20 full runs (worst +50 %)" in text
    assert "TP16 as shipped: 8,804" in text and "at 3fbbb3d" in text
    # the same output with the top row eager takes the eager class's band
    (tmp_path / "eager").mkdir()
    _best_folder(tmp_path / "eager", monkeypatch, BEST_OUTPUT.replace("0% (graphed, ±13%)", "7% (eager, ±23%)"))
    assert "(±23 % over 15 runs with eager decode stretches, worst +50 %)" in render_docs.best_compliant_h100()


def test_a_best_compliant_output_without_its_band_is_an_error_not_a_stale_sentence(tmp_path, monkeypatch) -> None:
    _best_folder(tmp_path, monkeypatch, "\n".join(line for line in BEST_OUTPUT.splitlines() if "by the prediction's" not in line))
    with pytest.raises(ValueError, match="no best row, band, class band or TP16 line"):
        render_docs.best_compliant_h100()


@pytest.mark.slow  # 16 s of CPU and more (the search); the whole suite, CI's, runs it
def test_the_best_compliant_prediction_the_docs_quote_is_what_the_planner_predicts_now(monkeypatch, capsys) -> None:
    """README, contest.md and fidelity.md quote the best compliant 2x8 H100 layout from a recorded output of
    benchmarks/best_compliant_layout.py; a planner change that moves what they quote (the top row, its band, TP16)
    fails here until that output is recorded again."""
    import sys

    from benchmarks import best_compliant_layout

    monkeypatch.setattr(sys, "argv", ["best_compliant_layout.py"])
    best_compliant_layout.main()
    now = render_docs.best_compliant_sentence(capsys.readouterr().out, "now")
    recorded = render_docs.best_compliant_sentence(
        (render_docs.RESULTS / render_docs.BEST_COMPLIANT / "output.txt").read_text(), "now")
    assert now == recorded, (
        f"the planner now predicts\n  {now}\nwhere the docs quote\n  {recorded}\nrecord it again: .venv/bin/python "
        "benchmarks/manifest.py record --out benchmarks/results/<date>-best-compliant-h100-<slug> --stdout output.txt -- "
        ".venv/bin/python benchmarks/best_compliant_layout.py, set render_docs.BEST_COMPLIANT to that folder and run "
        f"{render_docs.FIX}")
