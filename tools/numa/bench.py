"""NUMA bench: decode speed and weight-read bandwidth of a model under each --numa mode, against the
read bandwidth the probe measures per node on the same CPUs.

    python -m tools.numa.bench -m gemma-4-31B-it-Q4_K_M.gguf                 # every mode
    python -m tools.numa.bench -m MODEL.gguf --modes distribute,mirror -t 96 --tokens 32 --json out.json
    python -m tools.numa.bench                                               # the embedded 270M

First the probe (tools/numa/bandwidth.py node_matrix): every node's cores read a buffer on every
node, then all nodes at once on their own memory. Then, per mode, a fresh process loads the model
with `--numa MODE` (same threads), decodes --tokens tokens after a short prompt, --rounds times,
and reports: load time and the share of it spent placing threads and pages, the page check, decode
tokens/s (median round), and the weight bytes one decode step reads (every matrix once; the
embedding rows read per token are ignored, the tied LM head counts) times tokens/s = effective
GB/s, as a share of the sum of the per-node local read bandwidths. On one node the modes differ
only in page handling; on a dual-socket EPYC distribute and mirror are the ones to compare with
that sum (target: within 10%).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODES = ["none", "isolate", "interleave", "distribute", "mirror"]


def step_bytes(w, cfg) -> int:
    """Weight bytes one decode token reads: every matrix once (MoE: the used share of the experts)."""
    tot = 0
    for m in w.mats():
        if m is w.per_layer_token_embd or (m is w.token_embd and w.output is not w.token_embd):
            continue                                  # looked up by row only
        if "exps" in m.name and cfg.n_expert:
            tot += m.rows.nbytes * cfg.n_expert_used / cfg.n_expert
        else:
            tot += m.rows.nbytes
    return int(tot)


def one(a) -> dict:
    """Runs in the child: load with --numa a.one, decode, print a JSON line."""
    import numpy as np

    from gemma4cpu.engine import default_model_path
    from gemma4cpu.model import Model
    path = a.model or default_model_path()
    t0 = time.perf_counter()
    m = Model(path, n_ctx=a.tokens + 64, threads=a.threads, numa=a.one, mmap=not a.no_mmap, progress=False)
    load = time.perf_counter() - t0
    prompt = [2] + list(range(1000, 1015))
    t1 = time.perf_counter()
    m.forward(prompt)
    first = time.perf_counter() - t1
    rates = []
    for r in range(a.rounds):
        m.cache.truncate(len(prompt))
        t2 = time.perf_counter()
        for i in range(a.tokens):
            m.forward([int(np.int64(3000 + i))])
        rates.append(a.tokens / (time.perf_counter() - t2))
    rep = m.numa.report
    c = rep.check
    return {"mode": a.one, "resolved": m.numa_plan.mode, "threads": m.pool.size,
            "nodes": list(m.numa_plan.nodes), "cpus": list(m.numa_plan.decode.cpus),
            "per_node": {str(k): len(v) for k, v in m.numa_plan.decode.per_node().items()},
            "load_s": load, "place_s": rep.total_seconds, "first_forward_s": first, "tps": statistics.median(rates),
            "tps_runs": rates, "step_bytes": step_bytes(m.w, m.cfg),
            "pages": None if c is None else {"checked": c.pages, "wrong": c.wrong, "absent": c.absent,
                                             "per_node": c.per_node},
            "warnings": rep.warnings + m.numa_plan.warnings}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.numa.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", help="GGUF file (default: the embedded Gemma 3 270M)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma list (default {','.join(MODES)})")
    ap.add_argument("-t", "--threads", type=int, default=None, help="threads (default: one per physical core)")
    ap.add_argument("--tokens", type=int, default=16, help="decode tokens per round (default 16)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per mode, median (default 3)")
    ap.add_argument("--gib", type=float, default=1.0, help="probe buffer per node in GiB (default 1)")
    ap.add_argument("--no-mmap", action="store_true", help="load with --no-mmap")
    ap.add_argument("--no-probe", action="store_true", help="skip the bandwidth probe")
    ap.add_argument("--json", metavar="PATH", help="write everything as JSON")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(one(a)))
        return 0
    from gemma4cpu import numa
    topo = numa.read_topology("/")
    print("\n".join(topo.describe()))
    probe = None
    if not a.no_probe:
        from tools.numa import bandwidth as bw
        p = numa.plan(topo, "distribute", threads=a.threads)
        per = p.decode.workers_per_group if p.grouped else (p.decode.threads,)
        probe = bw.node_matrix(topo, min(per) if len(set(per)) == 1 else None, a.gib, 5, 1)
        bw.print_matrix(probe)
    rows = []
    for mode in [x.strip() for x in a.modes.split(",") if x.strip()]:
        cmd = [sys.executable, "-m", "tools.numa.bench", "--one", mode, "--tokens", str(a.tokens),
               "--rounds", str(a.rounds)] + (["-m", a.model] if a.model else []) + (
            ["-t", str(a.threads)] if a.threads else []) + (["--no-mmap"] if a.no_mmap else [])
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=os.getcwd())
        if r.returncode != 0:
            print(f"{mode}: failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
            rows.append({"mode": mode, "error": r.stderr.strip()[-2000:]})
            continue
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
    print()
    print("| mode | threads | nodes | load s | placing ms (% of load) | pages checked / elsewhere | decode t/s "
          "| weights GB/s | % of per-node sum |")
    print("|---|---:|---|---:|---:|---|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['mode']} | failed | | | | | | | |")
            continue
        gbs = r["step_bytes"] * r["tps"] / 1e9
        pct = f"{100 * gbs / probe['local_sum']:.0f}%" if probe else "-"
        pg = "-" if r["pages"] is None else f"{r['pages']['checked']} / {r['pages']['wrong']}"
        print(f"| {r['mode']}{'' if r['resolved'] == r['mode'] else ' -> ' + r['resolved']} | {r['threads']} "
              f"| {numa.format_cpu_list(r['nodes'])} | {r['load_s']:.2f} | {r['place_s'] * 1e3:.0f} "
              f"({100 * r['place_s'] / r['load_s']:.1f}%) | {pg} | {r['tps']:.2f} | {gbs:.1f} | {pct} |")
        for w in r["warnings"]:
            print(f"  {r['mode']}: warning: {w}")
    if probe:
        print(f"per-node local read bandwidth sum: {probe['local_sum']:.1f} GB/s; all nodes at once: "
              f"{probe['all_local']:.1f} GB/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"probe": probe, "modes": rows}, f, indent=2)
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
