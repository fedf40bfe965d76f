"""The layers and the absence of import cycles, as `.importlinter` states them: a new cycle or an
import against the layers fails the suite (docs/architecture.md draws them)."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("webapp", "training", "agents")
MAX_WEBAPP_MODULES = 10


def lint(config: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` in its own process: it configures logging globally (disabling every logger
    that exists), which would silence the loggers later tests capture."""
    env = dict(os.environ, PYTHONPATH=str(cwd))
    return subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--config", str(config), "--no-cache"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_import_contracts_are_kept():
    result = lint(ROOT / ".importlinter", ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout and "7 kept" in result.stdout


def test_every_engine_module_stands_on_one_floor():
    """The engine's floors contract names every module of `training/`: a new module must take its
    place there (docs/architecture.md, "The engine's map"), or it would escape the layering."""
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    floors = config["importlinter:contract:engine-floors"]["layers"].split()
    named = [m for m in floors if m != "|"]
    modules = sorted(p.stem for p in (ROOT / "training").glob("*.py") if p.stem != "__init__")
    assert sorted(named) == modules
    assert len(named) == len(set(named))


def test_the_engine_finds_none_of_its_own_modules_by_name():
    """An `importlib.import_module` of a training module would hide an import from the contracts
    (the launcher once reached the trainer that way, closing a circle); plugins are found by name
    in agents/, never the engine's own modules."""
    hidden = [f"{p.relative_to(ROOT)}:{n}" for p in (ROOT / "training").glob("*.py")
              for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
              if "import_module(" in line and "training" in line]
    assert hidden == []


def test_no_two_modules_import_each_other_even_through_others():
    graph = grimp.build_graph(*PACKAGES)
    in_cycles = sorted(
        {tuple(sorted((a, b))) for a in graph.modules for b in graph.find_modules_directly_imported_by(a)
         if graph.chain_exists(importer=b, imported=a)}
    )
    assert in_cycles == []


def test_the_webapp_package_holds_only_project_files():
    direct = sorted(p.name for p in (ROOT / "webapp").glob("*.py"))
    assert len(direct) <= MAX_WEBAPP_MODULES, direct


def test_the_contracts_catch_a_cycle_and_an_upward_import(tmp_path):
    """The same contract types over a small package that breaks both: proof the check can fail."""
    pkg = tmp_path / "shop"
    for name, body in {
        "__init__.py": "",
        "core.py": "from shop import views\n",  # upward: the bottom layer imports the top one
        "views.py": "from shop import orders\n",
        "orders.py": "from shop import views\n",  # a cycle between siblings
    }.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(body)
    config = tmp_path / ".importlinter"
    config.write_text(textwrap.dedent("""
        [importlinter]
        root_package = shop

        [importlinter:contract:layers]
        name = layers
        type = layers
        containers = shop
        layers =
            views
            orders
            core

        [importlinter:contract:cycles]
        name = cycles
        type = acyclic_siblings
        ancestors = shop
    """))
    result = lint(config, tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 broken" in result.stdout


def test_the_domain_contracts_catch_a_read_calling_a_write_and_a_view_using_another_domains_view(tmp_path):
    """The real `.importlinter` contracts inside a domain, over a small `webapp` that breaks both:
    a selector that imports its domain's services, and one domain's view importing another's."""
    real = configparser.ConfigParser()
    real.read(ROOT / ".importlinter")
    domain = real["importlinter:contract:domain-layers"]
    apart = real["importlinter:contract:views-apart"]
    containers = domain["containers"].split()
    for module in {*containers, *(m.rsplit(".", 1)[0] for m in apart["modules"].split())}:
        package = tmp_path.joinpath(*module.split("."))
        package.mkdir(parents=True, exist_ok=True)
        for name in ("__init__.py", "views.py", "services.py"):
            (package / name).touch()
    (tmp_path / "webapp" / "__init__.py").touch()
    (tmp_path / "webapp" / "runs" / "selectors.py").write_text("from webapp.runs import services\n")  # a read calls a write
    (tmp_path / "webapp" / "runs" / "views.py").write_text("from webapp.artifacts import views\n")  # a view uses another's
    config = configparser.ConfigParser()
    config["importlinter"] = {"root_package": "webapp"}
    config["importlinter:contract:domain-layers"] = dict(domain)
    config["importlinter:contract:views-apart"] = dict(apart)
    with (tmp_path / ".importlinter").open("w") as out:
        config.write(out)
    result = lint(tmp_path / ".importlinter", tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 broken" in result.stdout, result.stdout
