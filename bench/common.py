"""Shared pieces of the benchmarks: the header every bench prints, timing helpers, table output.

Import this before creating any gemma4cpu Pool: a Pool pins the calling thread to its cpus[0],
so the process's allowed CPUs are captured here at import (via tools.numa.bandwidth).
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/x.py` puts bench/ first on sys.path, not the repo root
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from tools.numa.bandwidth import (ALLOWED_CPUS_AT_IMPORT, layout_name, measure_best, parse_cpu_list,  # noqa: E402,F401
                                  parse_int_list, probe_kind)

_CPU_MODEL = None


def cpu_model() -> str:
    """Brand string via py-cpuinfo (cached; cpuinfo takes about a second), /proc/cpuinfo fallback."""
    global _CPU_MODEL
    if _CPU_MODEL is None:
        try:
            import cpuinfo

            info = cpuinfo.get_cpu_info()
            _CPU_MODEL = info.get("brand_raw") or info.get("brand") or "?"
            fam, model = info.get("family"), info.get("model")
            if fam is not None:
                _CPU_MODEL += f" (family {fam} model {model})"
        except Exception as e:  # py-cpuinfo missing or broken: still print something useful
            _CPU_MODEL = f"? (py-cpuinfo: {e.__class__.__name__})"
            try:
                with open("/proc/cpuinfo") as f:
                    for line in f:
                        if line.startswith("model name"):
                            _CPU_MODEL = line.split(":", 1)[1].strip()
                            break
            except OSError:
                pass
    return _CPU_MODEL


def numa_nodes() -> int:
    try:
        names = os.listdir("/sys/devices/system/node")
        return len([p for p in names if p.startswith("node") and p[4:].isdigit()]) or 1
    except OSError:
        return 1


def mem_total_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    return float("nan")


def header(title: str, threads=None, pools=None, extra: dict | None = None, file=None,
           quiet: bool = False) -> dict:
    """Print the standard bench header (to file, default stdout; quiet: don't); returns it as a
    dict (for --json output) whose "lines" entry holds the printed lines.

    threads: the thread counts of the run; pools: {n_threads: gemma4cpu Pool} whose pin plans
    are printed (worker 0's tid is -1 until the pool has run once)."""
    from gemma4cpu import isa

    import gemma4cpu

    h = {
        "title": title,
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "machine": cpu_model(),
        "host": platform.node(),
        "kernel": platform.release(),
        "logical_cpus": os.cpu_count(),
        "allowed_cpus": list(ALLOWED_CPUS_AT_IMPORT),
        "numa_nodes": numa_nodes(),
        "mem_gib": round(mem_total_gib(), 1),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "gemma4cpu": getattr(gemma4cpu, "__version__", "?"),
        "isa": isa.describe(),
        "isa_active": isa.active(),
        "fallbacks": isa.fallbacks(),
        "loadavg": loadavg(),
        "threads": list(threads) if threads is not None else None,
        "pin_plans": {str(t): p.pin_plan() for t, p in (pools or {}).items()},
    }
    if extra:
        h.update(extra)
    lines: list[str] = []
    p = lines.append
    p(f"# {title}")
    p(f"date     {h['date_utc']}")
    p(f"machine  {h['machine']}; {h['logical_cpus']} logical CPUs, allowed {h['allowed_cpus']}, "
      f"{h['numa_nodes']} NUMA node(s), {h['mem_gib']} GiB RAM; host {h['host']} {h['kernel']}")
    p(f"isa      {h['isa']}")
    p(f"load     {h['loadavg']} (1/5/15 min)")
    p(f"python   {h['python']}  numpy {h['numpy']}  gemma4cpu {h['gemma4cpu']}")
    if threads is not None:
        p(f"threads  {','.join(map(str, threads))}")
    for t, plan in h["pin_plans"].items():
        p(f"pin plan {t} thread(s): " + ", ".join(f"w{w}->cpu{c} tid{tid}" for w, c, tid in plan))
    for k, v in (extra or {}).items():
        p(f"{k:<8} {v}")
    h["lines"] = lines
    if not quiet:
        print("\n".join(lines) + "\n", file=file or sys.stdout)
    return h


class CpuNoise:
    """Share of the allowed CPUs' time spent by *other* processes (and hypervisor steal) between
    start() and stop(): this host is shared, so a high value flags a noisy measurement.
    Linux only (/proc); returns None elsewhere."""

    def __init__(self, cpus=None):
        self.cpus = set(ALLOWED_CPUS_AT_IMPORT if cpus is None else cpus)
        self.t0 = None

    def _sample(self):
        try:
            busy = total = 0
            with open("/proc/stat") as f:
                for line in f:
                    if line.startswith("cpu") and line[3:4].isdigit():
                        parts = line.split()
                        if int(parts[0][3:]) not in self.cpus:
                            continue
                        v = [int(x) for x in parts[1:9]]  # user nice system idle iowait irq softirq steal
                        total += sum(v)
                        busy += v[0] + v[1] + v[2] + v[5] + v[6] + v[7]
            with open("/proc/self/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            mine = int(fields[11]) + int(fields[12])  # utime, stime (all threads)
            return busy, total, mine
        except (OSError, ValueError, IndexError):
            return None

    def start(self):
        self.t0 = self._sample()
        return self

    def stop(self) -> float | None:
        """Percent of CPU time (of the allowed CPUs) used by others since start()."""
        t1 = self._sample()
        if self.t0 is None or t1 is None or t1[1] <= self.t0[1]:
            return None
        busy, total, mine = (b - a for a, b in zip(self.t0, t1))
        return max(0.0, 100.0 * (busy - mine) / total)


def probe_bandwidth(threads, cpus, gib: float, log, runs: int = 5) -> tuple[dict, dict, str]:
    """The read-bandwidth probe (tools.numa.bandwidth, fastest read pattern) for each thread count,
    thread t on cpus[t]: ({T: median GB/s}, {T: the runs}, the header's one-line description).
    Each count is logged as it is measured."""
    bw, bw_runs, lay = {}, {}, {}
    for t in threads:
        bw_runs[t], lay[t], _ = measure_best(t, cpus, gib, runs=runs)
        bw[t] = statistics.median(bw_runs[t])
        log(f"probe: {t} thread(s) on cpus {list(cpus[:t])}: {bw[t]:.1f} GB/s, {layout_name(lay[t])} "
            f"(runs {', '.join(f'{v:.1f}' for v in bw_runs[t])})")
    desc = (f"{gib:g} GiB, {probe_kind()} loads, fastest read pattern, median of {runs}: "
            + ", ".join(f"{t} thr {v:.1f} GB/s ({layout_name(lay[t])})" for t, v in sorted(bw.items())))
    return bw, bw_runs, desc


def loadavg() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "?"


def median(xs) -> float:
    return statistics.median(xs)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def md_table(headers: list[str], rows: list[list], align: str | None = None) -> str:
    """Markdown table; align is one char per column: 'l' or 'r' (default: first l, rest r)."""
    align = align or ("l" + "r" * (len(headers) - 1))
    out = ["| " + " | ".join(headers) + " |",
           "|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def fmt(x, nd=1) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    return f"{x:.{nd}f}"
