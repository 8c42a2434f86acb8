"""numpy structured dtypes of the GGUF blocks (itemsize pinned to the C sizeof in tests)."""
import numpy as np

block_q4_0 = np.dtype([("d", "<f2"), ("qs", "u1", 16)])
block_q5_0 = np.dtype([("d", "<f2"), ("qh", "u1", 4), ("qs", "u1", 16)])
block_q8_0 = np.dtype([("d", "<f2"), ("qs", "i1", 32)])
block_q4_K = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)])
block_q5_K = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qh", "u1", 32), ("qs", "u1", 128)])
block_q6_K = np.dtype([("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2")])
block_q8_K = np.dtype([("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16)])

BY_TYPE = {"Q4_0": block_q4_0, "Q5_0": block_q5_0, "Q8_0": block_q8_0, "Q4_K": block_q4_K,
           "Q5_K": block_q5_K, "Q6_K": block_q6_K}
