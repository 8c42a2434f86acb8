"""Memory placement on NUMA nodes: mbind, set_mempolicy, get_mempolicy and move_pages as raw Linux
system calls through ctypes (no libnuma needed; the four calls are all gemma4cpu uses), and the
placement of a model's weights and KV cache for a gemma4cpu.numa.Plan, checked page by page.

How a range of memory is put on a node (`place`):
  * pages of a file mapping (the GGUF weights, mapped read-only) come from the page cache, and the
    kernel allocates page-cache pages by the policy of the *thread* that faults them, not by the
    mapping's policy: so the range is faulted in (MADV_POPULATE_READ) under a thread policy
    (set_mempolicy, restored afterwards), then mbind(MPOL_MF_MOVE) records the policy on the range
    and migrates the pages that were already cached on another node (only pages no other process
    maps can move without privileges);
  * anonymous memory (copies of the weights for --no-mmap / mirror / --thp, the KV cache) takes
    the policy of its range at first touch: mbind before the data is written, MF_MOVE for pages
    already touched.
Every placement is then checked (`page_nodes`, move_pages with no target: the node of each page)
on a sample of pages per range, or all of them, and reported: pages on the expected node(s),
pages elsewhere, pages not present.
"""
from __future__ import annotations

import ctypes
import errno
import mmap as _mmap
import os
import platform
import resource
import threading
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
HUGE = 2 << 20

MPOL_DEFAULT, MPOL_PREFERRED, MPOL_BIND, MPOL_INTERLEAVE, MPOL_LOCAL = 0, 1, 2, 3, 4
MPOL_MF_STRICT, MPOL_MF_MOVE, MPOL_MF_MOVE_ALL = 1, 2, 4
MPOL_F_NODE, MPOL_F_ADDR = 1, 2
MADV_HUGEPAGE, MADV_POPULATE_READ = 14, 22
MAX_NODES = 1024                       # bits in the node masks passed to the kernel
POLICY_NAMES = {MPOL_DEFAULT: "default", MPOL_PREFERRED: "preferred", MPOL_BIND: "bind",
                MPOL_INTERLEAVE: "interleave", MPOL_LOCAL: "local"}

_SYSCALLS = {   # (mbind, set_mempolicy, get_mempolicy, move_pages)
    "x86_64": (237, 238, 239, 279),
    "aarch64": (235, 237, 236, 239),
}


class PlacementError(OSError):
    pass


_libc = None


def _lib():
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.syscall.restype = ctypes.c_long
        lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.munlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _libc = lib
    return _libc


_NR = _SYSCALLS.get(platform.machine().lower())
_AVAILABLE = None


def _nr():
    if _NR is None:
        raise PlacementError(errno.ENOSYS, f"NUMA system calls are not wired up for {platform.machine()}")
    return _NR


def available() -> tuple[bool, str]:
    """(True, "") if this process can query and set memory policies, else (False, why)."""
    global _AVAILABLE
    if _AVAILABLE is None:
        if platform.system() != "Linux":
            _AVAILABLE = (False, "not Linux")
        else:
            try:
                get_mempolicy()
                _AVAILABLE = (True, "")
            except OSError as e:
                _AVAILABLE = (False, f"get_mempolicy failed: {e.strerror or e}")
    return _AVAILABLE


