"""The layering stays true: no import from a lower stage to a higher one, no import circle, no oversized module.

Imports are read with `ast`: every import statement, absolute or relative, also inside functions and under
`if TYPE_CHECKING:` (a type-only back-reference still ties two modules into one), so neither a lazy import nor a
type-only one can hide a dependency. The layer order is the data path's, lowest first.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("orchestrator", "deployments")

# Lowest first; a module may import only from its own layer or lower ones.
LAYERS: list[set[str]] = [
    {"orchestrator", "records", "phases", "process", "provenance", "stats", "tables", "compressed"},
    {"config", "rules"},
    {"perfmodel"},
    {"api", "workload"},
    {"cluster", "transfer"},
    {"engines"},
    {"plan"},
    {"observe"},
    {"router", "deployments"},  # deployments: the thin Ray Serve classes around engines and router
    {"run", "calibrate"},
    {"cli", "__main__"},
]
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}
MAX_MODULE_LINES = 450
MAX_MODULES_PER_FOLDER = 12


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imported(source: str, module: str, known: dict[str, Path] | set[str], is_package: bool = False) -> set[str]:
    """Our modules that `source` (module `module`) imports: a `from pkg import name` of a submodule counts as that
    submodule; `from . import x` / `from .x import y` resolve against the module's package."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] in PACKAGES)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] in PACKAGES:
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    found.add(sub if sub in known else base)
    return found


def stage(module: str) -> str:
    """The package a module belongs to: `orchestrator.run.bench` -> run, `deployments.worker` -> deployments."""
    parts = module.split(".")
    if parts[0] == "deployments":
        return "deployments"
    return parts[1] if len(parts) > 1 else "orchestrator"


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: {i for i in imported(p.read_text(), m, known, p.name == "__init__.py") if i != m}
            for m, p in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return out


def test_every_package_has_a_layer():
    unplaced = sorted({stage(m) for m in modules()} - set(LAYER_OF))
    assert not unplaced, f"packages without a layer in tests/test_layering.py LAYERS: {unplaced}"


