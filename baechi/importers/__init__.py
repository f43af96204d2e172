"""Importers: other profile formats converted to ``baechi.graph/v1``.

Each importer is ``import_x(path, name=None) -> dict`` returning a JSON-ready document; use
:func:`import_graph` to pick one by name and validate the result.

>>> sorted(IMPORTERS)
['dnn-partitioning', 'pipedream']
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from baechi.errors import InvalidRequest
from baechi.graph import load_graph
from baechi.importers.dnn_partitioning import import_dnn_partitioning
from baechi.importers.pipedream import import_pipedream

Importer = Callable[..., dict[str, Any]]

#: Source format name (as in ``baechi import <format>``) → importer.
IMPORTERS: dict[str, Importer] = {
    "pipedream": import_pipedream,
    "dnn-partitioning": import_dnn_partitioning,
}


def import_graph(kind: str, source: str | Path, name: str | None = None) -> dict[str, Any]:
    """Convert ``source`` from format ``kind`` and validate it as ``baechi.graph/v1``.

    Raises
    ------
    InvalidRequest
        Unknown format name.
    InvalidGraph
        The file is malformed, or converts to an invalid graph (e.g. a cycle).
    """
    try:
        importer = IMPORTERS[kind]
    except KeyError:
        raise InvalidRequest(
            f"unknown profile format {kind!r}; choose one of {', '.join(IMPORTERS)}",
            {"field": "format"},
        ) from None
    document = importer(source, name=name)
    load_graph(document)
    return document


__all__ = ["IMPORTERS", "import_dnn_partitioning", "import_graph", "import_pipedream"]
