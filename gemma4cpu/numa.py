"""NUMA topology, CPU selection and per-node row splits: pure Python, no system calls.

`read_topology(root)` reads the machine from a sysfs/procfs tree (the live one at "/", or a fake
tree under tests/data/numa/): nodes with their CPUs, memory and distances
(/sys/devices/system/node), CPUs with their socket, SMT siblings and L3 (CCD) group
(/sys/devices/system/cpu/cpuN/{topology,cache}), the CPUs and memory nodes this process may use
(sched_getaffinity or Cpus_allowed_list, Mems_allowed_list, the cgroup cpuset and CPU quota),
automatic NUMA balancing and transparent huge pages.

`plan(topo, mode, threads, threads_batch, cpus, nodes, smt)` turns a request into a `Plan`:
which CPUs the decode and batch pools pin their workers to (one worker per CPU, grouped per node,
physical cores first, spread over the L3 groups of a node), which nodes hold weight pages, the
warnings a user needs, and (`Plan.row_split`) how a matrix's rows are split over the nodes in
`distribute` / `mirror`. Placement modes (`--numa`):

  none        no NUMA logic: workers on the first physical cores in CPU order, pages where they fall
  distribute  threads on every node; each matrix split by rows, node j's rows placed on node j and
              computed by node j's workers (one copy of the weights)
  isolate     one node: its CPUs, its memory
  interleave  threads on every node; weight pages interleaved over the nodes
  mirror      threads on every node; a copy of the weights per node, each node reads its own
  auto        distribute when the chosen CPUs span several nodes, else none (the default); with
              fewer threads than nodes, the first nodes, one thread each (isolate for one thread)

The memory side (mbind, move_pages, ...) is gemma4cpu.placement; this module only decides.
"""
from __future__ import annotations

import glob
import math
import os
from dataclasses import dataclass, field

from gemma4cpu.cpulist import parse_cpu_list

MODES = ("auto", "none", "distribute", "isolate", "interleave", "mirror")
ROW_ALIGN = 16   # row split granularity: the pool splits rows in multiples of 16 (csrc/g4_dispatch.c)


class NumaError(ValueError):
    """A CPU / node / thread request this machine or this process cannot honour."""


def format_cpu_list(cpus) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8' (taskset syntax)."""
    cs = sorted(set(int(c) for c in cpus))
    out, i = [], 0
    while i < len(cs):
        j = i
        while j + 1 < len(cs) and cs[j + 1] == cs[j] + 1:
            j += 1
        out.append(str(cs[i]) if i == j else f"{cs[i]}-{cs[j]}")
        i = j + 1
    return ",".join(out) if out else "(none)"


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _list(path: str) -> list[int] | None:
    s = _read(path)
    if s is None:
        return None
    return parse_cpu_list(s) if s else []


@dataclass(frozen=True)
class CpuInfo:
    cpu: int
    node: int
    package: int                  # socket
    core: int                     # the lowest CPU id among its SMT siblings (a core's key)
    siblings: tuple[int, ...]     # SMT siblings, itself included
    l3: int                       # the lowest CPU id sharing its L3 (a CCD on EPYC; a socket on Xeon)


@dataclass(frozen=True)
class NodeInfo:
    node: int
    cpus: tuple[int, ...]         # online CPUs of the node (allowed or not)
    mem_total: int                # bytes
    mem_free: int                 # bytes
    mem_available: int            # MemFree + Inactive(file): what a copy can take without swapping
    distances: tuple[int, ...]    # to every node, in Topology.nodes order (10 = local)


