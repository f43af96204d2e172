"""``auto``: the best plan of a portfolio found before the request's deadline (anytime).

How it decides, in order (each step replayed by the simulator; the fastest plan within memory
wins, so ``auto`` is never slower than any candidate it ran):

1. The candidates of :data:`PORTFOLIO`: m-ETF with the reduction pipeline (the first plan,
   as fast as m-ETF alone), then the cheap ones, m-TOPO and m-fill (memory first) with and
   without the pipeline, then m-cut (m-fill's kind of plan with the cheapest cuts; without
   the pipeline up to :data:`CUT_MAX_OPS` ops), m-ETF on the unreduced graph (the pipeline
   fuses away the parallelism of small graphs), m-EFT both ways where some op's time differs
   between devices (else later, step 7; :data:`PORTFOLIO`), m-SCT both ways (graphs up to
   :data:`SCT_MAX_OPS` ops: its LP grows super-linearly), and ``exact`` (CP-SAT, at most
   :data:`EXACT_MAX_S` seconds): on the graph itself when it has at most
   :data:`~baechi.algorithms.exact.EXACT_MAX_OPS` ops (from :data:`REDUCED_FIRST_MIN_OPS`
   ops up, first on the reduced graph, as named ``exact`` with the pipeline solves it, where
   m-ETF's plan with the pipeline leads), else on graphs the pipeline reduces to
   :data:`EXACT_MAX_NODES` nodes or fewer, on the relaxed model (``Problem.relaxed``:
   sequential mode's channels and received copies left out), which finds faster plans in
   the time it gets there (see :data:`PORTFOLIO`); from its own start (the better of m-ETF's
   and m-fill's plans), as ``exact`` alone starts. Each candidate after the first may use
   :data:`CANDIDATE_SHARE` of the time left, ``exact`` :data:`EXACT_SHARE` (all of it while
   there is no plan). A candidate whose algorithm is not registered
   (:data:`baechi.algorithms.ALGORITHMS`) is skipped.
2. Repair (:func:`baechi.repair.repair`) of the refused plans that overshot memory least
   (:data:`REPAIR_STARTS`) and of as many first plans (placed within the true limits,
   before the memory retries), and of the plans of :data:`BLIND_STARTS` placed as if memory
   were unlimited (the "cheapest" strategy; before ``exact``, which may take the time left):
   units move off the overflowing devices until every device fits. A greedy placer that
   dead-ends leaves a fast plan over a limit; repaired, it often beats m-fill's
   memory-first segments. When none of the cheap candidates (up to m-fill) found a plan,
   or m-ETF's (the first) overshot memory, the first blind start runs right after them,
   before the costlier ones take the time; with no plan, after m-cut with the pipeline,
   which secures one first (:data:`PORTFOLIO`).
   With still no plan, a last repair starts from the persistent bytes spread evenly
   (:data:`SPREAD_LABEL`); where they fill at least :data:`SPREAD_EARLY_SHARE` of the
   memory, right after the cheap candidates, followed by the repairs of their refused
   plans, before that first blind start.
3. The single-device plan, when the whole graph fits on one device and ``allow_single`` is on
   (with it off, neither this plan nor the "single" blind start runs).
4. Local search (:func:`baechi.search.improve`) from the best plan, on the unreduced graph's
   units, in slices until :data:`SEARCH_PATIENCE` slices in a row gain less than
   :data:`SEARCH_MIN_GAIN`, or the deadline.
5. Rounds, while time is left: ``exact`` again, on the full model, where it did not prove
   the plan it returned optimal (:func:`_proved`) or ran on the relaxed model, with the time
   left (at most :data:`EXACT_MAX_S`), now hinted with the best plan so far (the searched
   one; on the reduced graph the best plan on that reduction), then local search from its
   plan when that is faster, then ``exact`` hinted with that plan, and so on. The rounds
   stop at the deadline, at a proof, or after a round that found nothing faster. Why two
   starts: CP-SAT warm-started from a plan that local search or m-SCT cannot improve often
   stays at it, where from m-ETF's plan it finds a faster one (``bert24_training_layer``,
   PCIe, 75% memory: from m-SCT's 141.9 ms plan it still had 141.9 ms after 1 s and reached
   138.3 ms after 4 s; from m-ETF's 161.1 ms plan, 138.3 ms within 1 s); and from the best
   plan it often finishes what its first share did not. Local search stagnating early would
   otherwise leave the budget unused.
6. Restarts, while time is left: local search from the next fastest plans found
   (:data:`SEARCH_RESTARTS`), since where it stagnates its result depends on its start.
7. On devices alike, with at least :data:`LATE_MIN_S` left: m-EFT both ways, skipped in step
   1 there, then local search from the best plan when one of them is faster.
8. A finer reduction, with at least :data:`FINER_MIN_S` left: ``exact`` on the graph reduced
   with the merge cap scaled by :data:`FINER_CAP_SCALE` (more, smaller nodes: the pipeline's
   fuse units of up to half a device under memory limits, which leaves few ways to split),
   on its relaxed model, then local search from its plan when it is faster.
9. One long solve, with at least :data:`EXACT_LONG_MIN_S` left: ``exact`` on the graph
   itself, where no run proved its plan optimal, hinted with the best plan and given the
   time left (until the deadline or a proof). Its rounds restart CP-SAT's search each time;
   one long run keeps what it learned (``gnmt_training_layer``, PCIe, 50% memory, at the
   default 60 s: 377.2 ms after 21 s without it, 352.0 ms with it).

It stops early when a plan reaches the lower bound or ``exact`` proves one optimal. After the
deadline no candidate starts, except m-fill while no plan was found yet (it is linear and the
one most likely to fit). The deadline is ``options.time_limit_s`` after the request started.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from baechi.algorithms import ALGORITHMS
from baechi.algorithms.base import Assignment
from baechi.algorithms.exact import EXACT_MAX_OPS
from baechi.bounds import meets_bound
from baechi.errors import InfeasiblePlacement
from baechi.placing import (
    Request,
    Run,
    add_seconds,
    memory_blind_replay,
    overshoot,
    run_algorithm,
    single_plan,
    spread_plan,
)
from baechi.plan import Candidate, Chosen
from baechi.repair import Strategy, repair
from baechi.search import improve
from baechi.simulate import Simulation

#: ``auto`` runs m-SCT only on graphs up to this many ops: its LP grows super-linearly
#: (26 s on 30k ops with GLOP) and on the shared graphs it never beat m-ETF by much.
SCT_MAX_OPS = 5000

#: ``auto`` runs m-cut on the unreduced graph only up to this many ops: each of its walks
#: from a start position is as long as a device's stretch, and takes each unit with all its
#: ops (pipedream_nasnetalarge, 1,251 ops, 50% of its peak on 4 PCIe devices: 0.67 s of the
#: 2 s, which m-SCT and the repairs then lacked: 334.7 -> 655.3 ms). Its unreduced plans won
#: only on graphs of up to 326 ops (bench/results.csv). ``python bench/compare.py`` at 2 s
#: (204 memory-limited settings), m-cut taking whole units with this cap against m-cut
#: counting each stretch's positions up to 2,000 ops: geomean 1.0005 (21 faster, 28 slower,
#: within the noise of two passes). Its run with the pipeline has no cap: capped at this many
#: nodes too, ``auto`` at 2 s on bench/generated.py's 2,000-op graphs (970-1,384 nodes,
#: where that run took 0.4-0.7 s for no plan) gave geomean 0.995 and 0.998 in two passes
#: (36 settings), but bench/clusters.py's gnmt_baechi (582 nodes) on the mixed cluster, PCIe,
#: lost m-cut's 118.7 ms plan, the fastest named one: 144.9 ms.
CUT_MAX_OPS = 500

#: ``auto`` runs ``exact`` on the graph itself when it has at most
#: :data:`~baechi.algorithms.exact.EXACT_MAX_OPS` ops (a proof then holds for the request),
#: else on the reduced graph when that has at most this many nodes.
EXACT_MAX_NODES = 300

#: On graphs of at least this many ops (and at most
#: :data:`~baechi.algorithms.exact.EXACT_MAX_OPS`), ``auto`` runs ``exact`` on the reduced
#: graph before the graph itself where the fastest plan so far is m-ETF's with the pipeline,
#: faster by :data:`REDUCED_LEAD` than every plan of the graph itself: the reduction kept
#: what fast plans need, and on fewer nodes CP-SAT improves on that plan in the time it
#: gets, where on the graph itself it does not. gnmt_training_layer (192 ops, 94 nodes, 4
#: devices, PCIe, 2 s): ``exact`` on the graph itself spent 1.33 s for a plan slower than its
#: start, on the reduced graph 1.32 s for 376.0 ms from m-ETF's 378.7 ms; ``auto`` 377.8 ->
#: 375.1 ms. Below this size ``exact`` on the graph itself proves or improves within its
#: time, and the reduced graph's run only takes that time from it: without the floor,
#: ``python bench/compare.py --all-memory`` on the graphs of up to 300 ops (132 settings at
#: 2 s) gave stg50_rand0000 (NVLink) 6.7% slower, and the small cases of
#: ``baechi.testing.small_cases`` (360, 10-40 ops) up to 3.5%.
REDUCED_FIRST_MIN_OPS = 150

#: The relative lead of m-ETF's plan with the pipeline over every plan of the graph itself
#: above which ``exact`` runs on the reduced graph first (:data:`REDUCED_FIRST_MIN_OPS`).
REDUCED_LEAD = 1e-3

#: Seconds ``exact`` may take in ``auto`` at most (it stops earlier when it proves the
#: optimum): on the STG graphs (50–100 ops, 4 devices) it proves most within this, and the
#: time left goes to local search.
EXACT_MAX_S = 10.0

#: Local search runs in slices of at least this many seconds (more for large graphs,
#: :data:`SEARCH_SLICE_S_PER_OP`); it stops after :data:`SEARCH_PATIENCE` slices in a row
#: that improved the step time by less than :data:`SEARCH_MIN_GAIN`, or at the deadline.
SEARCH_SLICE_S = 0.1

#: Seconds of local search per op in one slice (10k ops: 1 s).
SEARCH_SLICE_S_PER_OP = 1e-4

#: Relative gain below which a slice of local search counts as stagnant.
SEARCH_MIN_GAIN = 1e-3

#: Local search stops after this many stagnant slices in a row. Searching on from the best
#: plan until the deadline instead, after the rounds and restarts (``python bench/compare.py``
#: on the memory-limited settings): geomean step 0.999 of this at 2 s (202 settings) and at
#: 10 s (the 54 at 50% memory; 15 faster, 3 slower): not worth requests that always take
#: their whole time limit.
SEARCH_PATIENCE = 2

#: After the rounds and restarts, with at least this many seconds left, ``exact`` on the
#: graph itself (where no shorter run proved its plan optimal) runs once more, hinted with
#: the best plan, until the deadline or a proof: its reruns of at most :data:`EXACT_MAX_S`
#: each restart CP-SAT's search, where one long run keeps what it learned. No shorter than
#: the runs before it, so only long limits (the default 60 s) reach it. Measured at 60 s
#: with ``python bench/compare.py --a baechi.auto.EXACT_LONG_MIN_S=inf --seconds 60``:
#:
#: - memory-limited (both networks at 75%, 50%, 30% and suggested memory; ten graphs of
#:   64-235 ops): geomean step 0.9957 of without, 10 of 60 faster, none slower
#:   (gnmt_training_layer, PCIe, 50%: 377.2 -> 352.0 ms; NVLink, 30%: 367.9 -> 338.8 ms);
#:   those requests then use their whole limit (median 21 -> 50 s);
#: - without memory limits (PCIe, 22 settings of the graphs of up to 300 ops, STG's
#:   included): 0.9972, 2 faster, none slower, median seconds unchanged (4.5: most are
#:   proven optimal before).
#:
#: At 2 s left instead of 10, at ``time_limit_s`` 10 (46 settings at 75% and 30% memory):
#: 0.9998, 4 faster, 2 slower: no gain where the rounds already get the time left.
EXACT_LONG_MIN_S = EXACT_MAX_S

#: With at least this many seconds left after the rounds and restarts, and no proof, ``exact``
#: solves a finer reduction (:data:`FINER_CAP_SCALE`) on its relaxed model with
#: :data:`EXACT_SHARE` of the time left (at most :data:`EXACT_MAX_S`); local search follows
#: from its plan when it is faster. Not a portfolio entry: at 2 s it took the time the
#: others need (``python bench/compare.py --network pcie``, the memory-limited settings:
#: geomean 1.014, and resnet50_inference_layer on 14 devices lost its only plan), while
#: with time left, at 30 s on the PCIe 30%/50% settings of the graphs of 300-1300 ops that
#: the coarse reduction serves worst (17 settings): geomean 0.984, 10 faster, 3 slower (at
#: most 1.3%); resnet50_inference_operator, 30%: 352.3 -> 328.5 ms; resnet50_training_layer,
#: 30%: 548.2 -> 528.4 ms; median seconds 11.5 -> 23.5 (it takes time the request had left).
#: At 10 s on every 75/50/30% setting of both networks (162): geomean 0.998, 35 faster, 24
#: slower (at most 4.1%: the noise of CP-SAT's two workers in the stages before it);
#: resnet50_training_layer, PCIe, 30%: 630.2 -> 548.9 ms.
FINER_MIN_S = 1.0

#: With at least this many seconds left after the rounds and restarts, on devices that no
#: op's time tells apart, the ``mixed_speeds`` entries (m-EFT both ways) run, each with
#: :data:`CANDIDATE_SHARE` of the time left, then local search from the best plan when one
#: of them is faster. There m-EFT differs from m-ETF only in which ready op goes first, and
#: in the candidates' order its two runs took time the others needed at 2 s (see
#: :data:`PORTFOLIO`); with time left they cost little, and ``auto`` is then never slower
#: than named m-EFT. bench/misses.py at the default 60 s, before this step: 0.12% slower
#: than named m-EFT on pipedream_nasnetamobile (NVLink, 70%) in one run of two. At 2 s it
#: rarely has the time: ``python bench/compare.py --a baechi.auto.LATE_MIN_S=inf`` (204
#: memory-limited settings) gave geomean 1.0004, 23 faster, 23 slower, and the two largest
#: differences (resnet50_training_layer, NVLink, 30%, 9%; pipedream_densenet121, PCIe, 75%,
#: 6%) came back in reruns where the step did not run: noise.
LATE_MIN_S = 1.0

#: The scale of the merge cap (:func:`~baechi.grouping.merge_cap`) of the finer reduction
#: (:data:`FINER_MIN_S`). Under memory limits the pipeline fuses units of up to half a device
#: (resnet50_inference_layer at 30% of its peak: 177 ops, 26 nodes), which leaves the solver
#: few splits that fit; at half the cap, 44 nodes. ``exact`` alone for 2 s on each reduction
#: (the PCIe 30%/50% settings, against auto's 2 s plan): at 0.5, 0.86 on
#: resnet50_training_layer (30%) and 0.93 on resnet50_inference_operator (50%), at 0.25
#: 0.93 on resnet50_inference_layer (50%), but at 0.25 worse than 1 on most: finer graphs
#: are slower to solve.
FINER_CAP_SCALE = 0.5

#: Every candidate but the first may use at most this share of the time left when it starts
#: (memory retries, solver time), so that the ones after it, and local search, get time too.
CANDIDATE_SHARE = 0.5

#: The share of the time left that an ``exact`` entry may use: more than the other
#: candidates, because CP-SAT's plans improve with time where local search has stagnated.
#: Measured with ``time_limit_s`` 2 on the benchmark settings (bench/run.py):
#: ``exact`` on bert_l-12_training_operator reduced (PCIe, 75%) needs about 1.3 s to leave
#: m-ETF's 2025 ms plan for 1897 ms; at half the time left it got 0.8 s. While no candidate
#: has found a plan, ``exact`` takes all the time left: nothing after it needs time then (the
#: repairs ran before it), and CP-SAT may need it for a first solution (bench/brute.py's
#: layered_s0_n8_ccr1, sequential, 2 x 60%: at this share ``auto`` found the 78 µs plan in 4
#: of 6 runs, with the whole time in 6 of 6).
EXACT_SHARE = 0.75

#: With time left after the rounds, local search runs again from this many of the next
#: fastest plans found (any plan it already started from excluded, equal plans of two runs
#: included): where it stagnates, its result depends on its start. README's GNMT job
#: (768 MiB, PCIe): from the single-device plan repaired, 116.7 -> 116.6 ms; from m-fill's
#: plan, 117.8 -> 113.7 ms. At 3, that job took 6-9 s for no faster plan; measured again
#: with branch moves (three runs each): 114.4 ms in 7-8 s at 3, 113.3 ms in 4-5 s at 1 (the
#: plan chosen under FIFO channels orders worse), while on bench/run.py's memory-limited
#: settings up to 3k ops (``time_limit_s`` 2, one pass) 3 gave a geomean of 0.9965 on PCIe
#: and 0.9988 on NVLink against 1: within the 0.2-0.3% two passes of the same code differ.
SEARCH_RESTARTS = 1

#: Refused plans (over memory) that ``auto`` tries to repair, those overshooting least first.
REPAIR_STARTS = 2

#: Plans placed as if no device had a memory limit that ``auto`` repairs under a memory limit,
#: before ``exact`` (which may take the time left): (algorithm, with the reduction pipeline,
#: repair strategy). Such a plan keeps the parallelism that memory-aware choices give up, and
#: its overshoot is often a few blocks that a few moves fix. Measured at 2 s against ``auto``
#: without them (bench/results.csv): inceptionv3_training_layer, NVLink, 30%: 388 -> 295 ms
#: (m-SCT's); pipedream_resnet50, PCIe, 75%: 781 -> 705 ms (the single-device plan).
#: m-ETF's plan of the reduced graph first: placed in milliseconds, it spreads fused blocks
#: over every device and overshoots a little, where "largest" (most bytes first) fits it
#: within a few steps (gnmt_baechi, 600 MiB, NVLink: in 0.5 s, 80.6 -> 81.4 ms). Against the
#: three starts without it, at ``time_limit_s`` 10 on 8 graphs at 50/60/70% of their peak
#: on both networks (48 settings, 34 with a plan; ``python bench/compare.py --fractions
#: 0.5,0.6,0.7 --seconds 10``, two passes): geomean 0.977 and 0.981; faster by over 0.1%
#: in 8 and 9, slower in 4 and 3 (at most 1.2%): bert_l-6_training_operator, PCIe, 70%:
#: 324.1 -> 192.8 ms; pipedream_nasnetamobile, PCIe, 70%: 435.0 -> 379.4 ms; gnmt_baechi,
#: NVLink, 70%: 85.8 -> 80.6 ms (at 600 MiB with 10 s: 103.8 -> 80.7 ms). At 2 s (96
#: settings, 40-90%): 0.999, within the noise of the time shares. The cheap single-device
#: plan last: it needs little time to win where it wins.
#:
#: When none of the cheap candidates (m-ETF with the pipeline, m-TOPO, m-fill) found a plan, the
#: first start alone runs right after them with a candidate's share of the time left
#: (:data:`CANDIDATE_SHARE`), the others where they ran before; when m-ETF's plan (the first
#: candidate) overshot memory but m-fill's fits, it runs there too, with a blind start's share
#: (:data:`BLIND_SHARE` over the four). Run with the others instead, before ``exact``, it came after
#: m-ETF unreduced and m-SCT's LPs had taken the time: on a machine 3x slower than the benchmarks'
#: (m-ETF on gnmt_baechi at 768 MiB: 0.35-0.43 s; emulated with four busy loops beside it on 2
#: cores) it got 0.016 s and was not placed, and gnmt_baechi (NVLink, 75%) got m-ETF unreduced's
#: 85.9 ms instead of its repair's 80.6 ms. ``python bench/compare.py`` at 2 s, early against with
#: the others: on the benchmarks' machine (0.13 s for that m-ETF), every memory-limited setting
#: (204), geomean 0.9989 (13 faster, 15 slower, at most 1.5%: CP-SAT varies more than that between
#: two runs of one variant); on the emulated slower machine, the 75% and 30% settings (108), 0.9999
#: (14 faster, 18 slower), gnmt_baechi NVLink 75% 85.9 -> 80.6 ms. Why early where no cheap
#: candidate fits: m-ETF unreduced and m-SCT's LP took the 2 s of gnmt_baechi at 600 MiB (no
#: network), which got no plan, where the repair needs 0.55 s (now 80.5 ms at 2 s). Against running
#: it with the others, on the 5 graphs of the memory sweep that have such settings at 40/60/70% of
#: their peak (``python bench/compare.py --fractions 0.4,0.6,0.7 --graph gnmt_baechi --graph
#: nasnetalarge --graph nasnetamobile --graph resnet101 --graph resnext101``): at 10 s, geomean
#: 0.982, 3 faster (pipedream_nasnetamobile, PCIe, 70%: 468.3 -> 389.6 ms; gnmt_baechi, NVLink, 70%:
#: 85.8 -> 80.6 ms), 1 slower (0.4%); at 2 s, two passes: 0.982 and 0.988, a plan where there was
#: none (pipedream_resnet101, PCIe, 60%: 721.6 ms), gnmt_baechi NVLink 70% 116.6 -> 80.6 ms, and
#: pipedream_nasnetamobile PCIe 70% slower (477.8 -> 530.3 and 474.4 -> 538.3 ms: the costlier
#: candidates get less of the 2 s).
BLIND_STARTS: tuple[tuple[str, bool, Strategy], ...] = (
    ("m-etf", True, "largest"),
    ("m-sct", False, "cheapest"),
    ("m-etf", False, "cheapest"),
    ("single", False, "cheapest"),
)

#: The share of the time left that the starts of :data:`BLIND_STARTS` may use together,
#: placing and repairing (each an equal part of the time left when it starts). A repair
#: that does not fit memory before its plan is slower than the best so far gives up early.
#: Where repairs fail they use all of it, which ``exact`` and the search then lack (at 0.6:
#: bert_l-12_training_operator, PCIe, suggested memory, lost 0.75 s of 2 s to three failed
#: repairs); at 0.3 the repairs of inceptionv3_training_layer (NVLink, 30%), 0.17 s each,
#: ran out of time (388 ms instead of 295 ms).
BLIND_SHARE = 0.45

#: The start of the last repair ``auto`` tries while it has no plan within memory
#: (:func:`~baechi.placing.spread_plan`): the persistent bytes spread evenly over the
#: devices. Where weights fill most of the memory, every placer's plan overflows a device:
#: resnet50_inference_layer on 14 devices at its suggested 2 GiB (weights 94% of its peak)
#: had no plan; repaired ("cheapest") from this start in 0.3 s, 297.3 ms (NVLink).
SPREAD_LABEL = "the persistent bytes spread evenly"

#: When the persistent bytes fill at least this share of the devices' memory and none of the
#: cheap candidates found a plan, the spread start runs right after them, before the first
#: blind start and the costlier candidates: it is the start made for weights that fill the
#: devices, and the others would take a short time limit first. Until a better plan comes,
#: its plan (every tensor crosses devices) does not stop the refused plans' repairs, which run
#: while there is no plan. resnet50_inference_layer on 14 devices at its suggested 2 GiB
#: (weights 65% of the cluster's memory) had no plan at 2 s with the spread start last; after
#: the first blind start, NVLink 294.6 ms, PCIe 3058-3135 ms, but on a machine 2x slower than
#: the benchmarks' the blind start's failed repair (0.85 s) left it too little time one run in
#: three. Before the blind start (``python bench/compare.py --graph inference --memory
#: suggested --memory 30%``, at 2 s on that slower machine, against after it): a plan in two
#: settings where there was none (resnet50_inference_layer and resnet50_inference_operator,
#: NVLink, suggested memory), geomean 0.997 of the other 47 (6 faster, 4 slower, at most
#: 3.7%). Training graphs' weights fill under a quarter of the memory at the benchmark's
#: levels. The refused plans' repairs follow it there (they run in ``blind()`` too, before
#: the blind starts), as the first blind start's failed repair (0.6 s on that slower
#: machine) otherwise left them no time: with them, and m-fill's refused plan (its first)
#: repaired "cheapest" too, ``python bench/compare.py --memory suggested --memory 30%`` at
#: 2 s (80 settings) gave geomean 0.991 (suggested 0.979, 30% 1.005: within the noise of two
#: passes on a 2-core machine, up to 10% on a setting); resnet50_inference_operator, PCIe,
#: suggested 1005 -> 472 ms; resnet50_inference_layer, NVLink, suggested, 297 -> 245 ms;
#: PCIe, suggested, 3058 -> 1472 ms in most runs (m-fill's first plan, repaired in 0.05 s,
#: comes after three failed repairs of 0.3 s each). Run wherever no cheap candidate found a
#: plan (not only where weights fill the memory), pipedream_nasnetamobile, PCIe, 75%, lost
#: the time m-SCT needed (366 -> 710 ms).
SPREAD_EARLY_SHARE = 0.5

#: The note of a candidate that found no plan within memory.
NO_FIT = "no plan within memory"

#: The note of a candidate stopped by its share of the time (the whole time, for the first),
#: and added to :data:`NO_FIT` when the share had run out as it stopped: its memory retries
#: stop there, so with more time it may find a plan (gnmt_baechi on two
#: devices of 80% and two of 50% of its peak at half the speed, NVLink, 2 s: m-SCT unreduced
#: stopped after 0.34 s; alone it fits in 0.54 s with one retry).
SHARE_RAN_OUT = "its share of the time ran out"

#: The note of a memory-blind repair start whose algorithm placed nothing: no plan (one
#: device cannot run every op), or the start's share of the time ran out first.
NOT_PLACED = "not placed (no plan, or its share of the time ran out)"


@dataclass(frozen=True)
class Entry:
    """One candidate of the portfolio: an algorithm, with the reduction pipeline or not.

    ``min_ops``/``max_ops`` skip it on smaller/larger graphs; ``max_seconds`` caps its
    time, memory retries included (the rest of the budget goes to the candidates after
    it); ``max_nodes``
    skips it when the pipeline leaves more nodes than that (known from an earlier candidate
    on the same reduction);
    ``hinted`` gives the algorithm the best plan so far on the same reduction as a warm start
    (``Problem.hint``); ``last_resort`` lets it start after the deadline while no plan was
    found; ``relaxed`` has it solve its relaxation (``Problem.relaxed``); ``if_reduced_leads``
    skips it unless the fastest plan so far is m-ETF's with the pipeline, ahead of every plan
    of the graph itself (:data:`REDUCED_FIRST_MIN_OPS`); ``mixed_speeds`` runs it in order
    only where some op's time differs between devices (their speeds or kinds,
    :attr:`~baechi.costmodel.CostModel.same_op_times`), elsewhere late, with time left
    (:data:`LATE_MIN_S`); ``secures_plan``, while no
    candidate has found a plan, runs it before the first blind start and lets it use all
    the time left, the deadline still holding (see :data:`PORTFOLIO`).
    """

    algorithm: str
    pipeline: bool
    min_ops: int = 0
    max_ops: int | None = None
    max_seconds: float | None = None
    max_nodes: int | None = None
    hinted: bool = False
    last_resort: bool = False
    relaxed: bool = False
    cap_scale: float = 1.0
    if_reduced_leads: bool = False
    mixed_speeds: bool = False
    secures_plan: bool = False


#: The candidates, in the order they run: the first plan as m-ETF gives it, then the cheap
#: and different ones (m-TOPO and m-fill take milliseconds and are what fits under tight
#: memory), then the costlier list schedulers and the solver. On a reduced graph the solver
#: first solves its relaxed model (no channels, no received copies): CP-SAT finds fast plans
#: of it sooner, and the replay judges them with the channels and the copies. Received copies
#: in the full model only: ``auto`` at 2 s on the PCIe memory-limited settings, geomean
#: 1.0009 of none anywhere (7 faster, 10 slower, within the noise of two passes; measured
#: while the relaxed run's warm start still held outputs as the full model does), where in
#: the relaxed model too, 1.0013 over both networks (``resnet50_training_layer``, PCIe, 50%:
#: 375.7 -> 434.2 ms, its relaxed run no longer proving the reduced graph's optimum in time).
#: ``exact`` alone at 1 s on
#: inceptionv3_training_layer reduced (52 nodes, PCIe, 30% memory): 958 ms on the full model,
#: 721-768 ms relaxed. On the graph itself (a proof then holds for the request) it solves the
#: full model, as named ``exact`` does: relaxed there, bert24_training_layer (64 ops, PCIe,
#: 75%) stayed at 138.7 ms where named ``exact`` finds 138.3 ms. ``auto`` at 2 s on the 282
#: memory-limited settings of bench/run.py, one pass each: geomean 0.998 of the full model
#: everywhere (39 faster, 17 slower; pipedream_nasnetalarge, PCIe, 50%: 335 -> 301 ms), 1.001
#: of the relaxed model everywhere (25 faster, 21 slower), without the bert24 losses.
#: m-cut after m-fill, both ways: ``python bench/compare.py`` (204 memory-limited settings,
#: 2 s) against the portfolio without it: geomean 0.9975, on PCIe 0.9947 (at 50% memory
#: 0.983: resnet50_training_layer 454.8 -> 375.7 ms, resnet50_inference_layer 282.2 -> 255.5
#: ms, inceptionv3_inference_layer at 75% 307.5 -> 290.5 ms), 18 faster and 20 slower (at
#: most 2.5% but gnmt_baechi, NVLink, 75%: 80.6 -> 85.8 ms, the m-cut of its reduced graph
#: taking 0.7 s of the 2 s with four memory retries; 80.6 ms both ways when rerun alone).
#: m-EFT (earliest finish) both ways after m-ETF unreduced, where devices differ in speed or
#: kind: ``auto`` at 2 s with against without them (bench/generated.py's graphs on its three
#: devices of speeds 1, 0.5, 0.5, unlimited and at 50% memory, and bench/clusters.py's mixed
#: cluster on both networks; 118 settings, one pass): geomean 0.975, 41 faster, 14 slower
#: (the faster up to 23% on fork_join_s7_n2000_ccr0.3 at 50%, pipedream_nasnetalarge, NVLink,
#: 345.3 -> 238.7 ms; the slower up to 6.6%, within the noise of CP-SAT and the time shares
#: at 2 s). Not on identical devices, where the two differ only in which ready op goes first:
#: run there too, on bench/run.py's 204 memory-limited settings at 2 s (one pass), geomean
#: 0.9993, 27 faster, 32 slower (pipedream_nasnetalarge, PCIe, 50%: 334.7 -> 300.4 ms;
#: resnet50_training_operator, NVLink, suggested: 618.0 -> 658.4 ms, the time it took from the
#: others): noise, for the time of two more candidates. Again on a machine where m-ETF places
#: gnmt_baechi at 768 MiB in 0.10 s (``python bench/eft.py --identical``): 1.0008, 9 faster, 18
#: slower (resnet50_training_layer, PCIe, 50%: 375.7 -> 417.6 ms), and nasnetalarge's 299.7 ms
#: without them. Hence, on devices alike, they run late, with time left (:data:`LATE_MIN_S`).
#: m-cut with the pipeline ``secures_plan``: where no cheap candidate found a plan it runs
#: before the first blind start (which then keeps a candidate's share, as with no plan) and
#: may use all the time left. The blind start's repair may use its share and fail, and left
#: m-cut too little: gnmt_baechi at 70% of its peak, NVLink, got no plan at 2 s on a machine
#: where m-ETF places gnmt_baechi at 768 MiB in 0.18 s (on one at 0.10 s, m-cut alone needs
#: 0.14 s there, the repair 0.28 s). Emulated at 0.36 s (six busy loops beside it on 2
#: cores), after against before: NVLink 70% 117.2 ms where there was no plan (3 of 3 runs),
#: PCIe 70% 129.6 ms against 124.9 (m-cut's plan; the repair now lacks the time), NVLink 75%
#: 80.6 against 116.8 ms. ``python bench/compare.py`` at 2 s on a machine at 0.10 s, m-cut
#: first wherever the first blind start ran early (a superset: where m-fill's plan fits too),
#: 204 settings: geomean 0.9996, 7 faster, 14 slower (at most 2.1%: noise;
#: resnet50_training_layer, PCIe, 30%: 626.7 -> 553.7 ms); with ``--fractions 0.4,0.6,0.7``
#: on the five graphs of the memory sweep that have no-plan settings: 0.9987, none slower.
#: Not where m-fill's plan fits: there, on the emulated slower machine, m-cut first and a
#: candidate's share for the repair took m-SCT's time (pipedream_nasnetamobile, PCIe, 75%:
#: 366.4 -> 419.2 ms).
PORTFOLIO: tuple[Entry, ...] = (
    Entry("m-etf", True),
    Entry("m-topo", True),
    Entry("m-topo", False),
    Entry("m-fill", False, last_resort=True),
    Entry("m-fill", True, last_resort=True),
    Entry("m-cut", True, secures_plan=True),
    Entry("m-cut", False, max_ops=CUT_MAX_OPS),
    Entry("m-etf", False),
    Entry("m-eft", False, mixed_speeds=True),
    Entry("m-eft", True, mixed_speeds=True),
    Entry("m-sct", True, max_ops=SCT_MAX_OPS),
    Entry("m-sct", False, max_ops=SCT_MAX_OPS),
    Entry("exact", True, min_ops=REDUCED_FIRST_MIN_OPS, max_ops=EXACT_MAX_OPS,
          max_seconds=EXACT_MAX_S, if_reduced_leads=True),
    Entry("exact", False, max_ops=EXACT_MAX_OPS, max_seconds=EXACT_MAX_S),
    Entry("exact", True, min_ops=EXACT_MAX_OPS + 1, max_nodes=EXACT_MAX_NODES,
          max_seconds=EXACT_MAX_S, relaxed=True),
)


@dataclass(frozen=True)
class Outcome:
    """The plan ``auto`` returns and how it got there (see :class:`~baechi.plan.PlanStats`)."""

    run: Run
    simulation: Simulation
    candidates: list[Candidate]
    chosen: Chosen
    seconds: dict[str, float]
    deadline_reached: bool
    #: The best lower bound proved on every plan's step time: the request's
    #: (:attr:`Request.bound_us`), or a solver's (``exact`` on the graph itself), whichever
    #: is higher.
    bound_us: float
    #: The other plans found (slower under FIFO channels), each with the run and the choice
    #: it stands for: the transfer-order post-pass may make one of them the fastest.
    others: list[tuple[Run, Simulation, Chosen]] = dataclasses.field(default_factory=list)

    @property
    def optimal(self) -> bool:
        """Whether the returned plan meets the bound, so no plan is faster."""
        return meets_bound(self.simulation, self.bound_us)


def place_auto(request: Request) -> Outcome:
    """Run the portfolio on ``request`` (see the module docstring).

    Raises
    ------
    InfeasiblePlacement
        No candidate found a plan within memory (the first candidate's reason, noted).
    """
    report = request.progress
    graph = request.graph
    candidates: list[Candidate] = []
    runs: list[Run] = []
    # ``exact`` entries that ran without a proof, or on the relaxed model
    solver_entries: list[Entry] = []
    best: Run | None = None
    seconds: dict[str, float] = {}
    deadline_reached = False
    applicable = [e for e in PORTFOLIO if e.algorithm in ALGORITHMS and len(graph) >= e.min_ops
                  and (e.max_ops is None or len(graph) <= e.max_ops)]
    # on devices alike, the mixed_speeds entries run late, with time left (LATE_MIN_S)
    late = [e for e in applicable if e.mixed_speeds and request.cost.same_op_times]
    entries = [e for e in applicable if e not in late]
    # the cheap entries come first (the last resorts the last of them); when none found a
    # plan, the first blind start runs before the costlier entries (see BLIND_STARTS)
    last_cheap = max((i for i, e in enumerate(entries) if e.last_resort), default=len(entries))
    blind_started: set[tuple[str, bool, Strategy]] = set()  # the BLIND_STARTS that ran
    single: Simulation | None = None
    blind_done = False
    spread_done = False
    spread_best: Run | None = None  # the best plan when it is the spread start's repair
    secured: Run | None = None  # the plan of a secures_plan entry, found while none was
    repaired_runs: list[Run] = []
    repaired_ids: set[tuple[int, Strategy]] = set()  # refused plans repaired, and how

    def take(repairs: Iterator[tuple[Simulation | None, Candidate]]) -> None:
        nonlocal best, seconds
        for fixed, candidate in repairs:
            candidates.append(candidate)
            seconds = add_seconds(seconds, {"repair": candidate.seconds})
            if fixed is None:
                continue
            # a plan of every op, whichever graph its start placed; labelled as the start
            options = request.options if candidate.pipeline else \
                request.options.without_pipeline()
            run = Run("repair", options, request.unreduced, fixed)
            repaired_runs.append(run)
            if best is None or fixed.estimate.step_time_us < _step_of(best):
                best = run

    def repair_refused() -> None:  # the refused plans not repaired yet (_refused_starts)
        take(_repairs(request, _refused_starts(request, runs, repaired_ids), _step_of(best)))

    def spread() -> None:  # once, while no plan: the persistent bytes spread evenly
        nonlocal spread_done, spread_best
        spread_done = True
        start = spread_plan(request) if not request.expired() else None
        if start is not None:
            take(_repairs(request, [(start, SPREAD_LABEL, False, CANDIDATE_SHARE, "cheapest")],
                          math.inf))
            spread_best = best

    def blind() -> None:  # once: before the solver, which may take the time left
        nonlocal single, blind_done
        blind_done = True
        single = single_plan(request) if request.options.allow_single else None
        # a plan within memory first: the refused plans are closest to one (closer than the
        # spread start's, where every tensor crosses devices)
        if best is None or best is spread_best:
            repair_refused()
        if best is None or not meets_bound(best.simulation, _bound(request, runs)):
            starts = _blind_starts(request, blind_started, skip_single=single is not None
                                   or not request.options.allow_single)
            take(_repairs(request, starts, _step_of(best)))
        if best is None and not spread_done:
            spread()

    for i, entry in enumerate(entries):
        # the first candidate always starts; past the deadline, only a last resort while
        # there is no plan
        if runs and request.expired() and (best is not None or not entry.last_resort):
            deadline_reached = True
            continue
        if best is not None and meets_bound(best.simulation, _bound(request, runs)):
            break
        if entry.if_reduced_leads and not _reduced_leads(best, runs):
            continue
        if entry.algorithm == "exact" and not blind_done:
            blind()
        elif i > last_cheap and not blind_started and (
                best is None or runs[0].simulation is None) and not (
                best is None and entry.secures_plan):
            # no plan yet, or the first (m-ETF's) overshot memory: the memory-first plans
            # that fit lack its parallelism, which the repair of its blind plan keeps
            if best is None and _weights_fill(request):
                spread()
                # then, as in blind(), the refused plans: closer to a plan than the spread's
                repair_refused()
            share = CANDIDATE_SHARE if best is None or best is secured else \
                BLIND_SHARE / len(BLIND_STARTS)
            take(_repairs(request, _blind_starts(request, blind_started, skip_single=True,
                                                 first_only=True, first_share=share),
                          _step_of(best)))
        report("auto", i / (len(entries) + 2))
        tick = time.perf_counter()
        # the first candidate has the whole time; only a last resort finishes past it
        last_resort = best is None and entry.last_resort
        if best is None and (entry.algorithm == "exact" or entry.secures_plan):
            fraction = 1.0  # nothing after exact needs time then; m-cut's plan is worth it
        else:
            fraction = EXACT_SHARE if entry.algorithm == "exact" else CANDIDATE_SHARE
        share = request if last_resort or not runs else _share(request, fraction)
        run = _run_entry(share, entry, runs, last_resort=last_resort)
        if run is None:
            continue
        runs.append(run)
        if entry.algorithm == "exact" and (not _proved(run) or _relaxed(request, entry)):
            solver_entries.append(entry)
        seconds = add_seconds(seconds, run.seconds)
        notes = []
        if run.error is not None and run.error.details.get("deadline_reached"):
            notes.append(SHARE_RAN_OUT)
        elif run.error is not None:
            notes += [NO_FIT, *([SHARE_RAN_OUT] if share.expired() else [])]
        if _relaxed(request, entry):
            notes.append(_relaxed_note(request))
        if run.algorithm_stats.get("fallback"):  # e.g. m-SCT's LP unsolved in its share
            notes.append(run.algorithm_stats["fallback"])
        candidates.append(Candidate(
            algorithm=entry.algorithm, pipeline=run.pipeline, step_time_us=run.step_time_us,
            seconds=time.perf_counter() - tick, note="; ".join(notes)))
        if run.simulation is not None and (best is None or _faster(run, best)):
            if best is None and entry.secures_plan:
                secured = run
            best = run
    if not blind_done and not request.expired():
        blind()
    if best is None or not meets_bound(best.simulation, _bound(request, runs)):
        repair_refused()
    if not blind_done and request.options.allow_single:
        single = single_plan(request)
    if single is not None:
        candidates.append(Candidate(algorithm="single", step_time_us=single.estimate.step_time_us))
        if single.estimate.step_time_us < _step_of(best):
            best = Run("single", request.options.without_pipeline(), request.unreduced, single)
    if best is None:
        errors = [r.error for r in runs if r.error is not None]
        # the first candidate's reason, unless it only says that time ran out
        error = next((e for e in errors if not e.details.get("deadline_reached")), errors[0])
        within, details = "", error.details
        if request.expired():  # candidates were skipped: more time may find a plan
            within = f" within the time limit of {request.options.time_limit_s:g} s; " \
                "a longer one may"
            details = {**details, "deadline_reached": True}
        raise InfeasiblePlacement(
            f"{error.message} (no algorithm of the portfolio found one{within})", details)
    assert best.simulation is not None
    chosen = Chosen(algorithm=best.algorithm, pipeline=best.pipeline)
    simulation = best.simulation
    bound_us = _bound(request, runs)
    # (entry, hinted): the first search starts from the portfolio's best; then the solver
    # again from the other start than its first run's, then from the best plan each time a
    # round found a faster one
    rounds: list[tuple[Entry, bool] | None] = [None, *((e, not e.hinted) for e in solver_entries)]
    search_starts: set[int] = set()  # signatures of the plans local search started from

    def solve_again(entry: Entry, note: str, share: float = 1.0) -> Run | None:
        """Run an entry (again, for a solver: a hinted one from the best plan so far) with
        ``share`` of the time left and record it; when its plan is faster, make it the best
        and return its run."""
        nonlocal seconds, bound_us, best, simulation, chosen
        tick = time.perf_counter()
        run = _run_entry(_share(request, share), entry, runs, start=simulation)
        if run is None:
            return None
        runs.append(run)
        seconds = add_seconds(seconds, run.seconds)
        bound_us = _bound(request, runs)
        candidates.append(Candidate(
            algorithm=entry.algorithm, pipeline=run.pipeline, step_time_us=run.step_time_us,
            seconds=time.perf_counter() - tick, note=note))
        if run.simulation is None or \
                run.simulation.estimate.step_time_us >= simulation.estimate.step_time_us:
            return None
        best, simulation = run, run.simulation
        chosen = Chosen(algorithm=run.algorithm, pipeline=run.pipeline)
        return run

    def search_best() -> None:
        """Local search from the best plan; its plan becomes the best when faster."""
        nonlocal seconds, simulation, chosen
        search_starts.add(_signature(simulation))
        searched, search = _search(request, simulation)
        if search is not None:
            candidates.append(search)
            seconds = add_seconds(seconds, {"search": search.seconds})
            if searched is not simulation:
                chosen = chosen.model_copy(update={"local_search": True})
                simulation = searched

    while rounds and not meets_bound(simulation, bound_us) and not request.expired():
        task = rounds.pop(0)
        if task is not None:
            entry, hinted = task
            run = solve_again(dataclasses.replace(entry, hinted=hinted, relaxed=False),
                              "again, from " + ("the best plan" if hinted else "its own start"))
            if run is None:
                continue  # found nothing faster: no search from it
            if not _proved(run):
                rounds.append((entry, True))
        search_best()
    # time left: local search again from the next fastest plans, whose result can beat the
    # first search's (it depends on its start)
    for run in _restarts([*runs, *repaired_runs], search_starts):
        if request.expired() or meets_bound(simulation, bound_us):
            break
        assert run.simulation is not None
        searched, search = _search(request, run.simulation)
        if search is None:
            continue
        candidates.append(search.model_copy(update={"note": f"from {run.algorithm}'s plan"}))
        seconds = add_seconds(seconds, {"search": search.seconds})
        if searched.estimate.step_time_us < simulation.estimate.step_time_us:
            best, simulation = run, searched
            chosen = Chosen(algorithm=run.algorithm, pipeline=run.pipeline,
                            local_search=searched is not run.simulation)
    # time left, on identical devices: the entries skipped there (m-EFT), cheap by now
    faster = False
    for entry in late:
        if request.seconds_left() < LATE_MIN_S or meets_bound(simulation, bound_us):
            break
        faster |= solve_again(entry, "with time left (devices alike)",
                              CANDIDATE_SHARE) is not None
    if faster and not request.expired():
        search_best()
    # time left: exact on a finer reduction, whose smaller nodes leave ways to split and
    # overlap that the pipeline's fused away, then local search from its plan when faster
    if request.seconds_left() >= FINER_MIN_S and not meets_bound(simulation, bound_us):
        finer = Entry("exact", True, max_nodes=EXACT_MAX_NODES, relaxed=True,
                      cap_scale=FINER_CAP_SCALE,
                      max_seconds=min(EXACT_MAX_S, EXACT_SHARE * request.seconds_left()))
        note = f"on a finer reduction (merge cap x{FINER_CAP_SCALE:g})" + (
            f"; {_relaxed_note(request)}" if _relaxed(request, finer) else "")
        if solve_again(finer, note) is not None and not request.expired():
            search_best()
    # time left: one long solve on the graph itself, hinted with the best plan, where the
    # shorter ones proved nothing (CP-SAT learns within a run, not across warm restarts)
    unproven = next((e for e in solver_entries if not e.pipeline), None)
    if unproven is not None and request.seconds_left() >= EXACT_LONG_MIN_S \
            and not meets_bound(simulation, bound_us):
        solve_again(dataclasses.replace(unproven, hinted=True, max_seconds=None),
                    "with the time left, from the best plan")
    deadline_reached = deadline_reached or request.expired()
    # the best run itself too when the search replaced its plan (its own channel order,
    # exact's, may still beat the searched plan once both are ordered)
    others = [(run, run.simulation, Chosen(algorithm=run.algorithm, pipeline=run.pipeline))
              for run in runs if run.simulation is not None and run.simulation is not simulation]
    return Outcome(best, simulation, candidates, chosen, seconds, deadline_reached, bound_us,
                   others)


def _share(request: Request, fraction: float) -> Request:
    """``request`` with its deadline ``fraction`` of the time left from now (itself at 1)."""
    if fraction == 1.0:
        return request
    return dataclasses.replace(
        request, deadline=time.perf_counter() + fraction * request.seconds_left())


def _run_entry(request: Request, entry: Entry, runs: list[Run], *, last_resort: bool = False,
               start: Simulation | None = None) -> Run | None:
    """Run one entry; ``None`` when it does not apply (too many nodes after reduction).

    A hinted entry without the pipeline starts from ``start`` when given (the best plan so
    far, searched or repaired), else from the fastest run's plan."""
    options = request.options if entry.pipeline else request.options.without_pipeline()
    if entry.max_seconds is not None and entry.max_seconds < options.time_limit_s:
        options = options.model_copy(update={"time_limit_s": entry.max_seconds})
        # the cap holds for the entry with its memory retries, not for each attempt alone
        # (at 60 s, exact on pipedream_nasnetalarge reduced, PCIe, 50%: four attempts over
        # memory took 39 s)
        request = dataclasses.replace(request, deadline=min(
            request.deadline, time.perf_counter() + entry.max_seconds))
    same = [r for r in runs if r.pipeline == entry.pipeline and r.reduction is not None
            and r.reduction.cap_scale == entry.cap_scale]
    reduced = same[0].reduction.graph if same else None
    spent: dict[str, float] = {}  # reducing with another merge cap, here
    if reduced is None and entry.cap_scale != 1.0:
        # a reduction no run placed before: none when it is the usual one or no reduction
        reduction, spent = request.reduction(options, entry.cap_scale)
        reduced = reduction.graph
        if len(reduced) in (len(request.reduction(options)[0].graph), len(request.graph)):
            return None
    if entry.max_nodes is not None and reduced is not None and len(reduced) > entry.max_nodes:
        return None
    hint = None
    if entry.hinted and not entry.pipeline:
        # every plan so far is a plan of the unreduced graph: start from the best of them
        fitting = [r.simulation for r in runs if r.simulation is not None]
        if start is not None:
            fitting.append(start)
        if fitting:
            best = min(fitting, key=lambda s: s.estimate.step_time_us)
            hint = Assignment(best.device_of, best.orders)
    elif entry.hinted:
        fitting = [r for r in same if r.simulation is not None and r.assignment is not None]
        if fitting:
            hint = min(fitting, key=lambda r: r.simulation.estimate.step_time_us).assignment
    run = run_algorithm(request, entry.algorithm, options, hint=hint, last_resort=last_resort,
                        relaxed=entry.relaxed, cap_scale=entry.cap_scale)
    return dataclasses.replace(run, seconds=add_seconds(spent, run.seconds)) if spent else run


#: A start for repair: the plan (or the algorithm that places it as if memory were
#: unlimited), its label, whether the pipeline made it, its share of the time left, and the
#: repair strategy.
RepairStart = tuple[Simulation | str, str, bool, float, Strategy]


def _refused_starts(request: Request, runs: list[Run], repaired: set[tuple[int, Strategy]]
                    ) -> list[RepairStart]:
    """The refused plans to repair, none twice with one strategy (``repaired``: ids of the
    plans taken before and their strategies, updated): the :data:`REPAIR_STARTS` that
    overshot least, with "largest"; then as many of the runs' first plans (placed within the
    true limits, where retries with lower budgets may have followed), with "cheapest", as
    they overshoot by whole blocks, like memory-blind plans: a first plan that is also the
    least overshooting (a run without retries, m-fill's) is repaired both ways.
    Measured at 2 s against the least overshooting alone (bench/compare.py, 204
    memory-limited settings): geomean 0.993, 25 faster, 16 slower (at most 0.8%);
    resnet50_inference_layer on its suggested 14 x 2 GiB (PCIe) 3051 -> 1472 ms, from
    m-fill's first plan; resnet50_training_layer, PCIe, 30%: 627 -> 547 ms."""
    def fresh(plans: list[tuple[Simulation, Run]], strategy: Strategy
              ) -> list[tuple[Simulation, Run]]:
        """Up to :data:`REPAIR_STARTS` of ``plans`` over all calls, least overshoot first."""
        taken = sum(1 for plan, _ in plans if (id(plan), strategy) in repaired)
        new = sorted(((p, r) for p, r in plans if (id(p), strategy) not in repaired),
                     key=lambda pr: sum(overshoot(pr[0], request.cluster).values()))
        new = new[:max(0, REPAIR_STARTS - taken)]
        repaired.update((id(plan), strategy) for plan, _ in new)
        return new

    least = fresh([(r.refused, r) for r in runs if r.refused is not None], "largest")
    firsts = fresh([(r.first_refused, r) for r in runs if r.first_refused is not None],
                   "cheapest")
    return [(plan, f"{run.algorithm}'s {label}", run.pipeline, CANDIDATE_SHARE, strategy)
            for pairs, label, strategy in ((least, "plan", "largest"),
                                           (firsts, "first plan", "cheapest"))
            for plan, run in pairs]


def _weights_fill(request: Request) -> bool:
    """Whether the persistent bytes fill at least :data:`SPREAD_EARLY_SHARE` of the memory
    of the devices that have a limit (all of them: an unlimited device holds any share)."""
    limits = [d.memory_bytes for d in request.cluster.devices]
    if None in limits:
        return False
    return sum(request.graph.persistent_bytes) >= SPREAD_EARLY_SHARE * sum(limits)  # type: ignore[arg-type]


def _blind_starts(request: Request, started: set[tuple[str, bool, Strategy]], *,
                  skip_single: bool, first_only: bool = False,
                  first_share: float = CANDIDATE_SHARE) -> list[RepairStart]:
    """:data:`BLIND_STARTS` to place as if memory were unlimited, those ``started`` before
    left out (``started`` updated): none when no device has a memory limit; the
    single-device plan not when it fits. Each gets an equal part of :data:`BLIND_SHARE`;
    with ``first_only`` the first one alone, with ``first_share`` of the time left (a
    candidate's share, :data:`CANDIDATE_SHARE`, unless told)."""
    if not _limited(request):
        return []
    starts = [start for start in BLIND_STARTS
              if start not in started and start[0] in ALGORITHMS
              and not (start[0] == "single" and skip_single)
              and not (start[0] == "m-sct" and len(request.graph) > SCT_MAX_OPS)]
    if first_only:
        starts = starts[:1]
    started.update(starts)
    share = first_share if first_only else BLIND_SHARE / max(1, len(starts))
    return [(a, f"{a}'s plan placed as if memory were unlimited", pipeline, share, strategy)
            for a, pipeline, strategy in starts]


def _repairs(request: Request, starts: list[RepairStart], give_up_us: float
             ) -> Iterator[tuple[Simulation | None, Candidate]]:
    """Repair (:func:`baechi.repair.repair`) each start within its share of the time left;
    a start given as an algorithm is placed first. A repair gives up once its plan is no
    faster than ``give_up_us`` (the best plan so far: it would not be taken). Yields each
    result (``None`` when it did not reach a faster plan within memory) and its candidate
    entry."""
    for start, label, pipeline, share, strategy in starts:
        if request.expired():
            return
        tick = time.perf_counter()
        deadline = tick + share * request.seconds_left()
        if isinstance(start, str):
            placed = memory_blind_replay(dataclasses.replace(request, deadline=deadline), start,
                                         pipeline=pipeline)
            if placed is None:  # listed, so that a start its share could not place shows
                yield None, Candidate(
                    algorithm="repair", pipeline=pipeline, seconds=time.perf_counter() - tick,
                    note=f"from {label}: {NOT_PLACED}")
                continue
            start = placed
        simulation: Simulation | None = start  # a blind plan may fit as it is
        if not start.estimate.memory_ok:
            fixed = repair(request.graph, request.cluster, start.device_of, start.orders,
                           units=request.units, cost=request.cost, strategy=strategy,
                           deadline=deadline, give_up_us=give_up_us)
            simulation = None if fixed is None else request.replay(*fixed)
            if simulation is not None and not simulation.estimate.memory_ok:
                simulation = None  # the judge disagrees: never return it
        yield simulation, Candidate(
            algorithm="repair", pipeline=pipeline,
            step_time_us=None if simulation is None else simulation.estimate.step_time_us,
            seconds=time.perf_counter() - tick,
            note=f"from {label}" + ("" if start.estimate.memory_ok else ", over memory")
                 + ("" if simulation is not None else "; no faster plan within memory"))


def _reduced_leads(best: Run | None, runs: list[Run]) -> bool:
    """Whether the fastest plan so far (``best``) is m-ETF's with the reduction pipeline and
    beats every plan of the graph itself in ``runs`` by :data:`REDUCED_LEAD` (see
    :data:`REDUCED_FIRST_MIN_OPS`)."""
    if best is None or best.algorithm != "m-etf" or not best.pipeline:
        return False
    own = min((_step_of(r) for r in runs if not r.pipeline), default=math.inf)
    return _step_of(best) < (1 - REDUCED_LEAD) * own


def _step_of(run: Run | None) -> float:
    """The step time of ``run``'s plan; infinite without one."""
    return math.inf if run is None or run.simulation is None else \
        run.simulation.estimate.step_time_us


def _restarts(runs: list[Run], searched: set[int]) -> list[Run]:
    """The runs local search restarts from: the :data:`SEARCH_RESTARTS` fastest whose plans
    it has not started from (``searched``: their signatures, updated), one run per plan (a
    repair that needed no move, or a reduction that fused nothing, gives another run's plan).
    """
    chosen: list[Run] = []
    for run in sorted((r for r in runs if r.simulation is not None), key=_step_of):
        if len(chosen) == SEARCH_RESTARTS:
            break
        assert run.simulation is not None
        signature = _signature(run.simulation)
        if signature not in searched:
            searched.add(signature)
            chosen.append(run)
    return chosen


def _signature(simulation: Simulation) -> int:
    """A hash of a plan (placement and orders): equal plans, equal signatures."""
    return hash((tuple(simulation.device_of), tuple(map(tuple, simulation.orders))))


def _proved(run: Run) -> bool:
    """Whether the solver proved the plan it returned optimal for the graph it placed (a
    reduced one included). A proof of its model is not enough: after a memory retry the
    model's budgets are below the devices' limits, and a plan that fits only in the
    solver's channel order may not be the model's optimum (fork_join(seed=1, ops=8,
    ccr=10), sequential, 2 devices at 60% of its peak, 2 s: the model proved 259 µs at the
    limits, its plan within memory took 365 µs, and without another round from the best
    plan ``auto`` returned it instead of 345 µs)."""
    return run.assignment is not None and run.assignment.stats.get("optimal") is True


def _relaxed(request: Request, entry: Entry) -> bool:
    """Whether ``entry`` solves a relaxed model here (parallel mode has no channels, and
    without memory limits no copy is held)."""
    return entry.relaxed and (request.cost.sequential or _limited(request))


def _relaxed_note(request: Request) -> str:
    """What the relaxed model leaves out on ``request``."""
    left_out = (["no channels"] if request.cost.sequential else []) + \
        (["no received copies in memory"] if _limited(request) else [])
    return f"relaxed model ({', '.join(left_out)})"


def _limited(request: Request) -> bool:
    """Whether some device has a memory limit."""
    return any(d.memory_bytes is not None for d in request.cluster.devices)


def _faster(run: Run, best: Run) -> bool:
    assert run.simulation is not None and best.simulation is not None
    return run.simulation.estimate.step_time_us < best.simulation.estimate.step_time_us


def _bound(request: Request, runs: list[Run]) -> float:
    """The best proven lower bound so far: the request's (:attr:`Request.bound_us`: the
    simulator's, raised by the transfers memory forces), or a solver's on the graph itself
    (``bound_us``; a bound proved on a reduced graph is kept as ``reduced_bound_us``)."""
    return max([request.bound_us,
                *(r.algorithm_stats.get("bound_us", 0.0) for r in runs)])


def _search(request: Request, simulation: Simulation) -> tuple[Simulation, Candidate | None]:
    """Local search from ``simulation``'s plan in slices (see the module docstring). None
    from a plan that fits memory only in its own transfer order: the search judges moves
    under FIFO channels."""
    graph, cluster = request.graph, request.cluster
    if len(cluster.devices) < 2 or request.expired() or simulation.transfer_order is not None:
        return simulation, None
    tick = time.perf_counter()
    device_of, orders = simulation.device_of, simulation.orders
    start_us = step_us = simulation.estimate.step_time_us
    slice_s = max(SEARCH_SLICE_S, SEARCH_SLICE_S_PER_OP * len(graph))
    evaluated = 0
    seed = 0
    stagnant = 0
    while not request.expired() and stagnant < SEARCH_PATIENCE:
        request.progress("search", 1 - step_us / start_us if start_us > 0 else 1.0)
        device_of, orders, found = improve(
            graph, cluster, device_of, orders, units=request.units, seed=seed,
            deadline=min(request.deadline, time.perf_counter() + slice_s), cost=request.cost)
        seed += 1
        evaluated += found.moves_evaluated
        gain = 1 - found.step_us / step_us if step_us > 0 else 0.0
        step_us = found.step_us
        if found.note:
            break
        stagnant = stagnant + 1 if gain < SEARCH_MIN_GAIN else 0
    improved = step_us < start_us
    candidate = Candidate(algorithm="local-search", step_time_us=step_us,
                          seconds=time.perf_counter() - tick, improved=improved,
                          moves_evaluated=evaluated)
    if not improved:
        return simulation, candidate
    return request.replay(device_of, orders), candidate


def candidate_fields(outcome: Outcome) -> dict[str, Any]:
    """The plan-stats fields of an ``auto`` outcome."""
    return {"candidates": outcome.candidates, "chosen": outcome.chosen,
            "deadline_reached": outcome.deadline_reached, "optimal": outcome.optimal,
            "bound_us": outcome.bound_us}


__all__ = ["EXACT_MAX_NODES", "PORTFOLIO", "SCT_MAX_OPS", "Entry", "Outcome", "place_auto"]
