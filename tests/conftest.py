"""Shared fixtures: the `isa` fixture runs a test once per table this host can run, and fails
(not skips) when a table the CPU supports is missing from the build."""
import zlib

import numpy as np
import pytest

from gemma4cpu import isa as isa_mod
from gemma4cpu.ref.quants import act_error_bound, dequant_act, weight_magnitudes  # noqa: F401

ALL_ISAS = ["ref", "avx2", "avx512", "amx"]
QUANT_TYPES = ["Q4_0", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
FLOAT_TYPES = ["F32", "F16", "BF16"]
ALL_TYPES = FLOAT_TYPES + QUANT_TYPES


def pytest_report_header(config):
    return f"gemma4cpu kernels: {isa_mod.describe()}"


@pytest.fixture(params=ALL_ISAS)
def isa(request):
    name = request.param
    if name not in isa_mod.available():
        pytest.skip(f"this CPU/OS cannot run the {name} table (features: {', '.join(isa_mod.cpu_features())})")
    with isa_mod.use(name):
        yield name


@pytest.fixture
def rng(request):
    # a seed per test (stable across runs) so failures reproduce
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)
