"""Writes the fake sysfs/procfs trees under tests/data/numa/ that tests/test_numa_plan.py plans on.

    python tests/data/numa/make_trees.py          # rewrite every tree next to this file

Each tree holds only the files gemma4cpu.numa.read_topology reads, with the contents Linux gives
on such a machine (CPU numbering, SMT sibling lists, L3 sharing, node distances, meminfo lines):

  epyc9655_2s_nps4   2 x AMD EPYC 9655 (Zen 5, 96 cores, 12 CCDs of 8 cores, 32 MiB L3 each), SMT on,
                     NPS4: 8 nodes of 24 cores (3 CCDs); CPUs 0-95 socket 0, 96-191 socket 1, their SMT
                     siblings +192; distances 10 / 12 (same socket) / 32; NUMA balancing on
  xeon8480_2s_smt    2 x Intel Xeon Platinum 8480+ (56 cores, one L3 per socket), SMT on, SNC off:
                     2 nodes; CPUs 0-55 / 56-111, siblings +112; distances 10 / 21
  laptop_1node       AMD Ryzen 7 7840U: 8 cores, SMT siblings adjacent (0-1, 2-3, ...), one node
  container_cgroup   2 x 16-core SMT host (0-15 / 16-31, siblings +32), a container limited by its
                     cgroup v2 cpuset to 8-23,40-55 (8 cores on each node) with cpu.max = 8 CPUs

`write_tree(root, spec)` is also used by tests to build small trees of their own.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GIB_KB = 1 << 20


def _fmt(cpus) -> str:
    cs = sorted(cpus)
    out, i = [], 0
    while i < len(cs):
        j = i
        while j + 1 < len(cs) and cs[j + 1] == cs[j] + 1:
            j += 1
        out.append(str(cs[i]) if i == j else f"{cs[i]}-{cs[j]}")
        i = j + 1
    return ",".join(out)


def _w(root: Path, rel: str, text: str):
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text if text.endswith("\n") else text + "\n")


def write_tree(root, spec: dict):
    """spec: cpus {cpu: (package, node, siblings tuple, l3 shared tuple)}, nodes {node: (mem_total_kb,
    mem_free_kb, inactive_file_kb)}, distances [[...]], model, allowed_cpus, allowed_mems, numa_balancing,
    thp, cgroup (optional dict: cpus, mems, cpu_max)."""
    root = Path(root)
    cpus, nodes = spec["cpus"], spec["nodes"]
    node_ids = sorted(nodes)
    _w(root, "sys/devices/system/cpu/online", _fmt(cpus))
    _w(root, "sys/devices/system/node/online", _fmt(node_ids))
    for c, (pkg, node, sib, l3) in cpus.items():
        d = f"sys/devices/system/cpu/cpu{c}"
        _w(root, f"{d}/topology/physical_package_id", str(pkg))
        _w(root, f"{d}/topology/thread_siblings_list", _fmt(sib))
        _w(root, f"{d}/cache/index3/level", "3")
        _w(root, f"{d}/cache/index3/shared_cpu_list", _fmt(l3))
    for i, n in enumerate(node_ids):
        total, free, inact = nodes[n]
        d = f"sys/devices/system/node/node{n}"
        _w(root, f"{d}/cpulist", _fmt(c for c, v in cpus.items() if v[1] == n))
        _w(root, f"{d}/distance", " ".join(str(x) for x in spec["distances"][i]))
        _w(root, f"{d}/meminfo", "\n".join([
            f"Node {n} MemTotal:       {total} kB", f"Node {n} MemFree:        {free} kB",
            f"Node {n} MemUsed:        {total - free} kB", f"Node {n} Inactive(file): {inact} kB"]))
    _w(root, "proc/self/status", f"Cpus_allowed_list:\t{_fmt(spec['allowed_cpus'])}\n"
                                 f"Mems_allowed_list:\t{_fmt(spec['allowed_mems'])}")
    _w(root, "proc/cpuinfo", f"processor\t: 0\nmodel name\t: {spec['model']}")
    _w(root, "proc/sys/kernel/numa_balancing", str(spec.get("numa_balancing", 0)))
    thp = spec.get("thp", "madvise")
    _w(root, "sys/kernel/mm/transparent_hugepage/enabled",
       " ".join(f"[{v}]" if v == thp else v for v in ("always", "madvise", "never")))
    cg = spec.get("cgroup")
    _w(root, "proc/self/cgroup", "0::/")
    if cg:
        _w(root, "sys/fs/cgroup/cpuset.cpus.effective", _fmt(cg["cpus"]))
        _w(root, "sys/fs/cgroup/cpuset.mems.effective", _fmt(cg["mems"]))
        _w(root, "sys/fs/cgroup/cpu.max", cg.get("cpu_max", "max 100000"))


def two_socket(cores_per_socket: int, nodes_per_socket: int, cores_per_l3: int, smt: bool,
               adjacent_siblings: bool = False):
    """cpus dict for a machine numbered like Linux on x86 servers: socket s core i -> s*C + i,
    SMT sibling + 2C (or, adjacent_siblings, core i -> CPUs 2i, 2i+1)."""
    C, S = cores_per_socket, 2
    cpus = {}
    n_log = S * C * (2 if smt else 1)
    for s in range(S):
        for i in range(C):
            core = s * C + i
            if adjacent_siblings:
                ids = (2 * core, 2 * core + 1) if smt else (core,)
            else:
                ids = (core, core + S * C) if smt else (core,)
            node = s * max(1, nodes_per_socket) + i // (C // max(1, nodes_per_socket))
            l3_cores = range(s * C + (i // cores_per_l3) * cores_per_l3, s * C + (i // cores_per_l3 + 1) * cores_per_l3)
            if adjacent_siblings:
                l3 = tuple(x for k in l3_cores for x in ((2 * k, 2 * k + 1) if smt else (k,)))
            else:
                l3 = tuple(x for k in l3_cores for x in ((k, k + S * C) if smt else (k,)))
            for c in ids:
                cpus[c] = (s, node, ids, l3)
    assert len(cpus) == n_log
    return dict(sorted(cpus.items()))


def specs() -> dict[str, dict]:
    out = {}
    # 2 x EPYC 9655, NPS4
    cpus = two_socket(96, 4, 8, smt=True)
    dist = [[10 if a == b else (12 if a // 4 == b // 4 else 32) for b in range(8)] for a in range(8)]
    out["epyc9655_2s_nps4"] = dict(
        cpus=cpus, nodes={n: (192 * GIB_KB, 180 * GIB_KB, 4 * GIB_KB) for n in range(8)}, distances=dist,
        model="AMD EPYC 9655 96-Core Processor", allowed_cpus=list(cpus), allowed_mems=list(range(8)),
        numa_balancing=1, thp="always")
    # 2 x Xeon Platinum 8480+
    cpus = two_socket(56, 1, 56, smt=True)
    out["xeon8480_2s_smt"] = dict(
        cpus=cpus, nodes={0: (512 * GIB_KB, 480 * GIB_KB, 8 * GIB_KB), 1: (512 * GIB_KB, 490 * GIB_KB, 8 * GIB_KB)},
        distances=[[10, 21], [21, 10]], model="Intel(R) Xeon(R) Platinum 8480+", allowed_cpus=list(cpus),
        allowed_mems=[0, 1], numa_balancing=0, thp="madvise")
    # laptop: one node, adjacent SMT siblings
    cpus = {c: (0, 0, (c - c % 2, c - c % 2 + 1), tuple(range(16))) for c in range(16)}
    out["laptop_1node"] = dict(
        cpus=cpus, nodes={0: (30 * GIB_KB, 20 * GIB_KB, 2 * GIB_KB)}, distances=[[10]],
        model="AMD Ryzen 7 7840U w/ Radeon  780M Graphics", allowed_cpus=list(cpus), allowed_mems=[0],
        numa_balancing=0, thp="madvise")
    # container on a 2 x 16-core SMT host, cgroup v2 cpuset 8-23,40-55 and an 8-CPU quota
    cpus = two_socket(16, 1, 16, smt=True)
    allowed = list(range(8, 24)) + list(range(40, 56))
    out["container_cgroup"] = dict(
        cpus=cpus, nodes={0: (64 * GIB_KB, 40 * GIB_KB, 1 * GIB_KB), 1: (64 * GIB_KB, 41 * GIB_KB, 1 * GIB_KB)},
        distances=[[10, 20], [20, 10]], model="Intel(R) Xeon(R) Gold 6346 CPU @ 3.10GHz",
        allowed_cpus=allowed, allowed_mems=[0, 1], numa_balancing=0, thp="never",
        cgroup=dict(cpus=allowed, mems=[0, 1], cpu_max="800000 100000"))
    return out


def main(argv=None) -> int:
    for name, spec in specs().items():
        root = HERE / name
        if root.exists():
            shutil.rmtree(root)
        write_tree(root, spec)
        n = sum(len(f) for _, _, f in os.walk(root))
        print(f"{root.relative_to(HERE.parent.parent.parent)}: {n} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
