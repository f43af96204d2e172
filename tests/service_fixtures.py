"""Fixtures for tests of the service: a real redis-server and real forking RQ workers (issue 4).

Loaded by ``tests/conftest.py`` (``pytest_plugins``), so every test module can use them.
Nothing is mocked: Redis is ``/usr/bin/redis-server`` (or ``$BAECHI_REDIS_SERVER``) on a free
loopback port with its own temp dir — never the system Redis on 6379 — and the API and the
workers are subprocesses (``python -m baechi.service``, ``python -m baechi.worker``). Tests needing them are
skipped, saying so, where ``redis-server`` is missing (CI installs it).

Fixtures
--------
redis_server (session)
    :class:`RedisServer` with ``--appendonly yes``: ``.url``, ``.port``, ``.client()``,
    ``.restart()`` (graceful stop, then start on the same port and AOF), ``.stop()``,
    ``.start()``.
service (session)
    :class:`Service`: the API with keys ``key-a`` and ``key-b`` plus two workers, on
    ``redis_server``. ``.url``, ``.keys`` (name → key), ``.client(key_name)`` (an
    ``httpx.Client`` sending that key), ``.start_worker(**env)``, ``.kill_worker(worker)``,
    ``.workers``, ``.wait(pid)`` (poll until the placement ends), ``.redis``.
make_service (function)
    Factory for an isolated stack — its own redis-server, API and ``workers=N`` workers —
    for tests that stop Redis, hold or kill workers: ``make_service(workers=0, env={...})``.
    Everything it started is stopped after the test.

Helpers: :func:`chain_graph` (a small valid graph), :func:`cluster` (a count-shorthand
cluster), :func:`wait_until` (bounded polling).

Workers started here use short heartbeats (1 s + 4 s grace) and a 2 s maintenance tick, so a
killed worker's job is reaped in seconds rather than the production minute.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
REDIS_SERVER = os.environ.get("BAECHI_REDIS_SERVER") or shutil.which("redis-server") \
    or "/usr/bin/redis-server"
HAVE_REDIS = Path(REDIS_SERVER).is_file() and os.access(REDIS_SERVER, os.X_OK)
#: API keys of the test services: name → key (here the same string).
KEYS = {"key-a": "key-a", "key-b": "key-b"}
#: Settings every process of a test stack gets (on top of BAECHI_REDIS_URL).
BASE_ENV = {
    "BAECHI_API_KEYS": ",".join(KEYS.values()),
    "BAECHI_WORKER_HEARTBEAT_S": "1",
    "BAECHI_WORKER_GRACE_S": "4",
    "BAECHI_WORKER_MAINTENANCE_S": "2",
    "BAECHI_WORKER_TTL_S": "20",
    "BAECHI_MAX_BODY_BYTES": str(16 * 2**20),
    "BAECHI_MAX_OPS": "50000",
    "BAECHI_PROGRESS_INTERVAL_S": "0.2",
}
STARTUP_TIMEOUT_S = 60.0

T = TypeVar("T")

needs_redis = pytest.mark.skipif(
    not HAVE_REDIS,
    reason=f"redis-server not found at {REDIS_SERVER} (apt-get install redis-server; CI has it)",
)


def _die_with_parent() -> None:
    """Linux: SIGTERM this child when the test process dies, so no stack outlives a crash."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(predicate: Callable[[], T], timeout: float, what: str,
               interval: float = 0.05) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# ------------------------------------------------------------------------------ redis
