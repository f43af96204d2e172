"""Numbers that would overflow a sum of the cost model are rejected up front, naming the field
(issue 12, items 9–10: each case is a reproduction from a probe of the running service)."""

from __future__ import annotations

from typing import Any

import pytest

import baechi
from baechi.cluster import parse_size
from baechi.errors import InvalidCluster, InvalidGraph


def _graph(ops: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"format": "baechi.graph/v1", "ops": ops, **extra}


@pytest.mark.parametrize("size", ["1e400", "1e308GiB", 2**63, 1e300])
def test_huge_sizes_are_refused_not_overflowing(size: Any) -> None:
    with pytest.raises(ValueError, match="larger than|not a whole"):
        parse_size(size)
    with pytest.raises(InvalidCluster, match="memory_bytes"):
        baechi.place(_graph([{"name": "a", "compute_us": 1}]),
                     {"devices": {"count": 2, "memory_bytes": size}})


def test_compute_time_is_bounded() -> None:
    ops = [{"name": f"o{i}", "compute_us": 1e308} for i in range(5)]
    with pytest.raises(InvalidGraph, match=r"ops\[0\]\)\.compute_us: .*less than or equal"):
        baechi.place(_graph(ops), {"devices": {"count": 2}}, "m-sct")


def test_speed_is_bounded() -> None:
    with pytest.raises(InvalidCluster, match=r"devices\[0\]\.speed"):
        baechi.place(_graph([{"name": "a", "compute_us": 5}]),
                     {"devices": [{"name": "x", "speed": 1e-308}]})


def test_int64_byte_fields_are_refused() -> None:
    ops = [{"name": f"o{i}", "compute_us": 1, "persistent_bytes": 2**63 - 1} for i in range(2)]
    with pytest.raises(InvalidGraph, match=r"op 'o0' \(ops\[0\]\)\.persistent_bytes"):
        baechi.load_graph(_graph(ops))


def test_bytes_adding_up_past_int64_are_refused() -> None:
    ops = [{"name": f"o{i}", "compute_us": 1, "persistent_bytes": 2**53} for i in range(600)]
    with pytest.raises(InvalidGraph, match=r"add up to .* \(2\*\*62\)"):
        baechi.load_graph(_graph(ops))


def test_largest_accepted_values_still_place_with_finite_estimates() -> None:
    ops = [{"name": f"o{i}", "compute_us": 1e12, "persistent_bytes": 2**53} for i in range(4)]
    plan = baechi.place(_graph(ops), {"devices": [{"name": "x", "speed": 1e-6}]}, "m-sct")
    assert plan.estimate.step_time_us == pytest.approx(4e18)
    assert plan.estimate.peak_memory_bytes == {"x": 4 * 2**53}


@pytest.mark.parametrize("where", ["meta", "attrs"])
def test_deeply_nested_json_is_refused_naming_the_field(where: str) -> None:
    deep: dict[str, Any] = {}
    cursor = deep
    for _ in range(300):
        cursor["x"] = {}
        cursor = cursor["x"]
    op: dict[str, Any] = {"name": "a", "compute_us": 1}
    doc = _graph([op])
    if where == "meta":
        doc["meta"] = deep
    else:
        op["attrs"] = deep
    with pytest.raises(InvalidGraph, match=f"{where}: JSON nested deeper than 64 levels"):
        baechi.load_graph(doc)


def test_forward_op_naming_itself_or_a_cycle_is_refused() -> None:
    with pytest.raises(InvalidGraph, match=r"op 'a' \(ops\[0\]\)\.forward_op: names itself"):
        baechi.load_graph(_graph([{"name": "a", "compute_us": 1, "forward_op": "a"}]))
    ops = [{"name": "a", "compute_us": 1, "forward_op": "b"},
           {"name": "b", "compute_us": 1, "forward_op": "c"},
           {"name": "c", "compute_us": 1, "forward_op": "a"}]
    with pytest.raises(InvalidGraph, match=r"forms a cycle 'a' -> 'b' -> 'c' -> 'a'"):
        baechi.load_graph(_graph(ops))
    chain = [{"name": "a", "compute_us": 1}, {"name": "b", "compute_us": 1, "forward_op": "a"},
             {"name": "c", "compute_us": 1, "forward_op": "b"}]
    assert baechi.load_graph(_graph(chain)).forward_op == [-1, 0, 1]


def test_one_colocation_group_pinned_to_two_devices_is_refused() -> None:
    ops = [{"name": "a", "compute_us": 1, "colocation_group": "g", "device": "/GPU:0"},
           {"name": "b", "compute_us": 1, "colocation_group": "g", "device": "/GPU:1"}]
    with pytest.raises(InvalidGraph, match=r"op 'b' \(ops\[1\]\)\.device: pinned to '/GPU:1'"
                                           r", but op 'a' .* group 'g' is pinned to '/GPU:0'"):
        baechi.load_graph(_graph(ops))
