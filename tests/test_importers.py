"""``baechi import``: PipeDream and dnn-partitioning profiles to ``baechi.graph/v1``.

The originals under ``tests/data/importers`` (MIT, see its README) must convert to exactly the
ops, edges and numbers of the shared conversions in ``../shared/graphs``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import DATA, SHARED, needs_shared

from baechi import InvalidGraph, InvalidRequest, load_graph
from baechi.cli import main
from baechi.importers import IMPORTERS, import_dnn_partitioning, import_graph, import_pipedream

ORIGINALS = DATA / "importers"
CASES = [
    ("pipedream", "pipedream/alexnet/graph.txt", "pipedream/pipedream_alexnet.json"),
    ("pipedream", "pipedream/gnmt/graph.txt", "pipedream/pipedream_gnmt.json"),
    ("dnn-partitioning", "dnn-partitioning/latency-inputs/LayerGraphs/bert24_inference.json",
     "dnn-partitioning/latency-inputs/bert24_inference_layer.json"),
]


def shared(path: str) -> dict[str, Any]:
    return json.loads((SHARED / "graphs" / path).read_text())


def as_shared(document: dict[str, Any]) -> dict[str, Any]:
    """The import without what issue 10 added to the dnn-partitioning mapping (times per kind,
    measured transfers, node ids, one tensor per source): the shared conversion predates it."""
    ops = [{k: v for k, v in op.items() if k != "compute_us_by_kind"}
           | ({"attrs": {k: v for k, v in op["attrs"].items() if k != "id"}}
              if "attrs" in op else {}) for op in document["ops"]]
    edges = [{k: v for k, v in e.items() if k not in ("transfer_us", "tensor")}
             for e in document["edges"]]
    return document | {"ops": ops, "edges": edges}


def without_tensors(edges: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k != "tensor"} for e in edges]


@needs_shared
@pytest.mark.parametrize(("kind", "original", "converted"), CASES)
def test_import_matches_the_shared_conversion(kind: str, original: str, converted: str) -> None:
    document = import_graph(kind, ORIGINALS / original)
    reference = shared(converted)
    if kind == "dnn-partitioning":
        document = as_shared(document)
        reference = reference | {"edges": without_tensors(reference["edges"])}
    assert document["name"] == reference["name"]
    assert document["ops"] == reference["ops"]  # names, order, types, every number, attrs
    assert document["edges"] == reference["edges"]
    numbers = {k: v for k, v in reference["meta"].items() if k.startswith("suggested_")}
    assert {k: v for k, v in document["meta"].items()
            if k.startswith("suggested_") and k != "suggested_cluster"} == numbers
    if kind != "dnn-partitioning":
        assert load_graph(document).sha256 == load_graph(
            reference | {"meta": document["meta"]}).sha256


@pytest.mark.parametrize("path", [
    "dnn-partitioning/latency-inputs/LayerGraphs/bert24_inference.json",
    "dnn-partitioning/throughput-inputs/LayerGraphs/bert24_inference.json",
    "dnn-partitioning/throughput-inputs/LayerGraphs/bert24_training.json",
])
def test_dnn_partitioning_keeps_what_their_model_needs(path: str) -> None:
    """Round trip: every field of the original that Tarnawski et al.'s model reads comes back
    from the import (issue 10 item 4), node by node and edge by edge."""
    original = json.loads((ORIGINALS / path).read_text())
    document = import_graph("dnn-partitioning", ORIGINALS / path)
    graph = load_graph(document)
    by_id = {graph.attrs[op]["id"]: op for op in range(len(graph))}
    assert len(by_id) == len(original["nodes"])
    for node in original["nodes"]:
        op = by_id[node["id"]]
        assert graph.names[op] == node["name"]
        assert graph.compute_us[op] == pytest.approx(node["fpgaLatency"] * 1000, abs=1e-3)
        kinds = graph.compute_us_by_kind[op]  # type: ignore[index]
        assert kinds["cpu"] == pytest.approx(node["cpuLatency"] * 1000, abs=1e-3)
        assert ("gpu" in kinds and kinds["gpu"] is None) == (not node["supportedOnFpga"])
        assert graph.persistent_bytes[op] == int(node["size"])
        assert graph.colocation_group[op] == f"color{node['colorClass']}"
        assert graph.attrs[op]["is_backward"] == bool(node["isBackwardNode"])  # type: ignore[index]
    edges = {(graph.attrs[graph.edge_src[k]]["id"], graph.attrs[graph.edge_dst[k]]["id"]): k
             for k in range(graph.num_edges)}  # type: ignore[index]
    assert len(edges) == len(original["edges"])
    for e in original["edges"]:
        k = edges[(e["sourceId"], e["destId"])]
        assert graph.edge_transfer_us[k] == e["cost"] * 1000  # type: ignore[index]
        assert graph.edge_bytes[k] == int(e["size"])
        assert graph.edge_tensor[k] == graph.names[graph.edge_src[k]]  # one tensor per node
    cluster = document["meta"]["suggested_cluster"]["devices"]
    accelerators = [d for d in cluster if d["kind"] == "gpu"]
    assert len(accelerators) == original["maxFPGAs"]
    assert all(d["memory_bytes"] == int(original["maxSizePerFPGA"]) for d in accelerators)
    cpus = [d for d in cluster if d["kind"] == "cpu"]
    assert len(cpus) == original["maxCPUs"] and all(d["host"] for d in cpus)


def test_pipedream_mapping() -> None:
    document = import_pipedream(ORIGINALS / "pipedream/gnmt/graph.txt")
    ops = {op["name"]: op for op in document["ops"]}
    lstm = ops["node7"]  # LSTM(2048, 1024): 3.190 + 5.348 ms, three outputs
    assert lstm["type"] == "LSTM"
    assert lstm["compute_us"] == 8538.0
    assert lstm["attrs"] == {"forward_us": 3190.0, "backward_us": 5348.0}
    assert lstm["output_bytes"] == 6291456 + 131072 + 131072
    assert lstm["persistent_bytes"] == 50364416
    assert "output_bytes" not in ops["node1"] and "persistent_bytes" not in ops["node1"]
    out = [e for e in document["edges"] if e["src"] == "node7"]
    assert {e["dst"] for e in out} == {"node8", "node9"}
    assert all(e["bytes"] == lstm["output_bytes"] and e["tensor"] == "node7:0" for e in out)
    assert document["name"] == "pipedream_gnmt"


def test_dnn_partitioning_operator_graph_features(tmp_path: Path) -> None:
    # Hand-written (not an original): nodes without a colour class, sub-µs latencies,
    # integer backward flags, a node with only a CPU latency, two tensors out of one node.
    source = {
        "maxSizePerFPGA": 1073741824.0, "maxFPGAs": 3, "maxCPUs": 1,
        "nodes": [
            {"name": "w", "id": 0, "fpgaLatency": 0, "isBackwardNode": False,
             "colorClass": 7, "size": 1024.0},
            {"name": "Shape1", "id": 5, "fpgaLatency": 4.358526865641276e-07,
             "isBackwardNode": False, "size": 16.0},
            {"name": "MatMul1", "id": 6, "fpgaLatency": 0.0344803921, "isBackwardNode": 0,
             "colorClass": 7, "size": 4096.0},
            {"name": "MatMul1_Grad", "id": 9, "cpuLatency": 0.5, "isBackwardNode": 1,
             "colorClass": 7, "size": 4096.0},
        ],
        "edges": [
            {"sourceId": 0, "destId": 6, "cost": 1.0, "size": 1024.0},
            {"sourceId": 5, "destId": 6, "cost": 0.0, "size": 16.0},
            {"sourceId": 6, "destId": 9, "cost": 2.0, "size": 4096.0},
            {"sourceId": 0, "destId": 9, "cost": 1.0, "size": 1024.0},
            {"sourceId": 6, "destId": 9, "cost": 0.5, "size": 64.0},
        ],
    }
    folder = tmp_path / "OperatorGraphs"
    folder.mkdir()
    path = folder / "Tiny_Training.json"
    path.write_text(json.dumps(source))
    document = import_graph("dnn-partitioning", path)
    assert document["name"] == "tiny_training_operator"
    assert document["meta"]["suggested_devices"] == 3
    assert document["meta"]["suggested_memory_bytes"] == 1073741824
    assert document["ops"] == [
        {"name": "w", "compute_us": 0.0, "persistent_bytes": 1024, "output_bytes": 1024,
         "colocation_group": "color7", "attrs": {"is_backward": False, "id": 0}},
        {"name": "Shape1", "compute_us": 0.0, "persistent_bytes": 16, "output_bytes": 16,
         "attrs": {"is_backward": False, "id": 5}},
        {"name": "MatMul1", "compute_us": 34.48, "persistent_bytes": 4096, "output_bytes": 4096,
         "colocation_group": "color7", "attrs": {"is_backward": False, "id": 6}},
        {"name": "MatMul1_Grad", "compute_us": 500.0, "compute_us_by_kind": {"cpu": 500.0},
         "persistent_bytes": 4096, "colocation_group": "color7",
         "attrs": {"is_backward": True, "id": 9}},
    ]
    tensors = [(e["src"], e["dst"], e["bytes"], e.get("tensor"), e["transfer_us"])
               for e in document["edges"]]
    assert tensors == [  # one tensor per source node; a second edge of a pair its own tensor
        ("w", "MatMul1", 1024, None, 1000.0),
        ("Shape1", "MatMul1", 16, None, 0.0),
        ("MatMul1", "MatMul1_Grad", 4096, None, 2000.0),
        ("w", "MatMul1_Grad", 1024, None, 1000.0),
        ("MatMul1", "MatMul1_Grad", 64, "MatMul1:4", 500.0),
    ]
    load_graph(document)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("node1 -- Input\n", "expected 'node_id -- description"),
        ("node1 -- Input -- forward_compute_time=1, backward_compute_time=0, "
         "activation_size=4\n", "missing parameter_size"),
        ("node1 -- Input -- forward_compute_time=x, backward_compute_time=0, "
         "activation_size=4, parameter_size=0\n", "forward_compute_time: not a number"),
        ("node1 -- Input -- forward_compute_time=1, backward_compute_time=0, "
         "activation_size=4, parameter_size=0\n\tnode9 -- node1\n", "unknown node 'node9'"),
        ("node1 -- Input -- forward_compute_time=1, backward_compute_time=0, "
         "activation_size=4, parameter_size=0\n\tnode1\n", "expected an edge"),
    ],
)
def test_pipedream_errors_name_the_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "graph.txt"
    path.write_text(text)
    with pytest.raises(InvalidGraph, match=message) as info:
        import_pipedream(path)
    assert str(path) in info.value.message


def test_pipedream_cycle_is_refused(tmp_path: Path) -> None:
    metrics = "forward_compute_time=1, backward_compute_time=0, activation_size=4, " \
              "parameter_size=0"
    path = tmp_path / "graph.txt"
    path.write_text(f"a -- A -- {metrics}\nb -- B -- {metrics}\n\ta -- b\n\tb -- a\n")
    with pytest.raises(InvalidGraph, match="cycle"):
        import_graph("pipedream", path)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "expected an object with 'nodes'"),
        ({"nodes": [{"name": "a"}]}, "missing 'id'"),
        ({"nodes": [{"name": "a", "id": 1, "fpgaLatency": -1}]}, "fpgaLatency"),
        ({"nodes": [{"name": "a", "id": 1, "fpgaLatency": True}]}, "expected a number"),
        ({"nodes": [{"name": "a", "id": 1}, {"name": "b", "id": 1}]}, "duplicate node id"),
        ({"nodes": [{"name": "a", "id": 1}], "edges": [{"sourceId": 1, "destId": 2}]},
         "destId: unknown node id 2"),
    ],
)
def test_dnn_partitioning_errors(tmp_path: Path, data: Any, message: str) -> None:
    path = tmp_path / "g.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InvalidGraph, match=message):
        import_dnn_partitioning(path)


def test_unknown_format_and_missing_file() -> None:
    with pytest.raises(InvalidRequest, match="choose one of"):
        import_graph("onnx", "x")
    with pytest.raises(InvalidGraph, match="cannot read"):
        import_graph("pipedream", "/nonexistent/graph.txt")
    assert set(IMPORTERS) == {"pipedream", "dnn-partitioning"}


def test_import_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "alexnet.json"
    source = ORIGINALS / "pipedream/alexnet/graph.txt"
    assert main(["import", "pipedream", str(source), "-o", str(out)]) == 0
    assert "pipedream_alexnet: 23 ops, 23 edges" in capsys.readouterr().out
    graph = load_graph(out)
    assert len(graph) == 23 and graph.name == "pipedream_alexnet"
    out2 = tmp_path / "bert.json"
    source2 = ORIGINALS / "dnn-partitioning/latency-inputs/LayerGraphs/bert24_inference.json"
    assert main(["import", "dnn-partitioning", str(source2), "-o", str(out2),
                 "--name", "bert"]) == 0
    assert load_graph(out2).name == "bert"


def test_import_cli_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "graph.txt"
    bad.write_text("garbage\n")
    assert main(["import", "pipedream", str(bad), "-o", str(tmp_path / "o.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("baechi: error:") and err.count("\n") == 1
    assert not (tmp_path / "o.json").exists()


@needs_shared
def test_every_shared_pipedream_graph_is_what_the_importer_writes() -> None:
    """The shared files are importer output: their numbers follow the importer's mapping."""
    for path in sorted((SHARED / "graphs" / "pipedream").glob("*.json")):
        reference = json.loads(path.read_text())
        for op in reference["ops"]:
            attrs = op["attrs"]
            assert op["compute_us"] == attrs["forward_us"] + attrs["backward_us"]
        outputs = {op["name"]: op.get("output_bytes", 0) for op in reference["ops"]}
        for edge in reference["edges"]:
            assert edge["bytes"] == outputs[edge["src"]] and edge["tensor"] == f"{edge['src']}:0"
