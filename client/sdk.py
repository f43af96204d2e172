"""The SDK: :class:`BaechiClient` talks to the service, :class:`Placement` follows one job.

>>> client = BaechiClient("http://localhost:8000", api_key="key-a")      # doctest: +SKIP
>>> placement = client.submit("graph.json", {"devices": {"count": 4, "memory_bytes": "8GiB"}})
>>> plan = placement.wait()                                              # doctest: +SKIP
>>> plan.estimate.step_time_us                                           # doctest: +SKIP
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

from baechi.client.errors import (
    BaechiError,
    InvalidInput,
    PlacementCanceled,
    PlacementFailed,
    ServerError,
    WaitTimeout,
)
from baechi.client.transport import Transport
from baechi.defaults import DEFAULT_ALGORITHM
from baechi.plan import Plan
from baechi.progress import ProgressBar

#: Statuses after which a placement never changes again.
TERMINAL = frozenset({"finished", "failed", "canceled"})
_GRAPH_ID = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class PlacementStatus:
    """What ``GET /placements/{id}`` says about a placement (docs/format.md §7)."""

    id: str
    status: str
    phase: str = ""
    fraction: float = 0.0
    error: dict[str, Any] | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def done(self) -> bool:
        """True once the placement is finished, failed or canceled."""
        return self.status in TERMINAL

    @classmethod
    def from_json(cls, data: Any) -> PlacementStatus:
        try:
            progress = data.get("progress") or {}
            return cls(
                id=str(data["id"]),
                status=str(data["status"]),
                phase=str(progress.get("phase") or ""),
                fraction=float(progress.get("fraction") or 0.0),
                error=data.get("error"),
                created_at=_time(data.get("created_at")),
                started_at=_time(data.get("started_at")),
                finished_at=_time(data.get("finished_at")),
                raw=data,
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ServerError(
                f"unexpected placement status from the server: {data!r:.200}"
            ) from None


class Placement:
    """One placement job on the service.

    Obtained from :meth:`BaechiClient.submit` or :meth:`BaechiClient.placement`.
    """

    def __init__(self, client: BaechiClient, placement_id: str,
                 status: PlacementStatus | None = None) -> None:
        self.client = client
        self.id = placement_id
        self.last_status = status

    def __repr__(self) -> str:
        state = self.last_status.status if self.last_status else "?"
        return f"Placement({self.id!r}, status={state!r})"

    @property
    def url(self) -> str:
        return f"{self.client.url}/placements/{self.id}"

    @property
    def report_url(self) -> str:
        """The HTML report (timeline, memory) of the finished placement."""
        return f"{self.url}/report"

    def status(self) -> PlacementStatus:
        """Fetch the current status, progress and error."""
        data = self.client._transport.json("GET", f"/placements/{self.id}")
        self.last_status = PlacementStatus.from_json(data)
        return self.last_status

    def plan(self) -> Plan:
        """The plan of a finished placement.

        Raises
        ------
        Conflict
            The placement has not finished (yet).
        """
        data = self.client._transport.json("GET", f"/placements/{self.id}/plan")
        try:
            return Plan.parse(data)
        except Exception as exc:  # baechi.InvalidPlan: the server sent something else
            raise ServerError(
                f"the server's plan for {self.id} is not a valid plan: {exc}"
            ) from None

    def cancel(self) -> PlacementStatus:
        """Cancel the job if it is queued or running; return the new status.

        Raises
        ------
        Conflict
            It already finished or failed.
        """
        data = self.client._transport.json("DELETE", f"/placements/{self.id}")
        self.last_status = PlacementStatus.from_json(data)
        return self.last_status

    def wait(
        self,
        timeout: float | None = None,
        progress: bool = True,
        poll_interval: float = 0.25,
        max_poll_interval: float = 2.0,
    ) -> Plan:
        """Poll until the job ends, then return its plan.

        Parameters
        ----------
        timeout : float, optional
            Seconds to wait at most; None waits as long as it takes.
        progress : bool
            Draw a progress bar on stderr when it is a terminal (never otherwise).
        poll_interval, max_poll_interval : float
            First and largest pause between polls (the pause grows by half each poll).

        Raises
        ------
        PlacementFailed
            The job failed; carries the job's error code and message.
        PlacementCanceled
            The job was canceled.
        WaitTimeout
            ``timeout`` passed first (the job goes on; call ``wait`` again).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = ProgressBar(enabled=progress)
        pause = poll_interval
        try:
            while True:
                status = self.status()
                fraction = 1.0 if status.status == "finished" else status.fraction
                bar.update(status.status, status.phase, fraction)
                if status.done:
                    break
                if deadline is not None and time.monotonic() + pause > deadline:
                    raise WaitTimeout(
                        f"placement {self.id} still {status.status} after {timeout:g} s "
                        f"(phase {status.phase or '-'}, {status.fraction:.0%})",
                        details={"id": self.id, "status": status.status},
                    )
                self.client._sleep(pause)
                pause = min(pause * 1.5, max_poll_interval)
        finally:
            bar.close()
        if status.status == "failed":
            error = status.error or {}
            raise PlacementFailed(
                str(error.get("message") or f"placement {self.id} failed"),
                code=str(error.get("code") or PlacementFailed.code),
                details={"id": self.id, **(error.get("details") or {})},
            )
        if status.status == "canceled":
            raise PlacementCanceled(f"placement {self.id} was canceled", details={"id": self.id})
        return self.plan()


