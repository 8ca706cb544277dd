"""Hot-path imports and module layering, checked on the sources (ast) and in fresh
interpreters, so that a convenient import cannot slow every job's prolog down."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "slurm_gpu_eff"
HEAVY = ("sqlite_utils", "jinja2", "click")


def modules() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path) -> set[str]:
    """Absolute names of everything `name` imports (relative imports resolved), plus
    importlib.import_module("x") / __import__("x") calls with a literal name."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.add(node.args[0].value)
    return found


def test_the_import_scanner_sees_relative_and_dynamic_imports(tmp_path: Path) -> None:
    found = imports("slurm_gpu_eff.node.gpu", PACKAGE / "node" / "gpu.py")
    assert {"slurm_gpu_eff.config", "pynvml", "ctypes"} <= found
    dynamic = tmp_path / "dyn.py"
    dynamic.write_text("import importlib\nimportlib.import_module('pynvml')\n__import__('jinja2')\n")
    assert {"pynvml", "jinja2"} <= imports("slurm_gpu_eff.dyn", dynamic)
    assert "slurm_gpu_eff.config" in imports("slurm_gpu_eff.sim.cli", PACKAGE / "sim" / "cli.py")
    assert len(modules()) >= 20


def test_nothing_imports_the_cli() -> None:
    offenders = {
        name for name, path in modules().items()
        if name != "slurm_gpu_eff.cli" and "slurm_gpu_eff.cli" in imports(name, path)
    }
    assert offenders == set()


FACES = ("slurm_gpu_eff.cli", "slurm_gpu_eff.mail", "slurm_gpu_eff.doctor")


def face_of(name: str) -> str | None:
    return next((f for f in FACES if name == f or name.startswith(f + ".")), None)


def lower_to_face(graph: dict[str, set[str]]) -> set[str]:
    """Imports that point up to a face, or across from one face to another: the faces
    (gpueff, gpueff-mail, gpueff doctor) stand side by side on top, each on the layers
    below; only the CLI starts doctor (`gpueff doctor` is its command)."""
    return {f"{name} -> {dep}" for name, deps in graph.items() for dep in deps
            if face_of(dep) not in (None, face_of(name))
            and (face_of(name), face_of(dep)) != ("slurm_gpu_eff.cli", "slurm_gpu_eff.doctor")}


def test_no_layer_below_imports_a_face_nor_one_face_another() -> None:
    assert lower_to_face(package_graph()) == set()
    # the rule sees both kinds of arrow
    assert lower_to_face({"slurm_gpu_eff.report.job": {"slurm_gpu_eff.doctor.base"},
                          "slurm_gpu_eff.mail.prog": {"slurm_gpu_eff.doctor"},
                          "slurm_gpu_eff.doctor.notes": {"slurm_gpu_eff.doctor.base"},
                          "slurm_gpu_eff.cli": {"slurm_gpu_eff.doctor", "slurm_gpu_eff.mail.idle"}}) == {
        "slurm_gpu_eff.cli -> slurm_gpu_eff.mail.idle",
        "slurm_gpu_eff.report.job -> slurm_gpu_eff.doctor.base",
        "slurm_gpu_eff.mail.prog -> slurm_gpu_eff.doctor"}


def test_no_module_of_the_package_imports_the_simulator() -> None:
    """The simulated GPUs live below pynvml (the stand-in library) and in the in-job
    workload; the code a site runs never reaches for them."""
    users = {
        name for name, path in modules().items() if not name.startswith("slurm_gpu_eff.sim")
        and any(i.startswith("slurm_gpu_eff.sim") for i in imports(name, path))
    }
    assert users == set()


def test_only_gpu_py_imports_pynvml() -> None:
    users = {
        str(path.relative_to(PACKAGE.parent)) for name, path in modules().items()
        if any(i == "pynvml" or i.startswith("pynvml.") for i in imports(name, path))
    }
    assert users == {"slurm_gpu_eff/node/gpu.py"}


