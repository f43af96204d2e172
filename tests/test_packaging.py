"""The distribution installs one top-level package, ``baechi`` (issue 12, item 4).

The design card keeps ``client/``, ``service/`` and ``worker/`` at the top of the repository;
they install and import as ``baechi.client``, ``baechi.service`` and ``baechi.worker`` so a
training script with its own ``client.py`` never imports ours by mistake, or breaks ours.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_holds_only_the_baechi_package(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
         "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True,
    )
    (wheel,) = tmp_path.glob("baechi-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.startswith("baechi-")}
    assert tops == {"baechi"}
    for package in ("client", "service", "service/routes", "worker"):
        assert f"baechi/{package}/__init__.py" in names
    top_level = next(n for n in names if n.endswith("top_level.txt"))
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["baechi"]


def test_a_users_own_client_module_does_not_collide(tmp_path: Path) -> None:
    for name in ("client", "service", "worker"):
        (tmp_path / f"{name}.py").write_text(f"WHO = 'the user\\'s {name}'\n")
    code = (
        "import client, service, worker\n"
        "from baechi import client as ours\n"
        "import baechi.service.cli, baechi.worker.runner\n"
        "assert client.WHO == \"the user's client\", client.WHO\n"
        "assert service.WHO == \"the user's service\" and worker.WHO == \"the user's worker\"\n"
        "assert hasattr(ours, 'BaechiClient') and ours.__name__ == 'baechi.client'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