class BaechiClient:
    """Client of a Baechi placement service (docs/format.md §7, §8).

    Parameters
    ----------
    url : str
        Base URL, e.g. ``http://localhost:8000``.
    api_key : str, optional
        The tenant's key (header ``X-API-Key``); default ``$BAECHI_API_KEY``.
    timeout : float
        Seconds per HTTP request.
    retries : int
        Extra attempts on connection errors and 503 (exponential backoff with jitter).
    backoff : float
        First pause between attempts, in seconds.
    transport : httpx.BaseTransport, optional
        For tests: an httpx transport instead of the network.
    """

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 4,
        backoff: float = 0.5,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if api_key is None:
            api_key = os.environ.get("BAECHI_API_KEY")
        self._sleep = sleep
        self._transport = Transport(url, api_key, timeout=timeout, retries=retries,
                                    backoff=backoff, transport=transport, sleep=sleep)
        self.url = self._transport.url

    def __enter__(self) -> BaechiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._transport.close()

    # ------------------------------------------------------------------ placements
    def submit(
        self,
        graph: Any,
        cluster: Any,
        algorithm: str = DEFAULT_ALGORITHM,
        options: dict[str, Any] | None = None,
        objective: str | None = None,
    ) -> Placement:
        """Submit a placement request; return the (queued) :class:`Placement`.

        Parameters
        ----------
        graph : dict, path, baechi.Graph, JSON text, or graph id
            A ``baechi.graph/v1`` document, or the id :meth:`upload_graph` returned.
        cluster : dict or baechi.Cluster
            Devices and network (docs/format.md §3), e.g.
            ``{"devices": {"count": 4, "memory_bytes": "8GiB"}}``.
        algorithm : str
            ``auto`` (the default, :data:`baechi.defaults.DEFAULT_ALGORITHM`), or a named
            algorithm: ``m-etf``, ``m-sct``, ``exact``, ...
        options : dict, optional
            Pipeline switches and ``time_limit_s`` (docs/format.md §3).
        objective : str, optional
            ``step_time`` (the server's default) or ``throughput`` (docs/format.md §10).

        Raises
        ------
        InvalidInput
            The server refused the graph or request (names the op or field).
        """
        body: dict[str, Any] = {}
        graph_id = _graph_id(graph)
        if graph_id is not None:
            body["graph_id"] = graph_id
        else:
            body["graph"] = _graph_document(graph)
        body["cluster"] = _cluster_document(cluster)
        body["algorithm"] = algorithm
        if options is not None:
            body["options"] = options
        if objective is not None:
            body["objective"] = objective
        data = self._transport.json("POST", "/placements", body=_dumps(body))
        if not isinstance(data, dict) or not data.get("id"):
            raise ServerError(f"POST /placements: no placement id in the answer: {data!r:.200}")
        status = PlacementStatus(id=str(data["id"]), status=str(data.get("status", "queued")),
                                 raw=data)
        return Placement(self, status.id, status)

    def placement(self, placement_id: str) -> Placement:
        """A handle on an existing placement (no request is made)."""
        return Placement(self, placement_id)

    def placements(self, limit: int | None = None) -> Iterator[PlacementStatus]:
        """The caller's placements, newest first, following the pages.

        Parameters
        ----------
        limit : int, optional
            Stop after this many.
        """
        cursor: str | None = None
        count = 0
        while True:
            params: dict[str, Any] = {}
            if cursor is not None:
                params["cursor"] = cursor
            if limit is not None:
                params["limit"] = max(1, min(limit - count, 1000))
            page = self._transport.json("GET", "/placements", params=params)
            for item in page.get("items", []):
                yield PlacementStatus.from_json(item)
                count += 1
                if limit is not None and count >= limit:
                    return
            cursor = page.get("next_cursor")
            if not cursor:
                return

    # ---------------------------------------------------------------------- graphs
    def upload_graph(self, graph: Any) -> str:
        """Upload a graph once (``POST /graphs``); return its id for :meth:`submit`."""
        data = self._transport.json("POST", "/graphs", body=_dumps(_graph_document(graph)))
        graph_id = data.get("graph_id") if isinstance(data, dict) else None
        if not isinstance(graph_id, str):
            raise ServerError(f"POST /graphs: no graph_id in the answer: {data!r:.200}")
        return graph_id

    # ---------------------------------------------------------------------- health
    def health(self) -> bool:
        """True when the service process answers ``/healthz``."""
        try:
            self._transport.request("GET", "/healthz")
        except BaechiError:
            return False
        return True

    def ready(self) -> dict[str, Any]:
        """``/readyz``: Redis reachable and a worker alive (raises when not)."""
        return self._transport.json("GET", "/readyz")

    # ------------------------------------------------------------------ TensorFlow
    def profile(self, model: Any, x: Any, y: Any, loss: Any, optimizer: Any,
                steps: int = 5, **kwargs: Any) -> dict[str, Any]:
        """Profile a Keras training step: see :func:`client.profile`."""
        from baechi.client.tf.profiler import profile

        return profile(model, x, y, loss, optimizer, steps=steps, **kwargs)

    def apply_plan(self, model: Any, plan: Any, device_map: Any = None, **kwargs: Any) -> Any:
        """Pin a model onto local devices: see :func:`client.apply_plan`."""
        from baechi.client.tf.pinning import apply_plan

        return apply_plan(model, plan, device_map, **kwargs)


