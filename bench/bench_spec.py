#!/usr/bin/env python3
"""Speculative decoding on 31B shapes (issue 5): what a verify forward and a draft step cost, the
speedup those costs give, the same measured end to end, prefill with the drafter loaded, n-gram
drafting on the real Gemma 3 270M.

    python bench/bench_spec.py                     # every section (~10-15 min on 2 cores; files cached)
    python bench/bench_spec.py --quick             # fewer runs and tokens, k = 3 only (~4 min)
    python bench/bench_spec.py --sections a,b,c    # only the cost model
    python bench/bench_spec.py --q8 --json out.json --llama-bench /path/to/llama-bench

Files: synthetic 31B-shaped Gemma 4 targets (gemma4cpu.synth_model.write: real shapes, random
valid Q4_K_M-mix blocks) with --layers A,B layers (default 6,12: both keep the real 5:1
sliding:full pattern, so a difference of B-A layers is (B-A)/6 whole groups of a 60-layer 31B), and
the synthetic 31B MTP assistant (write_assistant: 4 layers, Q4_K, Q6_K head). Made once and cached
in $GEMMA4CPU_CACHE, else /tmp/gemma4cpu-bench (the first run spends ~1-2 min writing them).

T threads (--threads, default all allowed CPUs) pinned to the first T CPUs of --cpus; llama-bench
runs under `taskset -c <the same CPUs>` with -t T.

Every figure is the median of its runs (--stat best: the fastest run instead; use it when the shared
host is busy, and say so). Sections:
  a  verify cost c(n), n = 1..9: ours = Model.forward of n tokens at position --prefix (a
     --prefix-token prompt is in the cache; the cache is truncated back after every timed call;
     logits for every row when n > 1, as a verify needs), interleaved rounds (each round times
     every (file, n) once, both files loaded, in an order rotated from the round before), one
     warm-up round, median of --a-runs; llama.cpp = `llama-bench -p 1,..,9 -n 0 -r <a-runs/2>` on the
     same file, twice per file alternating between the files (pp n on an empty cache, logits of
     the last row only), median of its samples. Per-layer cost is extrapolated
     linearly to 60 layers: c60(n) = cA(n) + (cB(n) - cA(n)) (60 - A) / (B - A).
  b  draft step: Assistant.draft(tok, h, P, k) next to the A-layer target (P = --prefix), time
     per step (median over --runs calls of k = 1 and of k = 3, per step), vs our c(1).
  c  model speedup: E(k) = (1 - a^(k+1)) / (1 - a) tokens per round, cost(k) = c(k+1) + k c_draft,
     speedup = E(k) c(1) / cost(k), for a in --accept and k = 1..8; from our 60-layer costs, from
     llama.cpp's 60-layer costs (with our draft step's absolute time), and from our A-layer file.
     The goal cell's verdict: "not judged" when some c(n) < c(1) by more than the two costs' noise
     bands (half the rounds' interquartile range; through the extrapolation 8 sA + 9 sB), else met /
     not met on the costs with every c(n) raised to at least c(1) (a dip inside the noise cannot
     carry the speedup over the goal; the line shows both figures when they differ).
  d  end to end, a controlled experiment: Engine on the A-layer target with the assistant loaded;
     the drafter is gemma4cpu.speculative.ReplayDrafter(reference, p_hit=a,
     compute=MTPDrafter(assistant)): every round it runs the real assistant for k steps (cost
     included) and then proposes the reference continuation (the plain greedy output of the same
     prompt), each token right with probability a (seeded: the same hits in every run). The
     Engine is made with draft=<assistant file> (so the assistant is bound to the Engine's own
     model and KV cache) and the replay drafter wrapping it is then set as `eng.drafter` (what
     Engine(draft=<Drafter>) would hold). Plain and speculative generate() calls alternate;
     decode t/s = GenerationStats.decode_tps (time after the first token); median of --e2e-runs;
     the speculative tokens must equal the plain ones. Printed beside the prediction of
     (a)-(c) for the same A-layer file and for 60 layers.
  e  prefill with the drafter loaded: pp512 = generate() of a 512-token prompt on an empty cache
     (max_tokens=1, GenerationStats.prefill_tps) by an Engine without a drafter and one with the
     assistant loaded (both alive, alternating, two warm-up rounds), median of --runs; goal ratio >= 0.98.
  f  n-gram drafting (prompt lookup) on the real Gemma 3 270M Q4_K_M (Engine()) on copy-heavy
     completion prompts (a passage then a quotation from it; a function then the same function
     renamed): spec_type "ngram" with draft_max 3, 5 and 5 + spec_autotune vs "none", alternating,
     median of --e2e-runs; acceptance, tokens/round, decode t/s, identical output.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # repo root, for `python bench/...`

from bench.bench_model import (DEFAULT_LLAMA_BENCH, LLAMA_DESC, Noise, cache_root, close_model,  # noqa: E402
                               find_tool, llama_build_flags, llama_desc, load_model, prompt_tokens, tensor_types)
from bench.common import ALLOWED_CPUS_AT_IMPORT, fmt, header, md_table, median, parse_cpu_list  # noqa: E402

import numpy as np  # noqa: E402

# what llama.cpp's build was made with (its CMakeCache.txt): main() sets both from the llama-bench it finds
LLAMA_FLAGS = "unknown build options"
LLAMA_SHORT = LLAMA_DESC
FULL_LAYERS = 60
ACCEPTS = (0.5, 0.7, 0.84, 0.95)
KS = tuple(range(1, 9))
GOAL = (0.84, 3, 3.0)          # acceptance, k, speedup goal
SECTIONS = "abcdef"
STAT = "median"                # --stat: "median", or "best" (fastest run: min time, max t/s)


def t_stat(xs) -> float:
    """The reported time of several runs: their median, or with --stat best the fastest."""
    return min(xs) if STAT == "best" else median(xs)


def r_stat(xs) -> float:
    """The reported rate (t/s) of several runs: their median, or with --stat best the highest."""
    return max(xs) if STAT == "best" else median(xs)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---- the cost model (pure arithmetic; tests/test_bench_tools.py tests it) ---------------------

def expected_tokens(a: float, k: int) -> float:
    """Tokens per round with k drafts, each right with probability a independently and accepted
    up to the first miss, plus the target's own token: sum_{i=0..k} a^i."""
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def round_cost(c: dict, c_draft: float, k: int) -> float:
    """One round: k draft steps and one target forward of k + 1 tokens."""
    return c[k + 1] + k * c_draft


