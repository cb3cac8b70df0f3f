"""The house's layering, enforced: engine <- models <- chat, bench <- cli, tui.

Every import in every module (function-level ones too) is checked against the layer it may
use, and commands that only read the catalog or the history must not load MLX.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ALLOWED: dict[str, set[str]] = {
    "engine": {"engine"},
    "models": {"engine", "models"},
    "prefix": {"engine", "models", "prefix"},
    "chat": {"engine", "models", "prefix", "chat"},
    "bench": {"engine", "models", "prefix", "bench"},
    "serve": {"engine", "models", "prefix", "chat", "serve"},
    "tune": {"engine", "models", "prefix", "chat", "tune"},
    "tui": {"engine", "models", "prefix", "chat", "tui"},
    "cli": {"engine", "models", "prefix", "chat", "bench", "serve", "tune", "cli", "tui"},
}
"""The layers each layer may import from (itself included)."""
UI_LIBRARIES = {"textual"}
"""Only the TUI (and the CLI that starts it) may import these."""


def layer_of(module: str) -> str | None:
    """'macspec.engine.generate.loop' -> 'engine'; 'tui.app' -> 'tui'; leaf modules -> None."""
    parts = module.split(".")
    if parts[0] == "tui":
        return "tui"
    if parts[0] != "macspec" or len(parts) == 1:
        return None
    if parts[1] == "__main__":
        return "cli"
    # Subpackages are layers; the package's own leaf modules (errors, _lazy) serve them all.
    return parts[1] if (ROOT / "macspec" / parts[1]).is_dir() else None


def imported_modules(source: str, module: str) -> list[str]:
    """Every module a source imports, relative imports resolved against `module`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: -node.level]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            # `from macspec.chat import store` names the submodule macspec.chat.store.
            found += [name] + [f"{name}.{alias.name}" for alias in node.names]
    return found


def violations(source: str, module: str) -> list[str]:
    """Imports of `module` that break the layering."""
    own = layer_of(module)
    if own is None:
        return []
    bad = []
    for imported in imported_modules(source, module):
        top = imported.split(".")[0]
        if top in UI_LIBRARIES and own not in {"tui", "cli"}:
            bad.append(f"{module} imports {imported} (UI library outside tui/cli)")
        if top not in {"macspec", "tui"}:
            continue
        layer = layer_of(imported)
        if layer is not None and layer not in ALLOWED[own]:
            bad.append(f"{module} ({own}) imports {imported} ({layer})")
    return bad


def project_modules() -> list[tuple[str, Path]]:
    modules = []
    for package in ("macspec", "tui"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules.append((".".join(parts), path))
    return modules


def test_every_module_is_in_a_known_layer() -> None:
    for module, _ in project_modules():
        layer = layer_of(module)
        assert layer is None or layer in ALLOWED, f"{module}: unknown layer {layer!r}"


def test_no_module_imports_a_layer_above_it() -> None:
    bad = [v for module, path in project_modules() for v in violations(path.read_text(), module)]
    assert bad == []


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("macspec.engine.generate.loop", "from macspec.chat import store"),
        ("macspec.engine.core.stats", "import macspec.models.catalog"),
        ("macspec.models.loader", "def f():\n    from macspec.bench.runner import run_bench"),
        ("macspec.chat.session", "from macspec.bench import figures"),
        ("macspec.chat.session", "from macspec.cli.app import fail"),
        ("tui.app", "from macspec.cli import run"),
        ("macspec.engine.generate.loop", "import textual.app"),
        ("macspec.engine.drafters.model", "from ...models import hub"),
    ],
)
def test_a_forbidden_import_is_caught(module: str, source: str) -> None:
    assert violations(source, module)


def test_allowed_imports_pass() -> None:
    assert not violations("from macspec.engine.core.events import Done", "macspec.chat.session")
    assert not violations("from macspec.errors import MacspecError", "macspec.engine.generate.loop")
    assert not violations("from tui.factory import make_app", "macspec.cli.chat")


