"""The threads and NUMA placement options shared by the command lines (run, serve, batch, bench):
-tb/--threads-batch, --numa, --numa-nodes, --smt, --no-mmap, --mlock, --thp.

    g = numa_args.add_args(parser)            # the argument group (run adds --show-placement to it)
    a = parser.parse_args(argv)
    kw = numa_args.engine_kwargs(a)            # Engine(threads_batch=, numa=, numa_nodes=, smt=, thp=)
    numa_args.check(kw, threads=a.threads, cpus=cpus)   # this machine's plan, or NumaError (ValueError)

--mlock and --no-mmap keep the dests compat.engine_kwargs reads (mlock, no_mmap), so they reach the
Engine through it as mlock= / mmap=; engine_kwargs here leaves them out.
"""
from __future__ import annotations

import argparse

NUMA_CHOICES = ["auto", "none", "distribute", "isolate", "interleave", "mirror", "numactl"]


def add_args(p: argparse.ArgumentParser, title: str = "threads and NUMA placement") -> argparse._ArgumentGroup:
    g = p.add_argument_group(title)
    g.add_argument("-tb", "--threads-batch", type=int, default=None, metavar="N",
                   help="worker threads for calls of more than one token (prompt, verify batches); "
                        "default: the same as -t")
    g.add_argument("--numa", default="auto", metavar="MODE", choices=NUMA_CHOICES,
                   help="auto (default: distribute on several nodes, else none); distribute: threads on every "
                        "node, each matrix split by rows, node j's rows on node j; isolate: one node; interleave: "
                        "weight pages interleaved over the nodes; mirror: a copy of the weights per node (refused "
                        "when memory is short); none (numactl: the same, for llama.cpp's flag): no placement")
    g.add_argument("--numa-nodes", metavar="LIST",
                   help="NUMA nodes to use, e.g. 0 or 0-3 (isolate: the first; default: every node of the "
                        "allowed CPUs)")
    g.add_argument("--smt", action="store_true",
                   help="also use SMT siblings (hyper-threads) by default; without it one thread per physical core")
    g.add_argument("--no-mmap", action="store_true",
                   help="read the weights into anonymous memory (placed before it is written) instead of mapping "
                        "the file")
    g.add_argument("--mlock", action="store_true",
                   help="lock the weights in RAM (needs RLIMIT_MEMLOCK or CAP_IPC_LOCK; a warning if refused)")
    g.add_argument("--thp", action="store_true",
                   help="back the weights with transparent huge pages (implies --no-mmap: THP is for anonymous "
                        "memory)")
    return g


def engine_kwargs(a: argparse.Namespace) -> dict:
    """Engine keyword arguments of the options add_args declared (not mlock / mmap: see the module
    docstring). ValueError naming the option for a malformed --numa-nodes or -tb < 1."""
    nodes = None
    if a.numa_nodes:
        from gemma4cpu.cpulist import parse_cpu_list
        try:
            nodes = parse_cpu_list(a.numa_nodes)
        except ValueError as e:
            raise ValueError(f"--numa-nodes: {e}") from None
    if a.threads_batch is not None and a.threads_batch < 1:
        raise ValueError(f"-tb / --threads-batch must be >= 1, got {a.threads_batch}")
    return dict(threads_batch=a.threads_batch, numa="none" if a.numa == "numactl" else a.numa,
                numa_nodes=nodes, smt=a.smt, thp=a.thp)


def check(kw: dict, threads: int | None = None, cpus: list[int] | None = None):
    """The NUMA plan an Engine with these options (engine_kwargs' dict) would make on this machine,
    without loading anything: gemma4cpu.numa.Plan (its .mode is the resolved mode), or NumaError
    (a ValueError) for a request this machine or process cannot honour (an unknown node, more
    threads than CPUs, a CPU outside the allowed set...)."""
    from gemma4cpu import placement
    return placement.make_plan(threads, cpus, kw.get("threads_batch"), kw.get("numa", "auto"),
                               kw.get("numa_nodes"), kw.get("smt", False))[1]