def model_speedup(c: dict, c_draft: float, a: float, k: int) -> float:
    """E(k) / cost per round, in units of plain decoding (one c(1) per token)."""
    return expected_tokens(a, k) * c[1] / round_cost(c, c_draft, k)


def extrapolate(ca: dict, cb: dict, la: int, lb: int, L: int = FULL_LAYERS) -> dict:
    """Linear in the layer count: c_L(n) = cA(n) + (cB(n) - cA(n)) (L - A) / (B - A)."""
    if lb == la:
        raise ValueError("need two different layer counts")
    return {n: ca[n] + (cb[n] - ca[n]) * (L - la) / (lb - la) for n in ca if n in cb}


def spread(runs: dict) -> dict:
    """{n: half the interquartile range of the per-round times of c(n)} (seconds): the noise band of
    a measured cost."""
    out = {}
    for n, xs in runs.items():
        if xs:
            q = np.percentile(np.asarray(xs, float), [25, 75])
            out[n] = float(q[1] - q[0]) / 2
    return out


def extrapolate_spread(sa: dict, sb: dict, la: int, lb: int, L: int = FULL_LAYERS) -> dict:
    """The noise band of extrapolate()'s c_L(n) = (1 - f) cA(n) + f cB(n), f = (L - A) / (B - A),
    propagated linearly in the worst case: |1 - f| sA(n) + |f| sB(n) (9x sB + 8x sA for 6 / 12 -> 60)."""
    f = (L - la) / (lb - la)
    return {n: abs(1 - f) * sa[n] + abs(f) * sb[n] for n in sa if n in sb}


def implausible(c: dict, s: dict | None = None) -> list:
    """The n > 1 whose cost c(n) lies below c(1) by more than the two costs' noise bands s(n) + s(1)
    (from spread(); none given: any c(n) < c(1)). A forward of n tokens reads the same weights as one
    of a single token and does more work; it may still take less time where its kernels stream
    memory better than the one-token ones (measured on the Zen 5 VM: t(4)/t(1) 0.85-0.91 for Q4_K with
    2 threads), so a small dip within the noise is not flagged. Larger dips on a noisy host mean the
    costs are noise (a 60-layer extrapolation multiplies the difference of two files 9-fold) and a
    speedup modelled from them means nothing."""
    s = s or {}
    return [n for n in sorted(c) if n > 1 and c[n] + s.get(n, 0.0) + s.get(1, 0.0) < c[1]]


def floored(c: dict) -> dict:
    """c with every c(n), n > 1, raised to at least c(1): the verdict on the goal is taken on these,
    so that a dip of c(n) below c(1) inside the noise bands (implausible() lets it through) cannot
    carry a speedup over the goal."""
    return {n: (v if n == 1 else max(v, c[1])) for n, v in c.items()}


def speedup_table(c: dict, c_draft: float, accepts=ACCEPTS, ks=KS) -> dict:
    """{a: {k: speedup}} for every k with c(k + 1) known."""
    return {a: {k: model_speedup(c, c_draft, a, k) for k in ks if k + 1 in c} for a in accepts}


def best_k(table_row: dict) -> int:
    return max(table_row, key=table_row.get)


def fmt_table(tab: dict, goal=GOAL) -> str:
    """Markdown: one row per acceptance, one column per k; the goal cell in bold, the best k of
    each row marked with a '*'."""
    ks = sorted({k for row in tab.values() for k in row})
    rows = []
    for a, row in tab.items():
        b = best_k(row) if row else None
        cells = []
        for k in ks:
            v = row.get(k)
            s = "-" if v is None else f"{v:.2f}" + ("*" if k == b else "")
            if (a, k) == goal[:2] and v is not None:
                s = f"**{s}**"
            cells.append(s)
        rows.append([f"{a:g}"] + cells)
    return md_table(["a \\ k"] + [str(k) for k in ks], rows)


def parse_floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x.strip()]


# ---- files -----------------------------------------------------------------------------------

def synth_target(layers: int, mix: str) -> tuple[Path, str]:
    from gemma4cpu.synth_model import write

    p = cache_root() / f"synth-31B-{layers}l-{mix}.gguf"
    if p.is_file():
        return p, "cached"
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    log(f"writing {p} (synthetic 31B, {layers} layers, {mix}) ...")
    t0 = time.perf_counter()
    write(str(tmp), "31B", layers, mix, seed=0, progress=True)
    tmp.replace(p)
    return p, f"made in {time.perf_counter() - t0:.0f} s"


def synth_assistant(mix: str) -> tuple[Path, str]:
    from gemma4cpu.synth_model import write_assistant

    p = cache_root() / f"synth-31B-assistant-{mix}.gguf"
    if p.is_file():
        return p, "cached"
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    log(f"writing {p} (synthetic 31B assistant, {mix}) ...")
    t0 = time.perf_counter()
    write_assistant(str(tmp), "31B", mix, seed=1, progress=True)
    tmp.replace(p)
    return p, f"made in {time.perf_counter() - t0:.0f} s"


# ---- (a) verify cost -------------------------------------------------------------------------

