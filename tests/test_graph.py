"""Graph format v1 (docs/format.md §2): loading and every validation rule, one clear error each."""

from __future__ import annotations

import pytest
from conftest import ROOT
from helpers import edge, graph_doc, op

from baechi import Cluster, InvalidCluster, InvalidGraph, load_graph, parse_size


def test_defaults_and_indexing() -> None:
    g = load_graph(graph_doc([op("a", 1.5), op("b", 2)], [edge("a", "b", 8)]))
    assert g.names == ["a", "b"] and g.topo == [0, 1]
    assert (g.output_bytes, g.temp_bytes, g.persistent_bytes) == ([0, 0], [0, 0], [0, 0])
    assert g.edge_tensor == ["a"] and g.edge_control == [False]
    assert g.out_edges == [[0], []] and g.in_edges == [[], [0]]


def test_canonical_order_takes_smallest_file_index_first() -> None:
    g = load_graph(graph_doc([op("z"), op("y"), op("x")], [edge("y", "z")]))
    assert [g.names[i] for i in g.topo] == ["y", "z", "x"]


@pytest.mark.parametrize(("doc", "message"), [
    ({"format": "baechi.graph/v2", "ops": []}, "format: expected 'baechi.graph/v1'"),
    (graph_doc([op("a"), op("a")]), r"ops\[1\].name: duplicate op name 'a'"),
    (graph_doc([op("a")], [edge("a", "b")]), r"edges\[0\].dst: unknown op 'b'"),
    (graph_doc([op("a")], [edge("a", "a")]), "self-loop on op 'a'"),
    (graph_doc([op("a", -1)]), r"op 'a' \(ops\[0\]\).compute_us: .*greater than or equal to 0"),
    (graph_doc([op("a", float("nan"))]), r"op 'a' \(ops\[0\]\).compute_us: must be a finite"),
    (graph_doc([op("a", float("inf"))]), r"op 'a' \(ops\[0\]\).compute_us: must be a finite"),
    (graph_doc([op("a", True)]), r"op 'a' \(ops\[0\]\).compute_us: a boolean is not a number"),
    (graph_doc([op("a", output_bytes=1.5)]), r"op 'a' \(ops\[0\]\).output_bytes"),
    (graph_doc([op("a", temp_bytes=True)]), r"temp_bytes: a boolean is not a number"),
    (graph_doc([op("a"), op("b")], [edge("a", "b", -4)]), r"edge 'a' -> 'b' \(edges\[0\]\).bytes"),
    (graph_doc([op("a", forward_op="nope")]), "forward_op: names unknown op 'nope'"),
    (graph_doc([op("a", colour="red")]), r"op 'a' \(ops\[0\]\).colour: Extra inputs"),
    ({**graph_doc([op("a")]), "extra": 1}, "extra: unknown key"),
    (graph_doc([{"compute_us": 1}]), r"ops\[0\].name: Field required"),
    (graph_doc([op("a"), op("b")], [edge("a", "b", 1, tensor="t"), edge("a", "b", 2, tensor="t")]),
     "duplicate edge"),
])
def test_invalid_graphs_name_op_and_field(doc: dict, message: str) -> None:
    with pytest.raises(InvalidGraph, match=message):
        load_graph(doc)


def test_cycle_error_names_the_ops_on_it() -> None:
    doc = graph_doc([op("s"), op("a"), op("b"), op("c")],
                    [edge("s", "a"), edge("a", "b"), edge("b", "c"), edge("c", "a")])
    with pytest.raises(InvalidGraph, match="cycle") as info:
        load_graph(doc)
    assert set(info.value.details["cycle"]) == {"a", "b", "c"}


def test_parallel_edges_with_different_tensors_and_attrs_are_kept() -> None:
    g = load_graph(graph_doc([op("a", attrs={"anything": [1, {"x": None}]}), op("b")],
                             [edge("a", "b", 1, tensor="a:0"), edge("a", "b", 2, tensor="a:1")]))
    assert g.num_edges == 2 and g.attrs == [{"anything": [1, {"x": None}]}, {}]
    assert load_graph(g.to_dict()).to_dict() == g.to_dict()


def test_json_errors_and_files(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InvalidGraph, match="not valid JSON"):
        load_graph(bad)
    with pytest.raises(InvalidGraph, match="cannot read graph file"):
        load_graph(tmp_path / "missing.json")


def test_bundled_graph_loads() -> None:
    # its load time is measured in bench/speed.py
    g = load_graph(ROOT / "examples" / "graphs" / "gnmt_baechi.json")
    assert len(g) == 2494 and g.num_edges == 4505


def test_sizes_and_clusters() -> None:
    assert parse_size("8GiB") == 8 * 2**30
    assert parse_size("512MiB") == 512 * 2**20
    assert parse_size("2.5GB") == 2_500_000_000
    c = Cluster.parse({"devices": {"count": 3, "memory_bytes": "1GiB"},
                       "network": {"latency_us": 5, "bandwidth_gbps": 10}})
    assert [d.name for d in c.devices] == ["/GPU:0", "/GPU:1", "/GPU:2"]
    assert c.devices[0].memory_bytes == 2**30 and c.network.mode == "sequential"
    assert c.network.transfer_us(10_000) == pytest.approx(6.0)


@pytest.mark.parametrize(("cluster", "message"), [
    ({"devices": []}, "devices"),
    ({"devices": {"count": 2, "memory_bytes": "lots"}}, "cannot read size 'lots'"),
    ({"devices": [{"name": "a"}, {"name": "a"}]}, "appears twice"),
    ({"devices": {"count": 2}, "network": {"latency_us": -1}}, "network.latency_us"),
    ({"devices": {"count": 2}, "network": {"mode": "carrier-pigeon"}}, "network.mode"),
    ({"devices": [{"name": "a", "speed": True}]}, "not a boolean"),
])
def test_invalid_clusters(cluster: dict, message: str) -> None:
    with pytest.raises(InvalidCluster, match=message):
        Cluster.parse(cluster)
