"""The settings where ``auto`` at the benchmarks' 2 s was slower than a named plan, placed
again as users get them: at the default time limit.

Usage::

    python bench/misses.py [--shared ../shared] [--from-csv]

The benchmarks give ``auto`` a ``time_limit_s`` of 2 s (:data:`run.AUTO_TIME_LIMIT_S`) so
that a thousand settings fit in an hour; a request without a time limit gets
:class:`baechi.options.Options`' default (60 s). This reads the rows of the last runs
(bench/results.csv, memory_sweep.csv, generated.csv, clusters.csv), takes every setting where
``auto``'s plan was slower than the fastest named plan by more than :data:`WORSE`, and places
it again with ``auto`` and with that named algorithm (same pipeline switch, ``allow_single``
off as in the sweeps), both without a time limit: the issue's target compares plans of the
same request, and the named ``exact`` improves with time too.

Writes ``bench/misses.csv`` and ``bench/fragments/misses.md`` (first line: the command);
``--from-csv`` renders the fragment again, placing nothing. Run it after the benchmarks whose
rows it reads.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import clusters  # noqa: E402  (bench/ is not a package)
import generated  # noqa: E402
from compare import place_auto  # noqa: E402
from run import (  # noqa: E402
    AUTO_TIME_LIMIT_S,
    NETWORKS,
    fastest,
    fastest_steps,
    named_label,
    named_steps,
    number,
    read_rows,
    rewrite_fragment,
    setting_key,
    single_peak,
    write_rows,
)

from baechi.options import Options  # noqa: E402

#: Relative excess over the fastest named plan above which ``auto``'s plan counts as slower
#: (bench/run.py's "worse" column).
WORSE = 1e-4

#: A miss: where it comes from, its label, the graph document, the cluster, the named run
#: that beat ``auto`` (its label: ``m-eft/unreduced``) and the two step times (µs) at 2 s.
Miss = tuple[str, str, dict[str, Any], dict[str, Any], str, float, float]


def graph_doc(shared: Path, group: str, name: str) -> dict[str, Any]:
    """The shared graph ``name`` of ``group`` (its folder)."""
    path = next(p for p in (shared / "graphs").rglob(f"{name}.json") if p.parent.name == group)
    return json.loads(path.read_text())


def misses(shared: Path) -> Iterator[Miss]:
    """Every setting of the last benchmark runs where ``auto`` was slower than a named plan."""
    rows = read_rows(ROOT / "bench" / "results.csv")
    steps: dict[tuple[str, ...], dict[str, float]] = {}  # per setting, each named plan's
    for r in rows:
        if r["status"] == "ok" and r["algorithm"] != "auto":
            steps.setdefault(setting_key(r), {})[named_label(r["algorithm"], r["pipeline"])] = \
                float(r["step_us"])
    named = {key: fastest(found) for key, found in steps.items()}
    autos = fastest_steps([r for r in rows if r["algorithm"] == "auto"])
    for r in rows:
        key = setting_key(r)
        if r["algorithm"] == "auto" and key in autos and key in named \
                and autos[key] > (1 + WORSE) * named[key]["named_us"]:
            network, memory = NETWORKS[r["network"]], r["memory_bytes"]
            devices = {"count": r["devices"],
                       **({"memory_bytes": memory} if memory is not None else {})}
            yield ("run.py", f"{r['graph']} {r['network']} {r['memory']}",
                   graph_doc(shared, r["group"], r["graph"]),
                   {"devices": devices, "network": network}, named[key]["named"],
                   named[key]["named_us"], autos[key])
    for r in sweep_rows("memory_sweep"):
        yield ("memory_sweep.py", f"{r['graph']} {r['network']} {r['memory']}",
               graph_doc(shared, r["group"], r["graph"]),
               {"devices": {"count": 4, "memory_bytes": int(r["memory_bytes"])},
                "network": NETWORKS[r["network"]]}, r["named"], float(r["named_us"]),
               float(r["auto_us"]))
    docs = {doc["name"]: doc for doc in generated.graphs(quick=False)}
    for r in sweep_rows("generated"):
        shape = next(s for s in generated.CLUSTERS if s.name == r["cluster"])
        doc = docs[r["graph"]]
        memory = None if r["memory"] == "unlimited" else \
            int(single_peak(doc) * shape.memory_share)
        yield ("generated.py", f"{r['graph']} {r['cluster']} {r['memory']}", doc,
               generated.cluster(shape, memory), r["named"], float(r["named_us"]),
               float(r["auto_us"]))
    for r in sweep_rows("clusters"):
        shape = next(s for s in clusters.SHAPES if s.name == r["shape"])
        doc = graph_doc(shared, r["group"], r["graph"])
        yield ("clusters.py", f"{r['graph']} {r['shape']} {r['network']}", doc,
               clusters.cluster(shape, NETWORKS[r["network"]], single_peak(doc)), r["named"],
               float(r["named_us"]), float(r["auto_us"]))


def sweep_rows(name: str) -> list[dict[str, Any]]:
    """The rows of ``bench/{name}.csv`` where ``auto``'s plan was slower than the named one."""
    rows = read_rows(ROOT / "bench" / f"{name}.csv")
    return [r for r in rows if (a := number(r.get("auto_us"))) is not None
            and (n := number(r.get("named_us"))) is not None and a > (1 + WORSE) * n]


