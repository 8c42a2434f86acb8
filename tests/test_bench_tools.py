"""Smoke tests of the bench tooling itself (CPU-list parsing, the bandwidth probe at a tiny size,
a tiny end-to-end kernel bench), part of the normal test run (they lived in bench/, which the test
command does not collect). They check that the tools run and produce sane output, never how fast
anything is."""
from __future__ import annotations

import json
import math
import statistics

import pytest

from bench import bench_attn, bench_kernels
from bench.common import CpuNoise, header, md_table
from tools.numa import bandwidth as bw


def test_parse_cpu_list():
    assert bw.parse_cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert bw.parse_cpu_list("3,1,3") == [3, 1]
    for bad in ("", "3-1", "a"):
        with pytest.raises(ValueError):
            bw.parse_cpu_list(bad)


def test_probe_tiny():
    cpus = list(bw.ALLOWED_CPUS_AT_IMPORT)
    runs = bw.measure_runs(1, cpus, gib=1 / 64, runs=5, warmup=1)
    assert len(runs) == 5 and all(math.isfinite(v) and v > 0 for v in runs)
    assert bw.measure_read_bandwidth(len(cpus), cpus, 1 / 64) > 0
    assert bw.probe_kind() in ("avx2", "scalar")
    with pytest.raises(ValueError):
        bw.measure_runs(len(cpus) + 1, cpus, gib=1 / 64)


def test_probe_layouts():
    """measure_best keeps the read pattern with the highest median, and returns its own runs;
    a bad pattern is refused by the C side with a message, not read out of bounds."""
    cpus = list(bw.ALLOWED_CPUS_AT_IMPORT)
    lays = ((1, 0), (4, 256))
    runs, best, every = bw.measure_best(1, cpus, gib=1 / 64, runs=5, warmup=1, layouts=lays)
    assert set(every) == set(lays) and all(len(v) == 5 and min(v) > 0 for v in every.values())
    assert runs == every[best]
    assert statistics.median(runs) == max(statistics.median(v) for v in every.values())
    assert bw.layout_name((2, 0)) == "2 streams" and bw.layout_name((8, 512)) == "8 streams + prefetch 512 B"
    for bad in ((0, 0), (65, 0), (2, 100), (2, -64)):
        with pytest.raises(RuntimeError, match="bad read pattern"):
            bw.measure_layout(1, cpus, gib=1 / 64, runs=1, warmup=0, layout=bad)
    with pytest.raises(RuntimeError, match="too small"):  # 64 streams x 128 B need 8 KiB a thread
        bw.measure_layout(1, cpus, gib=4096 / bw.GIB, runs=1, warmup=0, layout=(64, 0))


def test_probe_cli_json(capsys):
    assert bw.main(["--gib", "0.015625", "--threads", "1", "--json", "-"]) == 0
    res = json.loads(capsys.readouterr().out)
    r = res["results"][0]
    assert r["threads"] == 1 and r["gbs_median"] > 0
    assert set(r["by_layout"]) == set(res["layouts"]) and r["layout"] in res["layouts"]
    assert r["gbs_median"] == max(r["by_layout"].values())


def test_header_and_table():
    h = header("t", threads=[1], quiet=True)
    assert h["isa_active"] and any(line.startswith("isa ") for line in h["lines"])
    assert md_table(["a", "b"], [[1, 2]]).splitlines()[1] == "|:---|---:|"
    n = CpuNoise().start()
    v = n.stop()
    assert v is None or 0.0 <= v <= 100.0