@dataclass
class Topology:
    root: str
    nodes: dict[int, NodeInfo]
    cpus: dict[int, CpuInfo]      # online CPUs
    allowed_cpus: tuple[int, ...]
    allowed_mems: tuple[int, ...]
    cpu_quota: float | None = None          # cgroup cpu.max in CPUs (None: no quota)
    numa_balancing: int | None = None       # /proc/sys/kernel/numa_balancing
    thp: str | None = None                  # always / madvise / never
    model: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def live(self) -> bool:
        return os.path.abspath(self.root) == "/"

    def node_of(self, cpu: int) -> int:
        return self.cpus[cpu].node

    def distance(self, a: int, b: int) -> int:
        ids = sorted(self.nodes)
        return self.nodes[a].distances[ids.index(b)]

    @property
    def packages(self) -> list[int]:
        return sorted({c.package for c in self.cpus.values()})

    def cores(self, cpus=None) -> dict[int, list[int]]:
        """{core key: its CPUs among `cpus` (default: all online)}."""
        sel = self.cpus if cpus is None else {c: self.cpus[c] for c in cpus}
        out: dict[int, list[int]] = {}
        for c in sorted(sel):
            out.setdefault(self.cpus[c].core, []).append(c)
        return out

    def l3_groups(self, cpus=None) -> dict[int, list[int]]:
        sel = sorted(self.cpus if cpus is None else cpus)
        out: dict[int, list[int]] = {}
        for c in sel:
            out.setdefault(self.cpus[c].l3, []).append(c)
        return out

    def describe(self) -> list[str]:
        """Human-readable lines: the machine, per node CPUs / cores / memory, distances, limits."""
        al = set(self.allowed_cpus)
        lines = [f"{self.model or 'unknown CPU'}: {len(self.packages)} socket(s), {len(self.nodes)} NUMA node(s), "
                 f"{len(self.cores())} cores, {len(self.cpus)} CPUs"
                 + (f" ({len(self.cpus) // max(1, len(self.cores()))} threads per core)" if self.cpus else "")]
        for n in sorted(self.nodes):
            nd = self.nodes[n]
            cores = self.cores(nd.cpus)
            l3 = self.l3_groups(nd.cpus)
            ok = sorted(al & set(nd.cpus))
            lines.append(f"  node {n}: CPUs {format_cpu_list(nd.cpus)} ({len(cores)} cores, {len(l3)} L3 group(s)), "
                         f"{nd.mem_total / 2**30:.1f} GiB ({nd.mem_available / 2**30:.1f} GiB available), "
                         f"allowed CPUs {format_cpu_list(ok)}"
                         + ("" if n in self.allowed_mems else ", memory NOT allowed"))
        ids = sorted(self.nodes)
        if len(ids) > 1:
            lines.append("  distances: " + " | ".join(f"{a}: " + " ".join(str(self.distance(a, b)) for b in ids)
                                                     for a in ids))
        lines.append(f"  this process may use CPUs {format_cpu_list(self.allowed_cpus)} and memory nodes "
                     f"{format_cpu_list(self.allowed_mems)}"
                     + (f"; cgroup CPU quota {self.cpu_quota:g} CPUs" if self.cpu_quota else ""))
        lines.append(f"  automatic NUMA balancing: {_onoff(self.numa_balancing)}; transparent huge pages: "
                     f"{self.thp or 'unknown'}")
        return lines


def _onoff(v):
    return "unknown" if v is None else ("off" if v == 0 else f"on ({v})")


def _meminfo(path: str) -> dict[str, int]:
    out = {}
    s = _read(path) or ""
    for line in s.splitlines():
        parts = line.replace(":", " ").split()
        # "Node 0 MemTotal:  16475880 kB"
        if len(parts) >= 4 and parts[0] == "Node":
            try:
                out[parts[2]] = int(parts[3]) * (1024 if parts[-1] == "kB" else 1)
            except ValueError:
                pass
    return out


def _status_lists(root: str) -> tuple[list[int] | None, list[int] | None]:
    s = _read(os.path.join(root, "proc/self/status")) or ""
    cpus = mems = None
    for line in s.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            cpus = parse_cpu_list(line.split(":", 1)[1]) if line.split(":", 1)[1].strip() else []
        elif line.startswith("Mems_allowed_list:"):
            mems = parse_cpu_list(line.split(":", 1)[1]) if line.split(":", 1)[1].strip() else []
    return cpus, mems


def _cgroup_limits(root: str) -> tuple[list[int] | None, list[int] | None, float | None]:
    """(cpuset CPUs, cpuset mems, CPU quota in CPUs) of this process's cgroup (v2, or v1 cpuset)."""
    cg = _read(os.path.join(root, "proc/self/cgroup")) or ""
    cpus = mems = quota = None
    for line in cg.splitlines():
        hid, _, rest = line.partition(":")
        ctrl, _, path = rest.partition(":")
        path = path.strip().lstrip("/")
        if hid == "0" and ctrl == "":                     # cgroup v2
            d = os.path.join(root, "sys/fs/cgroup", path)
            cpus = _list(os.path.join(d, "cpuset.cpus.effective")) or cpus
            mems = _list(os.path.join(d, "cpuset.mems.effective")) or mems
            q = (_read(os.path.join(d, "cpu.max")) or "").split()
            if len(q) == 2 and q[0] != "max":
                quota = int(q[0]) / int(q[1])
        elif "cpuset" in ctrl.split(","):                 # cgroup v1
            d = os.path.join(root, "sys/fs/cgroup/cpuset", path)
            cpus = _list(os.path.join(d, "cpuset.effective_cpus")) or cpus
            mems = _list(os.path.join(d, "cpuset.effective_mems")) or mems
    return cpus, mems, quota