def place_again(miss: Miss) -> dict[str, Any]:
    """The miss's row: its 2 s figures and both plans at the default time limit."""
    source, label, doc, cluster, named, named_us, auto_us = miss
    algorithm, _, unreduced = named.partition("/")
    again = named_steps(doc, cluster, [(algorithm, not unreduced, {})])
    step, seconds = place_auto(doc, cluster, Options().time_limit_s)  # a request without one
    return {"source": source, "setting": label, "named": named, "named_2s_us": named_us,
            "auto_2s_us": auto_us, "named_us": again.get(named), "auto_us": step,
            "auto_seconds": seconds}


def markdown(rows: list[dict[str, Any]], command: str, elapsed: float) -> str:
    """The fragment: each miss at 2 s and at the default time limit."""
    limit = Options().time_limit_s
    out = [f"<!-- generated by: {command} in {elapsed:.0f} s -->",
           "## The settings where auto at 2 s was slower, at the default time limit", "",
           "Every setting of bench/run.py, memory_sweep.py, generated.py and clusters.py (the "
           f"sections above) where `auto` at `time_limit_s` {AUTO_TIME_LIMIT_S:g} was slower "
           "than the fastest named plan by more than "
           f"{WORSE:.2%}, placed again as a request without a time limit gets it ({limit:g} s),"
           " with `auto` and with that named algorithm (also at its default: `exact` improves "
           "with time). `auto / named` < 1: `auto` is faster on the same request. One run "
           "each: where the two are within a few tenths of a percent, another run may order "
           "them the other way (CP-SAT's workers and the time shares vary).", "",
           "| from | setting | named | named at 2 s, ms | auto at 2 s, ms | "
           f"named at {limit:g} s, ms | auto at {limit:g} s, ms | auto / named | auto s |",
           "|---|---|---|---|---|---|---|---|---|"]

    def ms(value: Any) -> str:
        return "–" if number(value) is None else f"{number(value) / 1e3:.3f}"

    slower = 0
    for r in rows:
        auto, named = number(r.get("auto_us")), number(r.get("named_us"))
        ratio = "–" if auto is None or named is None else f"{auto / named:.4f}"
        slower += auto is None or (named is not None and auto > (1 + WORSE) * named)
        out.append(f"| {r['source']} | {r['setting']} | {r['named']} | {ms(r['named_2s_us'])} | "
                   f"{ms(r['auto_2s_us'])} | {ms(r.get('named_us'))} | {ms(r.get('auto_us'))} | "
                   f"{ratio} | {float(r['auto_seconds']):.1f} |")
    out += ["", f"At the default time limit `auto` is slower than the named plan (or has none) "
            f"in {slower} of these {len(rows)} settings.", ""]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", default=str(ROOT.parent / "shared"))
    parser.add_argument("--from-csv", action="store_true",
                        help="render the fragment again from bench/misses.csv, placing nothing")
    args = parser.parse_args()
    table, fragment = ROOT / "bench" / "misses.csv", ROOT / "bench" / "fragments" / "misses.md"
    if args.from_csv:
        rewrite_fragment(fragment, markdown(read_rows(table), "", 0.0), "bench/misses.csv")
        return 0
    tick = time.perf_counter()
    rows = []
    for miss in misses(Path(args.shared)):
        rows.append(place_again(miss))
        print(f"{miss[0]} {miss[1]}: {rows[-1]}", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - tick
    write_rows(rows, table)
    fragment.write_text(markdown(rows, "python bench/misses.py", elapsed))
    print(f"wrote {fragment} and bench/misses.csv in {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
