"""Memory read-bandwidth probe: GB/s (1e9 bytes/s) for 1..N pinned threads.

    python -m tools.numa.bandwidth                  # 2 GiB, 1..N threads on the allowed CPUs
    python -m tools.numa.bandwidth --cpus 0-1 --gib 4 --runs 7 --json bw.json
    python -m tools.numa.bandwidth --matrix         # per node and node to node (NUMA machines)

The C side (bandwidth.c, next to this file) is compiled on first use with the system C
compiler (`cc`, or $CC) into a cache directory ($GEMMA4CPU_CACHE, else
$XDG_CACHE_HOME/gemma4cpu, else ~/.cache/gemma4cpu) and loaded with ctypes; no pip packages are
needed. It is built with -O2 -mavx2 only when this CPU reports AVX2, scalar otherwise.

Thread t of a measurement with T threads is pinned to cpus[t]; each thread first-touches and
then read-sums its own 1/T of the buffer, in each read pattern of LAYOUTS (side-by-side streams
per thread, software prefetch distance): the result of one thread count is the median of `runs`
passes (after `warmup` untimed passes) of the pattern whose median is highest. Which pattern a
core reads fastest with differs: 8 streams with prefetch on a 2-vCPU Xeon VM (one stream read
10-20 % less), 2 streams without prefetch on a 2-vCPU AMD EPYC Zen 5 VM (8 streams read 15-20 %
less on one core).

--matrix: for every node i with allowed CPUs, its physical cores (or --threads per node) read a
buffer bound to node j (mbind before the first touch), for every allowed memory node j: the
node-to-node matrix. Then every node's threads at once, each on its own node's memory (first
touch): the machine's local read bandwidth, printed beside the sum of the per-node local figures.

Bench scripts import `measure_read_bandwidth(threads, cpus, gib)`.
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from gemma4cpu.cpulist import parse_cpu_list  # noqa: E402  (one parser for CLI, bench and tools)

_SRC = Path(__file__).with_name("bandwidth.c")
GIB = 1 << 30

# The process's allowed CPUs as seen at import (a gemma4cpu Pool gives the calling thread its
# affinity back after each call, but a `with pool.pinned():` block narrows it while it lasts).
ALLOWED_CPUS_AT_IMPORT: tuple[int, ...] = tuple(sorted(os.sched_getaffinity(0))) if hasattr(
    os, "sched_getaffinity") else tuple(range(os.cpu_count() or 1))

_lib = None


def parse_int_list(spec: str) -> list[int]:
    """'1,2,4' or '1-4' -> ints (same syntax as CPU lists)."""
    return parse_cpu_list(spec)


def has_avx2() -> bool:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "avx2" in line.split(":", 1)[1].split()
    except OSError:
        pass
    return False


def cache_dir() -> Path:
    d = os.environ.get("GEMMA4CPU_CACHE")
    if d:
        return Path(d)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gemma4cpu"


def _compile() -> Path:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise RuntimeError("no C compiler found (set CC); the bandwidth probe is compiled at first use")
    flags = ["-O2", "-std=gnu11", "-fPIC", "-shared", "-pthread"] + (["-mavx2"] if has_avx2() else [])
    src = _SRC.read_bytes()
    key = hashlib.sha256(src + " ".join([cc] + flags).encode()).hexdigest()[:16]
    out = cache_dir() / f"g4bw-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp_so = Path(tmp) / out.name
        r = subprocess.run([cc, *flags, "-o", str(tmp_so), str(_SRC)], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"compiling {_SRC} failed:\n{' '.join([cc, *flags])}\n{r.stderr}")
        os.replace(tmp_so, out)  # atomic: concurrent first uses cannot see a half-written file
    return out


def _load():
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(str(_compile()))
        lib.g4bw_kind.restype = ctypes.c_char_p
        lib.g4bw_measure.restype = ctypes.c_int
        lib.g4bw_measure.argtypes = [
            ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
            ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.c_size_t]
        lib.g4bw_measure_layout.restype = ctypes.c_int
        lib.g4bw_measure_layout.argtypes = [
            ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
            ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_int),
            ctypes.c_char_p, ctypes.c_size_t]
        lib.g4bw_measure_node.restype = ctypes.c_int
        lib.g4bw_measure_node.argtypes = [
            ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
            ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.c_size_t]
        _lib = lib
    return _lib


def probe_kind() -> str:
    """'avx2' or 'scalar': which read loop the compiled probe uses."""
    return _load().g4bw_kind().decode()


# Read patterns (streams per thread, software prefetch bytes ahead; 0 = none). Every measurement
# runs each and keeps the one with the highest median: the probe stands for what the memory can
# give a core, whichever way the core reads best.
LAYOUTS: tuple[tuple[int, int], ...] = ((8, 512), (2, 0))


def layout_name(layout: tuple[int, int]) -> str:
    s, pf = layout
    return f"{s} stream{'s' if s != 1 else ''}" + (f" + prefetch {pf} B" if pf else "")


def measure_best(threads: int, cpus=None, gib: float = 2.0, runs: int = 5, warmup: int = 1,
                 mem_node: int | None = None, layouts=None) -> tuple[list[float], tuple[int, int], dict]:
    """measure_layout for each read pattern of `layouts` (default LAYOUTS): (the runs of the one
    with the highest median, that pattern, {pattern: its runs})."""
    every = {lay: measure_layout(threads, cpus, gib, runs, warmup, mem_node, lay) for lay in (layouts or LAYOUTS)}
    best = max(every, key=lambda lay: statistics.median(every[lay]))
    return every[best], best, every


def measure_runs(threads: int, cpus=None, gib: float = 2.0, runs: int = 5, warmup: int = 1,
                 mem_node: int | None = None) -> list[float]:
    """GB/s of each of `runs` timed passes over a `gib` GiB buffer read by `threads` threads,
    thread t pinned to cpus[t] (default: the CPUs allowed at import, in order), in the read
    pattern of LAYOUTS that reads fastest here (measure_best). mem_node: the whole buffer on that
    NUMA node (default: each thread's slice first-touched by it)."""
    return measure_best(threads, cpus, gib, runs, warmup, mem_node)[0]


def measure_layout(threads: int, cpus=None, gib: float = 2.0, runs: int = 5, warmup: int = 1,
                   mem_node: int | None = None, layout: tuple[int, int] = LAYOUTS[0]) -> list[float]:
    """measure_runs in one read pattern: layout = (streams per thread, prefetch bytes ahead or 0)."""
    cpus = list(ALLOWED_CPUS_AT_IMPORT if cpus is None else cpus)
    if threads < 1:
        raise ValueError("threads must be >= 1")
    if len(cpus) < threads:
        raise ValueError(f"{threads} threads need {threads} CPUs, got {cpus}")
    lib = _load()
    c_cpus = (ctypes.c_int * threads)(*cpus[:threads])
    out = (ctypes.c_double * runs)()
    pin_err = ctypes.c_int(0)
    msg = ctypes.create_string_buffer(256)
    streams, pf = layout
    rc = lib.g4bw_measure_layout(threads, c_cpus, int(gib * GIB), -1 if mem_node is None else int(mem_node),
                                 int(streams), int(pf), warmup, runs, out, ctypes.byref(pin_err), msg, 256)
    if rc != 0:
        raise RuntimeError(f"bandwidth probe failed: {msg.value.decode()}")
    if pin_err.value:
        raise RuntimeError(f"{pin_err.value} probe thread(s) could not be pinned to CPUs {cpus[:threads]}")
    return list(out)


def measure_read_bandwidth(threads: int, cpus=None, gib: float = 2.0, runs: int = 5,
                           warmup: int = 1) -> float:
    """Median read bandwidth in GB/s (1e9 B/s) of `threads` pinned threads over a `gib` GiB buffer."""
    return statistics.median(measure_runs(threads, cpus, gib, runs, warmup))


def sweep(thread_counts, cpus=None, gib: float = 2.0, runs: int = 5, warmup: int = 1) -> dict:
    """{'kind', 'gib', 'runs', 'cpus', 'layouts', 'results': [{'threads', 'cpus', 'gbs_median', 'gbs_min',
    'gbs_max', 'gbs_runs', 'layout' (the fastest read pattern's name), 'by_layout' {name: median}}]}."""
    cpus = list(ALLOWED_CPUS_AT_IMPORT if cpus is None else cpus)
    results = []
    for t in thread_counts:
        r, best, every = measure_best(t, cpus, gib, runs, warmup)
        results.append({"threads": t, "cpus": cpus[:t], "gbs_median": statistics.median(r),
                        "gbs_min": min(r), "gbs_max": max(r), "gbs_runs": r, "layout": layout_name(best),
                        "by_layout": {layout_name(k): statistics.median(v) for k, v in every.items()}})
    return {"kind": probe_kind(), "gib": gib, "runs": runs, "warmup": warmup, "cpus": cpus,
            "layouts": [layout_name(x) for x in LAYOUTS], "results": results}


def node_matrix(topo=None, threads_per_node: int | None = None, gib: float = 2.0, runs: int = 5,
                warmup: int = 1) -> dict:
    """Read bandwidth from every node's cores to every allowed memory node, and of all nodes at once.
    {'nodes', 'mem_nodes', 'cpus' {node: pinned CPUs}, 'matrix' [[GB/s of node i reading node j]],
    'local_sum' (sum of the diagonal), 'all_local' (all nodes at once, each on its own memory)}."""
    from gemma4cpu import numa
    topo = topo or numa.read_topology("/")
    cpu_nodes = [n for n in sorted(topo.nodes) if set(topo.nodes[n].cpus) & set(topo.allowed_cpus)]
    mem_nodes = [n for n in sorted(topo.nodes) if n in topo.allowed_mems]
    cpus = {}
    for n in cpu_nodes:
        p = numa.plan(topo, "isolate", nodes=[n], threads=threads_per_node)
        cpus[n] = list(p.decode.cpus)
    matrix = [[statistics.median(measure_runs(len(cpus[i]), cpus[i], gib, runs, warmup, mem_node=j))
               for j in mem_nodes] for i in cpu_nodes]
    diag = [matrix[a][mem_nodes.index(i)] for a, i in enumerate(cpu_nodes) if i in mem_nodes]
    allc = [c for i in cpu_nodes for c in cpus[i]]
    together = statistics.median(measure_runs(len(allc), allc, gib * len(cpu_nodes), runs, warmup))
    return {"kind": probe_kind(), "gib": gib, "runs": runs, "nodes": cpu_nodes, "mem_nodes": mem_nodes,
            "cpus": {str(k): v for k, v in cpus.items()}, "matrix": matrix, "local_sum": sum(diag),
            "all_local": together}


def print_matrix(res: dict, file=None):
    file = file or sys.stdout
    mn = res["mem_nodes"]
    print(f"read bandwidth GB/s, node i's cores reading memory of node j ({res['gib']:g} GiB per buffer, "
          f"{res['kind']} loads, median of {res['runs']}):", file=file)
    print("| cores of \\ memory on | " + " | ".join(f"node {j}" for j in mn) + " |", file=file)
    print("|---|" + "---:|" * len(mn), file=file)
    for i, row in zip(res["nodes"], res["matrix"]):
        print(f"| node {i} ({len(res['cpus'][str(i)])} threads) | " + " | ".join(f"{v:.1f}" for v in row) + " |",
              file=file)
    print(f"sum of the per-node local figures: {res['local_sum']:.1f} GB/s; every node at once on its own memory: "
          f"{res['all_local']:.1f} GB/s", file=file)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.numa.bandwidth", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpus", default=None,
                    help="taskset-style CPU list, thread t pinned to the t-th (default: allowed CPUs)")
    ap.add_argument("--threads", default=None,
                    help="thread counts, e.g. 1,2,4 or 1-8 (default: 1..len(cpus))")
    ap.add_argument("--gib", type=float, default=2.0, help="buffer size in GiB (default 2)")
    ap.add_argument("--runs", type=int, default=5, help="timed passes per thread count (median; default 5)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed passes first (default 1)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON ('-' = stdout only)")
    ap.add_argument("--matrix", action="store_true",
                    help="per node and node to node: node i's cores reading memory bound to node j, then all "
                         "nodes at once (--threads: one count, per node)")
    a = ap.parse_args(argv)
    if a.matrix:
        tpn = parse_int_list(a.threads)[0] if a.threads else None
        res = node_matrix(None, tpn, a.gib, a.runs, a.warmup)
        if a.json == "-":
            json.dump(res, sys.stdout, indent=2)
            print()
            return 0
        print_matrix(res)
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=2) + "\n")
            print(f"wrote {a.json}")
        return 0
    cpus = parse_cpu_list(a.cpus) if a.cpus else list(ALLOWED_CPUS_AT_IMPORT)
    counts = parse_int_list(a.threads) if a.threads else list(range(1, len(cpus) + 1))
    if a.runs < 5:
        print(f"note: --runs {a.runs} < 5; medians of so few passes are noisy", file=sys.stderr)
    res = sweep(counts, cpus, a.gib, a.runs, a.warmup)
    if a.json == "-":
        json.dump(res, sys.stdout, indent=2)
        print()
        return 0
    print(f"read bandwidth: {a.gib:g} GiB buffer, {res['kind']} loads, median of {a.runs} passes, "
          f"cpus={cpus}; the fastest of the read patterns {', '.join(res['layouts'])} (per thread)")
    names = res["layouts"]
    print("| threads | cpus | GB/s median | min | max | pattern | " + " | ".join(names) + " |")
    print("|---:|---|---:|---:|---:|---|" + "---:|" * len(names))
    for r in res["results"]:
        print(f"| {r['threads']} | {','.join(map(str, r['cpus']))} | {r['gbs_median']:.1f} "
              f"| {r['gbs_min']:.1f} | {r['gbs_max']:.1f} | {r['layout']} | "
              + " | ".join(f"{r['by_layout'][n]:.1f}" for n in names) + " |")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2) + "\n")
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
