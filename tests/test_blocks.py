"""Block sizes pinned three ways: C sizeof (via the kernels' type table), numpy dtypes, gguf."""
import gguf
import pytest

from gemma4cpu.kernels import TYPE_IDS, type_info
from gemma4cpu.ref import blocks

GQT = gguf.GGMLQuantizationType


@pytest.mark.parametrize("name", list(TYPE_IDS))
def test_block_sizes_match_gguf(name):
    bs, bb, _, _ = type_info(name)
    assert (bs, bb) == tuple(gguf.GGML_QUANT_SIZES[GQT[name]])
    if name in blocks.BY_TYPE:
        assert blocks.BY_TYPE[name].itemsize == bb


def test_q8_K_dtype_matches_c():
    # block_q8_K: float d, int8 qs[256], int16 bsums[16] = 292 bytes (static_assert in g4_blocks.h)
    assert blocks.block_q8_K.itemsize == 292
    from gemma4cpu import _kernels
    assert _kernels.act_row_bytes(TYPE_IDS["Q4_K"], 256) == 292
    assert _kernels.act_row_bytes(TYPE_IDS["Q8_0"], 32) == 34


def test_unsupported_type_is_refused():
    with pytest.raises(ValueError, match="unsupported"):
        type_info("IQ2_XXS")
    with pytest.raises(ValueError, match="unsupported"):
        type_info(3)  # Q4_1: not a type Gemma GGUFs use, not supported
