"""Print this machine's NUMA topology and the gemma4cpu command lines that fit it.

    python -m tools.numa.topology                       # this machine
    python -m tools.numa.topology -m MODEL.gguf         # also: does --numa mirror fit?
    python -m tools.numa.topology --sysfs tests/data/numa/epyc9655_2s_nps4   # a fake tree
    python -m tools.numa.topology --json

What it prints: the CPU model and features (py-cpuinfo; psutil for the memory totals), sockets,
nodes with their CPUs, cores, L3 (CCD) groups, memory and distances, the CPUs and memory nodes
this process may use (taskset, cgroup cpuset and quota), NUMA balancing and THP, the plan
gemma4cpu makes by default (which CPU each worker is pinned to, grouped per node), its warnings,
and recommended command lines.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from gemma4cpu import numa


# the CPU features the kernels care about, as /proc/cpuinfo (and py-cpuinfo) name them
FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16",
            "amx_int8", "amx_bf16")


def cpu_features() -> tuple[str, list[str]]:
    """(brand, the FEATURES this CPU has, in that order) from py-cpuinfo; ('', []) when it is missing."""
    try:
        import cpuinfo
        info = cpuinfo.get_cpu_info()
    except Exception:  # noqa: BLE001  (an optional, slow probe: never fatal)
        return "", []
    flags = set(info.get("flags", []))
    keep = [f for f in FEATURES if f in flags]
    return info.get("brand_raw", ""), keep


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.numa.topology", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sysfs", default="/", help="root of a sysfs/procfs tree (default: this machine)")
    ap.add_argument("-m", "--model", help="GGUF file: say whether a copy per node (--numa mirror) fits")
    ap.add_argument("--numa", default="auto", choices=numa.MODES, help="plan to show (default auto)")
    ap.add_argument("-t", "--threads", type=int, default=None, help="threads for the plan shown")
    ap.add_argument("--json", action="store_true", help="print the topology and plan as JSON")
    a = ap.parse_args(argv)
    topo = numa.read_topology(a.sysfs)
    live = topo.live
    brand, feats = cpu_features() if live else ("", [])
    size = os.path.getsize(a.model) if a.model else None
    try:
        plan = numa.plan(topo, a.numa, threads=a.threads)
    except numa.NumaError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.json:
        out = {
            "model": brand or topo.model, "features": feats, "allowed_cpus": list(topo.allowed_cpus),
            "allowed_mems": list(topo.allowed_mems), "cpu_quota": topo.cpu_quota,
            "numa_balancing": topo.numa_balancing, "thp": topo.thp,
            "nodes": {n: {"cpus": list(nd.cpus), "cores": len(topo.cores(nd.cpus)),
                          "l3_groups": len(topo.l3_groups(nd.cpus)), "mem_total": nd.mem_total,
                          "mem_available": nd.mem_available, "distances": list(nd.distances)}
                      for n, nd in topo.nodes.items()},
            "plan": {"mode": plan.mode, "nodes": list(plan.nodes), "mem_nodes": list(plan.mem_nodes),
                     "cpus": list(plan.decode.cpus), "group_first": list(plan.decode.group_first),
                     "warnings": plan.warnings, "notes": plan.notes},
            "recommend": numa.recommend(topo, size),
        }
        json.dump(out, sys.stdout, indent=2)
        print()
        return 0
    if brand:
        topo.model = brand
    for line in topo.describe():
        print(line)
    if feats:
        print(f"  features: {' '.join(feats)}")
    if live:
        try:
            import psutil
            vm = psutil.virtual_memory()
            print(f"  memory: {vm.total / 2**30:.1f} GiB total, {vm.available / 2**30:.1f} GiB available (psutil)")
        except ImportError:
            pass
    print()
    for line in plan.describe():
        print(line)
    print()
    print("recommended:")
    for line in numa.recommend(topo, size):
        print(f"  {line}")
    if size:
        print(f"  (model {size / 2**30:.2f} GiB; a mirror needs that much free on every node)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
