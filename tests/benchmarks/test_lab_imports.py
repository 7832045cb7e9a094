"""The benchmark lab is the package ``flowrl.bench``, reached by plain imports (architecture issue item 5).

- no file under scripts/, tests/ or flowrl/ loads benchmark code by file path (``spec_from_file_location``,
  ``SourceFileLoader``, ``runpy.run_path``) or by editing ``sys.path``; a test may still put its own directory on
  sys.path for a helper module, and the lab may load ``scripts/train.py`` (the trainer's CLI, not lab code);
- scripts/benchmarks/ holds no Python any more, and every benchmark ``scripts/bench.py`` lists imports;
- the run cache's code digest reads the files that affect a run, named relative to the repository root;
- committed results in docs/benchmarks/*.json hold no absolute path.
"""
import ast
import json
from pathlib import Path

import pytest

import flowrl.bench
from flowrl.bench import learning_lib

REPO = Path(__file__).resolve().parents[2]
LOADERS = {"spec_from_file_location", "SourceFileLoader", "run_path"}
SYS_PATH_EDITS = {"insert", "append", "extend", "remove", "pop", "clear"}
# Lab files that may load a file by path: {"path": "what it loads, and why that is not benchmark code"}.
LAB_LOADS_ALLOWED = {"flowrl/bench/faults.py": "scripts/train.py, to drive the trainer's CLI in-process"}


def _is_sys_path(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
        and node.value.id == "sys"


def path_tricks(tree: ast.AST) -> list[ast.AST]:
    """Calls that load a module from a file, and statements that change ``sys.path``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name in LOADERS:
                found.append(node)
            elif isinstance(f, ast.Attribute) and f.attr in SYS_PATH_EDITS and _is_sys_path(f.value):
                found.append(node)
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_is_sys_path(t) or (isinstance(t, ast.Subscript) and _is_sys_path(t.value)) for t in targets):
                found.append(node)
    return found


def reaches(node: ast.AST, source: str, tree: ast.AST, depth: int = 3) -> str:
    """The text a loader or sys.path edit is built from: its own source plus, for every name it uses, the source
    of every assignment to that name in the file (followed ``depth`` levels)."""
    text = ast.get_source_segment(source, node) or ""
    if depth == 0:
        return text
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} - {"sys", "importlib", "Path", "str"}
    for a in ast.walk(tree):
        if isinstance(a, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names for t in a.targets):
            text += "\n" + reaches(a.value, source, tree, depth - 1)
    return text


def callers(node: ast.AST, source: str, tree: ast.AST) -> str:
    """For a trick inside a helper function (``load_path(name, path)``), what the file calls that helper with."""
    text = ""
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) and node in ast.walk(func):
            for call in ast.walk(tree):
                if isinstance(call, ast.Call) and getattr(call.func, "id", None) == func.name:
                    text += "\n" + reaches(call, source, tree)
    return text


def files() -> list[Path]:
    return [p for root in ("scripts", "tests", "flowrl") for p in sorted((REPO / root).rglob("*.py"))
            if p != Path(__file__).resolve()]


@pytest.mark.parametrize("path", files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_benchmark_code_is_loaded_by_path(path):
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    name = path.relative_to(REPO).as_posix()
    tricks = path_tricks(tree)
    if name.startswith("flowrl/bench/"):
        assert not tricks or name in LAB_LOADS_ALLOWED, \
            f"{name}: the lab imports its modules (from flowrl.bench import ...), it loads nothing by path"
        return
    bad = [ast.get_source_segment(source, t) for t in tricks
           if "bench" in (reaches(t, source, tree) + callers(t, source, tree)).lower()]
    assert not bad, f"{name}: import benchmark code from flowrl.bench instead of loading it by path: {bad}"


def test_scripts_benchmarks_holds_no_code_and_every_benchmark_imports():
    assert not list((REPO / "scripts" / "benchmarks").glob("**/*.py"))
    names = flowrl.bench.available()
    assert {"learning", "hacking", "gpu", "toy-baseline", "reliability"} <= set(names)
    for name in names:
        assert callable(flowrl.bench.load(name).main), name
    with pytest.raises(SystemExit, match="did you mean 'hacking'"):
        flowrl.bench.load("hackin")


def test_code_digest_reads_the_files_that_affect_a_run():
    digested = {p.relative_to(REPO).as_posix() for p in learning_lib.digested_files()}
    assert "flowrl/bench/learning_lib.py" in digested                   # how a recipe is trained and counted
    assert "flowrl/training/trainer.py" in digested and any(n.startswith("samplers/") for n in digested)
    assert any(n.startswith("rewards/") for n in digested)
    assert not {n for n in digested if n.startswith("flowrl/bench/")} - set(learning_lib.LAB_RUN_FILES)
    assert all(not Path(n).is_absolute() and "__pycache__" not in n for n in digested)


def test_code_digest_ignores_caches_written_at_run_time(tmp_path, monkeypatch):
    """A hidden cache beside the shipped data (the preference datasets' .latent_cache) is not code: writing one
    must not change the digest that keys cached runs."""
    pkg = tmp_path / "flowrl" / "assets"
    pkg.mkdir(parents=True)
    (pkg / "weights.bin").write_bytes(b"1234")
    monkeypatch.setattr(learning_lib, "REPO", tmp_path)
    monkeypatch.setattr(learning_lib, "LAB_RUN_FILES", ())
    before = learning_lib.digested_files(("flowrl",))
    (pkg / ".latent_cache").mkdir()
    (pkg / ".latent_cache" / "abc.pt").write_bytes(b"cached latents")
    assert learning_lib.digested_files(("flowrl",)) == before == [pkg / "weights.bin"]


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


@pytest.mark.parametrize("path", sorted((REPO / "docs" / "benchmarks").glob("*.json")), ids=lambda p: p.name)
def test_committed_results_hold_no_absolute_paths(path):
    absolute = [s for s in _strings(json.loads(path.read_text())) if s.startswith(("/", "~")) or s[1:3] == ":\\"]
    assert not absolute, f"{path.name}: paths relative to the repository root (flowrl.bench.paths.rel): {absolute}"
