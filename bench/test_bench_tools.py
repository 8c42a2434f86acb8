"""Smoke tests of the bench tooling itself (CPU-list parsing, the bandwidth probe at a tiny size,
a tiny end-to-end kernel bench). Collected only with `pytest bench/`; `--benchmark-only` skips
them. They check that the tools run and produce sane output, never how fast anything is."""
from __future__ import annotations

import json
import math

import pytest

from bench import bench_kernels
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


def test_probe_cli_json(capsys):
    assert bw.main(["--gib", "0.015625", "--threads", "1", "--json", "-"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["results"][0]["threads"] == 1 and res["results"][0]["gbs_median"] > 0


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