# --------------------------------------------------------------------------- helpers
def _time(value: Any) -> datetime | None:
    if value in (None, ""):
        return None
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def _graph_id(graph: Any) -> str | None:
    if isinstance(graph, str) and _GRAPH_ID.match(graph) and not os.path.exists(graph):
        return graph
    return None


def _graph_document(graph: Any) -> Any:
    """The graph as JSON-ready data (or raw JSON bytes, sent as they are)."""
    from baechi.graph import Graph

    if isinstance(graph, Graph):
        return graph.to_dict()
    if isinstance(graph, dict):
        return graph
    if isinstance(graph, bytes):
        return _parse(graph, "graph")
    if isinstance(graph, str) and graph.lstrip().startswith("{"):
        return _parse(graph.encode(), "graph")
    if isinstance(graph, (str, Path)):
        path = Path(graph)
        try:
            return _parse(path.read_bytes(), str(path))
        except OSError as exc:
            raise InvalidInput(f"{path}: cannot read graph file: {exc.strerror}",
                               code="invalid_graph") from None
    raise InvalidInput(f"graph: expected a dict, a path, JSON or a baechi.Graph, "
                       f"not {type(graph).__name__}", code="invalid_graph")


def _cluster_document(cluster: Any) -> Any:
    from baechi.cluster import Cluster

    if isinstance(cluster, Cluster):
        return cluster.to_json()
    if isinstance(cluster, dict):
        return cluster
    if isinstance(cluster, (str, Path)):
        path = Path(cluster)
        try:
            return _parse(path.read_bytes(), str(path))
        except OSError as exc:
            raise InvalidInput(f"{path}: cannot read cluster file: {exc.strerror}",
                               code="invalid_cluster") from None
    raise InvalidInput(f"cluster: expected a dict or a baechi.Cluster, not "
                       f"{type(cluster).__name__}", code="invalid_cluster")


def _parse(data: bytes, what: str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"{what}: not valid JSON: {exc}") from None


def _dumps(body: Any) -> bytes:
    try:
        return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError as exc:
        raise InvalidInput(f"request: cannot encode as JSON: {exc}") from None


__all__ = ["TERMINAL", "BaechiClient", "Placement", "PlacementStatus"]
