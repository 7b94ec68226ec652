"""The house's layers (docs/architecture.md): a module imports only from its own layer or
the layers below it, read from the code's own import statements (those inside functions
too). A new module must be given a layer here, so the table in the doc stays whole."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "vllm_offload"

# Low to high, as docs/architecture.md's table. A name is a module, or a package whose
# modules all sit in that layer.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__init__", "errors", "safe_files", "http_limits"),
    ("config", "model", "upstream", "disk_layout", "vllm_ext"),
    ("hardware", "disk_facts", "systemd", "cluster_router"),
    ("plan",),
    ("launch", "launch_spec", "launch_kv", "argv_check", "run_vllm"),
    ("deployment", "preflight", "length_advice"),
    ("box",),
    ("manager", "bench", "cli", "__main__"),
)


def layer_of(module: str) -> int:
    """``vllm_offload.a.b`` -> the layer of ``a``."""
    top = module.split(".")[1] if "." in module else "__init__"
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(
        f"vllm_offload.{top} has no layer: add it to LAYERS and to docs/architecture.md"
    )


def is_module(name: str) -> bool:
    return (PACKAGE / f"{name}.py").is_file() or (PACKAGE / name).is_dir()


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "vllm_offload":  # modules, or names of the package's face
                names |= {
                    f"vllm_offload.{a.name}" if is_module(a.name) else "vllm_offload"
                    for a in node.names
                }
            elif node.module.startswith("vllm_offload."):
                names.add(node.module)
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.startswith("vllm_offload.")}
    return names


def test_every_import_goes_down_or_across() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        module = ".".join(rel.parts)
        here = layer_of(module)
        for name in imported(path):
            if layer_of(name) > here:
                upward.append(
                    f"{module} (layer {here + 1}) imports {name} (layer {layer_of(name) + 1})"
                )
    assert not upward, "\n".join(upward)


def top_imports(path: Path) -> set[str]:
    """The first names of every absolute import in ``path`` (those inside functions too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
    return names


def test_the_checkout_s_folders_import_down_only() -> None:
    """Issue #57: four benchmarks imported tests and five tests loaded scripts by path, a
    loop no layer check saw. Now: the package imports none of the checkout's folders;
    testkit (what tests and benchmarks share) imports only the package; benchmarks import
    the package and testkit, never tests; tests import scripts as modules, not by path."""
    root = PACKAGE.parent
    above = {
        "vllm_offload": {"testkit", "benchmarks", "tests", "examples"},
        "testkit": {"benchmarks", "tests", "examples"},
        "benchmarks": {"tests"},
        "examples": {"testkit", "benchmarks", "tests"},
    }
    upward = [
        f"{path.relative_to(root)} imports {name}"
        for folder, banned in above.items()
        for path in sorted((root / folder).rglob("*.py"))
        for name in sorted(top_imports(path) & banned)
    ]
    by_path = [
        str(path.relative_to(root))
        for path in sorted((root / "tests").rglob("*.py"))
        if path != Path(__file__) and "spec_from_file_location" in path.read_text()
    ]
    assert not upward and not by_path, (upward, by_path)
