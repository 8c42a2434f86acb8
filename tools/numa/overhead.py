"""Load overhead of thread and page placement: how much of a model's load time each --numa mode
spends planning, pinning and placing (issue 6 target: <= 5% of the load on the 270M model).

    python -m tools.numa.overhead                                  # the embedded 270M, every mode, 5 loads each
    python -m tools.numa.overhead -m MODEL.gguf --modes isolate,mirror --reps 3 --json out.json

Every load is a fresh process (`Model(path, numa=MODE)`, timed from the call to its return: the
GGUF header, the memory check, the weight views, the NUMA plan and pools, weight placement, the KV
cache and its placement), run twice per mode:
  shortcut  as loads run on this machine: with one allowed memory node, mapped weight pages are
            neither touched nor queried and the KV cache is left alone;
  forced    the page-by-page path of a multi-node machine (place_weights and place_kv with
            force=True): every mapped weight page is faulted in under the thread policy, its
            range policy recorded, every page queried (and moved if elsewhere), the KV cache bound.
Reported per mode and path (medians over --reps loads, the modes taking turns): the load, its
parts (topology + plan, pools = the pinned worker threads, weight pages, of which copying the
weights into anonymous memory, KV cache), placement as a share of the load without and with the
copy (mirror and --no-mmap copy the weights by design: the copy replaces the file mapping, it is
what those modes are for, not bookkeeping around the load), the first 16-token forward after the
load (the forced path's page faults are paid at load instead of there), and the page check.
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
PATHS = ["shortcut", "forced"]


def one(a) -> dict:
    """In the child: one timed load (and a first forward), as a dict."""
    import functools

    from gemma4cpu import placement
    from gemma4cpu.engine import default_model_path
    from gemma4cpu.model import Model
    path = a.model or default_model_path()
    if a.force:
        placement.place_weights = functools.partial(placement.place_weights, force=True)
        placement.place_kv = functools.partial(placement.place_kv, force=True)
    t0 = time.perf_counter()
    m = Model(path, n_ctx=a.ctx_size, threads=a.threads, numa=a.one, mmap=not a.no_mmap, progress=False)
    load = time.perf_counter() - t0
    rep = m.numa.report
    t1 = time.perf_counter()
    m.forward([2] + list(range(1000, 1015)))
    first = time.perf_counter() - t1
    c = rep.check
    return {"mode": a.one, "resolved": m.numa_plan.mode, "path": "forced" if a.force else "shortcut",
            "threads": m.pool.size, "load_s": load, "setup_s": rep.setup_seconds, "weights_s": rep.seconds,
            "copy_s": rep.copy_seconds, "kv_s": rep.kv_seconds, "place_s": rep.total_seconds,
            "first_forward_s": first, "weight_bytes": m.w.n_bytes, "copied": not rep.mmap,
            "pages": None if c is None else {"checked": c.pages, "wrong": c.wrong, "absent": c.absent},
            "kv_pages": None if rep.kv is None else {"checked": rep.kv.pages, "wrong": rep.kv.wrong},
            "kv_policy_ok": rep.kv_policy_ok, "warnings": list(rep.warnings)}


def summarize(runs: list[dict]) -> dict:
    """Medians over the loads of one mode and path; percentages per load, then the median."""
    med = lambda k: statistics.median(r[k] for r in runs)          # noqa: E731
    return {"mode": runs[0]["mode"], "resolved": runs[0]["resolved"], "path": runs[0]["path"],
            "threads": runs[0]["threads"], "loads": len(runs), "copied": runs[0]["copied"],
            "load_s": med("load_s"), "setup_s": med("setup_s"), "weights_s": med("weights_s"),
            "copy_s": med("copy_s"), "kv_s": med("kv_s"), "place_s": med("place_s"),
            "pct_excl_copy": statistics.median(100 * (r["place_s"] - r["copy_s"]) / r["load_s"] for r in runs),
            "pct_incl_copy": statistics.median(100 * r["place_s"] / r["load_s"] for r in runs),
            "first_forward_s": med("first_forward_s"), "pages": runs[-1]["pages"], "kv_pages": runs[-1]["kv_pages"],
            "kv_policy_ok": runs[-1]["kv_policy_ok"], "warnings": runs[-1]["warnings"]}


def table(rows: list[dict], target: float) -> list[str]:
    out = ["| mode | path | load ms | topology+plan+pools ms | weight pages ms (copy) | KV ms | placement % of load "
           "excl. copy | incl. copy | first forward ms | pages checked / elsewhere |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['mode']} | {r['path']} | failed | | | | | | | |")
            continue
        pg = "-" if r["pages"] is None else f"{r['pages']['checked']} / {r['pages']['wrong']}"
        cp = f" ({r['copy_s'] * 1e3:.0f})" if r["copied"] else ""
        ok = "" if r["pct_excl_copy"] <= target else " **over**"
        out.append(f"| {r['mode']}{'' if r['resolved'] == r['mode'] else ' -> ' + r['resolved']} | {r['path']} "
                   f"| {r['load_s'] * 1e3:.0f} | {r['setup_s'] * 1e3:.1f} | {r['weights_s'] * 1e3:.1f}{cp} "
                   f"| {r['kv_s'] * 1e3:.1f} | {r['pct_excl_copy']:.1f}%{ok} | {r['pct_incl_copy']:.1f}% "
                   f"| {r['first_forward_s'] * 1e3:.0f} | {pg} |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.numa.overhead", description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", help="GGUF file (default: the embedded Gemma 3 270M)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma list (default {','.join(MODES)})")
    ap.add_argument("--paths", default=",".join(PATHS), help="shortcut, forced or both (default both)")
    ap.add_argument("--reps", type=int, default=5, help="loads per mode and path, median (default 5)")
    ap.add_argument("-t", "--threads", type=int, default=None, help="threads (default: one per physical core)")
    ap.add_argument("-c", "--ctx-size", type=int, default=4096, help="KV cache positions (default 4096, as run)")
    ap.add_argument("--no-mmap", action="store_true", help="load with --no-mmap")
    ap.add_argument("--target", type=float, default=5.0, help="the share of the load to meet, %% (default 5)")
    ap.add_argument("--json", metavar="PATH", help="write the summary and every load as JSON ('-': stdout only)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--force", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(one(a)))
        return 0
    modes = [x.strip() for x in a.modes.split(",") if x.strip()]
    paths = [x.strip() for x in a.paths.split(",") if x.strip()]
    bad = [m for m in modes if m not in MODES] + [p for p in paths if p not in PATHS]
    if bad or a.reps < 1:
        print(f"error: {'unknown mode/path ' + ', '.join(bad) if bad else '--reps must be >= 1'}", file=sys.stderr)
        return 2
    runs: dict[tuple[str, str], list] = {(m, p): [] for p in paths for m in modes}
    errors = {}
    for _ in range(a.reps):                         # the modes take turns: drift hits them alike
        for (mode, path), got in runs.items():
            if (mode, path) in errors:
                continue
            cmd = [sys.executable, "-m", "tools.numa.overhead", "--one", mode, "-c", str(a.ctx_size)] + (
                ["--force"] if path == "forced" else []) + (["-m", a.model] if a.model else []) + (
                ["-t", str(a.threads)] if a.threads else []) + (["--no-mmap"] if a.no_mmap else [])
            r = subprocess.run(cmd, capture_output=True, text=True, cwd=os.getcwd())
            if r.returncode != 0:
                errors[(mode, path)] = r.stderr.strip()[-2000:] or f"exit {r.returncode}"
                continue
            got.append(json.loads(r.stdout.strip().splitlines()[-1]))
    rows = [{"mode": m, "path": p, "error": errors[(m, p)]} if (m, p) in errors else summarize(runs[(m, p)])
            for (m, p) in runs]
    if a.json == "-":
        json.dump({"target_pct": a.target, "rows": rows, "loads": [x for v in runs.values() for x in v]},
                  sys.stdout, indent=2)
        print()
        return 1 if errors else 0
    print(f"placement overhead at load, median of {a.reps} fresh loads per row (target <= {a.target:g}% of the load)")
    for line in table(rows, a.target):
        print(line)
    for r in rows:
        if "error" in r:
            print(f"{r['mode']} {r['path']}: failed: {r['error'].splitlines()[-1]}")
        for w in r.get("warnings", []):
            print(f"{r['mode']} {r['path']}: warning: {w}")
    met = [f"{r['mode']} {r['path']}" for r in rows if "error" not in r and r["pct_excl_copy"] <= a.target]
    over = [f"{r['mode']} {r['path']}" for r in rows if "error" not in r and r["pct_excl_copy"] > a.target]
    print(f"within {a.target:g}% (copy excluded): {', '.join(met) or 'none'}; over: {', '.join(over) or 'none'}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"target_pct": a.target, "rows": rows, "loads": [x for v in runs.values() for x in v]}, f,
                      indent=2)
        print(f"wrote {a.json}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
