"""The distribution installs one top-level package, ``baechi`` (issue 12, item 4).

The design card keeps ``client/``, ``service/`` and ``worker/`` at the top of the repository;
they install and import as ``baechi.client``, ``baechi.service`` and ``baechi.worker`` so a
training script with its own ``client.py`` never imports ours by mistake, or breaks ours.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
USERS_OWN = ("client", "service", "worker")
IMPORTS = (
    "import client, service, worker\n"
    "from baechi import client as ours\n"
    "import baechi.service.app, baechi.worker.runner, baechi.worker.tasks, baechi.jobs.store\n"
    "assert client.WHO == \"the user's client\", client.WHO\n"
    "assert service.WHO == \"the user's service\" and worker.WHO == \"the user's worker\"\n"
    "assert hasattr(ours, 'BaechiClient') and ours.__name__ == 'baechi.client'\n"
    "import baechi; print(baechi.__file__)\n"
)


def _users_directory(path: Path) -> Path:
    path.mkdir(exist_ok=True)
    for name in USERS_OWN:
        (path / f"{name}.py").write_text(f"WHO = 'the user\\'s {name}'\n")
    return path


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
        check=True, capture_output=True,
    )
    (built,) = out.glob("baechi-*.whl")
    return built


def test_wheel_holds_only_the_baechi_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.startswith("baechi-")}
    assert tops == {"baechi"}
    for package in ("client", "jobs", "service", "service/routes", "worker"):
        assert f"baechi/{package}/__init__.py" in names
    top_level = next(n for n in names if n.endswith("top_level.txt"))
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["baechi"]


def test_a_users_own_client_module_does_not_collide(tmp_path: Path) -> None:
    """The editable install (this checkout)."""
    result = subprocess.run([sys.executable, "-c", IMPORTS], cwd=_users_directory(tmp_path),
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(ROOT / "baechi" / "__init__.py")


def test_the_installed_wheel_imports_and_does_not_collide(wheel: Path, tmp_path: Path) -> None:
    """The wheel, installed into a fresh venv (its dependencies are this venv's packages,
    reached through a .pth line, which loads none of this venv's own .pth files and so not
    the editable install)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site,
                    str(wheel)], check=True, capture_output=True)
    Path(site, "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    users = _users_directory(tmp_path / "work")
    result = subprocess.run([str(python), "-c", IMPORTS], cwd=users, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(Path(site, "baechi", "__init__.py"))
    verbs = subprocess.run([str(python), "-c", "import sys; from baechi.cli import main; "
                            "sys.argv = ['baechi', '--help']; main()"],
                           cwd=users, capture_output=True, text=True)
    assert verbs.returncode == 0, verbs.stderr
    for verb in ("serve", "worker"):
        assert verb in verbs.stdout


def test_one_engine_module_does_not_load_every_placer() -> None:
    """``baechi.place`` loads on first use (issue 12, item 3): the reduction pipeline alone
    imports no placer, and ``baechi.place`` still answers."""
    code = ("import sys, baechi.pipeline\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('baechi.algorithms.'))\n"
            "assert not loaded, loaded\n"
            "import baechi\n"
            "assert baechi.place.__module__ == 'baechi.api'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def _imported_modules(folder: Path) -> set[str]:
    """Every module a folder's Python files import (absolute imports, at any depth)."""
    import ast

    found: set[str] = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


@pytest.mark.parametrize(("folder", "other"), [("service", "worker"), ("worker", "service")])
def test_service_and_worker_share_only_the_job_contract(folder: str, other: str) -> None:
    """Issue 12, item 6: both import ``baechi.jobs``, neither imports the other."""
    imported = _imported_modules(ROOT / folder)
    assert not {m for m in imported if m.split(".")[:2] == ["baechi", other]}
    assert any(m.startswith("baechi.jobs") for m in imported)