def _mask(nodes) -> ctypes.Array:
    m = (ctypes.c_ulong * (MAX_NODES // 64))()
    for n in nodes:
        if not 0 <= int(n) < MAX_NODES:
            raise PlacementError(errno.EINVAL, f"node {n} out of range")
        m[int(n) // 64] |= 1 << (int(n) % 64)
    return m


def _unmask(m) -> list[int]:
    return [i * 64 + b for i in range(len(m)) if m[i] for b in range(64) if m[i] >> b & 1]


def _check(rc: int, what: str):
    if rc < 0:
        e = ctypes.get_errno()
        raise PlacementError(e, f"{what}: {os.strerror(e)}")


def mbind(addr: int, length: int, mode: int, nodes=(), flags: int = 0):
    """mbind(2) on [addr, addr + length) (addr page-aligned)."""
    m = _mask(nodes)
    rc = _lib().syscall(_nr()[0], ctypes.c_void_p(addr), ctypes.c_ulong(length), ctypes.c_int(mode),
                        m if nodes else None, ctypes.c_ulong(MAX_NODES + 1 if nodes else 0), ctypes.c_uint(flags))
    _check(rc, f"mbind({POLICY_NAMES.get(mode, mode)}, nodes {list(nodes)}, {length} bytes)")


def set_mempolicy(mode: int, nodes=()):
    """set_mempolicy(2): the calling thread's policy for new allocations."""
    m = _mask(nodes)
    rc = _lib().syscall(_nr()[1], ctypes.c_int(mode), m if nodes else None,
                        ctypes.c_ulong(MAX_NODES + 1 if nodes else 0))
    _check(rc, f"set_mempolicy({POLICY_NAMES.get(mode, mode)}, {list(nodes)})")


def get_mempolicy(addr: int | None = None) -> tuple[int, list[int]]:
    """(mode, nodes) of the calling thread, or of the range holding addr (MPOL_F_ADDR)."""
    mode = ctypes.c_int(0)
    m = (ctypes.c_ulong * (MAX_NODES // 64))()
    rc = _lib().syscall(_nr()[2], ctypes.byref(mode), m, ctypes.c_ulong(MAX_NODES + 1),
                        ctypes.c_void_p(addr or 0), ctypes.c_ulong(MPOL_F_ADDR if addr else 0))
    _check(rc, "get_mempolicy")
    return mode.value & 0xFFFF, _unmask(m)   # the mode's high bits carry flags (MPOL_F_STATIC_NODES ...)


class thread_policy:
    """with thread_policy(MPOL_BIND, [1]): allocations of this thread follow it; restored after."""

    def __init__(self, mode: int, nodes):
        self.mode, self.nodes = mode, list(nodes)

    def __enter__(self):
        self.saved = get_mempolicy()
        set_mempolicy(self.mode, self.nodes)
        return self

    def __exit__(self, *exc):
        mode, nodes = self.saved
        set_mempolicy(mode, nodes if mode not in (MPOL_DEFAULT, MPOL_LOCAL) else ())
        return False


def move_pages(pages: np.ndarray, nodes: np.ndarray | None = None, flags: int = 0) -> np.ndarray:
    """move_pages(2) for this process: pages (uintp addresses). nodes None: query, the status is
    each page's node or -errno (-ENOENT: not present). Otherwise move page i to nodes[i]."""
    pages = np.ascontiguousarray(pages, dtype=np.uintp)
    status = np.empty(pages.size, np.int32)
    CH = 1 << 16
    for a in range(0, pages.size, CH):
        b = min(pages.size, a + CH)
        nd = None if nodes is None else np.ascontiguousarray(nodes[a:b], dtype=np.int32)
        rc = _lib().syscall(_nr()[3], ctypes.c_int(0), ctypes.c_ulong(b - a),
                            ctypes.c_void_p(pages[a:b].ctypes.data),
                            None if nd is None else ctypes.c_void_p(nd.ctypes.data),
                            ctypes.c_void_p(status[a:b].ctypes.data), ctypes.c_int(flags))
        _check(rc, "move_pages")
    return status


def page_span(addr: int, length: int) -> tuple[int, int]:
    """The page-aligned span covering [addr, addr + length)."""
    a = addr // PAGE * PAGE
    return a, -(-(addr + length) // PAGE) * PAGE


def _spaced(n: int, sample: int | None) -> np.ndarray:
    """Indices of `sample` evenly spaced pages of n (every page with None or sample >= n); strictly
    increasing (the step is > 1), so no np.unique: its first call imports numpy.ma, ~7-10 ms of a load)."""
    if sample is None or sample >= n:
        return np.arange(n)
    return np.linspace(0, n - 1, sample).astype(np.int64)


def _hist(nodes: np.ndarray) -> dict[int, int]:
    """{node: count} of an array of node ids (>= 0)."""
    if nodes.size == 0:
        return {}
    cnt = np.bincount(nodes)
    return {int(n): int(cnt[n]) for n in np.flatnonzero(cnt)}


def page_nodes(addr: int, length: int, sample: int | None = None) -> np.ndarray:
    """Node (or -errno) of the pages of [addr, addr + length): every page, or `sample` evenly spaced."""
    a, b = page_span(addr, length)
    n = (b - a) // PAGE
    if n == 0:
        return np.empty(0, np.int32)
    return move_pages(a + _spaced(n, sample).astype(np.uintp) * PAGE)


def populate(addr: int, length: int):
    """Fault in the pages of a mapping for reading (MADV_POPULATE_READ, Linux 5.14+; else touch)."""
    a, b = page_span(addr, length)
    if _lib().madvise(ctypes.c_void_p(a), ctypes.c_size_t(b - a), MADV_POPULATE_READ) == 0:
        return
    buf = (ctypes.c_ubyte * (b - a)).from_address(a)
    np.frombuffer(buf, np.uint8)[::PAGE].sum()   # a read per page


def addr_of(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _on(st: np.ndarray, nodes) -> np.ndarray:
    """st (move_pages statuses) in nodes, elementwise (a lookup table: np.isin is slow on many small
    calls). A negative status (-ENOENT: page not present, -EFAULT, ...) is on no node: False, never
    an index (it used to wrap round the table, or raise IndexError when the table has one entry)."""
    lut = np.zeros(max(max(nodes), int(st.max(initial=0))) + 1, bool)
    lut[list(nodes)] = True
    return (st >= 0) & lut[np.maximum(st, 0)]


def targets(n_pages: int, mode: int, nodes) -> np.ndarray:
    """The node each page of a range should be on: bind/preferred -> nodes[0]; interleave -> round robin."""
    nodes = np.asarray(list(nodes), np.int32)
    if mode == MPOL_INTERLEAVE:
        return nodes[np.arange(n_pages) % nodes.size]
    return np.full(n_pages, nodes[0], np.int32)


def place(addr: int, length: int, mode: int, nodes, file_backed: bool) -> np.ndarray | None:
    """Put [addr, addr + length) on `nodes` by `mode` (MPOL_BIND / MPOL_INTERLEAVE / MPOL_PREFERRED).
    file_backed (pages of a mapped file, which the page cache allocates by the faulting thread's
    policy, never the range's): every page of the span is faulted in under that thread policy, the
    range policy is recorded (mbind, no move: /proc/PID/numa_maps shows it), then every page is
    queried and the ones on a node outside `nodes` are moved there (move_pages); returns the final
    node of each page. Anonymous memory: the pages wholly inside the range get the range policy
    (pages not yet touched are allocated by it; touched ones move with MPOL_MF_MOVE); returns None."""
    if file_backed:
        a, b = page_span(addr, length)
    else:
        a, b = -(-addr // PAGE) * PAGE, (addr + length) // PAGE * PAGE
    if b <= a:
        return None
    if not file_backed:
        mbind(a, b - a, mode, nodes, MPOL_MF_MOVE)
        return None
    # the range policy first: splitting the mapping at the range's ends unmaps huge file folios
    # mapped across them (measured: a whole 221-page tensor read back "not present" when mbind came
    # after the populate), and MPOL_MF_MOVE would do the same to pages it need not move
    mbind(a, b - a, mode, nodes, 0)
    with thread_policy(mode, nodes):
        populate(a, b - a)
    pages = a + np.arange((b - a) // PAGE, dtype=np.uintp) * PAGE
    st = move_pages(pages)
    bad = (st >= 0) & ~_on(st, nodes)
    if bad.any():
        st[bad] = move_pages(pages[bad], targets(pages.size, mode, nodes)[bad], MPOL_MF_MOVE)
        st[bad] = move_pages(pages[bad])
    return st


# ---- weights and caches of a model ---------------------------------------------------------------

@dataclass
class Range:
    name: str             # tensor (and rows) this range holds
    addr: int
    length: int
    nodes: tuple[int, ...]  # where its pages should be (interleave: any of them)
    mode: int


@dataclass
class Check:
    """Page-by-page check of a set of ranges (move_pages queries)."""
    pages: int = 0                  # pages queried
    ok: int = 0                     # on an expected node
    wrong: int = 0                  # on another node
    absent: int = 0                 # not present (never touched, or swapped out)
    per_node: dict = field(default_factory=dict)
    worst: list = field(default_factory=list)   # (fraction wrong, name, {node: pages})

    def line(self) -> str:
        nodes = ", ".join(f"node {n}: {c}" for n, c in sorted(self.per_node.items()))
        return (f"{self.pages} pages checked: {self.ok} on the expected node(s), {self.wrong} elsewhere, "
                f"{self.absent} not present ({nodes or 'none present'})")


def _sample_pages(r: Range, sample: int | None) -> np.ndarray:
    a, b = page_span(r.addr, r.length)
    n = (b - a) // PAGE
    return (a + _spaced(n, sample) * PAGE).astype(np.uintp)


def check(ranges: list[Range], sample: int | None = 64, status: list | None = None) -> Check:
    """Where the pages of each range are (move_pages queries, one call for all ranges): `sample`
    evenly spaced pages per range, or every page (None); status: per range the nodes already known."""
    out = Check()
    if status is None:
        pages = [_sample_pages(r, sample) for r in ranges]
        allst = move_pages(np.concatenate(pages)) if pages else np.empty(0, np.int32)
        cuts = np.cumsum([0] + [p.size for p in pages])
        status = [allst[cuts[i]:cuts[i + 1]] for i in range(len(ranges))]
    for r, st in zip(ranges, status):
        present = st[st >= 0]
        ok = int(_on(present, r.nodes).sum())
        out.pages += st.size
        out.ok += ok
        out.wrong += present.size - ok
        out.absent += int((st == -errno.ENOENT).sum())
        hist = _hist(present)
        for n, c in hist.items():
            out.per_node[n] = out.per_node.get(n, 0) + c
        if present.size - ok:
            out.worst.append(((present.size - ok) / max(1, present.size), r.name, hist, r.nodes))
    out.worst.sort(key=lambda w: -w[0])
    return out


@dataclass
class Report:
    mode: str
    mmap: bool
    seconds: float = 0.0          # placing the weights (place_weights), copies included
    copy_seconds: float = 0.0     # of which: reading the file into anonymous copies, one per node
    setup_seconds: float = 0.0    # topology, plan, pools (setup)
    kv_seconds: float = 0.0       # placing the KV cache
    bytes: int = 0
    ranges: list = field(default_factory=list)
    check: Check | None = None
    kv: Check | None = None
    kv_policy_ok: bool | None = None
    huge_bytes: int | None = None
    buffers: list = field(default_factory=list)   # AnonBuffers holding copies (kept alive here)
    warnings: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    @property
    def total_seconds(self) -> float:
        return self.seconds + self.setup_seconds + self.kv_seconds

    def lines(self) -> list[str]:
        out = [f"placement {self.mode} ({'mapped file' if self.mmap else 'anonymous copies'}): "
               f"{self.bytes / 2**30:.2f} GiB in {len(self.ranges)} ranges, {self.seconds * 1e3:.1f} ms "
               + (f"(of which copying the weights {self.copy_seconds * 1e3:.1f} ms) " if not self.mmap else "") +
               f"(+ topology, plan and pools {self.setup_seconds * 1e3:.1f} ms, KV cache {self.kv_seconds * 1e3:.1f} ms)"]
        if self.check is not None:
            out.append("  weights: " + self.check.line())
        if self.kv is not None:
            out.append("  KV cache: " + self.kv.line() + ("" if self.kv_policy_ok is None else
                                                         f"; range policy {'set' if self.kv_policy_ok else 'MISSING'}"))
        if self.huge_bytes is not None:
            out.append(f"  transparent huge pages: {self.huge_bytes / 2**20:.0f} MiB of the weights")
        out += [f"  note: {n}" for n in self.notes] + [f"  warning: {w}" for w in self.warnings]
        return out


class AnonBuffer:
    """Anonymous private memory (page-aligned; 2 MiB-aligned with huge=True), placed before use."""

    def __init__(self, nbytes: int, huge: bool = False):
        pad = HUGE if huge else 0
        self._mm = _mmap.mmap(-1, nbytes + pad, flags=_mmap.MAP_PRIVATE | _mmap.MAP_ANONYMOUS)
        base = addr_of(np.frombuffer(self._mm, np.uint8, count=1))
        off = (-base) % HUGE if huge else 0
        self.array = np.frombuffer(self._mm, np.uint8, count=nbytes, offset=off)
        self.addr = base + off
        self.nbytes = nbytes
        if huge:
            _lib().madvise(ctypes.c_void_p(self.addr), ctypes.c_size_t(nbytes), MADV_HUGEPAGE)


def anon_huge_bytes(addr: int, length: int) -> int:
    """AnonHugePages of the mappings overlapping [addr, addr + length) (/proc/self/smaps)."""
    tot, inside = 0, False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = lo < addr + length and hi > addr
                elif inside and head == "AnonHugePages:":
                    tot += int(line.split()[1]) * 1024
    except OSError:
        return 0
    return tot


def lock_memory(addr: int, length: int) -> str | None:
    """mlock the range; None on success, else a message naming the limit."""
    a, b = page_span(addr, length)
    if _lib().mlock(ctypes.c_void_p(a), ctypes.c_size_t(b - a)) == 0:
        return None
    e = ctypes.get_errno()
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    lim = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft / 2**20:.1f} MiB"
    return (f"--mlock: locking {(b - a) / 2**30:.2f} GiB failed ({os.strerror(e)}; RLIMIT_MEMLOCK is {lim}): "
            "raise it (ulimit -l unlimited, or LimitMEMLOCK= in a systemd unit) or grant CAP_IPC_LOCK")


def parallel_copy(dst: np.ndarray, src: np.ndarray, cpus=None, chunk: int = 64 << 20):
    """dst[:] = src in chunks over a few threads (numpy releases the GIL), each pinned to one of cpus."""
    n = src.size
    jobs = [(a, min(n, a + chunk)) for a in range(0, n, chunk)]
    cpus = list(cpus or [None])[:8]
    lock = threading.Lock()

    def work(cpu):
        if cpu is not None:
            try:
                os.sched_setaffinity(0, {cpu})
            except OSError:
                pass
        while True:
            with lock:
                if not jobs:
                    return
                a, b = jobs.pop()
            np.copyto(dst[a:b], src[a:b])

    ts = [threading.Thread(target=work, args=(c,), daemon=True) for c in cpus]
    [t.start() for t in ts]
    [t.join() for t in ts]


def now() -> float:
    return time.perf_counter()


# ---- a model's pools, weights and KV cache for a plan --------------------------------------------

def make_pools(plan):
    """(decode pool, batch pool) for a gemma4cpu.numa.Plan: workers pinned one per CPU, grouped per
    node when the plan splits rows; the batch pool is the decode pool when the counts agree."""
    from gemma4cpu import kernels as K
    pools = []
    for pp in plan.pools:
        pool = K.Pool(pp.threads, list(pp.cpus))
        if pp.n_groups > 1:
            pool.set_groups(list(pp.group_first))
        pools.append(pool)
    return pools[0], pools[-1]


def _file_span(f) -> tuple[int, int]:
    base = addr_of(f._map)
    return base, base + f._map.size


def _mat_ranges(m, bounds, nodes) -> list[Range]:
    """Per node j the bytes of rows [bounds[j], bounds[j+1]) of matrix m."""
    rb, a0 = m.rows.shape[1], addr_of(m.rows)
    out = []
    for j, n in enumerate(nodes):
        r0, r1 = bounds[j], bounds[j + 1]
        if r1 > r0:
            out.append(Range(f"{m.name} rows {r0}-{r1 - 1}", a0 + r0 * rb, (r1 - r0) * rb, (n,), MPOL_BIND))
    return out


def _ranges_for(plan, mats, copy_index: int | None = None) -> list[Range]:
    """Where every matrix's pages should go under plan (a copy per node: copy_index's node)."""
    mode = plan.mode
    out = []
    for m in mats:
        if mode == "isolate" or (mode in ("distribute", "mirror") and len(plan.mem_nodes) == 1):
            out.append(Range(m.name, addr_of(m.rows), m.rows.nbytes, (plan.mem_nodes[0],), MPOL_BIND))
        elif mode == "interleave":
            out.append(Range(m.name, addr_of(m.rows), m.rows.nbytes, tuple(plan.mem_nodes), MPOL_INTERLEAVE))
        elif mode == "mirror":
            n = plan.mem_nodes[copy_index or 0]
            out.append(Range(m.name, addr_of(m.rows), m.rows.nbytes, (n,), MPOL_BIND))
        elif mode == "distribute":
            out += _mat_ranges(m, plan.row_split(m.rows.shape[0]), plan.decode.group_nodes)
    return out


def weight_copies(plan, mmap: bool = True, thp: bool = False) -> int:
    """How many anonymous copies of the file's tensor data place_weights makes under plan: 0 (mapped),
    1 (--no-mmap or THP), one per memory node for mirror (what gemma4cpu.memory counts)."""
    if plan.mode == "mirror":
        return max(1, len(plan.mem_nodes))
    return 1 if (not mmap) or thp else 0


def place_weights(f, weights, plan, mmap: bool = True, mlock: bool = False, thp: bool = False,
                  live: bool = True, sample: int | None = 64, force: bool = False) -> Report:
    """Place the weight matrices of `weights` (views into GGUF file f) for plan, in place:
      mapped  (default) the pages of the mapped file are bound where the plan says (see `place`);
      copies  (mmap=False, thp, or mirror) the tensor data is read into anonymous memory whose
              policy is set before it is written, one copy per node for mirror; each Mat's rows then
              view the copy (mirror: the first node's; Mat.placement names every node's).
    Sets Mat.placement (kernels.RowPlacement) when the plan splits rows. live=False (a fake
    topology): decide the row splits but leave memory alone. With one allowed memory node there is
    nothing to move: mapped pages are not touched, only checked (`sample` pages per range, or every
    page with None), unless force (tests, measurements). On several nodes every mapped page is
    faulted in, queried and, if elsewhere, moved; the check then covers every page."""
    from gemma4cpu import kernels as K
    t0 = now()
    mats = weights.mats()
    mode = plan.mode
    copy = weight_copies(plan, mmap, thp) > 0
    rep = Report(mode=mode, mmap=not copy)
    if live and mode != "none":
        ok, why = available()
        if not ok:
            rep.warnings.append(f"NUMA placement is not available here ({why}): pages stay where the kernel puts "
                                "them")
            live = False
    fb0, fb1 = _file_span(f)
    in_file = [m for m in mats if fb0 <= addr_of(m.rows) < fb1]
    # none can be in the file when every matrix was copied out (GGUFTensor.rows: misaligned data)
    lo = min((addr_of(m.rows) for m in in_file), default=0)
    hi = max((addr_of(m.rows) + m.rows.nbytes for m in in_file), default=0)
    if copy and not in_file:
        copy = False
        rep.mmap = True
    one_node = len(_allowed_mems()) == 1 and set(plan.mem_nodes) <= set(_allowed_mems())
    if copy:
        n_copies = weight_copies(plan, mmap, thp)
        size = hi - lo
        if live:
            _check_room(plan, size, mode)
        bufs = [AnonBuffer(size, huge=thp) for _ in range(n_copies)]
        views = [{id(m): b.array[addr_of(m.rows) - lo:addr_of(m.rows) - lo + m.rows.nbytes].reshape(m.rows.shape)
                  for m in in_file} for b in bufs]
        for ci, b in enumerate(bufs):
            shadow = [_Shadow(m.name, views[ci][id(m)]) for m in in_file]
            ranges = _ranges_for(plan, shadow, ci) if mode != "none" else []
            rep.ranges += ranges
            if not live or not ranges:
                continue
            # the policy first: pages are allocated by it as the data is written
            if mode == "distribute" and plan.grouped:
                for r in ranges:
                    a, z = page_span(r.addr, r.length)
                    mbind(a, z - a, r.mode, r.nodes)
            else:
                mbind(b.addr, -(-b.nbytes // PAGE) * PAGE, ranges[0].mode, ranges[0].nodes)
        tc = now()
        with open(f.path, "rb", buffering=0) as fh:   # read(2) into the copy: no page cache mapped here
            fh.seek(lo - fb0)
            mv = memoryview(bufs[0].array)
            pos = 0
            while pos < size:
                got = fh.readinto(mv[pos:min(size, pos + (64 << 20))])
                if not got:
                    raise OSError(f"{f.path}: short read at byte {lo - fb0 + pos}")
                pos += got
        per_node = plan.decode.per_node()
        for ci in range(1, n_copies):
            parallel_copy(bufs[ci].array, bufs[0].array, per_node.get(plan.mem_nodes[ci]))
        rep.copy_seconds = now() - tc
        for m in in_file:
            if mode == "mirror" and plan.grouped:
                m.placement = K.RowPlacement(plan.row_split(m.rows.shape[0]),
                                             [views[ci][id(m)] for ci in range(n_copies)])
            m.rows = views[0][id(m)]
        rep.bytes = size * n_copies
        rep.buffers = bufs
        locks = [(b.addr, b.nbytes) for b in bufs]
        if thp:
            rep.huge_bytes = sum(anon_huge_bytes(b.addr, b.nbytes) for b in bufs)
            if rep.huge_bytes == 0:
                rep.warnings.append("--thp: no transparent huge page backs the weights (transparent_hugepage "
                                    "is 'never', or no free 2 MiB blocks)")
    else:
        rep.ranges = _ranges_for(plan, mats) if mode != "none" else []
        if live and rep.ranges and (force or not one_node):
            def one(r):
                st = place(r.addr, r.length, r.mode, r.nodes, file_backed=fb0 <= r.addr < fb1)
                # anonymous memory (the repacked Q4_K matrices, gemma4cpu.repack): every page is
                # present (written at load), so every page is queried
                return st if st is not None else move_pages(_sample_pages(r, None))
            # ranges in parallel: each thread faults its pages in under its own thread policy, and
            # ctypes lets go of the GIL around the system calls
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(max_workers=max(1, min(16, len(plan.decode.cpus), len(rep.ranges)))) as ex:
                status = list(ex.map(one, rep.ranges))
            rep.check = check(rep.ranges, status=status)
        elif live and rep.ranges:
            rep.notes.append(f"one memory node ({format_nodes(plan.mem_nodes)}): every page is on it; the mapped "
                             "pages are neither touched nor queried")
        rep.bytes = sum(m.rows.nbytes for m in mats)
        locks = [(lo, hi - lo)]
    if plan.grouped and mode == "distribute":
        for m in mats:
            m.placement = K.RowPlacement(plan.row_split(m.rows.shape[0]))
    if mlock:
        for a, n in locks:
            msg = lock_memory(a, n)
            if msg:
                rep.warnings.append(msg)
                break
    if live and rep.ranges and (copy or force or not one_node):
        if rep.check is None:
            rep.check = check(rep.ranges, sample)
        c = rep.check
        if c.wrong:
            frac, name, hist, want = c.worst[0]
            rep.warnings.append(
                f"weights on the wrong node after load: {c.wrong} of {c.pages - c.absent} checked pages are not where "
                f"--numa {plan.requested} put them (worst: {name}: {frac:.0%} elsewhere, pages per node {hist}, "
                f"expected {format_nodes(want)}); another process may map the file (only pages no one else maps "
                "can move), or a node is short of memory: try --no-mmap, or drop the page cache")
    elif not live and mode != "none":
        rep.notes.append("memory left alone (the topology is not this machine's, or placement is unavailable)")
    rep.seconds = now() - t0
    return rep


class _Shadow:
    """A stand-in Mat (name, rows) for computing ranges over a copy."""

    def __init__(self, name, rows):
        self.name, self.rows = name, rows


def _allowed_mems() -> list[int]:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Mems_allowed_list:"):
                    from gemma4cpu.cpulist import parse_cpu_list
                    return parse_cpu_list(line.split(":", 1)[1])
    except (OSError, ValueError):
        pass
    return [0]


def format_nodes(nodes) -> str:
    return ",".join(str(n) for n in nodes)


def _check_room(plan, size: int, mode: str):
    """Refuse copies of the weights that do not fit the free memory of their nodes."""
    from gemma4cpu.numa import read_topology
    topo = read_topology("/")
    if mode == "mirror" or mode == "isolate":
        need = {n: size for n in (plan.mem_nodes or plan.nodes)}
    elif mode == "interleave" and plan.mem_nodes:
        need = {n: size // len(plan.mem_nodes) for n in plan.mem_nodes}
    elif mode == "distribute" and plan.mem_nodes:
        w = plan.decode.workers_per_group if plan.grouped else (1,)
        need = {n: size * w[i] // sum(w) for i, n in enumerate(plan.decode.group_nodes)} if plan.grouped else \
            {plan.mem_nodes[0]: size}
    else:
        return
    short = [(n, b, topo.nodes[n].mem_available) for n, b in need.items()
             if n in topo.nodes and topo.nodes[n].mem_available and b > topo.nodes[n].mem_available]
    if short:
        n, b, have = short[0]
        what = "a copy of the weights per node" if mode == "mirror" else "the copied weights"
        raise MemoryError(
            f"--numa {mode}: {what} needs {b / 2**30:.2f} GiB on node {n}, which has {have / 2**30:.2f} GiB free "
            f"(MemFree + inactive page cache; {len(short)} of {len(need)} node(s) short)"
            + ("; use --numa distribute (one copy, rows split over the nodes)" if mode == "mirror" else ""))


def kv_policy(plan) -> tuple[int, tuple[int, ...]]:
    """(policy, nodes) place_kv gives the KV cache under plan: interleave -> MPOL_INTERLEAVE over the
    plan's memory nodes, as its weights (even over one node: numa_maps then shows what was asked);
    otherwise the readers' nodes: one -> MPOL_BIND to it, several -> MPOL_INTERLEAVE over them
    (attention heads are split over all workers)."""
    if plan.mode == "interleave":
        nodes = tuple(plan.mem_nodes) or tuple(plan.nodes)
        return MPOL_INTERLEAVE, nodes
    nodes = tuple(plan.nodes)
    return (MPOL_BIND if len(nodes) == 1 else MPOL_INTERLEAVE), nodes


def place_kv(cache, plan, rep: Report | None = None, live: bool = True, force: bool = False) -> Report:
    """Give the KV cache arrays of `cache` (K and V of every layer, those of two pages or more) the
    range policy of kv_policy(plan): the pages wholly inside each array; pages not yet touched
    follow it when first written, touched ones are moved. Then checks 16 pages per array
    (rep.kv) and reads the policy back with get_mempolicy (rep.kv_policy_ok). With one allowed
    memory node there is nothing to place unless force (tests, measurements)."""
    rep = rep or Report(mode=plan.mode, mmap=True)
    if plan.mode == "none" or not live or not available()[0]:
        return rep
    if not force and len(_allowed_mems()) == 1:     # one memory node: nothing to place
        return rep
    mode, nodes = kv_policy(plan)
    ranges = []
    arrays = [(f"K[{il}]", x) for il, x in enumerate(cache.k)] + [(f"V[{il}]", x) for il, x in enumerate(cache.v)]
    for name, arr in arrays:
        a, b = -(-addr_of(arr) // PAGE) * PAGE, (addr_of(arr) + arr.nbytes) // PAGE * PAGE
        if b - a >= PAGE and arr.nbytes >= 2 * PAGE:
            place(a, b - a, mode, nodes, file_backed=False)
            # the pages the policy governs (a partial page at either end is shared with the allocator)
            ranges.append(Range(name, a, b - a, nodes, mode))
    rep.kv = check(ranges, 16)
    ok = True
    for r in ranges:
        pm, pn = get_mempolicy(r.addr)
        ok &= pm == mode and set(pn) == set(nodes)
    rep.kv_policy_ok = ok if ranges else None
    if ranges and not ok:
        rep.warnings.append("the KV cache's range policy did not take (get_mempolicy disagrees)")
    return rep


class NumaWarning(UserWarning):
    """Something about threads or memory placement a user should know (gemma4cpu.numa, placement)."""


@dataclass
class Setup:
    """What Model.__init__ gets from `setup`: the plan, its pools and the placement report."""
    plan: object
    pool: object
    pool_batch: object
    report: Report
    live: bool

    def place_kv(self, cache):
        w0, t0 = len(self.report.warnings), now()
        place_kv(cache, self.plan, self.report, live=self.live)
        self.report.kv_seconds += now() - t0
        _warn(self.report.warnings[w0:])


def _warn(msgs):
    import warnings
    for m in msgs:
        warnings.warn(m, NumaWarning, stacklevel=4)


class Planned(NamedTuple):
    topology: object
    plan: object
    seconds: float      # reading the topology and planning


def make_plan(threads=None, cpus=None, threads_batch=None, numa="auto", numa_nodes=None, smt: bool = False,
              topology=None) -> Planned:
    """(topology, gemma4cpu.numa.plan(...), seconds) for setup's arguments; Model plans first, so that
    the memory check can count the copies the plan will make (weight_copies)."""
    from gemma4cpu import numa as numa_mod
    t0 = now()
    topo = topology if topology is not None else numa_mod.read_topology("/")
    p = numa_mod.plan(topo, numa, threads=threads, threads_batch=threads_batch, cpus=cpus, nodes=numa_nodes, smt=smt)
    return Planned(topo, p, now() - t0)


def setup(f, weights, threads=None, cpus=None, threads_batch=None, numa="auto", numa_nodes=None,
          smt: bool = False, mmap: bool = True, mlock: bool = False, thp: bool = False, topology=None,
          planned=None) -> Setup:
    """Plan (gemma4cpu.numa.plan) threads and placement for a model, create its pools and place its
    weights (see place_weights). topology: a gemma4cpu.numa.Topology (default: this machine; a fake
    tree plans and pins but leaves memory alone). planned: make_plan's (topology, plan, seconds) for these
    arguments, when the caller has planned already (its time counts in setup_seconds). Issues
    NumaWarning for what the user should know."""
    if planned is None:
        planned = make_plan(threads, cpus, threads_batch, numa, numa_nodes, smt, topology)
    topo, p, plan_seconds = planned
    t0 = now()
    pool, pool_batch = make_pools(p)
    t1 = now()
    rep = place_weights(f, weights, p, mmap=mmap, mlock=mlock, thp=thp, live=topo.live)
    rep.setup_seconds = plan_seconds + (t1 - t0)
    _warn(p.warnings + rep.warnings)
    return Setup(plan=p, pool=pool, pool_batch=pool_batch, report=rep, live=topo.live)