def package_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a `from x import name` counts as x)."""
    names = modules()
    return {
        name: {i for i in imports(name, path) if i in names and i != name}
        for name, path in names.items()
    }


def test_there_are_no_import_cycles() -> None:
    graph = package_graph()
    cycles = []
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    cycles.append(" -> ".join(path + [nxt]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    assert cycles == []


# What runs on a node may lean on the ground modules, never on the accounting, store or
# report code (their imports are slow, and a node must work when they break). Of the
# Slurm access layer, only its command runner (the orphan watch's one question).
NODE_MAY_USE = {"slurm_gpu_eff", "slurm_gpu_eff.errors", "slurm_gpu_eff.model", "slurm_gpu_eff.config",
                "slurm_gpu_eff.hostlist", "slurm_gpu_eff.slurm", "slurm_gpu_eff.slurm.run"}


def test_node_modules_use_only_node_and_ground_modules() -> None:
    graph = package_graph()
    outside = {
        f"{name} -> {dep}" for name, deps in graph.items() if name.startswith("slurm_gpu_eff.node")
        for dep in deps if not dep.startswith("slurm_gpu_eff.node") and dep not in NODE_MAY_USE
    }
    assert outside == set()


def test_model_and_errors_import_only_the_standard_library() -> None:
    for name in ("slurm_gpu_eff.model", "slurm_gpu_eff.errors", "slurm_gpu_eff.node.stats",
                 "slurm_gpu_eff.slurm", "slurm_gpu_eff.slurm.run", "slurm_gpu_eff.slurm.sacct"):
        outside = {
            i for i in imports(name, modules()[name])
            if i.split(".")[0] not in sys.stdlib_module_names
            and not i.startswith(("slurm_gpu_eff.errors", "__future__"))
        }
        assert outside == set(), name


def loaded_after(code: str) -> dict[str, bool]:
    """Run `code` in a fresh isolated interpreter; which heavy modules got loaded."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
    done = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "module", ["slurm_gpu_eff.node.hooks", "slurm_gpu_eff.node.sampler", "slurm_gpu_eff.node.gpu",
               "slurm_gpu_eff.node.gpustats", "slurm_gpu_eff.node.live", "slurm_gpu_eff.node.orphan",
               "slurm_gpu_eff.node.samples"],
)
def test_hot_path_imports_stay_light(module: str) -> None:
    assert loaded_after(f"import {module}") == dict.fromkeys(HEAVY, False)


def test_all_hot_paths_together_and_a_gpu_session_stay_light(tmp_path: Path) -> None:
    """The sampler's whole GPU path, the real pynvml over the stand-in library included."""
    from tests import standin
    from tests.configfile import write_config

    devices = tmp_path / "devices.json"
    devices.write_text('{"n": [{"minor": 0, "uuid": "GPU-0"}]}')
    write_config(tmp_path / "gpueff.toml", {"gpu": {"library": standin.library_path()},
                                            "sim": {"devices": str(devices), "state_dir": str(tmp_path)}})
    code = (
        "import os\n"
        f"os.environ.update(GPUEFF_CONFIG={str(tmp_path / 'gpueff.toml')!r}, SLURMD_NODENAME='n')\n"
        "import slurm_gpu_eff.node.hooks, slurm_gpu_eff.node.sampler, slurm_gpu_eff.node.gpu\n"
        "from slurm_gpu_eff.config import load_config\n"
        "from slurm_gpu_eff.node.gpu import GpuSession\n"
        "s = GpuSession(load_config())\n"
        "assert [g.minor for g in s.bind([0])] == [0]\n"
        f"assert {standin.library_path()!r} in open('/proc/self/maps').read()\n"
    )
    assert loaded_after(code) == dict.fromkeys(HEAVY, False)


def test_the_probe_would_notice_a_heavy_import() -> None:
    assert loaded_after("import slurm_gpu_eff.report.render")["jinja2"] is True
    assert loaded_after("import slurm_gpu_eff.store.sqlite_schema")["sqlite_utils"] is True