def test_the_readme_layout_table_names_every_package_in_its_layer():
    """README's "Layout" table: row n lists exactly the packages and top-level modules of LAYERS[n - 1]."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("\n## Layout\n"):]
    rows = re.findall(r"^\| (\d+) \| ([^|]+) \|", section, flags=re.M)
    listed = {int(n): {name.removesuffix("/").removesuffix(".py") for name in re.findall(r"`([^`]+)`", names)}
              for n, names in rows}
    expected = {i + 1: names - {"orchestrator", "__main__"} for i, names in enumerate(LAYERS)}
    assert listed == expected, f"README.md layout table vs tests/test_layering.py LAYERS: {listed} != {expected}"
    on_disk = {stage(m) for m in modules()} - {"orchestrator", "__main__"}
    assert on_disk == set().union(*listed.values()), f"packages on disk vs the README table: {sorted(on_disk)}"


def test_no_import_from_a_lower_layer_to_a_higher_one():
    upward = []
    for module, targets in graph().items():
        for target in targets:
            src, dst = stage(module), stage(target)
            if LAYER_OF.get(dst, -1) > LAYER_OF.get(src, len(LAYERS)):
                upward.append(f"{module} ({src}, layer {LAYER_OF[src]}) imports {target} ({dst}, layer {LAYER_OF[dst]})")
    assert not upward, "imports against the layer order:\n" + "\n".join(sorted(upward))


def test_no_import_circle_between_packages():
    edges: dict[str, set[str]] = defaultdict(set)
    for module, targets in graph().items():
        edges[stage(module)].update(stage(t) for t in targets if stage(t) != stage(module))
    assert not cycles(edges), f"packages importing each other: {cycles(edges)}"


def test_no_import_circle_between_modules():
    assert not cycles(graph()), f"modules importing each other: {cycles(graph())}"


def test_the_import_reader_sees_every_kind_of_import():
    """Relative, function-local and type-only imports are edges; so a circle made of them fails the test above."""
    known = {"orchestrator.router.dispatch", "orchestrator.router.relay", "orchestrator.router.pairs",
             "orchestrator.config.schema"}
    source = ("from typing import TYPE_CHECKING\nfrom . import pairs\nfrom .dispatch import PDDispatcher\n"
              "if TYPE_CHECKING:\n    from orchestrator.config.schema import RunConfig\n"
              "def f():\n    import orchestrator.router.relay\n")
    assert imported(source, "orchestrator.router.relay", known) == {
        "orchestrator.router.pairs", "orchestrator.router.dispatch", "orchestrator.config.schema",
        "orchestrator.router.relay"}
    assert imported("from .. import config\n", "orchestrator.router", {"orchestrator.config"}, is_package=True) == {
        "orchestrator.config"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_over_the_size_limit():
    long = {m: n for m, p in modules().items() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split along their jobs): {long}"


def test_no_folder_over_the_module_limit():
    per_folder: dict[Path, int] = defaultdict(int)
    for path in modules().values():
        if path.name != "__init__.py":
            per_folder[path.parent.relative_to(REPO)] += 1
    crowded = {str(f): n for f, n in per_folder.items() if n > MAX_MODULES_PER_FOLDER}
    assert not crowded, f"folders over {MAX_MODULES_PER_FOLDER} modules (make a sub-package): {crowded}"


def test_a_benchmark_script_is_imported_by_its_package_name():
    """`from benchmarks.startup import ...` (the repository root on sys.path), never a bare `import startup` that needs
    benchmarks/ on sys.path: mypy cannot resolve the bare name, so the dependency goes unchecked (typed Any). Sibling
    scripts, scripts/ and the tests alike."""
    folder = REPO / "benchmarks"
    siblings = {p.stem for p in folder.glob("*.py")}
    bare = []
    for path in sorted(folder.glob("*.py")) + sorted((REPO / "scripts").rglob("*.py")) + sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            bare += [f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] in siblings]
    assert not bare, f"bare imports of benchmark scripts (write `from benchmarks.NAME import ...`): {bare}"


# ---- tests: shared code lives in support modules and conftest.py files, never in another test module ----

# Plain helpers shared on purpose; fixtures go in a conftest.py, where pytest finds them without an import.
TEST_SUPPORT_MODULES = {"tests.support", "tests.faultcheck", "tests.multihost.benchjob", "tests.multihost.lab"}


def imported_test_modules(source: str, module: str) -> set[str]:
    """The modules under tests/ that `source` (module `module`, e.g. tests.router.test_x) imports: absolute or
    relative imports, also inside functions."""
    package = module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "tests")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "tests":
                continue
            for a in node.names:  # `from tests import support` imports the module tests.support
                sub = f"{base}.{a.name}"
                found.add(sub if (REPO / Path(*sub.split("."))).with_suffix(".py").exists() else base)
    return found


def test_no_test_module_imports_another_test_module():
    crossing = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        for target in sorted(imported_test_modules(path.read_text(), module) - TEST_SUPPORT_MODULES - {"tests"}):
            crossing.append(f"{path.relative_to(REPO)} imports {target}")
    assert not crossing, ("move what is shared into tests/support.py (helpers) or a conftest.py (fixtures, no "
                          "import needed):\n" + "\n".join(crossing))


def test_the_test_import_check_sees_what_it_must():
    """Absolute, relative and function-local imports of test modules and conftests are all seen."""
    source = ("from tests.router.test_pd_dispatch import x\nfrom . import test_routing\n"
              "def f():\n    import tests.conftest\nfrom tests import support\nfrom tests.support import sim_config\n")
    assert imported_test_modules(source, "tests.router.test_probe") == {
        "tests.router.test_pd_dispatch", "tests.router.test_routing", "tests.conftest", "tests.support"}


def test_no_module_imports_another_module_s_private_name():
    """A name another module needs is public there (SimRequest, not _Request): `from orchestrator.x import _y` in the
    product ties two modules by what one of them calls an internal detail (tests may reach in; the product may not)."""
    private = []
    for module, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] in PACKAGES):
                private += [f"{module}: from {'.' * node.level}{node.module or ''} import {a.name}" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
    assert not private, "private names imported across modules (make them public where they live):\n" + "\n".join(private)
