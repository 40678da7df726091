"""The house stays one the next engineer can carry: the measures of issue 34, each a test that fails when it slips.

- tasks/ shows the pipeline: at most 10 entries at its top, one package per stage;
- no import cycle among the product's modules (the packages' one-way layering is `make lint`'s .importlinter);
- no product module over 600 lines, no product function over 80;
(the README as a front page is tests/unit/test_readme.py's).
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("tasks", "flows", "blocks")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _product_files() -> list[Path]:
    return sorted(p for package in PRODUCT for p in (ROOT / package).rglob("*.py"))


def test_the_tasks_folder_shows_the_pipeline_stages():
    top = sorted(p.name for p in (ROOT / "tasks").iterdir() if p.name != "__pycache__")
    assert len(top) <= 10, top
    stages = {"common", "weights", "infra", "image", "deploy", "watch", "checks", "report"}
    assert stages <= set(top), stages - set(top)
    assert not [name for name in top if name.endswith(".py") and name != "__init__.py"], "a module at the top of tasks/"


def test_no_import_cycle_among_product_modules():
    graph = grimp.build_graph(*PRODUCT, exclude_type_checking_imports=True)
    cycles = sorted(
        (module, imported)
        for module in graph.modules
        for imported in graph.find_modules_directly_imported_by(module)
        if imported != module and graph.chain_exists(importer=imported, imported=module)
    )
    assert cycles == []


def test_no_product_module_is_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in _product_files() if (n := len(p.read_text().splitlines())) > 600}
    assert long == {}


def test_no_product_function_is_over_80_lines():
    long = {}
    for path in _product_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if (lines := node.end_lineno - first + 1) > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = lines
    assert long == {}
