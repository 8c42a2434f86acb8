"""Per-tensor page placement of a model: where its weight pages really are.

    python -m tools.numa.placement -m MODEL.gguf --numa distribute      # load here, query every page
    python -m tools.numa.placement -m MODEL.gguf --numa mirror --no-mmap -t 8 --top 20
    python -m tools.numa.placement --pid 12345 -m MODEL.gguf            # a running gemma4cpu process

Loading here (-m without --pid) builds the model as `python -m gemma4cpu.run` would (same flags)
and asks the kernel for the node of every page of every weight range (move_pages with no target
node): one row per matrix with its pages per node, the node(s) the plan wants, and the share
elsewhere; then the totals per node and the placement report of the load.

For a running process (--pid) it reads /proc/PID/numa_maps: page counts per node (N0=, N1=, ...)
and the policy of every mapping. With -m, the mappings of that GGUF are matched to tensors by file
offset (/proc/PID/maps): gemma4cpu's placement splits the mapping at every range it binds, so
each mapping is one tensor's rows on one node; a mapping that spans several tensors is shared out
by size (marked ~). Anonymous copies (--no-mmap, mirror) are listed as mappings with their policy.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

import numpy as np

from gemma4cpu import numa
from gemma4cpu import placement as P


def _fmt_nodes(hist: dict) -> str:
    return " ".join(f"N{n}={c}" for n, c in sorted(hist.items())) or "-"


def _error(msg: str) -> int:
    """One line on stderr and exit status 2 (bad flags, a refused plan, an unreadable model)."""
    print(f"error: {msg}", file=sys.stderr)
    return 2


def in_process(a) -> int:
    import warnings

    from gemma4cpu.model import Model
    try:
        cpus = numa.parse_cpu_list(a.cpus) if a.cpus else None
    except ValueError as e:
        return _error(f"--cpus: {e}")
    try:
        nodes = numa.parse_cpu_list(a.numa_nodes) if a.numa_nodes else None
    except ValueError as e:
        return _error(f"--numa-nodes: {e}")
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always", P.NumaWarning)
        try:
            m = Model(a.model, n_ctx=a.ctx_size, threads=a.threads, cpus=cpus, numa=a.numa, numa_nodes=nodes,
                      mmap=not a.no_mmap, thp=a.thp, progress=False)
        except (ValueError, OSError, MemoryError) as e:   # NumaError and GGUFFormatError are ValueErrors
            return _error(str(e))
    plan, rep = m.numa_plan, m.numa.report
    if a.touch:
        for x in m.w.mats():
            P.populate(P.addr_of(x.rows), x.rows.nbytes)
    rows = []
    tot: dict[int, int] = {}
    ranges = rep.ranges or [P.Range(x.name, P.addr_of(x.rows), x.rows.nbytes, tuple(plan.nodes) or (0,), 0)
                            for x in m.w.mats()]
    for r in ranges:
        st = P.page_nodes(r.addr, r.length)
        present = st[st >= 0]
        hist = {int(n): int(c) for n, c in zip(*np.unique(present, return_counts=True))}
        for n, c in hist.items():
            tot[n] = tot.get(n, 0) + c
        bad = int((~np.isin(present, r.nodes)).sum()) if rep.ranges else 0
        rows.append((bad / max(1, present.size), r, st.size, int((st < 0).sum()), hist))
    for line in plan.describe() + rep.lines():
        print(line)
    for w in got:
        print(f"warning: {w.message}")
    print()
    print(f"| tensor | MiB | pages | not present | pages per node | expected | elsewhere |")
    print("|---|---:|---:|---:|---|---|---:|")
    shown = sorted(rows, key=lambda x: -x[0])[:a.top] if a.top else rows
    for frac, r, n, absent, hist in shown:
        want = ",".join(map(str, r.nodes)) if rep.ranges else "any"
        print(f"| {r.name} | {r.length / 2**20:.1f} | {n} | {absent} | {_fmt_nodes(hist)} | {want} | {frac:.0%} |")
    if a.top and len(rows) > a.top:
        print(f"| ... {len(rows) - a.top} more ranges | | | | | | |")
    print()
    print(f"total: {sum(r[2] for r in rows)} pages, {_fmt_nodes(tot)}, "
          f"{sum(r[3] for r in rows)} not present, "
          f"{sum(int(round(r[0] * sum(r[4].values()))) for r in rows)} elsewhere than planned")
    return 0


_NM = re.compile(r"^([0-9a-f]+)\s+(\S+)(.*)$")


def read_numa_maps(pid: int) -> list[dict]:
    """[{start, end, offset, path, policy, nodes {n: pages}, pagesize}] of a process
    (/proc/PID/maps and /proc/PID/numa_maps, see parse_numa_maps)."""
    with open(f"/proc/{pid}/maps") as f:
        maps = f.read()
    with open(f"/proc/{pid}/numa_maps") as f:
        numa_maps = f.read()
    return parse_numa_maps(maps, numa_maps)


def parse_numa_maps(maps: str, numa_maps: str) -> list[dict]:
    """The texts of /proc/PID/maps and /proc/PID/numa_maps -> one dict per numa_maps line:
    start, end (from maps; start when maps lacks it), offset (file offset, from maps), path (maps'
    path, else numa_maps' file=), policy (e.g. 'default', 'bind:0', 'interleave:0-1'), nodes
    {node: pages}, pagesize (bytes, kernelpagesize_kB; 4096 when absent)."""
    spans = {}
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if not parts:
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        spans[lo] = (hi, int(parts[2], 16), parts[5].strip() if len(parts) > 5 else "")
    out = []
    for line in numa_maps.splitlines():
        m = _NM.match(line.strip())
        if not m:
            continue
        start = int(m.group(1), 16)
        hi, off, path = spans.get(start, (start, 0, ""))
        d = {"start": start, "end": hi, "offset": off, "path": path, "policy": m.group(2), "nodes": {},
             "pagesize": 4096}
        for tok in m.group(3).split():
            k, _, v = tok.partition("=")
            if re.fullmatch(r"N\d+", k):
                d["nodes"][int(k[1:])] = int(v)
            elif k == "kernelpagesize_kB":
                d["pagesize"] = int(v) * 1024
            elif k == "file" and not d["path"]:
                d["path"] = v
        out.append(d)
    return out


def of_pid(a) -> int:
    try:
        maps = read_numa_maps(a.pid)
    except OSError as e:
        return _error(f"--pid {a.pid}: cannot read its numa_maps: {e.strerror or e}")
    tensors = []
    if a.model:
        from gemma4cpu.gguf_io import GGUFFile
        try:
            g = GGUFFile(a.model)
        except (ValueError, OSError) as e:
            return _error(str(e))
        tensors = sorted((t.offset, t.offset + t.n_bytes, name) for name, t in g.tensors.items())
        real = os.path.realpath(a.model)
    tot: dict[int, int] = {}
    print("| mapping | MiB | policy | pages per node | tensors |")
    print("|---|---:|---|---|---|")
    for d in maps:
        size = d["end"] - d["start"]
        is_model = a.model and d["path"] and os.path.realpath(d["path"]) == real
        anon = not d["path"] or d["path"].startswith("[")
        if not (is_model or (anon and size >= a.min_mib << 20)):
            continue
        for n, c in d["nodes"].items():
            tot[n] = tot.get(n, 0) + c * d["pagesize"] // 4096
        names = ""
        if is_model:
            f0, f1 = d["offset"], d["offset"] + size
            inside = [nm for lo, hi, nm in tensors if lo < f1 and hi > f0]
            names = (inside[0] if len(inside) == 1 else f"~{len(inside)} tensors: {inside[0]} .. {inside[-1]}"
                     if inside else "(header)")
        label = os.path.basename(d["path"]) if is_model else (d["path"] or "anonymous")
        print(f"| {label} {d['start']:#x} | {size / 2**20:.1f} | {d['policy']} | {_fmt_nodes(d['nodes'])} | "
              f"{names} |")
    print()
    print(f"total (4 KiB pages): {_fmt_nodes(tot)}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.numa.placement", description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", help="GGUF file (loaded here unless --pid)")
    ap.add_argument("--pid", type=int, help="report a running process from /proc/PID/numa_maps")
    ap.add_argument("--numa", default="auto", choices=numa.MODES, help="placement mode for the load (default auto)")
    ap.add_argument("--numa-nodes", help="NUMA nodes to use")
    ap.add_argument("-t", "--threads", type=int, default=None, help="worker threads")
    ap.add_argument("-C", "--cpus", help="taskset-style CPU list")
    ap.add_argument("-c", "--ctx-size", type=int, default=256, help="context for the KV cache (default 256)")
    ap.add_argument("--no-mmap", action="store_true", help="read the weights into anonymous memory")
    ap.add_argument("--thp", action="store_true", help="transparent huge pages (implies --no-mmap)")
    ap.add_argument("--touch", action="store_true",
                    help="fault every weight page in before querying (a one-node load leaves mapped pages alone)")
    ap.add_argument("--top", type=int, default=0, help="show only the N ranges with most pages elsewhere")
    ap.add_argument("--min-mib", type=int, default=64, help="--pid: anonymous mappings from this size (default 64)")
    a = ap.parse_args(argv)
    if a.pid is not None:
        return of_pid(a)
    if not a.model:
        ap.error("give -m MODEL.gguf (and --pid PID for a running process)")
    ok, why = P.available()
    if not ok:
        print(f"error: cannot query page placement here: {why}", file=sys.stderr)
        return 2
    return in_process(a)


if __name__ == "__main__":
    sys.exit(main())
