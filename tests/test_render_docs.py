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
