"""Deployment: the compose file validates, the image builds what it should, the CLI behaves."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from service_fixtures import ROOT, RedisServer, free_port, needs_redis

COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"


def run(args: list[str], env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BAECHI_")}
    return subprocess.run(args, cwd=ROOT, env={**clean, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)


# -------------------------------------------------------------------------- compose
def test_compose_file_matches_the_compose_schema() -> None:
    tool = shutil.which("check-jsonschema") or str(Path(sys.executable).with_name(
        "check-jsonschema"))
    if not Path(tool).exists():
        pytest.skip("check-jsonschema is not installed (pip install check-jsonschema)")
    result = run([tool, "--builtin-schema", "vendor.compose-spec", str(COMPOSE)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_redis_is_durable_and_services_wait_for_health() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    redis = services["redis"]
    command = " ".join(redis["command"])
    assert "--appendonly yes" in command and "--maxmemory-policy noeviction" in command
    assert redis["healthcheck"]["test"]
    for name in ("api", "worker"):
        service = services[name]
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
        assert service["healthcheck"]["test"]
        assert service["build"]["dockerfile"] == "docker/Dockerfile"
        assert service["environment"]["BAECHI_REDIS_URL"] == "redis://redis:6379/0"
    # Scalable: no fixed container name or host port on the worker.
    assert "container_name" not in services["worker"]
    assert "ports" not in services["worker"]
    assert services["worker"]["command"] == ["worker"]


def test_dockerfile_installs_the_server_extra_and_runs_baechi() -> None:
    text = DOCKERFILE.read_text()
    assert '"baechi[server]"' in text
    assert 'ENTRYPOINT ["baechi"]' in text
    assert "USER baechi" in text
    for package in ("baechi", "jobs", "service", "worker"):
        assert f"COPY {package} ./{package}" in text


# ------------------------------------------------------------------------------ CLI
def test_service_and_worker_each_register_their_own_verb() -> None:
    from baechi.service.cli import cmd_serve
    from baechi.service.cli import register as register_service
    from baechi.worker.cli import cmd_worker
    from baechi.worker.cli import register as register_worker

    parser = argparse.ArgumentParser()
    verbs = parser.add_subparsers(dest="verb")
    register_service(verbs)
    register_worker(verbs)
    serve = parser.parse_args(["serve", "--host", "0.0.0.0", "--port", "9000"])
    assert (serve.func, serve.host, serve.port) == (cmd_serve, "0.0.0.0", 9000)
    worker = parser.parse_args(["worker", "--burst", "--queue", "q"])
    assert (worker.func, worker.burst, worker.queue) == (cmd_worker, True, "q")


@pytest.mark.parametrize("module", ["baechi.service.cli", "baechi.worker.cli"])
def test_cli_modules_import_nothing_heavy(module: str) -> None:
    code = (f"import sys, {module}; heavy = {{'fastapi', 'uvicorn', 'rq', 'redis'}} & "
            "set(sys.modules); print(sorted(heavy)); sys.exit(1 if heavy else 0)")
    result = run([sys.executable, "-c", code])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("side", "other"), [
    ("baechi.worker.runner, baechi.worker.tasks, baechi.worker.health, baechi.worker.cli",
     "baechi.service"),
    ("baechi.service.app, baechi.service.cli", "baechi.worker"),
])
def test_service_and_worker_share_the_job_contract_not_each_other(side: str, other: str) -> None:
    """Issue 12, item 6: both import baechi.jobs; neither imports the other."""
    code = (f"import sys, {side}; wrong = sorted(m for m in sys.modules "
            f"if m == {other!r} or m.startswith({other + '.'!r})); "
            "print(wrong); sys.exit(1 if wrong or 'baechi.jobs.store' not in sys.modules else 0)")
    result = run([sys.executable, "-c", code])
    assert result.returncode == 0, result.stdout + result.stderr


def test_serve_refuses_to_start_without_keys() -> None:
    result = run([sys.executable, "-m", "baechi.service"])
    assert result.returncode == 2
    assert "BAECHI_API_KEYS" in result.stderr and "BAECHI_ALLOW_ANONYMOUS" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("module", ["baechi.service", "baechi.worker"])
def test_unreachable_redis_is_one_line_naming_the_url(module: str) -> None:
    url = f"redis://user:secret@127.0.0.1:{free_port()}/0"
    result = run([sys.executable, "-m", module],
                 env={"BAECHI_REDIS_URL": url, "BAECHI_API_KEYS": "k"})
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert url.replace("secret", "***") in lines[0] and "secret" not in lines[0]


def test_bad_setting_is_reported() -> None:
    result = run([sys.executable, "-m", "baechi.worker"], env={"BAECHI_MAX_OPS": "many"})
    assert result.returncode == 2
    assert "BAECHI_MAX_OPS" in result.stderr


def test_api_keys_comma_separated_or_json() -> None:
    from baechi.jobs.settings import Settings

    assert Settings(api_keys="a, b,,c").api_keys == ("a", "b", "c")
    assert Settings(api_keys='["a", "b"]').api_keys == ("a", "b")
    tenants = Settings(api_keys="a,b").tenants
    assert len(set(tenants.values())) == 2
    assert not set(tenants.values()) & {"a", "b"}


@needs_redis
def test_baechi_worker_burst_and_health(redis_server: RedisServer, tmp_path: Path) -> None:
    """The real entry points: ``python -m baechi.worker --burst`` drains the queue and exits 0."""
    env = {"BAECHI_REDIS_URL": redis_server.url.rsplit("/", 1)[0] + "/4",
           "BAECHI_QUEUE_NAME": "burst-test"}
    result = run([sys.executable, "-m", "baechi.worker", "--burst"], env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    health = run([sys.executable, "-m", "baechi.worker.health"], env=env)
    assert health.returncode == 1 and "unhealthy" in health.stderr


@needs_redis
def test_anonymous_access_only_when_allowed(redis_server: RedisServer) -> None:
    from fastapi.testclient import TestClient

    from baechi.jobs.settings import Settings
    from baechi.service.app import create_app

    url = redis_server.url.rsplit("/", 1)[0] + "/6"
    assert Settings(redis_url=url).refusal() is not None
    open_app = create_app(Settings(redis_url=url, allow_anonymous=True))
    assert open_app.state.settings.refusal() is None
    with TestClient(open_app) as http:
        assert http.get("/placements").status_code == 200
    # With keys configured as well, a key-less caller is anonymous but a wrong key is refused.
    mixed = create_app(Settings(redis_url=url, allow_anonymous=True, api_keys="k"))
    with TestClient(mixed) as http:
        assert http.get("/placements").status_code == 200
        assert http.get("/placements", headers={"X-API-Key": "wrong"}).status_code == 401