def _model_name(root: str) -> str:
    s = _read(os.path.join(root, "proc/cpuinfo")) or ""
    for line in s.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""


def read_topology(root: str = "/", allowed_cpus=None) -> Topology:
    """The machine under `root` ("/" = this one). allowed_cpus overrides the CPU mask (default:
    this thread's sched_getaffinity on the live system, Cpus_allowed_list in a fake tree; both
    intersected with the cgroup cpuset)."""
    live = os.path.abspath(root) == "/"
    sysn = os.path.join(root, "sys/devices/system/node")
    sysc = os.path.join(root, "sys/devices/system/cpu")
    online = _list(os.path.join(sysc, "online"))
    if online is None:
        online = sorted(int(os.path.basename(p)[3:]) for p in glob.glob(os.path.join(sysc, "cpu[0-9]*")))
    notes: list[str] = []
    node_ids = _list(os.path.join(sysn, "online"))
    if node_ids is None:
        node_ids = sorted(int(os.path.basename(p)[4:]) for p in glob.glob(os.path.join(sysn, "node[0-9]*")))
    node_cpus: dict[int, list[int]] = {}
    for n in node_ids:
        node_cpus[n] = [c for c in (_list(os.path.join(sysn, f"node{n}", "cpulist")) or []) if c in online]
    if not node_ids:                                      # a kernel without NUMA: one node
        node_ids = [0]
        node_cpus = {0: list(online)}
        notes.append("no /sys/devices/system/node: treated as one node")
    cpu_node = {c: n for n, cs in node_cpus.items() for c in cs}
    cpus: dict[int, CpuInfo] = {}
    for c in online:
        d = os.path.join(sysc, f"cpu{c}")
        pkg = _read(os.path.join(d, "topology/physical_package_id"))
        sib = _list(os.path.join(d, "topology/thread_siblings_list")) or [c]
        l3 = None
        for idx in sorted(glob.glob(os.path.join(d, "cache/index[0-9]*"))):
            if _read(os.path.join(idx, "level")) == "3":
                sh = _list(os.path.join(idx, "shared_cpu_list"))
                if sh:
                    l3 = min(sh)
        p = int(pkg) if pkg not in (None, "", "-1") else 0
        cpus[c] = CpuInfo(cpu=c, node=cpu_node.get(c, node_ids[0]), package=p,
                          core=min([s for s in sib if s in online] or [c]), siblings=tuple(sib),
                          l3=l3 if l3 is not None else -1 - p)   # no L3 info: one group per socket
    nodes: dict[int, NodeInfo] = {}
    for n in node_ids:
        mi = _meminfo(os.path.join(sysn, f"node{n}", "meminfo"))
        dist = (_read(os.path.join(sysn, f"node{n}", "distance")) or "").split()
        dist_t = tuple(int(x) for x in dist) if len(dist) == len(node_ids) else tuple(
            10 if m == n else 20 for m in node_ids)
        nodes[n] = NodeInfo(node=n, cpus=tuple(node_cpus[n]), mem_total=mi.get("MemTotal", 0),
                            mem_free=mi.get("MemFree", 0),
                            mem_available=mi.get("MemFree", 0) + mi.get("Inactive(file)", 0),
                            distances=dist_t)
    st_cpus, st_mems = _status_lists(root)
    cg_cpus, cg_mems, quota = _cgroup_limits(root)
    if allowed_cpus is not None:
        al = set(int(c) for c in allowed_cpus)
    elif live and hasattr(os, "sched_getaffinity"):
        al = set(os.sched_getaffinity(0))
    else:
        al = set(st_cpus if st_cpus is not None else online)
    if cg_cpus is not None:
        al &= set(cg_cpus)
    al &= set(online)
    mems = set(st_mems if st_mems is not None else node_ids)
    if cg_mems is not None:
        mems &= set(cg_mems)
    mems &= set(node_ids)
    nb = _read(os.path.join(root, "proc/sys/kernel/numa_balancing"))
    thp = _read(os.path.join(root, "sys/kernel/mm/transparent_hugepage/enabled"))
    if thp and "[" in thp:
        thp = thp[thp.index("[") + 1:thp.index("]")]
    return Topology(root=root, nodes=nodes, cpus=cpus, allowed_cpus=tuple(sorted(al)),
                    allowed_mems=tuple(sorted(mems)), cpu_quota=quota,
                    numa_balancing=int(nb) if nb and nb.lstrip("-").isdigit() else None,
                    thp=thp, model=_model_name(root), notes=notes)


