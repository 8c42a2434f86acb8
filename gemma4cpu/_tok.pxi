# Tokenizer core wrapper (included by _kernels.pyx): owns a g4_tok built from the vocabulary and
# turns Python str into ids with the GIL released. The algorithms are in csrc/g4_tok.c.
from libc.stdint cimport int32_t, int64_t, uint8_t


cdef extern from "g4_tok.h" nogil:
    ctypedef struct g4_tok:
        pass
    g4_tok *g4_tok_new(int kind, int32_t n, const char *texts, const int64_t *offs, const float *scores,
                       const uint8_t *flags, int32_t n_merges, const char *mtexts, const int64_t *moffs,
                       int escape_ws, int add_space_prefix, char *msg, size_t msg_len)
    void g4_tok_free(g4_tok *t)
    int32_t g4_tok_lookup(const g4_tok *t, const char *s, int64_t n)
    int64_t g4_tok_encode(const g4_tok *t, const char *s, int64_t n, int parse_special,
                          int32_t *out, int64_t cap)
    void g4_tok_set_match_limit(int64_t limit)


def tok_set_match_limit(int64_t limit):
    """Testing: candidate count above which the special partition runs per special text (-1: default,
    0: always). The ids are the same either way (tests/test_tokenizer.py checks it)."""
    g4_tok_set_match_limit(limit)


def _blob(strings):
    """UTF-8 bytes of all strings concatenated and their (n+1,) int64 offsets."""
    enc = [s.encode("utf-8") for s in strings]
    offs = np.zeros(len(enc) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in enc], out=offs[1:])
    return b"".join(enc), offs


cdef class TokCore:
    """kind: 0 = SPM (scores), 1 = BPE (merges). flags: uint8 per token (1 control/unknown,
    2 user-defined)."""
    cdef g4_tok *t
    cdef readonly int n_vocab

    def __cinit__(self, int kind, list tokens, scores, flags, merges=None, bint escape_ws=True,
                  bint add_space_prefix=False):
        self.t = NULL
        blob, offs = _blob(tokens)
        cdef const int64_t[::1] ov = offs
        cdef const uint8_t[::1] fv = np.ascontiguousarray(flags, dtype=np.uint8)
        if fv.shape[0] != len(tokens):
            raise ValueError(f"{fv.shape[0]} token flags for {len(tokens)} tokens")
        cdef const float[::1] sv
        cdef const float *sp = NULL
        if scores is not None:
            sv = np.ascontiguousarray(scores, dtype=np.float32)
            if sv.shape[0] != len(tokens):
                raise ValueError(f"{sv.shape[0]} token scores for {len(tokens)} tokens")
            sp = &sv[0]
        mblob, moffs = _blob(merges or [])
        cdef const int64_t[::1] mv = moffs
        cdef const char *tb = blob
        cdef const char *mb = mblob
        cdef char msg[256]
        msg[0] = 0
        self.t = g4_tok_new(kind, len(tokens), tb, &ov[0], sp, &fv[0], len(merges or []), mb, &mv[0],
                            escape_ws, add_space_prefix, msg, sizeof(msg))
        if self.t == NULL:
            raise ValueError(f"tokenizer: {msg.decode()}")
        self.n_vocab = len(tokens)

    def __dealloc__(self):
        if self.t != NULL:
            g4_tok_free(self.t)

    def lookup(self, str text):
        b = text.encode("utf-8")
        return g4_tok_lookup(self.t, b, len(b))

    def encode(self, str text, bint parse_special=False):
        """ids (int32 numpy array) of text, without BOS/EOS."""
        b = text.encode("utf-8")
        cdef const char *p = b
        cdef int64_t n = len(b)
        cdef int64_t cap = n + 16, got
        cdef int32_t[::1] ov
        while True:
            out = np.empty(cap, dtype=np.int32)
            ov = out
            with nogil:
                got = g4_tok_encode(self.t, p, n, parse_special, &ov[0], cap)
            if got < 0:
                raise MemoryError("tokenizer: out of memory")
            if got <= cap:
                return out[:got]
            cap = got