def ours_costs(models: dict, ns, prefix: int, runs: int, cpus, seed: int = 0) -> dict:
    """{key: {"c": {n: seconds}, "runs_s": ..}} of forward(n tokens) at position `prefix` for every
    model of `models` ({key: Model}, all loaded at once): each round times every (model, n) once,
    in an order rotated by one from the round before, so that drift on a shared host falls on every
    file alike (the extrapolation to 60 layers amplifies a difference between the files 9-fold)."""
    rng = np.random.default_rng(seed)
    for m in models.values():
        m.cache.truncate(0)
        m.forward(prompt_tokens(prefix, m.cfg.n_vocab, seed=seed))
    cells = [(key, n) for key in models for n in ns]
    ts = {c: [] for c in cells}
    noise = None
    for r in range(runs + 1):                        # round 0 = warm-up
        if r == 1:
            noise = Noise(cpus).start()
        sh = (r * len(ns) // 2 + r) % len(cells)
        for key, n in cells[sh:] + cells[:sh]:
            m = models[key]
            # one untimed token on this model first: a forward right after the *other* model's
            # 9-token one read up to 40 % slow here (c(1) 207 vs ~145 ms, 6 layers; cause not
            # pinned down), which no verify loop sees: it runs one model over and over
            m.forward(rng.integers(1000, min(m.cfg.n_vocab, 200000), 1), "last")
            m.cache.truncate(prefix)
            toks = rng.integers(1000, min(m.cfg.n_vocab, 200000), n)
            t0 = time.perf_counter()
            m.forward(toks, "all" if n > 1 else "last")
            dt = time.perf_counter() - t0
            m.cache.truncate(prefix)
            if r:
                ts[(key, n)].append(dt)
    others = noise.stop() if noise else None
    return {key: {"c": {n: t_stat(ts[(key, n)]) for n in ns}, "runs_s": {n: ts[(key, n)] for n in ns},
                  "others_pct": others} for key in models}


def llama_costs(exe: str, path: Path, cpus, ns, runs: int) -> dict:
    """`llama-bench -p n1,n2,.. -n 0 -r runs -o json` under taskset: median of the per-repetition
    times of each pp n (one load of the file for every n; bench_model.llama_bench keeps only the
    first row of the output, so this reads them all)."""
    cmd = [exe, "-m", str(path), "-t", str(len(cpus)), "-p", ",".join(map(str, ns)), "-n", "0",
           "-r", str(runs), "-o", "json"]
    taskset = shutil.which("taskset")
    full = ([taskset, "-c", ",".join(map(str, cpus))] + cmd) if taskset else cmd
    noise = Noise(cpus).start()
    t0 = time.perf_counter()
    r = subprocess.run(full, capture_output=True, text=True,
                       preexec_fn=None if taskset else (lambda: os.sched_setaffinity(0, cpus)))
    wall = time.perf_counter() - t0
    others = noise.stop()
    if r.returncode != 0:
        tail = [ln for ln in r.stderr.strip().splitlines() if ln.strip()][-3:]
        return {"error": f"llama-bench rc {r.returncode}: {' | '.join(tail)}", "cmd": " ".join(full)}
    try:
        rows = json.loads(r.stdout)
    except ValueError as e:
        return {"error": f"unparsable llama-bench output ({e}): {r.stdout[:200]!r}", "cmd": " ".join(full)}
    c, samples = {}, {}
    for row in rows:
        n = int(row["n_prompt"])
        s = [x / 1e9 for x in (row.get("samples_ns") or [row["avg_ns"]])]
        c[n], samples[n] = t_stat(s), s
    meta = {k: rows[0].get(k) for k in ("build_commit", "build_number", "cpu_info", "backends", "model_type",
                                         "n_threads", "flash_attn", "type_k", "type_v", "repack")}
    return {"c": c, "runs_s": samples, "others_pct": others, "cmd": " ".join(full), "wall_s": wall, **meta}


def ratio_rows(label_costs: list[tuple[str, dict]], ns) -> list[list]:
    rows = []
    for label, c in label_costs:
        if not c:
            continue
        rows.append([label, fmt(1e3 * c[1], 1)] + [fmt(c[n] / c[1], 2) if n in c else "-" for n in ns])
    return rows


# ---- (b) draft step --------------------------------------------------------------------------

def draft_cost(m, assistant, prefix: int, runs: int, cpus) -> dict:
    V = m.cfg.n_vocab
    m.cache.truncate(0)
    _, h = m.forward(prompt_tokens(prefix, V, seed=5))
    tok = 1234
    assistant.draft(tok, h[-1], prefix, 3)          # warm-up
    noise = Noise(cpus).start()
    one, three = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        assistant.draft(tok, h[-1], prefix, 1)
        one.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        assistant.draft(tok, h[-1], prefix, 3)
        three.append((time.perf_counter() - t0) / 3)
    others = noise.stop()
    return {"step_s": t_stat(one + three), "k1_s": t_stat(one), "k3_per_step_s": t_stat(three),
            "runs_k1_s": one, "runs_k3_per_step_s": three, "others_pct": others,
            "bytes": int(assistant.n_bytes)}


# ---- (d) end to end --------------------------------------------------------------------------

def e2e(eng, prefix: int, tokens: int, configs: list[tuple[float, int]], runs: int, cpus, seed: int = 7) -> dict:
    from gemma4cpu import speculative as spec

    V = eng.model.cfg.n_vocab
    prompt = [int(t) for t in prompt_tokens(prefix, V, seed=seed)]
    ref = eng.generate(prompt, max_tokens=tokens, spec_type="none")      # warm-up, and the reference
    reference = prompt + list(ref.tokens)
    real_drafter = eng.drafter

    def drafter(a):
        return spec.ReplayDrafter(reference, p_hit=a, seed=seed, n_vocab=V, compute=spec.MTPDrafter(eng.assistant))

    plain, out = [], {c: {"tps": [], "stats": None, "same": True} for c in configs}
    noise = Noise(cpus).start()
    try:
        for r in range(runs):
            eng.drafter = real_drafter
            res = eng.generate(prompt, max_tokens=tokens, spec_type="none")
            plain.append(res.stats.decode_tps)
            order = configs[r % len(configs):] + configs[:r % len(configs)]
            for (a, k) in order:
                eng.drafter = drafter(a)
                res = eng.generate(prompt, max_tokens=tokens, spec_type="mtp", draft_max=k)
                o = out[(a, k)]
                o["tps"].append(res.stats.decode_tps)
                o["stats"] = res.stats.spec
                o["same"] &= list(res.tokens) == list(ref.tokens)
                log(f"  e2e round {r + 1}/{runs} a={a:g} k={k}: {res.stats.decode_tps:.2f} t/s "
                    f"(plain {plain[-1]:.2f}); {res.stats.spec.line()}")
    finally:
        eng.drafter = real_drafter
    others = noise.stop()
    return {"plain_tps": r_stat(plain), "plain_runs": plain, "n_generated": len(ref.tokens),
            "stop": ref.stats.stop_reason, "others_pct": others,
            "spec": {c: {"tps": r_stat(o["tps"]), "runs": o["tps"], "same": o["same"],
                         "stats": o["stats"].as_dict(), "line": o["stats"].line()} for c, o in out.items()}}


# ---- (e) prefill -----------------------------------------------------------------------------

def prefill_pair(eng_plain, eng_draft, n: int, runs: int, cpus) -> dict:
    V = eng_plain.model.cfg.n_vocab
    prompt = [int(t) for t in prompt_tokens(n, V, seed=11)]

    def one(eng):
        eng.reset()
        r = eng.generate(prompt, max_tokens=1, spec_type="none")
        eng.reset()
        return r.stats.prefill_tps

    for _ in range(2):                               # warm-up: the first calls run slow here (page cache, THP)
        one(eng_plain), one(eng_draft)
    noise = Noise(cpus).start()
    a, b = [], []
    for r in range(runs):
        for eng, acc in ((eng_plain, a), (eng_draft, b)) if r % 2 == 0 else ((eng_draft, b), (eng_plain, a)):
            acc.append(one(eng))
        log(f"  pp{n} round {r + 1}/{runs}: without {a[-1]:.1f} t/s, with drafter {b[-1]:.1f} t/s")
    others = noise.stop()
    return {"without_tps": r_stat(a), "with_tps": r_stat(b), "ratio": r_stat(b) / r_stat(a),
            "runs_without": a, "runs_with": b, "others_pct": others}


# ---- (f) n-gram on the real 270M -------------------------------------------------------------

PASSAGE = (
    "The Amundsen-Scott South Pole Station is a United States scientific research station at the South "
    "Pole of the Earth. It is the southernmost point under the jurisdiction of the United States. The "
    "station is located on the high plateau of Antarctica at an elevation of 2,835 metres above sea level. "
    "It was originally built by 24 Navy Seabees in November 1956, as part of the International Geophysical "
    "Year. Since then it has been rebuilt twice: the second station was a geodesic dome finished in 1975, "
    "and the current elevated station was dedicated on 12 January 2008. The station has been continuously "
    "occupied since it was built, and its population ranges from about 50 people in winter to about 150 in "
    "summer.")

CODE = '''def moving_average(values, window):
    """Return the moving averages of `values` over `window` items."""
    if window <= 0:
        raise ValueError("window must be positive")
    out = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out
'''

NGRAM_PROMPTS = {
    # extraction: the answer is a verbatim quotation of the passage
    "extract": ("Passage:\n" + PASSAGE + "\n\nTask: quote, word for word, the sentences of the passage about "
                "the station's history.\nQuotation: \"It was originally built"),
    # code edit: the same function with a new name, the body unchanged
    "code-rename": ("# utils.py\n\n" + CODE + "\n\n# The same function renamed to rolling_mean "
                    "(the body is unchanged):\n\ndef rolling_mean(values, window):\n"),
    # a longer edit: two functions, rename a variable in both
    "code-edit": ("```python\n" + CODE + "\n\ndef moving_sum(values, window):\n    return [x * window for x in "
                  "moving_average(values, window)]\n```\n\nThe same code with `values` renamed to `xs`:\n\n"
                  "```python\ndef moving_average(xs, window):\n"),
}
NGRAM_MODES = (("ngram", 3, False), ("ngram", 5, False), ("ngram", 5, True))


def ngram_bench(eng, prompts: dict, tokens: int, runs: int, cpus) -> dict:
    out = {}
    for name, text in prompts.items():
        ids = eng.tokenize(text)
        ref = eng.generate(ids, max_tokens=tokens, spec_type="none")     # warm-up, and the reference
        plain = []
        res = {m: {"tps": [], "stats": None, "same": True} for m in NGRAM_MODES}
        noise = Noise(cpus).start()
        for r in range(runs):
            plain.append(eng.generate(ids, max_tokens=tokens, spec_type="none").stats.decode_tps)
            for mode in NGRAM_MODES[r % 3:] + NGRAM_MODES[:r % 3]:
                st, k, auto = mode
                g = eng.generate(ids, max_tokens=tokens, spec_type=st, draft_max=k, spec_autotune=auto)
                o = res[mode]
                o["tps"].append(g.stats.decode_tps)
                o["stats"] = g.stats.spec
                o["same"] &= list(g.tokens) == list(ref.tokens)
        others = noise.stop()
        out[name] = {"n_prompt": len(ids), "n_generated": len(ref.tokens), "stop": ref.stats.stop_reason,
                     "plain_tps": r_stat(plain), "plain_runs": plain, "others_pct": others,
                     "text": ref.text,
                     "modes": {f"{st} k<={k}{' autotune' if auto else ''}":
                               {"tps": r_stat(o["tps"]), "runs": o["tps"], "same": o["same"],
                                "stats": o["stats"].as_dict(), "line": o["stats"].line()}
                               for (st, k, auto), o in res.items()}}
        log(f"  ngram {name}: plain {r_stat(plain):.1f} t/s; " + "; ".join(
            f"{m} {v['tps']:.1f} t/s" for m, v in out[name]["modes"].items()))
    return out


# ---- main ------------------------------------------------------------------------------------

def by_pos(stats: dict) -> str:
    return "/".join(f"{100 * x:.0f}" for x in stats["acceptance_by_pos"]) or "-"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=None, help="threads (default: all allowed CPUs)")
    ap.add_argument("--cpus", default=None, help="taskset-style CPU list; T threads use the first T "
                                                 "(default: the process's allowed CPUs)")
    ap.add_argument("--runs", type=int, default=None, help="timed runs per figure, median reported "
                                                           "(default 5; --quick 3)")
    ap.add_argument("--layers", default="6,12", help="the two layer counts A,B of the synthetic targets "
                                                     "(default 6,12)")
    ap.add_argument("--prefix", type=int, default=256, help="tokens in the cache before a timed verify "
                                                            "(default 256)")
    ap.add_argument("--n-max", type=int, default=9, help="largest verify batch n (default 9 = k 8 + 1)")
    ap.add_argument("--accept", default=",".join(map(str, ACCEPTS)), help="acceptance rates a (default "
                                                                          "0.5,0.7,0.84,0.95)")
    ap.add_argument("--tokens", type=int, default=None, help="tokens per end-to-end run (default 48; --quick 24)")
    ap.add_argument("--a-runs", type=int, default=None, help="rounds of the verify-cost timing (a) (default 9; "
                                                             "--quick 3): its 60-layer extrapolation amplifies noise")
    ap.add_argument("--e2e-runs", type=int, default=3, help="runs of each end-to-end configuration, (d) and (f) (default 3)")
    ap.add_argument("--k-sweep", action=argparse.BooleanOptionalAction, default=None,
                    help="end to end also k = 1..8 at a = 0.84 (default on; off with --quick)")
    ap.add_argument("--ngram-tokens", type=int, default=None, help="tokens per n-gram run (default 160; "
                                                                   "--quick 96)")
    ap.add_argument("--q8", action="store_true", help="(a) and (c) also on Q8_0-mix targets")
    ap.add_argument("--sections", default=SECTIONS, help="which sections to run (default abcdef; c and the "
                                                         "predictions of d need a and b)")
    ap.add_argument("--llama-bench", default=None, help=f"llama-bench binary (default $LLAMA_BENCH, else "
                                                        f"{DEFAULT_LLAMA_BENCH})")
    ap.add_argument("--no-llama", action="store_true", help="our engine only")
    ap.add_argument("--quick", action="store_true", help="3 runs, 24 e2e tokens (k = 3 only), 96 n-gram tokens "
                                                         "on two prompts")
    ap.add_argument("--stat", choices=["median", "best"], default="median",
                    help="how runs are summarised: median (default), or best = the fastest run (min time, max "
                         "t/s), which on a shared host estimates the uncontended figure")
    ap.add_argument("--json", metavar="PATH", help="write header and every figure as JSON")
    a = ap.parse_args(argv)
    global STAT
    STAT = a.stat
    runs = a.runs if a.runs is not None else (3 if a.quick else 5)
    a_runs = a.a_runs if a.a_runs is not None else (3 if a.quick else 9)
    tokens = a.tokens if a.tokens is not None else (24 if a.quick else 48)
    ng_tokens = a.ngram_tokens if a.ngram_tokens is not None else (96 if a.quick else 160)
    k_sweep = a.k_sweep if a.k_sweep is not None else not a.quick
    if runs < 1 or a.e2e_runs < 1 or (a.a_runs is not None and a.a_runs < 1):
        ap.error("--runs and --e2e-runs must be >= 1")
    try:
        la, lb = sorted(int(x) for x in a.layers.split(","))
    except ValueError:
        ap.error("--layers takes two layer counts, e.g. 6,12")
    if la == lb or la < 2:
        ap.error("--layers needs two different counts >= 2 (a sliding and a full layer)")
    if not 2 <= a.n_max <= 17:
        ap.error("--n-max must be in 2..17")
    accepts = parse_floats(a.accept)
    if not accepts or not all(0.0 <= x < 1.0 for x in accepts):
        ap.error("--accept takes rates in [0, 1)")
    sections = set(a.sections.lower())
    if not sections <= set(SECTIONS):
        ap.error(f"--sections: choose from {SECTIONS}")
    cpus = parse_cpu_list(a.cpus) if a.cpus else list(ALLOWED_CPUS_AT_IMPORT)
    T = a.threads or len(cpus)
    if T > len(cpus):
        ap.error(f"{T} threads need that many CPUs; --cpus gives {cpus}")
    cpus = cpus[:T]
    ns = list(range(1, a.n_max + 1))
    ks = [k for k in KS if k + 1 <= a.n_max]
    t_start = time.perf_counter()

    lb_exe = None
    notes = []
    if not a.no_llama and "a" in sections:
        lb_exe = find_tool(a.llama_bench or os.environ.get("LLAMA_BENCH") or DEFAULT_LLAMA_BENCH, "LLAMA_BENCH",
                           "llama-bench", None)
        if lb_exe is None:
            notes.append("llama-bench not found (--llama-bench, $LLAMA_BENCH): our engine only")
    elif a.no_llama:
        notes.append("--no-llama: our engine only")
    global LLAMA_FLAGS, LLAMA_SHORT
    flags = llama_build_flags(lb_exe)
    LLAMA_FLAGS, LLAMA_SHORT = flags or "unknown build options", llama_desc(flags)

    # files
    mixes = ["q4_k_m"] + (["q8_0"] if a.q8 else [])
    files, file_notes = {}, []
    if "a" in sections:
        want = [(mix, L) for mix in mixes for L in (la, lb)]
    elif sections & set("bde"):
        want = [("q4_k_m", la)]
    else:
        want = []
    for mix, L in want:
        p, note = synth_target(L, mix)
        files[(mix, L)] = p
        file_notes.append(f"{p.name}: {note}")
    asst = None
    if sections & set("bde"):
        asst, note = synth_assistant("q4_k_m")
        file_notes.append(f"{asst.name}: {note}")

    # header (throwaway pool for the pin plan; the models' pools use the same CPUs)
    from gemma4cpu import kernels as K
    from gemma4cpu.synth import random_rows

    pool = K.Pool(T, cpus)
    K.matmul(pool, "Q8_0", random_rows("Q8_0", 8, 256, np.random.default_rng(0)), 256, np.ones((1, 256), np.float32))
    extra = {
        "pinning": f"ours: Model/Engine(threads={T}, cpus={cpus}), pool workers pinned one per CPU; "
                   f"llama.cpp: taskset -c {','.join(map(str, cpus))} llama-bench -t {T}",
        "llama": (f"{lb_exe} = {LLAMA_SHORT}; built with {LLAMA_FLAGS}"
                  if lb_exe else "absent: " + "; ".join(notes)),
        "config": f"runs={runs} a_runs={a_runs} e2e_runs={a.e2e_runs} layers={la},{lb} prefix={a.prefix} n=1..{a.n_max} accept={accepts} "
                  f"stat={a.stat} e2e_tokens={tokens} k_sweep={k_sweep} ngram_tokens={ng_tokens} sections={''.join(sorted(sections))}",
    }
    h = header("gemma4cpu speculative decoding bench (bench/bench_spec.py)", threads=[T], pools={T: pool}, extra=extra)
    pool.close()
    for (mix, L), p in files.items():
        print(f"model    {p.name} ({p.stat().st_size / 2**20:.0f} MiB; {tensor_types(p)})")
    if asst:
        print(f"drafter  {asst.name} ({asst.stat().st_size / 2**20:.0f} MiB; {tensor_types(asst)})")
    for n in file_notes + notes:
        print(f"note     {n}")
    print()

    R: dict = {"header": h, "notes": notes + file_notes}
    n_ctx = max(a.prefix + a.n_max + 8, a.prefix + tokens + 24, 520)

    # ---- (a)
    costs: dict = {}          # (engine, mix, L or 60) -> {n: s}
    spreads: dict = {}        # the same keys -> {n: noise band (s)}: spread(), extrapolate_spread()
    if "a" in sections:
        print(f"## (a) Verify cost c(n): one forward of n tokens after {a.prefix} cached positions\n")
        for mix in mixes:
            log(f"[a] ours {mix}: {la} and {lb} layers, interleaved ...")
            ms = {L: load_model(files[(mix, L)], n_ctx, cpus) for L in (la, lb)}
            rr = ours_costs(ms, ns, a.prefix, a_runs, cpus)
            for m in ms.values():
                close_model(m)
            del ms
            gc.collect()
            for L, r in rr.items():
                costs[("ours", mix, L)] = r["c"]
                spreads[("ours", mix, L)] = spread(r["runs_s"])
                R.setdefault("a", {})[f"ours {mix} {L}"] = r
                log(f"[a] ours {L} layers: " + " ".join(f"{n}:{1e3 * v:.0f}ms" for n, v in r["c"].items()))
            if lb_exe:
                # two passes per file, alternating files, each with half the repetitions
                half = (a_runs + 1) // 2
                got: dict = {}
                for rep in range(2):
                    for L in (la, lb):
                        p = files[(mix, L)]
                        log(f"[a] llama-bench {p.name} (pass {rep + 1}/2) ...")
                        lr = llama_costs(lb_exe, p, cpus, ns, half)
                        if "error" in lr:
                            got[L] = lr
                        elif "error" not in got.get(L, {}):
                            g = got.setdefault(L, {**lr, "runs_s": {n: [] for n in ns}, "others": []})
                            for n in ns:
                                g["runs_s"][n] += lr["runs_s"].get(n, [])
                            g["others"].append(lr["others_pct"])
                for L, g in got.items():
                    p = files[(mix, L)]
                    if "error" in g:
                        R["a"][f"llama {mix} {L}"] = g
                        print(f"llama.cpp could not run {p.name}: {g['error']} (continuing with ours only)\n")
                        continue
                    g["c"] = {n: t_stat(v) for n, v in g["runs_s"].items() if v}
                    g["others_pct"] = max([x for x in g.pop("others") if x is not None], default=None)
                    R["a"][f"llama {mix} {L}"] = g
                    costs[("llama", mix, L)] = g["c"]
                    spreads[("llama", mix, L)] = spread(g["runs_s"])
            for eng in ("ours", "llama"):
                if (eng, mix, la) in costs and (eng, mix, lb) in costs:
                    costs[(eng, mix, FULL_LAYERS)] = extrapolate(costs[(eng, mix, la)], costs[(eng, mix, lb)], la, lb)
                    spreads[(eng, mix, FULL_LAYERS)] = extrapolate_spread(spreads[(eng, mix, la)],
                                                                          spreads[(eng, mix, lb)], la, lb)
        rows = []
        for mix in mixes:
            for L in (la, lb, FULL_LAYERS):
                tag = f"{L}" if L != FULL_LAYERS else f"{L} (extrapolated)"
                rows += ratio_rows([(f"{mix} {tag}, gemma4cpu", costs.get(("ours", mix, L))),
                                    (f"{mix} {tag}, llama.cpp", costs.get(("llama", mix, L)))], ns)
        print(md_table(["file / engine", "c(1) ms"] + [f"c({n})/c(1)" for n in ns], rows))
        print(f"\ngemma4cpu: Model.forward at position {a.prefix}, logits for all n rows (a verify's need), "
              f"{a.stat} of {a_runs} interleaved rounds. llama.cpp = {LLAMA_SHORT}, built with {LLAMA_FLAGS}: "
              f"`llama-bench -p 1..{a.n_max} -n 0 -r {(a_runs + 1) // 2}`, two passes per file alternating = pp n on an empty cache with the logits of the last "
              f"row only (so its c(n) leaves out n - 1 rows of the LM head), {a.stat} of its samples. "
              f"60-layer rows: c60(n) = c{la}(n) + (c{lb}(n) - c{la}(n)) * {FULL_LAYERS - la}/{lb - la}.")
        for k_, v in R.get("a", {}).items():
            if v.get("others_pct") is not None:
                print(f"others % during {k_}: {v['others_pct']:.0f}")
        print()

    # ---- (b)
    c_draft = None
    if "b" in sections:
        from gemma4cpu.assistant import Assistant

        print(f"## (b) Draft step: the synthetic 31B assistant next to the {la}-layer target\n")
        m = load_model(files[("q4_k_m", la)], n_ctx, cpus)
        ast = Assistant(asst, m)
        d = draft_cost(m, ast, a.prefix, max(runs, 5), cpus)
        close_model(m)
        del m, ast
        gc.collect()
        c_draft = d["step_s"]
        R["b"] = d
        rows = [["draft step (ours)", fmt(1e3 * c_draft, 2), fmt(1e3 * d["k1_s"], 2), fmt(1e3 * d["k3_per_step_s"], 2)]]
        print(md_table(["", "ms per step", "k=1 call", "k=3 call / 3"], rows))
        print(f"\nweights read per step {d['bytes'] / 2**20:.0f} MiB (4 layers, projections, the 262144 x 1024 Q6_K head)")
        for key, label in ((("ours", "q4_k_m", la), f"our {la}-layer c(1)"),
                           (("ours", "q4_k_m", lb), f"our {lb}-layer c(1)"),
                           (("ours", "q4_k_m", FULL_LAYERS), "our 60-layer c(1) (extrapolated)"),
                           (("llama", "q4_k_m", FULL_LAYERS), "llama.cpp 60-layer c(1) (extrapolated)")):
            if key in costs:
                print(f"draft step / {label} = {c_draft / costs[key][1]:.4f} ({1e3 * costs[key][1]:.1f} ms)")
        if d.get("others_pct") is not None:
            print(f"others % {d['others_pct']:.0f}")
        print()

    # ---- (c)
    tables = {}
    if "a" in sections and c_draft is not None:
        print("## (c) Model speedup E(k) c(1) / (c(k+1) + k c_draft), E(k) = (1 - a^(k+1)) / (1 - a)\n")
        srcs = [(("ours", "q4_k_m", FULL_LAYERS), "gemma4cpu, 60-layer 31B Q4_K_M (extrapolated)"),
                (("llama", "q4_k_m", FULL_LAYERS), f"{LLAMA_SHORT} target costs, 60-layer (extrapolated), "
                                                   f"with our draft step ({1e3 * c_draft:.1f} ms)"),
                (("ours", "q4_k_m", la), f"gemma4cpu, the {la}-layer file as measured (the e2e target)")]
        if a.q8:
            srcs += [(("ours", "q8_0", FULL_LAYERS), "gemma4cpu, 60-layer 31B Q8_0 (extrapolated; Q4_K_M drafter)"),
                     (("llama", "q8_0", FULL_LAYERS), f"{LLAMA_SHORT}, 60-layer Q8_0, with our draft step")]
        print("ideal (free verify and draft) = E(k): " + ", ".join(
            f"a={x:g}: " + "/".join(f"{expected_tokens(x, k):.2f}" for k in ks) for x in accepts) + "\n")
        for key, label in srcs:
            if key not in costs:
                continue
            tab = speedup_table(costs[key], c_draft, accepts, ks)
            tables[label] = tab
            print(f"### {label}\n")
            print(fmt_table(tab))
            g = tab.get(GOAL[0], {}).get(GOAL[1])
            bad = implausible(costs[key], spreads.get(key))
            if bad:
                print(f"\nWARNING: c(n) < c(1) beyond the noise bands for n = {', '.join(map(str, bad))}: "
                      "these costs are noise (rerun without --quick, or with more --a-runs, on a quieter "
                      "host); the speedups above are not a result")
            if g is not None:
                gf = model_speedup(floored(costs[key]), c_draft, GOAL[0], GOAL[1])
                verdict = "not judged: implausible costs" if bad else "met" if gf >= GOAL[2] else "not met"
                floor_note = f", {gf:.2f}x with c(n) >= c(1)" if gf != g else ""
                print(f"\na={GOAL[0]}, k={GOAL[1]}: {g:.2f}x{floor_note} (goal >= {GOAL[2]}x: "
                      f"{verdict}); c({GOAL[1] + 1})/c(1) = "
                      f"{costs[key][GOAL[1] + 1] / costs[key][1]:.3f}, c_draft/c(1) = {c_draft / costs[key][1]:.4f}\n")
        print("bold = the goal cell (a = 0.84, k = 3, goal >= 3.0x); * = the best k of the row.\n")
        R["c"] = {lab: {str(x): {str(k): v for k, v in row.items()} for x, row in tab.items()}
                  for lab, tab in tables.items()}

    # ---- (d), (e): one Engine with the assistant loaded
    eng_d = None
    if sections & set("de"):
        from gemma4cpu.engine import Engine

        eng_d = Engine(str(files[("q4_k_m", la)]), draft=str(asst), threads=T, cpus=cpus, n_ctx=n_ctx,
                       progress=False, spec_type="none")
    if "d" in sections:
        configs = [(x, 3) for x in accepts]
        if k_sweep:
            configs += [(0.84, k) for k in ks if (0.84, k) not in configs]
        print(f"## (d) End to end, controlled experiment: {la}-layer synthetic 31B target, replaying drafter "
              f"(assistant compute included), {tokens} tokens after a {a.prefix}-token prompt\n")
        log(f"[d] e2e, {len(configs)} configurations x {a.e2e_runs} runs ...")
        e = e2e(eng_d, a.prefix, tokens, configs, a.e2e_runs, cpus)
        R["d"] = {**e, "spec": {f"a={x:g} k={k}": v for (x, k), v in e["spec"].items()}}
        c_la = costs.get(("ours", "q4_k_m", la))
        c_60 = costs.get(("ours", "q4_k_m", FULL_LAYERS))
        rows = []
        for (x, k), v in e["spec"].items():
            s = v["stats"]
            pred = model_speedup(c_la, c_draft, x, k) if c_la and c_draft and k + 1 in c_la else None
            pred60 = model_speedup(c_60, c_draft, x, k) if c_60 and c_draft and k + 1 in c_60 else None
            # the same cost model with the tokens per round this run actually got
            real = ((s["mean_accepted"] + 1) * c_la[1] / round_cost(c_la, c_draft, k)
                    if c_la and c_draft and k + 1 in c_la and s["rounds"] else None)
            rows.append([f"{x:g}", k, s["drafted"], s["accepted"], fmt(100 * s["acceptance"], 1), by_pos(s),
                         fmt(s["mean_accepted"] + 1, 2), fmt(expected_tokens(x, k), 2),
                         fmt(e["plain_tps"], 2), fmt(v["tps"], 2), fmt(v["tps"] / e["plain_tps"], 2),
                         fmt(real, 2), fmt(pred, 2), fmt(pred60, 2), "yes" if v["same"] else "NO"])
        print(md_table(["a", "k", "drafted", "accepted", "accept %", "by position %", "tokens/round",
                        "E(k)", "plain t/s", "spec t/s", "speedup", f"model, {la} layers, this run's tokens/round",
                        f"model, {la} layers, E(k)", "model, 60 layers, E(k)", "same tokens"], rows))
        print(f"\nplain = spec_type 'none' in the same run ({a.stat} of {a.e2e_runs}: "
              f"{', '.join(f'{v:.2f}' for v in e['plain_runs'])} t/s); {e['n_generated']} tokens generated "
              f"(stop: {e['stop']}). decode t/s = tokens after the first / time after the first. "
              f"'model' columns: the formula of (c) with the costs of (a)/(b), at the tokens per round this run got "
              f"or at E(k) of the nominal a; 60 layers = the prediction for a real-depth 31B. "
              f"by position % = accepted / proposed at draft position i (cumulative: a^i in expectation). "
              f"others % {fmt(e['others_pct'], 0)}.\n")
        for (x, k), v in e["spec"].items():
            print(f"a={x:g} k={k}: {v['line']}; draft {1e3 * v['stats']['draft_s']:.0f} ms, verify "
                  f"{1e3 * v['stats']['verify_s']:.0f} ms, plain steps {1e3 * v['stats']['plain_s']:.0f} ms (last run)")
        print()

    if "e" in sections:
        print(f"## (e) Prefill with the drafter loaded: pp512 on the {la}-layer synthetic 31B target\n")
        from gemma4cpu.engine import Engine

        eng_p = Engine(str(files[("q4_k_m", la)]), threads=T, cpus=cpus, n_ctx=n_ctx, progress=False)
        log(f"[e] pp512 x {runs} runs each ...")
        pp = prefill_pair(eng_p, eng_d, 512, runs, cpus)
        close_model(eng_p.model)
        del eng_p
        R["e"] = pp
        print(md_table(["Engine", "pp512 t/s", "runs"], [
            ["without a drafter", fmt(pp["without_tps"], 2), ", ".join(f"{v:.2f}" for v in pp["runs_without"])],
            ["with the assistant loaded (draft=...)", fmt(pp["with_tps"], 2),
             ", ".join(f"{v:.2f}" for v in pp["runs_with"])]], "lrl"))
        print(f"\nratio with / without = {pp['ratio']:.3f} (goal >= 0.98: {'met' if pp['ratio'] >= 0.98 else 'not met'}); "
              f"both Engines alive, alternating; pp512 = GenerationStats.prefill_tps of a 512-token prompt on an "
              f"empty cache (max_tokens=1). others % {fmt(pp['others_pct'], 0)}\n")
    if eng_d is not None:
        close_model(eng_d.model)
        eng_d = None
        gc.collect()

    # ---- (f)
    if "f" in sections:
        from gemma4cpu.engine import Engine

        print("## (f) n-gram drafting on the real Gemma 3 270M Q4_K_M (copy-heavy completion prompts)\n")
        eng = Engine(threads=T, cpus=cpus, progress=False)
        prompts = dict(list(NGRAM_PROMPTS.items())[:2]) if a.quick else NGRAM_PROMPTS
        log(f"[f] n-gram, {len(prompts)} prompts x {a.e2e_runs} runs ...")
        ng = ngram_bench(eng, prompts, ng_tokens, a.e2e_runs, cpus)
        close_model(eng.model)
        R["f"] = ng
        rows = []
        for name, v in ng.items():
            rows.append([name, "none", "-", "-", "-", "-", fmt(v["plain_tps"], 1), "1.00", "-"])
            for mode, mv in v["modes"].items():
                s = mv["stats"]
                rows.append([name, mode, f"{s['accepted']}/{s['drafted']}", fmt(100 * s["acceptance"], 1), by_pos(s),
                             fmt(s["mean_accepted"] + 1, 2), fmt(mv["tps"], 1), fmt(mv["tps"] / v["plain_tps"], 2),
                             "yes" if mv["same"] else "NO"])
        print(md_table(["prompt", "drafting", "accepted/drafted", "accept %", "by position %", "tokens/round",
                        "decode t/s", "speedup", "same tokens"], rows))
        print(f"\n{ng_tokens} tokens per run, greedy; {a.stat} of {a.e2e_runs} alternating runs; speedup = decode t/s over "
              f"spec_type 'none' in the same run. Prompts (token counts): "
              + ", ".join(f"{n} {v['n_prompt']}" for n, v in ng.items()) + ".\n")
        for name, v in ng.items():
            for mode, mv in v["modes"].items():
                print(f"{name}, {mode}: {mv['line']}")
            print(f"{name}: plain output starts {v['text'][:100]!r}; others % {fmt(v['others_pct'], 0)}")
        print()

    elapsed = time.perf_counter() - t_start
    la_ = os.getloadavg()
    print(f"load at end {la_[0]:.2f} {la_[1]:.2f} {la_[2]:.2f}; total {elapsed:.0f} s")
    if a.json:
        R["elapsed_s"] = elapsed
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(R, indent=1, default=str) + "\n")
        log(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
