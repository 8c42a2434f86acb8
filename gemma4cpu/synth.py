"""Random but valid weight data for tests and speed benchmarks.

Random bytes give a non-finite f16 scale about 3% of the time, so every scale field is
overwritten with a finite positive f16 in a realistic range. Timing does not depend on what
the weights mean, so this gives honest full-size benchmarks without downloading a model.
"""
from __future__ import annotations

import numpy as np

from gemma4cpu.kernels import row_bytes, type_id, TYPE_NAMES

# byte offsets of f16 scale fields inside each block
_SCALE_OFFSETS = {"Q4_0": [0], "Q5_0": [0], "Q8_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
_BLOCK_BYTES = {"Q4_0": 18, "Q5_0": 22, "Q8_0": 34, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def random_rows(t, n_rows: int, k: int, rng: np.random.Generator, scale: float = 0.02) -> np.ndarray:
    """(n_rows, row_bytes) uint8 of valid random blocks of type t (float types: N(0, scale))."""
    name = TYPE_NAMES[type_id(t)]
    rb = row_bytes(t, k)
    if name == "F32":
        return (rng.standard_normal((n_rows, k), dtype=np.float32) * np.float32(scale)).view(np.uint8)
    if name == "F16":
        return (rng.standard_normal((n_rows, k), dtype=np.float32) * scale).astype(np.float16).view(np.uint8)
    if name == "BF16":
        f = rng.standard_normal((n_rows, k), dtype=np.float32) * np.float32(scale)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    data = rng.integers(0, 256, size=(n_rows, rb), dtype=np.uint8)
    bb = _BLOCK_BYTES[name]
    blocks = data.reshape(-1, bb)
    # per-weight scale so that |w| ~ scale: sub-block scales are up to 63 (K) and quants up to 15-127
    qmax = {"Q4_0": 8, "Q5_0": 16, "Q8_0": 127, "Q4_K": 15 * 63, "Q5_K": 31 * 63, "Q6_K": 32 * 127}[name]
    for off in _SCALE_OFFSETS[name]:
        d = (rng.uniform(0.5, 1.5, size=blocks.shape[0]) * scale / qmax).astype(np.float16)
        blocks[:, off:off + 2] = d.view(np.uint8).reshape(-1, 2)
    return data