def test_bench_kernels_tiny(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = bench_kernels.main(["--types", "Q8_0", "--gib", "0.01", "--batches", "1,2", "--prefill", "4",
                             "--threads", "1", "--bw", "10", "--max-call-s", "0.01", "--min-mib", "1",
                             "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "| Q8_0 |" in text and "t(n)/t(1)" in text
    d = json.loads(out.read_text())
    batch = [r for r in d["results"] if r["group"] == "batch"]
    assert {r["n"] for r in batch} == {1, 2} and all(r["gbs"] > 0 for r in batch)
    assert [r["ratio_n1"] for r in batch if r["n"] == 1] == [1.0]
    assert any(r["group"] == "prefill" for r in d["results"])


def test_bench_attn_tiny(capsys):
    assert bench_attn.main(["--shapes", "4:40:4:2:64:16", "--reps", "2"]) == 0
    row = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| 4:40")]
    assert len(row) == 1
    cells = [c.strip() for c in row[0].strip("|").split("|")]
    assert cells[1] == "4 x 40, 4 / 2 x 64, 16" and float(cells[2]) > 0 and float(cells[4]) > 0
    # the flop count: rows at positions 36..39 see min(pos + 1, window) = 16 slots each
    r = bench_attn.run_one(bench_attn.parse_shape("4:40:4:2:64:16"), "q8_0", 1, 1)
    assert r["gflops"] == pytest.approx(4 * (4 * 16) * 64 * 4 / (r["min_ms"] * 1e-3) / 1e9)
    for bad in ("9:8:4:2:64", "4:40:3:2:64", "4:40:4:2:48", "4:40:4", "x"):
        with pytest.raises(ValueError):
            bench_attn.parse_shape(bad)
    with pytest.raises(SystemExit):
        bench_attn.main(["--against", "/nonexistent", "--shapes", "4:40:4:2:64"])


# ---- bench/bench_spec.py: the cost model and the command line (no model files) ----------------

def test_spec_cost_model():
    from bench import bench_spec as bs

    assert bs.expected_tokens(0.84, 3) == pytest.approx(1 + 0.84 + 0.84 ** 2 + 0.84 ** 3)
    assert bs.expected_tokens(0.84, 3) == pytest.approx(3.1383, abs=1e-4)   # the "ideal 3.1x"
    assert bs.expected_tokens(0.0, 5) == 1.0 and bs.expected_tokens(1.0, 4) == 5.0
    free = {n: 1.0 for n in range(1, 10)}                       # verify costs c(1), drafts are free
    assert bs.model_speedup(free, 0.0, 0.84, 3) == pytest.approx(bs.expected_tokens(0.84, 3))
    # llama.cpp's figures from the issue: c(4) = 1.49 c(1) -> about 2.1x at a = 0.84, k = 3
    assert bs.model_speedup({1: 1.0, 4: 1.49}, 0.0, 0.84, 3) == pytest.approx(2.106, abs=1e-3)
    assert bs.round_cost({1: 1.0, 4: 1.2}, 0.05, 3) == pytest.approx(1.35)
    ca = {n: 1.0 + 0.1 * n for n in range(1, 4)}
    cb = {n: 2.0 + 0.2 * n for n in range(1, 4)}
    c60 = bs.extrapolate(ca, cb, 6, 12)                         # (60 - 6) / 6 = 9 steps of cB - cA
    assert c60[1] == pytest.approx(1.1 + 9 * 1.1) and c60[3] == pytest.approx(1.3 + 9 * 1.3)
    with pytest.raises(ValueError):
        bs.extrapolate(ca, cb, 6, 6)
    tab = bs.speedup_table(free, 0.0, accepts=(0.5, 0.84), ks=(1, 2, 3, 9))
    assert set(tab[0.84]) == {1, 2, 3}                          # k = 9 needs c(10)
    assert bs.best_k(tab[0.84]) == 3
    md = bs.fmt_table(tab)
    assert "**3.14*" in md and md.splitlines()[0].startswith("| a \\ k | 1 | 2 | 3 |")
    # a noisy extrapolation can make c(n) < c(1) (seen: c60(4)/c60(1) = 0.98): flagged, not judged
    assert bs.implausible({1: 1.0, 2: 1.1, 3: 1.3}) == []
    assert bs.implausible({1: 1.0, 2: 1.1, 4: 0.98, 5: 0.5}) == [4, 5]
    # with noise bands: a dip inside s(n) + s(1) is not flagged, one beyond it is
    runs = {1: [0.9, 1.0, 1.0, 1.1], 4: [0.96, 0.98, 0.98, 1.0], 5: [0.5, 0.5, 0.5, 0.5]}
    s = bs.spread(runs)
    assert s[1] == pytest.approx((1.025 - 0.975) / 2) and s[5] == 0.0   # numpy's linear quartiles
    assert bs.implausible({1: 1.0, 4: 0.98, 5: 0.5}, s) == [5]
    assert bs.implausible({1: 1.0, 4: 0.96}, s) == [4]                   # 0.96 + 0.005 + 0.025 < 1
    # the verdict's costs: dips below c(1) raised to c(1), so noise cannot carry a speedup over the goal
    assert bs.floored({1: 1.0, 2: 0.9, 4: 1.2}) == {1: 1.0, 2: 1.0, 4: 1.2}
    flat = {n: 1.0 for n in range(1, 5)}
    assert bs.model_speedup(bs.floored({**flat, 4: 0.94}), 0.02, 0.84, 3) == bs.model_speedup(flat, 0.02, 0.84, 3)
    assert bs.model_speedup({**flat, 4: 0.94}, 0.02, 0.84, 3) > bs.model_speedup(flat, 0.02, 0.84, 3)
    # bands through the extrapolation: |1 - f| sA + f sB, f = 9 for 6 / 12 -> 60 layers
    s60 = bs.extrapolate_spread({1: 0.01, 2: 0.02}, {1: 0.03, 2: 0.0}, 6, 12)
    assert s60[1] == pytest.approx(8 * 0.01 + 9 * 0.03) and s60[2] == pytest.approx(8 * 0.02)


def test_spec_cli_arguments(capsys):
    from bench import bench_spec as bs

    for bad in (["--layers", "6"], ["--layers", "6,6"], ["--layers", "1,6"], ["--sections", "xyz"],
                ["--accept", "1.5"], ["--n-max", "1"], ["--runs", "0"], ["--threads", "99"]):
        with pytest.raises(SystemExit):
            bs.main(bad)
    capsys.readouterr()
    # section c alone needs no file (it reads the costs of a and b): the header, then nothing
    assert bs.main(["--sections", "c", "--no-llama"]) == 0
    out = capsys.readouterr().out
    assert "# gemma4cpu speculative decoding bench" in out and "isa " in out and "pinning" in out


def test_kernel_pair_harness(tmp_path):
    """bench/kernel_pair.c (ab_kernels.sh -t): two builds opened side by side in one process, the
    rows split over pinned threads. Built here against the reference products (the fastest to
    compile): the same library twice must give the same output, and a build whose products differ
    must be reported as differing."""
    import os
    import shutil
    import subprocess
    from pathlib import Path

    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    root = Path(__file__).resolve().parents[1]
    base = ["-std=c11", "-ffp-contract=off", "-fPIC", "-fno-strict-aliasing", "-O1", f"-I{root / 'csrc'}"]

    def lib(name, extra=(), more=()):
        objs = []
        for src in [root / "csrc" / "ref" / "gemm_ref.c", root / "csrc" / "ref" / "quant_ref.c", *more]:
            o = tmp_path / f"{name}.{src.name}.o"
            flags = extra if src.parent.name == "ref" else ()
            subprocess.run([cc, *base, *flags, "-c", str(src), "-o", str(o)], check=True)
            objs.append(str(o))
        out = tmp_path / f"{name}.so"
        subprocess.run([cc, "-shared", *objs, "-lm", "-o", str(out)], check=True)
        return str(out)

    a = lib("a")
    kp = tmp_path / "kp"
    subprocess.run([cc, "-O1", "-pthread", str(root / "bench" / "kernel_pair.c"), "-ldl", "-o", str(kp)], check=True)
    cpus = ",".join(str(c) for c in list(bw.ALLOWED_CPUS_AT_IMPORT)[:2])
    r = subprocess.run([str(kp), a, a, "ref", "q4_K", "512", "96", "3", "3", cpus], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "same output" in r.stdout and f"threads={len(cpus.split(','))} pairs=3" in r.stdout
    # a "new" build whose q4_K product moves its first row's result by one ulp
    wrap = tmp_path / "wrap.c"
    wrap.write_text("#include <math.h>\n#include <stddef.h>\n#include <stdint.h>\n"
                    "void real_q4k(const void *, size_t, const void *, size_t, float *, int64_t, int64_t, int64_t,"
                    " int64_t, int64_t);\n"
                    "void g4_gemm_q4_K_q8_K_ref(const void *w, size_t wrb, const void *x, size_t xrb, float *y,"
                    " int64_t ldy, int64_t n, int64_t k, int64_t r0, int64_t r1) {\n"
                    "    real_q4k(w, wrb, x, xrb, y, ldy, n, k, r0, r1);\n"
                    "    if (r0 < r1) y[r0] = nextafterf(y[r0], INFINITY);\n}\n")
    b = lib("b", ["-Dg4_gemm_q4_K_q8_K_ref=real_q4k"], [wrap])
    r = subprocess.run([str(kp), a, b, "ref", "q4_K", "512", "96", "3", "3", cpus], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "OUTPUT DIFFERS" in r.stdout
    for bad in (["ref", "q4_K", "500", "96", "1", "3", cpus], ["ref", "q4_K", "512", "96", "1", "3", "0;1"],
                ["ref", "q7_K", "512", "96", "1", "3", cpus], ["nosuchisa", "q4_K", "512", "96", "1", "3", cpus]):
        r = subprocess.run([str(kp), a, a, *bad], capture_output=True, text=True)
        assert r.returncode != 0 and r.stderr.strip(), bad