LIGHT_COMMANDS = [
    ["--help"],
    ["models", "--json"],
    ["history"],
    ["rm", "--help"],
    ["pull", "--help"],
    ["serve", "--help"],
    ["tune", "--help"],
]


@pytest.mark.parametrize("argv", LIGHT_COMMANDS, ids=" ".join)
def test_light_commands_do_not_load_mlx(argv: list[str], tmp_path: Path) -> None:
    """`macspec --help`, `models`, `history`, `rm`, `pull`, `serve --help` and `tune --help`
    start without MLX, mlx-lm, Textual or the server's stack."""
    code = (
        "import sys\n"
        "from macspec.cli import main\n"
        f"status = main({argv!r})\n"
        "heavy = sorted(m for m in ('mlx', 'mlx_lm', 'textual', 'fastapi', 'uvicorn') "
        "if m in sys.modules)\n"
        "print('HEAVY', ','.join(heavy), 'STATUS', status)\n"
    )
    env = {"MACSPEC_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("HEAVY")]
    assert line, out.stderr
    assert line[-1] == "HEAVY  STATUS 0", out.stdout + out.stderr


def test_python_dash_m_runs_the_cli() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "macspec", "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0
    assert "Usage: macspec" in out.stdout


def test_ruff_check_and_format_are_clean() -> None:
    """CI runs the style checks too: lint findings or unformatted files fail the suite."""
    for args in (["check", "--quiet", "."], ["format", "--check", "--quiet", "."]):
        out = subprocess.run(
            [sys.executable, "-m", "ruff", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, f"ruff {' '.join(args)}:\n{out.stdout}{out.stderr}"


ENGINE_ROOMS = ["core", "caches", "drafters", "policy", "trees", "generate", "batch"]
"""The engine's sub-packages, bottom up: each may import only itself and those before it."""


def engine_room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["macspec", "engine"] and len(parts) > 2 else None


def engine_violations(source: str, module: str) -> list[str]:
    """Imports of an engine sub-package's module from a sub-package above it."""
    own = engine_room(module)
    if own is None:
        return []
    allowed = set(ENGINE_ROOMS[: ENGINE_ROOMS.index(own) + 1])
    found = []
    for imported in imported_modules(source, module):
        room = engine_room(imported)
        if imported == "macspec.engine" or (room is not None and room not in allowed):
            found.append(f"{module} ({own}) imports {imported}")
    return found


def test_every_engine_module_is_in_a_room() -> None:
    engine = ROOT / "macspec" / "engine"
    loose = [p.name for p in engine.glob("*.py") if p.name != "__init__.py"]
    assert loose == [], "modules directly in macspec/engine/ (put them in a sub-package)"
    rooms = {engine_room(m) for m, _ in project_modules()} - {None}
    assert rooms == set(ENGINE_ROOMS)


def test_engine_rooms_import_only_downward() -> None:
    bad = [
        v for module, path in project_modules() for v in engine_violations(path.read_text(), module)
    ]
    assert bad == []


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("macspec.engine.core.stats", "from macspec.engine.caches.cached import CachedModel"),
        ("macspec.engine.trees.cycle", "from macspec.engine.generate.loop import Engine"),
        ("macspec.engine.drafters.mtp", "from macspec.engine import Engine"),
        ("macspec.engine.policy.length", "def f():\n    from ..trees import sizing"),
    ],
)
def test_an_upward_engine_import_is_caught(module: str, source: str) -> None:
    assert engine_violations(source, module)


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (function-level and TYPE_CHECKING ones too)."""
    modules = {m for m, _ in project_modules()}
    graph: dict[str, set[str]] = {}
    for module, path in project_modules():
        found = set(imported_modules(path.read_text(), module)) & modules
        graph[module] = {m for m in found if m != module and not module.startswith(m + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles() -> None:
    assert circles(import_graph()) == []


def test_a_circle_is_found() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_is_over_400_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for _, p in project_modules()
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert long == {}
