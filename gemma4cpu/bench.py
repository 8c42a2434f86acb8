"""python -m gemma4cpu.bench -m MODEL [-md DRAFT]: llama-bench-style speed tests.

    python -m gemma4cpu.bench                                   # embedded 270M: pp512, tg128, 5 runs
    python -m gemma4cpu.bench -m model.gguf -p 512 -n 128 -t 8,16,32 -r 5 -o json > out.json
    python -m gemma4cpu.bench -m model.gguf -md assistant.gguf --draft-max 1,2,3,4 --plot speed.png
    python -m gemma4cpu.bench -m synth:31B:6 -md synth --spec-type replay --replay-hit 0.7
    python -m gemma4cpu.bench -m model.gguf -t 16 --vs-llama-cpp /path/to/llama-bench

Tests, for every thread count of -t (each its own Engine pinned to the first T CPUs of --cpus, or of
the allowed CPUs), after one untimed warm-up, repeated -r times, reported as mean +- stddev of t/s:
  ppN     one forward of N prompt tokens on an empty cache (chunks of -ub) : N / time
  tgN     N single-token forwards after one token, as llama-bench's tg   : N / time
  tgN+k   speculative: greedy generation of N tokens with draft length k (each of --draft-max):
          (N - 1) / decode time, with the acceptance and tokens per round. Drafters: mtp (the -md
          assistant), ngram (prompt lookup), replay (--replay-hit P: each draft is right with
          probability P, the real -md drafter's compute still runs: the speed at a chosen acceptance,
          for synthetic models whose random weights accept nothing)
Threads and placement: --numa, --numa-nodes, -tb, --smt, --thp, --no-mmap, --mlock as in gemma4cpu.run,
for every thread count; the header gives each count's resolved NUMA plan (header.numa in JSON).
Output (-o): md (default; the header with machine and placement first), csv, json; stdout holds
only that, progress goes to stderr. --vs-llama-cpp PATH runs PATH (llama-bench) on the same file,
threads and CPUs (taskset) in the same session and prints both side by side (skipped with a message
when PATH is not an executable). --plot FILE draws t/s against threads and against draft length
(matplotlib: pip install 'gemma4cpu[plot]').

Synthetic full-size models, so machines can be compared without downloading 20 GB: -m synth:SHAPE[:LAYERS][:q8_0]
(SHAPE 31B, 26B-A4B, E4B, E2B; gemma4cpu.synth_model, written once under $GEMMA4CPU_CACHE or
~/.cache/gemma4cpu) and -md synth for the matching MTP assistant. Timing does not depend on what the
weights mean; fewer layers scale the per-token cost.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ALLOWED_AT_IMPORT = sorted(os.sched_getaffinity(0))   # before any pool pins this thread
FIELDS = ["engine", "model", "size_gib", "threads", "cpus", "test", "n_prompt", "n_gen", "draft", "draft_max",
          "runs", "tps_mean", "tps_stddev", "samples_tps", "acceptance", "tokens_per_round"]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def _ints(s: str, name: str) -> list[int]:
    try:
        v = [int(x) for x in str(s).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{name}: expected comma-separated integers, got {s!r}") from None
    if not v:
        raise ValueError(f"{name}: empty list")
    return v


def cache_dir() -> Path:
    d = os.environ.get("GEMMA4CPU_CACHE")
    return Path(d) if d else Path.home() / ".cache" / "gemma4cpu"


def resolve_model(spec: str | None) -> tuple[str | None, str | None]:
    """(path, synthetic shape or None). synth:SHAPE[:LAYERS][:q8_0] writes the file once."""
    if spec is None or not spec.startswith("synth:"):
        return spec, None
    from gemma4cpu import synth_model
    parts = spec.split(":")[1:]
    shape = parts[0]
    layers, mix = None, "q4_k_m"
    for p in parts[1:]:
        if p.lower() in ("q8_0", "q4_k_m"):
            mix = p.lower()
        elif p:
            layers = int(p)
    if shape not in synth_model.SHAPES:
        raise ValueError(f"unknown synthetic shape {shape!r}; choose from {', '.join(synth_model.SHAPES)}")
    path = cache_dir() / f"synth-{shape}-{layers or 'all'}l-{mix}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        log(f"writing synthetic {shape} ({layers or 'all'} layers, {mix}) to {path} (once)")
        tmp = str(path) + ".tmp"
        synth_model.write(tmp, shape, layers, mix, progress=True)
        os.replace(tmp, path)
    return str(path), shape


def resolve_draft(spec: str | None, shape: str | None) -> str | None:
    if spec != "synth":
        return spec
    if shape is None:
        raise ValueError("-md synth needs a synthetic target (-m synth:SHAPE...)")
    from gemma4cpu import synth_model
    path = cache_dir() / f"synth-{shape}-assistant-q4_k_m.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        log(f"writing the synthetic {shape} MTP assistant to {path} (once)")
        tmp = str(path) + ".tmp"
        synth_model.write_assistant(tmp, shape, progress=True)
        os.replace(tmp, path)
    return str(path)


# ---- machine header ----------------------------------------------------------------------------

def machine() -> dict:
    from gemma4cpu import isa
    cpu = "?"
    try:
        import cpuinfo
        cpu = cpuinfo.get_cpu_info().get("brand_raw") or "?"
    except Exception:
        try:
            for line in open("/proc/cpuinfo"):
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
    h = {"cpu": cpu, "logical_cpus": os.cpu_count(), "allowed_cpus": ALLOWED_AT_IMPORT, "host": platform.node(),
         "kernel": platform.release(), "python": platform.python_version(), "isa": isa.active(),
         "isa_describe": isa.describe(), "numa": None,
         "date_utc": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    try:
        from gemma4cpu import numa
        h["numa"] = numa.read_topology("/", allowed_cpus=ALLOWED_AT_IMPORT).describe()
    except Exception as e:
        h["numa"] = [f"(topology unavailable: {type(e).__name__})"]
    try:
        import gemma4cpu
        h["gemma4cpu"] = gemma4cpu.__version__
        h["loadavg"] = list(os.getloadavg())
    except OSError:
        pass
    return h


def _pin_plan(eng) -> list:
    try:
        return [list(x) for x in eng.model.pool.pin_plan()]
    except Exception:
        return []


# ---- our measurements --------------------------------------------------------------------------

def _stats(samples: list[float]) -> tuple[float, float]:
    return statistics.fmean(samples), (statistics.stdev(samples) if len(samples) > 1 else 0.0)


def _tokens(n: int, n_vocab: int, seed: int) -> list[int]:
    import numpy as np
    rng = np.random.default_rng(seed)
    return [2] + rng.integers(100, max(101, min(n_vocab, 200000)), n - 1).tolist()


def bench_pp(eng, n: int, runs: int) -> list[float]:
    m = eng.model
    toks = _tokens(n, m.cfg.n_vocab, 1)

    def one():
        eng.reset()
        t0 = time.perf_counter()
        m.forward(toks, "last")
        return n / (time.perf_counter() - t0)

    one()
    out = [one() for _ in range(runs)]
    eng.reset()
    return out


def bench_tg(eng, n: int, runs: int) -> list[float]:
    m = eng.model
    nxt = _tokens(n + 1, m.cfg.n_vocab, 2)[1:]

    def one():
        eng.reset()
        m.forward([2], "last")
        t0 = time.perf_counter()
        for t in nxt[:n]:
            m.forward([t], "last")
        return n / (time.perf_counter() - t0)

    one()
    out = [one() for _ in range(runs)]
    eng.reset()
    return out


SPEC_PROMPT = ("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
               "def fibonacci_memo(n, memo={}):\n    if n < 2:\n        return n\n")


def bench_spec(eng, n: int, k: int, runs: int, kind: str, p_hit: float | None) -> dict:
    """Greedy generation of n tokens with draft length k: t/s over the decode part, acceptance."""
    from gemma4cpu import speculative as spec
    ids = eng.tokenize(SPEC_PROMPT) if eng.tokenizer.n_vocab > 1000 and not kind == "replay" else None
    if ids is None or len(ids) < 4:
        ids = _tokens(32, eng.n_vocab, 3)
    ids = ids[: max(4, min(len(ids), eng.n_ctx - n - 2))]
    kw = dict(max_tokens=n, temperature=0.0)
    saved = eng.drafter
    try:
        if kind == "replay":
            eng.reset()
            ref = eng.generate(ids, spec_type="none", **kw)
            eng.drafter = spec.ReplayDrafter(ids + ref.tokens, p_hit=p_hit, n_vocab=eng.n_vocab,
                                             compute=saved if isinstance(saved, spec.MTPDrafter) else None)
            st = "mtp"
        else:
            st = kind

        def one():
            eng.reset()
            r = eng.generate(ids, spec_type=st, draft_max=k, **kw)
            s = r.stats
            return ((s.n_generated - 1) / s.decode_s if s.decode_s > 0 and s.n_generated > 1 else 0.0), s

        one()
        res = [one() for _ in range(runs)]
    finally:
        eng.drafter = saved
        eng.reset()
    sp = [s.spec for _, s in res if s.spec is not None]
    acc = statistics.fmean(x.acceptance for x in sp) if sp else None
    tpr = statistics.fmean(x.mean_accepted + 1 for x in sp) if sp else None
    return {"samples": [t for t, _ in res], "acceptance": acc, "tokens_per_round": tpr,
            "n_gen": statistics.fmean(s.n_generated for _, s in res)}


# ---- llama.cpp -----------------------------------------------------------------------------------

def llama_bench(exe: str, model: str, cpus: list[int], p: int, n: int, runs: int, ubatch: int | None) -> list[dict]:
    cmd = [exe, "-m", str(model), "-t", str(len(cpus)), "-p", str(p), "-n", str(n), "-r", str(runs), "-o", "json"]
    if ubatch:
        cmd += ["-ub", str(ubatch)]
    ts = shutil.which("taskset")
    full = ([ts, "-c", ",".join(map(str, cpus))] + cmd) if ts else cmd
    log("running: " + " ".join(full))
    r = subprocess.run(full, capture_output=True, text=True,
                       preexec_fn=None if ts else (lambda: os.sched_setaffinity(0, cpus)))
    if r.returncode != 0:
        raise RuntimeError(f"llama-bench failed (rc {r.returncode}): {' | '.join(r.stderr.strip().splitlines()[-3:])}")
    try:
        rows = json.loads(r.stdout)
    except ValueError as e:
        raise RuntimeError(f"unparsable llama-bench output ({e}): {r.stdout[:200]!r}") from None
    return rows


# ---- output --------------------------------------------------------------------------------------

def _fmt_tps(r: dict) -> str:
    return f"{r['tps_mean']:.2f} ± {r['tps_stddev']:.2f}"


def md_table(headers, rows) -> str:
    out = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---:" if i else ":---" for i in range(len(headers))) + " |"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def render_md(header: dict, results: list[dict], llama: dict) -> str:
    lines = [f"# gemma4cpu bench: {header['model']}",
             f"machine  {header['machine']['cpu']}; {header['machine']['logical_cpus']} logical CPUs, allowed "
             f"{header['machine']['allowed_cpus']}; {header['machine']['host']} {header['machine']['kernel']}",
             f"isa      {header['machine']['isa_describe']}"]
    lines += [f"numa     {x}" for x in (header["machine"]["numa"] or [])[:6]]
    for t, plan in header["pin_plans"].items():
        lines.append(f"pinning  {t} threads: " + ", ".join(f"w{w}->cpu{c}" for w, c, *_ in plan))
    for t, plan in header.get("numa", {}).get("plans", {}).items():     # the resolved mode first, then pools
        lines += [f"placement {t} threads: {x.strip()}" for x in plan]
    for t, line in header.get("repack", {}).items():                    # gemma4cpu.repack: Q4_K layout
        lines.append(f"weights  {t} threads: {line}")
    lines.append(f"config   {header['config']}")
    if llama.get("skipped"):
        lines.append(f"llama.cpp skipped: {llama['skipped']}")
    lines.append("")
    ours = [r for r in results if r["engine"] == "gemma4cpu"]
    rows = []
    for r in ours:
        extra = ""
        if r["acceptance"] is not None:
            extra = f"{100 * r['acceptance']:.1f}% / {r['tokens_per_round']:.2f}"
        rows.append([r["model"], f"{r['size_gib']:.2f} GiB", r["threads"], r["test"], _fmt_tps(r), extra])
    lines.append(md_table(["model", "size", "threads", "test", "t/s", "accepted / tokens per round"], rows))
    ll = [r for r in results if r["engine"] == "llama.cpp"]
    if ll:
        lines += ["", "## side by side (same file, threads and CPUs)", ""]
        rows = []
        for r in ours:
            o = next((x for x in ll if x["threads"] == r["threads"] and x["test"] == r["test"]), None)
            if o is None:
                continue
            rows.append([r["threads"], r["test"], _fmt_tps(r), _fmt_tps(o), f"{r['tps_mean'] / o['tps_mean']:.2f}x"
                         if o["tps_mean"] else "-"])
        lines.append(md_table(["threads", "test", "gemma4cpu t/s", "llama.cpp t/s", "gemma4cpu / llama.cpp"], rows))
        if llama.get("build"):
            lines.append(f"\nllama.cpp: {llama['path']} build {llama['build']}")
    return "\n".join(lines) + "\n"


def render_csv(header: dict, results: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS + ["machine", "date_utc"], extrasaction="ignore")
    w.writeheader()
    for r in results:
        row = dict(r)
        row["cpus"] = " ".join(map(str, r["cpus"]))
        row["samples_tps"] = " ".join(f"{x:.4f}" for x in r["samples_tps"])
        row["machine"] = header["machine"]["cpu"]
        row["date_utc"] = header["machine"]["date_utc"]
        w.writerow(row)
    return buf.getvalue()


def plot(results: list[dict], path: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ours = [r for r in results if r["engine"] == "gemma4cpu"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    ax = axes[0]
    for eng_name, style in (("gemma4cpu", "-o"), ("llama.cpp", "--s")):
        rs = [r for r in results if r["engine"] == eng_name and r["draft"] is None]
        for test in sorted({r["test"] for r in rs}):
            pts = sorted((r["threads"], r["tps_mean"], r["tps_stddev"]) for r in rs if r["test"] == test)
            ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], fmt=style, capsize=3,
                        label=f"{eng_name} {test}")
    ax.set_xlabel("threads")
    ax.set_ylabel("tokens / s")
    ax.set_title("t/s against threads")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax = axes[1]
    spec = [r for r in ours if r["draft"] is not None]
    for t in sorted({r["threads"] for r in spec}):
        pts = sorted((r["draft_max"], r["tps_mean"], r["tps_stddev"]) for r in spec if r["threads"] == t)
        ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], fmt="-o", capsize=3,
                    label=f"{t} threads, {spec[0]['draft']}")
        base = next((r for r in ours if r["threads"] == t and r["test"].startswith("tg") and r["draft"] is None), None)
        if base:
            ax.axhline(base["tps_mean"], ls=":", color="grey", label=f"{t} threads, no drafts ({base['test']})")
    ax.set_xlabel("draft-max")
    ax.set_ylabel("tokens / s")
    ax.set_title("speculative t/s against draft-max" if spec else "no speculative runs (give -md or --spec-type)")
    ax.grid(alpha=0.3)
    if spec:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- main ----------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    from gemma4cpu import compat, numa_args
    p = argparse.ArgumentParser(prog="python -m gemma4cpu.bench", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", help="GGUF file or synth:SHAPE[:LAYERS][:q8_0] (default: the embedded 270M)")
    p.add_argument("-md", "--model-draft", help="MTP assistant GGUF, or 'synth' for the synthetic one")
    p.add_argument("-p", "--n-prompt", default="512", help="prompt lengths for ppN, comma-separated; 0 = none")
    p.add_argument("-n", "--n-gen", default="128", help="generation lengths for tgN, comma-separated; 0 = none")
    p.add_argument("-r", "--repetitions", type=int, default=5, help="runs per test (default 5)")
    p.add_argument("-t", "--threads", default=None, help="thread counts, comma-separated (default: all allowed)")
    p.add_argument("-C", "--cpus", help="taskset-style CPU list; T threads use its first T (default: allowed CPUs)")
    numa_args.add_args(p, "threads and NUMA placement (as gemma4cpu.run; the plan of each thread count is in the "
                          "header)")
    p.add_argument("--spec-type", default=None, choices=["mtp", "ngram", "replay", "none"],
                   help="speculative tgN runs: mtp (default with -md), ngram, replay (--replay-hit), none")
    p.add_argument("--draft-max", default="3", help="draft lengths for the speculative runs (sweep), e.g. 1,2,4")
    p.add_argument("--replay-hit", type=float, default=0.7, help="replay drafter: chance each draft is right")
    p.add_argument("-o", "--output", default="md", choices=["md", "csv", "json"], help="stdout format (default md)")
    p.add_argument("--vs-llama-cpp", metavar="PATH", help="llama-bench binary: run it on the same file and threads")
    p.add_argument("--plot", metavar="FILE.png", help="plot t/s against threads and draft-max (matplotlib)")
    p.add_argument("-c", "--ctx-size", type=int, default=None, help="context (default: enough for the tests)")
    p.add_argument("--cache-type-k", "-ctk", default="f16", choices=["f16", "f32", "q8_0", "q4_0"])
    p.add_argument("--cache-type-v", "-ctv", default="f16", choices=["f16", "f32", "q8_0", "q4_0"])
    compat.add_args(p)
    return p


def main(argv=None) -> int:
    from gemma4cpu import compat, numa_args
    a = build_parser().parse_args(argv)
    err = sys.stderr
    try:
        pps = [x for x in _ints(a.n_prompt, "-p") if x > 0]
        tgs = [x for x in _ints(a.n_gen, "-n") if x > 0]
        kmax = _ints(a.draft_max, "--draft-max")
        ckw = compat.engine_kwargs(a, note=lambda m: print("note: " + m, file=err))
        if a.cpus:
            from gemma4cpu.cpulist import parse_cpu_list
            cpus = parse_cpu_list(a.cpus)
        else:
            cpus = list(ALLOWED_AT_IMPORT)
        threads = _ints(a.threads, "-t") if a.threads else [len(cpus)]
        if max(threads) > len(cpus) or min(threads) < 1:
            raise ValueError(f"-t {a.threads}: each thread count must be in 1..{len(cpus)} (the CPUs given)")
        if a.repetitions < 1:
            raise ValueError("-r must be >= 1")
        if not 0.0 <= a.replay_hit <= 1.0:
            raise ValueError("--replay-hit must be in [0, 1]")
        if any(not 1 <= k <= 16 for k in kmax):
            raise ValueError("--draft-max values must be in 1..16")
        nkw = numa_args.engine_kwargs(a)
        for t in threads:                    # each thread count's plan, before any model is written or loaded
            numa_args.check(nkw, cpus=cpus[:t])
        path, shape = resolve_model(a.model)
        draft = resolve_draft(a.model_draft, shape)
    except ValueError as e:
        print(f"error: {e}", file=err)
        return 2
    if a.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("error: --plot needs matplotlib: pip install 'gemma4cpu[plot]'", file=err)
            return 2
    for f, what in ((path, "model"), (draft, "draft model")):
        if f and not os.path.exists(f):
            print(f"error: {what} file not found: {f}", file=err)
            return 2
    spec_kind = a.spec_type or ("mtp" if draft else "none")
    if spec_kind == "mtp" and not draft:
        print("error: --spec-type mtp needs -md", file=err)
        return 2
    from gemma4cpu.engine import Engine, default_model_path
    path = str(path or default_model_path())
    size_gib = os.path.getsize(path) / 2**30
    llama: dict = {}
    lb = None
    if a.vs_llama_cpp:
        if Path(a.vs_llama_cpp).is_file() and os.access(a.vs_llama_cpp, os.X_OK):
            lb = a.vs_llama_cpp
            llama["path"] = lb
        else:
            llama["skipped"] = f"no executable llama-bench at {a.vs_llama_cpp}: gemma4cpu only"
            log("note: " + llama["skipped"])
    n_ctx = a.ctx_size or max([64] + [x + 8 for x in pps] + [x + 200 for x in tgs])
    results: list[dict] = []
    pin_plans, repacks = {}, {}
    numa_modes, numa_plans = {}, {}
    name = os.path.basename(path)
    t_start = time.perf_counter()

    def row(engine, t, cp, test, npr, ngen, samples, draft_name=None, k=None, acc=None, tpr=None):
        m, s = _stats(samples)
        results.append(dict(engine=engine, model=name, size_gib=size_gib, threads=t, cpus=cp, test=test, n_prompt=npr,
                            n_gen=ngen, draft=draft_name, draft_max=k, runs=len(samples), tps_mean=m, tps_stddev=s,
                            samples_tps=samples, acceptance=acc, tokens_per_round=tpr))
        log(f"  {engine} {t} thr {test}: {m:.2f} ± {s:.2f} t/s" + (f", accepted {100 * acc:.1f}%" if acc is not None else ""))

    for t in threads:
        cp = cpus[:t]
        try:
            eng = Engine(path, draft=draft if spec_kind in ("mtp", "replay") else None, cpus=cp, n_ctx=n_ctx,
                         cache_type_k=a.cache_type_k, cache_type_v=a.cache_type_v, progress=True,
                         spec_type="none", **nkw, **ckw)
        except (ValueError, OSError, MemoryError, NotImplementedError) as e:
            print(f"error: {e}", file=err)
            return 1
        pin_plans[str(t)] = _pin_plan(eng)
        np_ = eng.model.numa_plan
        numa_modes[str(t)], numa_plans[str(t)] = np_.mode, np_.describe()
        repacks[str(t)] = eng.model.repack.line()
        log(f"[{t} threads on CPUs {cp}]")
        for n in pps:
            row("gemma4cpu", t, cp, f"pp{n}", n, 0, bench_pp(eng, n, a.repetitions))
        for n in tgs:
            row("gemma4cpu", t, cp, f"tg{n}", 0, n, bench_tg(eng, n, a.repetitions))
            if spec_kind != "none":
                for k in kmax:
                    r = bench_spec(eng, n, k, a.repetitions, spec_kind, a.replay_hit)
                    dname = spec_kind if spec_kind != "replay" else f"replay p={a.replay_hit:g}"
                    row("gemma4cpu", t, cp, f"tg{n}+{spec_kind}{k}", 0, n, r["samples"], dname, k,
                        r["acceptance"], r["tokens_per_round"])
        try:
            eng.model.pool.close()
        except Exception:
            pass
        del eng
        if lb:
            for pp, tg in [(n, 0) for n in pps] + [(0, n) for n in tgs]:
                try:
                    rows = llama_bench(lb, path, cp, pp, tg, a.repetitions, ckw.get("max_batch"))
                except RuntimeError as e:
                    llama.setdefault("errors", []).append(str(e))
                    log(f"note: {e}")
                    continue
                for x in rows:
                    samples = x.get("samples_ts") or [x.get("avg_ts", 0.0)]
                    test = f"pp{x['n_prompt']}" if x.get("n_prompt") else f"tg{x['n_gen']}"
                    row("llama.cpp", t, cp, test, x.get("n_prompt", 0), x.get("n_gen", 0), [float(v) for v in samples])
                    llama["build"] = f"{x.get('build_commit')} ({x.get('build_number')})"
                    llama["backends"] = x.get("backends")
    numa_cfg = (f"numa={a.numa}" + (f" nodes={a.numa_nodes}" if a.numa_nodes else "")
                + (f", threads-batch={a.threads_batch}" if a.threads_batch else "") + (", smt" if a.smt else "")
                + (", thp" if a.thp else ""))
    header = {"tool": "python -m gemma4cpu.bench", "model": path, "draft": draft, "machine": machine(),
              "pin_plans": pin_plans, "repack": repacks,
              "numa": {"requested": a.numa, "numa_nodes": nkw["numa_nodes"], "threads_batch": a.threads_batch,
                       "smt": a.smt, "thp": a.thp, "resolved": numa_modes, "plans": numa_plans},
              "config": f"runs={a.repetitions} (mean ± stddev of t/s after 1 warm-up), threads={threads}, "
                        f"cpus={cpus}, {numa_cfg}, n_ctx={n_ctx}, KV {a.cache_type_k}/{a.cache_type_v}, "
                        f"spec={spec_kind}" + (f" draft-max={kmax}" if spec_kind != "none" else "")
                        + (f", replay hit {a.replay_hit:g}" if spec_kind == "replay" else ""),
              "elapsed_s": time.perf_counter() - t_start}
    if a.output == "json":
        sys.stdout.write(json.dumps({"header": header, "results": results, "llama_cpp": llama}, indent=1) + "\n")
    elif a.output == "csv":
        sys.stdout.write(render_csv(header, results))
    else:
        sys.stdout.write(render_md(header, results, llama))
    sys.stdout.flush()
    if a.plot:
        plot(results, a.plot)
        log(f"wrote {a.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