# ---- plans ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PoolPlan:
    """One pool: worker i pinned to cpus[i] (on node cpu_nodes[i]); group g = workers
    [group_first[g], group_first[g+1]) (one group per node in distribute / mirror, else one)."""
    cpus: tuple[int, ...]
    cpu_nodes: tuple[int, ...]
    group_first: tuple[int, ...]

    @property
    def threads(self) -> int:
        return len(self.cpus)

    @property
    def n_groups(self) -> int:
        return len(self.group_first) - 1

    @property
    def group_nodes(self) -> tuple[int, ...]:
        return tuple(self.cpu_nodes[self.group_first[g]] for g in range(self.n_groups))

    @property
    def workers_per_group(self) -> tuple[int, ...]:
        return tuple(self.group_first[g + 1] - self.group_first[g] for g in range(self.n_groups))

    def per_node(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for c, n in zip(self.cpus, self.cpu_nodes):
            out.setdefault(n, []).append(c)
        return out

    def describe(self) -> str:
        return " | ".join(f"node {n}: {format_cpu_list(cs)}" for n, cs in sorted(self.per_node().items())) + (
            f" ({self.n_groups} groups)" if self.n_groups > 1 else "")


@dataclass
class Plan:
    requested: str                     # the --numa value asked for
    mode: str                          # what runs (auto resolved)
    nodes: tuple[int, ...]             # compute nodes, in group order
    mem_nodes: tuple[int, ...]         # nodes that receive weight pages
    decode: PoolPlan                   # n_tok == 1
    batch: PoolPlan                    # n_tok > 1 (-tb); the decode plan when the counts agree
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def grouped(self) -> bool:
        """Rows split per node (distribute, mirror on more than one node)."""
        return self.mode in ("distribute", "mirror") and len(self.nodes) > 1

    def row_split(self, n_rows: int) -> tuple[int, ...] | None:
        """Row bounds per node for a matrix of n_rows (None: no split), proportional to the decode
        pool's workers per node, in multiples of ROW_ALIGN rows except the end."""
        if not self.grouped:
            return None
        return split_rows(n_rows, self.decode.workers_per_group)

    @property
    def pools(self) -> list[PoolPlan]:
        return [self.decode] if self.batch is self.decode else [self.decode, self.batch]

    def describe(self) -> list[str]:
        lines = [f"numa {self.mode}" + (f" (from {self.requested})" if self.requested != self.mode else "")
                 + f": compute nodes {format_cpu_list(self.nodes)}, weight pages on {format_cpu_list(self.mem_nodes)}",
                 f"  decode pool, {self.decode.threads} threads: {self.decode.describe()}"]
        if self.batch is not self.decode:
            lines.append(f"  batch pool, {self.batch.threads} threads: {self.batch.describe()}")
        lines += [f"  note: {n}" for n in self.notes] + [f"  warning: {w}" for w in self.warnings]
        return lines


def split_rows(n_rows: int, weights) -> tuple[int, ...]:
    """Bounds (0, b1, ..., n_rows): group g gets rows [b_g, b_g+1), about n_rows * w_g / sum(w),
    each inner bound rounded to the nearest multiple of ROW_ALIGN (never decreasing)."""
    w = [int(x) for x in weights]
    tot = sum(w)
    if tot <= 0 or any(x < 0 for x in w):
        raise ValueError(f"bad split weights {w}")
    out, acc = [0], 0
    for x in w[:-1]:
        acc += x
        b = int(math.floor(n_rows * acc / tot / ROW_ALIGN + 0.5)) * ROW_ALIGN
        out.append(min(max(b, out[-1]), n_rows))
    out.append(n_rows)
    return tuple(out)


def _core_order(topo: Topology, cpus: list[int]) -> list[list[int]]:
    """The cores among `cpus` (each a list of its CPUs, lowest first), ordered round-robin over the
    L3 groups (so k cores of a node spread over its CCDs), groups by lowest CPU."""
    cores = topo.cores(cpus)
    by_l3: dict[int, list[list[int]]] = {}
    for key in sorted(cores):
        by_l3.setdefault(topo.cpus[key].l3, []).append(cores[key])
    groups = [by_l3[g] for g in sorted(by_l3, key=lambda g: min(min(c) for c in by_l3[g]))]
    out = []
    for i in range(max((len(g) for g in groups), default=0)):
        out += [g[i] for g in groups if i < len(g)]
    return out


def _take(topo: Topology, cpus: list[int], k: int) -> list[int]:
    """k CPUs of `cpus`: one per core first (cores spread over L3 groups), then second threads."""
    order = _core_order(topo, cpus)
    out: list[int] = []
    level = 0
    while len(out) < k:
        row = [c[level] for c in order if level < len(c)]
        if not row:
            break
        out += row[:k - len(out)]
        level += 1
    return sorted(out)


def _spread(counts_cap: dict[int, tuple[int, int]], total: int) -> dict[int, int]:
    """Threads per node: round-robin over nodes with spare physical cores, then spare CPUs."""
    take = {n: 0 for n in counts_cap}
    left = total
    for cap_idx in (0, 1):
        while left:
            progressed = False
            for n in sorted(counts_cap):
                if left and take[n] < counts_cap[n][cap_idx]:
                    take[n] += 1
                    left -= 1
                    progressed = True
            if not progressed:
                break
    return take


def plan(topo: Topology, mode: str = "auto", threads: int | None = None, threads_batch: int | None = None,
         cpus=None, nodes=None, smt: bool = False) -> Plan:
    """Choose CPUs, groups and memory nodes for a request; raises NumaError for requests this
    machine / process cannot honour. See the module docstring for the modes."""
    if mode not in MODES:
        raise NumaError(f"unknown NUMA mode {mode!r}; choose from {', '.join(MODES)}")
    warnings: list[str] = []
    notes: list[str] = list(topo.notes)
    allowed = [c for c in topo.allowed_cpus if c in topo.cpus]
    if not allowed:
        raise NumaError("this process may not run on any online CPU")
    for name, v in (("threads", threads), ("threads_batch", threads_batch)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise NumaError(f"{name} must be an integer >= 1, got {v!r}")
    if nodes is not None:
        nodes = [int(n) for n in nodes]
        unknown = [n for n in nodes if n not in topo.nodes]
        if unknown:
            raise NumaError(f"unknown NUMA node(s) {format_cpu_list(unknown)}; this machine has node(s) "
                            f"{format_cpu_list(topo.nodes)}")
        barred = [n for n in nodes if n not in topo.allowed_mems]
        if barred:
            raise NumaError(f"NUMA node(s) {format_cpu_list(barred)} are not in this process's allowed memory "
                            f"nodes {format_cpu_list(topo.allowed_mems)} (cgroup cpuset / numactl)")
        nocpu = [n for n in nodes if not set(topo.nodes[n].cpus) & set(allowed)]
        if nocpu:
            raise NumaError(f"NUMA node(s) {format_cpu_list(nocpu)} have no CPU this process may use "
                            f"(allowed CPUs {format_cpu_list(allowed)})")
    al = set(allowed)
    if cpus is not None:
        cpus = [int(c) for c in cpus]
        bad = [c for c in cpus if c not in al]
        if bad:
            raise NumaError(f"CPU(s) {format_cpu_list(bad)} are not among the CPUs this process may use "
                            f"({format_cpu_list(allowed)}: taskset / cgroup cpuset)")
        if len(set(cpus)) != len(cpus):
            raise NumaError(f"CPU list {cpus} names a CPU twice")
        if threads is not None and threads != len(cpus):
            raise NumaError(f"threads={threads} but {len(cpus)} CPUs given ({format_cpu_list(cpus)}); "
                            "give one CPU per thread")
        if nodes is not None:
            off = [c for c in cpus if topo.node_of(c) not in nodes]
            if off:
                raise NumaError(f"CPU(s) {format_cpu_list(off)} are not on NUMA node(s) {format_cpu_list(nodes)}")
        threads = len(cpus)
    # candidate nodes
    cand_nodes = sorted({topo.node_of(c) for c in (cpus if cpus is not None else allowed)})
    if nodes is not None:
        cand_nodes = [n for n in cand_nodes if n in nodes]
    machine_nodes = sorted(n for n in topo.nodes if topo.nodes[n].cpus)
    resolved = mode
    if mode == "auto":
        resolved = "distribute" if len(cand_nodes) > 1 else "none"
        few = min([t for t in (threads, threads_batch) if t is not None], default=None)
        if resolved == "distribute" and cpus is None and few is not None and few < len(cand_nodes):
            cand_nodes = cand_nodes[:few]             # fewer threads than nodes: one node per thread
            resolved = "distribute" if len(cand_nodes) > 1 else "isolate"
    if resolved in ("distribute", "mirror", "isolate"):
        lack = [n for n in cand_nodes if n not in topo.allowed_mems]
        keep = [n for n in cand_nodes if n in topo.allowed_mems]
        if lack and not keep:
            raise NumaError(f"--numa {resolved}: none of the nodes {format_cpu_list(cand_nodes)} of the allowed CPUs "
                            f"is an allowed memory node ({format_cpu_list(topo.allowed_mems)})")
        if lack:
            warnings.append(f"node(s) {format_cpu_list(lack)} are not allowed memory nodes: their CPUs are left out "
                            f"of {resolved}")
            cand_nodes = keep
    if resolved == "isolate":
        if cpus is not None:
            ns = sorted({topo.node_of(c) for c in cpus})
            if len(ns) > 1:
                raise NumaError(f"--numa isolate runs on one node, but CPUs {format_cpu_list(cpus)} are on nodes "
                                f"{format_cpu_list(ns)}")
            cand_nodes = ns
        else:
            cand_nodes = cand_nodes[:1]
    if mode not in ("none", "auto") and resolved != "isolate" and len(machine_nodes) > len(cand_nodes) \
            and nodes is None and cpus is None:
        warnings.append(f"--numa {mode}: the CPU mask (taskset / cgroup cpuset) reaches node(s) "
                        f"{format_cpu_list(cand_nodes)} of {format_cpu_list(machine_nodes)}")
    pool_cpus = [c for c in (cpus if cpus is not None else allowed) if topo.node_of(c) in cand_nodes]
    phys = len(topo.cores(pool_cpus))
    if threads is None:
        threads = len(pool_cpus) if smt else phys
        if topo.cpu_quota and threads > max(1, int(topo.cpu_quota)):
            notes.append(f"cgroup CPU quota {topo.cpu_quota:g} CPUs: {max(1, int(topo.cpu_quota))} threads "
                         f"(of {threads})")
            threads = max(1, int(topo.cpu_quota))
        if cpus is None and nodes is None and len(allowed) < len(topo.cpus):
            warnings.append(f"the CPU mask (taskset / cgroup cpuset) allows {len(allowed)} of the {len(topo.cpus)} "
                            f"online CPUs ({format_cpu_list(allowed)}): using {threads} thread(s) on them")
    grouped_mode = resolved in ("distribute", "mirror") and len(cand_nodes) > 1
    if grouped_mode and threads < len(cand_nodes):
        raise NumaError(f"--numa {resolved} over {len(cand_nodes)} nodes needs at least one thread per node, "
                        f"got {threads} (use --numa isolate, or more threads)")

    def choose(t: int, what: str) -> PoolPlan:
        if t > len(pool_cpus):
            where = f" on node(s) {format_cpu_list(cand_nodes)}" if len(cand_nodes) < len(machine_nodes) else ""
            raise NumaError(f"{what}={t}: more threads than CPUs: this process may use {len(pool_cpus)} CPU(s)"
                            f"{where} ({format_cpu_list(pool_cpus)}; taskset / cgroup cpuset)")
        if grouped_mode and t < len(cand_nodes):
            raise NumaError(f"--numa {resolved} over {len(cand_nodes)} nodes needs at least one thread per node, "
                            f"got {what}={t}")
        if cpus is not None and t == len(cpus):
            chosen = list(cpus)
            if resolved in ("distribute", "mirror", "interleave"):
                chosen = sorted(chosen, key=lambda c: cand_nodes.index(topo.node_of(c)))  # stable per node
        elif cpus is not None and resolved in ("none", "isolate"):
            chosen = list(cpus[:t])                     # a shorter pool (-tb) takes the list's first CPUs
        elif resolved in ("none", "isolate"):
            chosen = _take(topo, pool_cpus, t) if resolved == "isolate" else _first(topo, pool_cpus, t)
        else:
            per = {n: [c for c in pool_cpus if topo.node_of(c) == n] for n in cand_nodes}
            take = _spread({n: (len(topo.cores(per[n])), len(per[n])) for n in cand_nodes}, t)
            chosen = [c for n in cand_nodes for c in _take(topo, per[n], take[n])]
        nodes_of = tuple(topo.node_of(c) for c in chosen)
        if grouped_mode:
            first = [0] + [i for i in range(1, len(chosen)) if nodes_of[i] != nodes_of[i - 1]] + [len(chosen)]
            return PoolPlan(tuple(chosen), nodes_of, tuple(first))
        return PoolPlan(tuple(chosen), nodes_of, (0, len(chosen)))

    dec = choose(threads, "threads")
    bat = dec if threads_batch is None or threads_batch == threads else choose(threads_batch, "threads_batch")
    if grouped_mode and bat.group_nodes != dec.group_nodes:
        raise NumaError(f"the decode and batch pools must span the same nodes ({format_cpu_list(dec.group_nodes)} "
                        f"vs {format_cpu_list(bat.group_nodes)})")
    for p, what in [(dec, "threads")] + ([(bat, "threads_batch")] if bat is not dec else []):
        n_phys = len(topo.cores(p.cpus))
        if p.threads > n_phys:
            warnings.append(f"{what}={p.threads} on {n_phys} physical core(s): SMT siblings share a core's "
                            "execution units and caches (usually slower for memory-bound decode)")
        if topo.cpu_quota and p.threads > topo.cpu_quota + 1e-9:
            warnings.append(f"{what}={p.threads} but the cgroup CPU quota is {topo.cpu_quota:g} CPUs (cpu.max): "
                            "spinning workers will be throttled")
    used_nodes = tuple(n for n in cand_nodes if n in set(dec.cpu_nodes) | set(bat.cpu_nodes))
    if len(used_nodes) > 1 and resolved != "none" and topo.numa_balancing:
        warnings.append("automatic NUMA balancing is on (/proc/sys/kernel/numa_balancing): the kernel may "
                        "migrate placed weight pages; turn it off with "
                        "'echo 0 | sudo tee /proc/sys/kernel/numa_balancing'")
    if resolved == "interleave":
        mem = tuple(n for n in topo.allowed_mems if nodes is None or n in nodes)
    elif resolved == "none":
        mem = ()
    else:
        mem = used_nodes
    return Plan(requested=mode, mode=resolved, nodes=used_nodes, mem_nodes=mem, decode=dec, batch=bat,
                warnings=warnings, notes=notes)


def _first(topo: Topology, cpus: list[int], k: int) -> list[int]:
    """k CPUs in CPU order, one per core first (mode none: no NUMA logic, no reordering)."""
    cores = topo.cores(cpus)
    out: list[int] = []
    level = 0
    while len(out) < k:
        row = sorted(cs[level] for cs in cores.values() if level < len(cs))
        if not row:
            break
        out += row[:k - len(out)]
        level += 1
    return sorted(out)


def recommend(topo: Topology, model_bytes: int | None = None) -> list[str]:
    """Suggested command lines for this machine (tools/numa/topology)."""
    p = plan(topo, "auto")
    cores = len(topo.cores(p.decode.cpus))
    out = []
    base = "python -m gemma4cpu.run -m MODEL.gguf"
    n_nodes = len(p.nodes)
    if n_nodes > 1:
        out.append(f"{base} --numa distribute -t {p.decode.threads}    # one copy, rows split over nodes "
                   f"{format_cpu_list(p.nodes)}")
        fits = model_bytes is None or all(topo.nodes[n].mem_available >= model_bytes for n in p.nodes)
        out.append(f"{base} --numa mirror -t {p.decode.threads}        # a copy per node"
                   + ("" if model_bytes is None else (" (fits)" if fits else " (does NOT fit in free memory)")))
        one = p.nodes[0]
        k = len(topo.cores([c for c in topo.allowed_cpus if topo.node_of(c) == one]))
        out.append(f"{base} --numa isolate --numa-nodes {one} -t {k}   # one node only")
    else:
        out.append(f"{base} -t {cores}    # one node: physical cores {format_cpu_list(p.decode.cpus)}")
    if topo.numa_balancing and n_nodes > 1:
        out.append("echo 0 | sudo tee /proc/sys/kernel/numa_balancing    # stop the kernel moving placed pages")
    return out
