"""A short fuzzing run of the loader and the tokenizer in the test suite (the long run with the
README figures is tools/fuzz_gguf.py). Deterministic: fixed seeds, a fixed number of inputs.

What must hold: no input makes a target raise anything but the typed refusals (a crash) or run past
the 1 s hang limit; and the run is not vacuous: the mutants reach every stage (parse, tokenizer,
template, weights, forward) and many distinct errors. The driver itself is shown to catch a crash
and a hang."""
import os
import time

import pytest

from gemma4cpu import fuzz

N_GGUF = 1200
N_TEXT = 3000


def _stages(st):
    seen = set()
    for lab in st.labels:
        seen.update(p for p in lab.split(" | ") if "Error" not in p)
    return seen


def test_short_fuzz_loader(tmp_path):
    seeds = list(fuzz.seeds().values())
    fz = fuzz.RandomFuzzer(fuzz.run_gguf, seeds, rng_seed=8, hang_s=1.0, out_dir=tmp_path)
    st = fz.run(n=N_GGUF)
    assert st.inputs == N_GGUF
    assert st.crashes == 0, "\n".join(st.crash_examples)
    assert st.hangs == 0, sorted(os.listdir(tmp_path))
    assert {"parsed", "tokenizer", "template", "weights", "forward"} <= _stages(st)
    errors = {p for lab in st.labels for p in lab.split(" | ") if "Error" in p}
    assert len(errors) >= 60, sorted(errors)   # measured ~150 classes for this seed; mutations do bite


def test_short_fuzz_tokenizer(tmp_path):
    toks = fuzz.tokenizers()
    seeds = [bytes([i]) + t.encode() for i, t in enumerate(fuzz.TEXTS)]
    fz = fuzz.RandomFuzzer(lambda d: fuzz.run_tokenizer(d, toks), seeds, rng_seed=9, hang_s=1.0,
                           out_dir=tmp_path, mutator=fuzz.text_mutate, max_size=1 << 16)
    st = fz.run(n=N_TEXT)
    assert st.crashes == 0, "\n".join(st.crash_examples)
    assert st.hangs == 0
    assert any(lab.endswith("ok") for lab in st.labels) and "surrogates" in st.labels  # both paths ran


def test_driver_reports_crashes_and_hangs(tmp_path):
    """The same driver, given a target with a planted bug and a planted hang, reports both and saves
    the inputs: the zero counts above can be trusted."""
    seeds = list(fuzz.seeds().values())[:2]

    def buggy(data):
        if len(data) % 7 == 3:
            raise IndexError("planted")
        if len(data) % 7 == 5:
            while True:                       # a Python-level infinite loop: stopped by the alarm
                pass
        return fuzz.run_gguf(data, forward=False)

    fz = fuzz.RandomFuzzer(buggy, seeds, rng_seed=3, hang_s=0.2, out_dir=tmp_path)
    t0 = time.perf_counter()
    st = fz.run(n=60)
    assert st.crashes > 0 and st.hangs > 0
    assert "IndexError: planted" in st.crash_examples[0]
    names = os.listdir(tmp_path)
    assert any(n.startswith("crash-") for n in names) and any(n.startswith("hang-") for n in names)
    assert time.perf_counter() - t0 < 60 * 0.2 + 30     # every hang was cut at its limit


def test_mutator_round_trip_and_hostility():
    """scan/serialize are exact inverses on the seeds (so a mutant differs only where mutated), and
    the mutator produces each hostile class the issue lists."""
    import random
    for data in fuzz.seeds().values():
        d, fields = fuzz.scan(data)
        assert d is not None and fuzz.serialize(d) == data and fields
    rng = random.Random(5)
    base = fuzz.seeds()["gemma4_bpe"]
    kinds = set()
    from gemma4cpu.gguf_io import GGUFFile, GGUFFormatError
    for _ in range(1500):
        try:
            GGUFFile.from_bytes(fuzz.mutate(base, rng))
        except GGUFFormatError as e:
            msg = str(e)
            for k, pat in [("truncated", "truncated"), ("huge count", "implausible"), ("past end", "past the end"),
                           ("overlap", "overlap"), ("bad type", "unknown ggml type"), ("utf8", "UTF-8"),
                           ("alignment", "aligned"), ("duplicate", "duplicate"), ("dims", "dimension")]:
                if pat in msg:
                    kinds.add(k)
    assert kinds == {"truncated", "huge count", "past end", "overlap", "bad type", "utf8", "alignment",
                     "duplicate", "dims"}


def test_atheris_smoke(tmp_path):
    """The coverage-guided engine starts, runs and exits clean (a few hundred inputs)."""
    pytest.importorskip("atheris")
    if "asan" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("atheris brings its own libFuzzer runtime, which does not mix with a preloaded gcc libasan")
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, os.path.join(root, "tools", "fuzz_gguf.py"), "--engine", "atheris",
                        "--target", "gguf", "--runs", "300", "--seconds", "120", "--workers", "1",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "0 crashes, 0 hangs" in p.stdout, p.stdout