class RedisServer:
    """A private redis-server with an append-only file in its own directory."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.dir = directory
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.log = directory / "redis.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        self.dir.mkdir(parents=True, exist_ok=True)
        args = [
            REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.dir), "--appendonly", "yes", "--appendfsync", "everysec",
            "--save", "", "--maxmemory-policy", "noeviction", "--daemonize", "no",
            "--logfile", str(self.log), "--protected-mode", "yes",
        ]
        self.proc = subprocess.Popen(args, cwd=self.dir, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        wait_until(self._pings, 20, f"redis-server on port {self.port}\n{_log_tail(self.log)}")
        return self

    def _pings(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"redis-server exited:\n{_log_tail(self.log)}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop it (SIGTERM: Redis flushes the AOF first; SIGKILL: it does not)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        """Stop gracefully and start again on the same port and data (AOF)."""
        self.stop()
        self.start()

    def client(self, db: int = 0) -> Any:
        from redis import Redis

        return Redis(host="127.0.0.1", port=self.port, db=db, socket_timeout=10)


# ------------------------------------------------------------------------- processes
class Process:
    """A subprocess of the stack with its log file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        self.killed = False  # set when a test killed it on purpose
        self._log_file = log.open("ab")
        self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=self._log_file,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=_die_with_parent)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def children(self) -> list[int]:
        """Pids whose parent is this process (a worker's work horse)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # Field 4 (ppid) follows the parenthesised command name, which may hold spaces.
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == self.pid:
                found.append(int(entry.name))
        return found

    def kill(self, sig: int = signal.SIGKILL, children: bool = True) -> None:
        """Send ``sig`` to the process (and first to its children, e.g. the work horse)."""
        self.killed = True
        if children:
            for pid in self.children():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        if self.alive:
            self.proc.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM (an RQ worker's warm shutdown), a second one (cold), then SIGKILL."""
        children = self.children()
        for _ in range(2):
            if not self.alive:
                break
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                continue
        if self.alive:
            os.killpg(self.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        for pid in children:  # a work horse runs in its own process group
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._log_file.close()

    def tail(self) -> str:
        return _log_tail(self.log)


class Service:
    """An API subprocess and its workers on one Redis."""

    def __init__(self, redis: RedisServer, directory: Path, env: dict[str, str] | None = None,
                 workers: int = 2) -> None:
        self.redis = redis
        self.dir = directory
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.keys = dict(KEYS)
        # The developer's own BAECHI_* settings must not leak into the stack under test.
        inherited = {k: v for k, v in os.environ.items()
                     if not k.startswith("BAECHI_") or k == "BAECHI_SHARED"}
        self.env = {**inherited, **BASE_ENV, "BAECHI_REDIS_URL": redis.url, **(env or {})}
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
        self.api: Process | None = None
        self.workers: list[Process] = []
        self._initial_workers = workers
        self._count = 0

    def start(self) -> Service:
        self.api = Process("api", [PYTHON, "-m", "baechi.service", "--port", str(self.port),
                                   "--log-level", "warning"],
                           self.env, self.dir / "api.log")
        for _ in range(self._initial_workers):
            self.start_worker(wait=False)
        wait_until(self._healthy, STARTUP_TIMEOUT_S, f"the API at {self.url}")
        if self._initial_workers:
            wait_until(lambda: self._ready(self._initial_workers), STARTUP_TIMEOUT_S,
                       f"{self._initial_workers} workers registered")
        return self

    def _healthy(self) -> bool:
        import httpx

        assert self.api is not None
        if not self.api.alive:
            raise AssertionError(f"the API exited:\n{self.api.tail()}")
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def _ready(self, workers: int) -> bool:
        for worker in self.workers:
            if not worker.alive and not worker.killed:
                raise AssertionError(f"worker {worker.name} exited:\n{worker.tail()}")
        return self.live_workers() >= workers

    def live_workers(self) -> int:
        import httpx

        response = httpx.get(f"{self.url}/readyz", timeout=5)
        return int(response.json().get("workers", 0)) if response.status_code == 200 else 0

    def start_worker(self, wait: bool = True, queue: str | None = None,
                     **env: str) -> Process:
        """Start one more ``python -m baechi.worker`` (``env``: extra BAECHI_* settings)."""
        self._count += 1
        name = f"w{self._count}-{self.port}"
        args = [PYTHON, "-m", "baechi.worker", "--name", name]
        if queue:
            args += ["--queue", queue]
        worker = Process(name, args, {**self.env, **env}, self.dir / f"{name}.log")
        self.workers.append(worker)
        if wait:
            expected = sum(1 for w in self.workers if w.alive)
            wait_until(lambda: self._ready(expected), STARTUP_TIMEOUT_S,
                       f"worker {name} to register")
        return worker

    def kill_worker(self, worker: Process, sig: int = signal.SIGKILL,
                    children: bool = True) -> None:
        """Kill a worker (and, by default, its work horse) with ``sig``."""
        worker.kill(sig, children=children)

    def client(self, key: str | None = "key-a", timeout: float = 60.0) -> Any:
        """An ``httpx.Client`` on the API sending the key named ``key`` (None: no key)."""
        import httpx

        headers = {"X-API-Key": self.keys[key]} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def wait(self, placement_id: str, key: str = "key-a", timeout: float = 120.0,
             statuses: tuple[str, ...] = ("finished", "failed", "canceled")) -> dict[str, Any]:
        """Poll ``GET /placements/{id}`` until its status is one of ``statuses``."""
        with self.client(key) as http:
            def done() -> dict[str, Any] | None:
                body = http.get(f"/placements/{placement_id}").json()
                return body if body.get("status") in statuses else None

            return wait_until(done, timeout, f"placement {placement_id} to reach {statuses}",
                              interval=0.1)

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        if self.api is not None:
            self.api.stop()

    def logs(self) -> str:
        parts = [f"--- {p.name}\n{p.tail()}" for p in [self.api, *self.workers] if p]
        return "\n".join(parts)


# -------------------------------------------------------------------------- graphs
def chain_graph(n: int = 20, name: str = "chain", compute_us: float = 100.0,
                nbytes: int = 1000) -> dict[str, Any]:
    """A small valid graph: a chain of ``n`` ops with a side branch every 5 ops."""
    ops = [{"name": f"op{i}", "compute_us": compute_us + i, "output_bytes": nbytes}
           for i in range(n)]
    edges = [{"src": f"op{i}", "dst": f"op{i + 1}", "bytes": nbytes} for i in range(n - 1)]
    edges += [{"src": f"op{i}", "dst": f"op{i + 2}", "bytes": nbytes // 2}
              for i in range(0, n - 2, 5)]
    return {"format": "baechi.graph/v1", "name": name, "ops": ops, "edges": edges}


def cluster(count: int = 2, memory: str | int | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"count": count}
    if memory is not None:
        devices["memory_bytes"] = memory
    return {"devices": devices, "network": {"latency_us": 134, "bandwidth_gbps": 5.7}}


# -------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private redis-server (AOF on) for the whole session."""
    if not HAVE_REDIS:
        pytest.skip(f"redis-server not found at {REDIS_SERVER} (apt-get install redis-server)")
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def service(redis_server: RedisServer,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """The API (keys key-a, key-b) and two forking workers on ``redis_server``."""
    stack = Service(redis_server, tmp_path_factory.mktemp("service"), workers=2)
    try:
        yield stack.start()
    except BaseException:
        print(stack.logs(), file=sys.stderr)
        raise
    finally:
        stack.stop()


@pytest.fixture
def make_service() -> Iterator[Callable[..., Service]]:
    """Factory of isolated stacks (own Redis, API, workers), torn down after the test."""
    if not HAVE_REDIS:
        pytest.skip(f"redis-server not found at {REDIS_SERVER} (apt-get install redis-server)")
    stacks: list[Service] = []
    dirs: list[Path] = []

    def make(workers: int = 0, env: dict[str, str] | None = None) -> Service:
        directory = Path(tempfile.mkdtemp(prefix="baechi-stack-"))
        dirs.append(directory)
        redis = RedisServer(directory / "redis").start()
        stack = Service(redis, directory, env=env, workers=workers)
        stacks.append(stack)
        return stack.start()

    try:
        yield make
    finally:
        for stack in stacks:
            stack.stop()
            stack.redis.stop()
        for directory in dirs:
            shutil.rmtree(directory, ignore_errors=True)
