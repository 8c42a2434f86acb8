/* Tokenizer core: llama.cpp-identical SentencePiece (score-driven bigram merges) and Gemma 4 BPE
 * (rank-driven merges over newline-split words), with special-token partitioning done the way
 * llama.cpp does it (longest special text first, then leftmost), byte fallback to <0xXX>.
 * Plain C, no SIMD: tokenization is branchy and memory-bound; correctness is what matters. */
#ifndef G4_TOK_H
#define G4_TOK_H

#include <stddef.h>
#include <stdint.h>

enum { G4_TOK_SPM = 0, G4_TOK_BPE = 1 };

/* per-token flags given by the caller (derived from tokenizer.ggml.token_type and llama.cpp's
 * text-based overrides) */
enum {
    G4_TOKF_CONTROL = 1,       /* control or unknown: matched as special only when parse_special */
    G4_TOKF_USER = 2,          /* user-defined: always matched as special text */
};

typedef struct g4_tok g4_tok;

/* texts: all token texts concatenated (UTF-8 bytes), token i = texts[offs[i] .. offs[i+1]).
 * scores: SPM merge priority per token (may be NULL for BPE). flags: G4_TOKF_* per token.
 * merges (BPE only): n_merges strings "left right" concatenated likewise (moffs: n_merges+1).
 * escape_ws: replace ' ' by U+2581 before merging. Returns NULL with msg filled on failure. */
g4_tok *g4_tok_new(int kind, int32_t n, const char *texts, const int64_t *offs, const float *scores,
                   const uint8_t *flags, int32_t n_merges, const char *mtexts, const int64_t *moffs,
                   int escape_ws, int add_space_prefix, char *msg, size_t msg_len);
void g4_tok_free(g4_tok *t);

/* id of an exact token text, or -1 */
int32_t g4_tok_lookup(const g4_tok *t, const char *s, int64_t n);

/* Tokenize n bytes of UTF-8 (no BOS/EOS: the caller adds those). Writes at most cap ids to out
 * and returns how many ids the text produces (> cap: call again with a larger buffer), or -1
 * on allocation failure. */
int64_t g4_tok_encode(const g4_tok *t, const char *s, int64_t n, int parse_special,
                      int32_t *out, int64_t cap);

/* Testing: the candidate count above which the special partition is computed per special text
 * (-1 = the default, 4 per byte + 65536; 0 = always per text). Both give the same ids. */
void g4_tok_set_match_limit(int64_t limit);

#endif
