"""pytest-benchmark setup for bench/ (run explicitly: `pytest bench/ --benchmark-only`; the normal
test run only collects tests/, see testpaths in pyproject.toml)."""
from __future__ import annotations

import os

import pytest

from bench.common import ALLOWED_CPUS_AT_IMPORT, header, parse_cpu_list


def bench_cpus() -> list[int]:
    """CPUs for the benchmark pool: $G4_BENCH_CPUS (taskset list) or the allowed CPUs, cut to
    $G4_BENCH_THREADS threads if set."""
    spec = os.environ.get("G4_BENCH_CPUS")
    cpus = parse_cpu_list(spec) if spec else list(ALLOWED_CPUS_AT_IMPORT)
    n = int(os.environ.get("G4_BENCH_THREADS", len(cpus)))
    return cpus[:n]


def pytest_report_header(config):
    h = header("gemma4cpu pytest-benchmark (bench/test_bench_kernels.py)", threads=[len(bench_cpus())],
               quiet=True)
    return h["lines"]


def pytest_benchmark_update_machine_info(config, machine_info):

    h = header("", quiet=True)
    keys = ("machine", "isa", "isa_active", "fallbacks", "allowed_cpus", "numa_nodes", "numpy", "loadavg")
    machine_info["gemma4cpu"] = {k: h[k] for k in keys}


@pytest.fixture(scope="session")
def pool():
    from gemma4cpu.kernels import Pool

    cpus = bench_cpus()
    p = Pool(len(cpus), cpus)
    yield p
    p.close()
