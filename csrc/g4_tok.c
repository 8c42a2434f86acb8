/* Tokenizer core (see g4_tok.h). The algorithms follow llama.cpp's llama-vocab.cpp behaviour
 * exactly, because ids must be identical to llama.cpp's:
 *  - special partition: every occurrence of every special text is a candidate; candidates are
 *    taken longest first, then by token id, then leftmost, skipping any that overlap one already
 *    taken. This is what llama.cpp's per-token find() loop over shrinking fragments computes.
 *  - SPM: split into UTF-8 characters, repeatedly merge the adjacent pair whose concatenation is a
 *    token with the highest score (ties: leftmost), then map each piece to its id or to <0xXX>
 *    byte tokens.
 *  - BPE (gemma4): split into runs of '\n' and runs of everything else; a pure newline run that is a
 *    token is taken whole; otherwise merge by lowest merge rank (ties: leftmost).
 * The data structures are our own: open-addressing hash tables keyed by byte strings, a trie of
 * special texts, and one binary heap for both merge orders. */
#define _GNU_SOURCE            /* memmem */
#include "g4_tok.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t *slot;          /* token id, -1 = empty */
    uint64_t mask;
} g4_tmap;

typedef struct {            /* trie of special texts: edges in one hash table */
    uint64_t *key;          /* (node << 8 | byte) + 1, 0 = empty */
    int32_t *child;
    uint64_t mask;
    int32_t *term;          /* per node: token id ending here, -1 = none */
    int32_t n_nodes, cap_nodes;
} g4_trie;

struct g4_tok {
    int kind, escape_ws, add_space_prefix;
    int32_t n;
    const char *texts;      /* owned copy */
    int64_t *offs;
    float *scores;
    uint8_t *flags;
    g4_tmap map;
    int32_t byte_tok[256];
    /* BPE merges: key = bytes of left+right with the split point; value = rank */
    char *mtexts;
    int64_t *mstart;
    int32_t *mlen, *msplit, *mrank;
    int32_t *mslot;
    uint64_t mmask;
    int32_t n_merges;
    g4_trie trie;
};

static uint64_t hash_bytes(const char *s, int64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (int64_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static uint64_t pow2_at_least(uint64_t x) {
    uint64_t c = 16;
    while (c < x) c <<= 1;
    return c;
}

/* ---- token text -> id ---- */

int32_t g4_tok_lookup(const g4_tok *t, const char *s, int64_t n) {
    uint64_t i = hash_bytes(s, n) & t->map.mask;
    for (;;) {
        int32_t id = t->map.slot[i];
        if (id < 0) return -1;
        int64_t len = t->offs[id + 1] - t->offs[id];
        if (len == n && memcmp(t->texts + t->offs[id], s, (size_t)n) == 0) return id;
        i = (i + 1) & t->map.mask;
    }
}

static int tmap_build(g4_tok *t) {
    uint64_t cap = pow2_at_least((uint64_t)t->n * 2 + 1);
    t->map.slot = malloc(cap * sizeof(int32_t));
    if (!t->map.slot) return -1;
    memset(t->map.slot, 0xff, cap * sizeof(int32_t));
    t->map.mask = cap - 1;
    for (int32_t id = 0; id < t->n; id++) {
        const char *s = t->texts + t->offs[id];
        int64_t n = t->offs[id + 1] - t->offs[id];
        uint64_t i = hash_bytes(s, n) & t->map.mask;
        for (;;) {
            int32_t o = t->map.slot[i];
            if (o < 0) { t->map.slot[i] = id; break; }
            int64_t len = t->offs[o + 1] - t->offs[o];
            if (len == n && memcmp(t->texts + t->offs[o], s, (size_t)n) == 0) {
                t->map.slot[i] = id;   /* duplicate text: the later id wins, as in llama.cpp */
                break;
            }
            i = (i + 1) & t->map.mask;
        }
    }
    return 0;
}

/* ---- BPE merge ranks ---- */

static int32_t merge_rank(const g4_tok *t, const char *s, int32_t n, int32_t split) {
    if (!t->mslot) return -1;
    uint64_t i = (hash_bytes(s, n) ^ ((uint64_t)split * 0x9E3779B97F4A7C15ull)) & t->mmask;
    for (;;) {
        int32_t m = t->mslot[i];
        if (m < 0) return -1;
        if (t->mlen[m] == n && t->msplit[m] == split && memcmp(t->mtexts + t->mstart[m], s, (size_t)n) == 0)
            return t->mrank[m];
        i = (i + 1) & t->mmask;
    }
}

static int merges_build(g4_tok *t, int32_t n_merges, const char *mtexts, const int64_t *moffs) {
    int64_t total = moffs[n_merges] - moffs[0];
    t->mtexts = malloc((size_t)total + 1);
    t->mstart = malloc(sizeof(int64_t) * (size_t)(n_merges + 1));
    t->mlen = malloc(sizeof(int32_t) * (size_t)(n_merges + 1));
    t->msplit = malloc(sizeof(int32_t) * (size_t)(n_merges + 1));
    t->mrank = malloc(sizeof(int32_t) * (size_t)(n_merges + 1));
    uint64_t cap = pow2_at_least((uint64_t)n_merges * 2 + 1);
    t->mslot = malloc(cap * sizeof(int32_t));
    if (!t->mtexts || !t->mstart || !t->mlen || !t->msplit || !t->mrank || !t->mslot) return -1;
    memset(t->mslot, 0xff, cap * sizeof(int32_t));
    t->mmask = cap - 1;
    int64_t w = 0;
    int32_t m = 0;
    for (int32_t r = 0; r < n_merges; r++) {
        const char *s = mtexts + moffs[r];
        int64_t n = moffs[r + 1] - moffs[r];
        /* "left right": the separator is the first space at index >= 1 (as llama.cpp parses it) */
        int64_t sp = -1;
        for (int64_t i = 1; i < n; i++) if (s[i] == ' ') { sp = i; break; }
        if (sp < 0 || n - 1 > INT32_MAX) continue;   /* malformed merge: can never apply */
        int32_t len = (int32_t)(n - 1), split = (int32_t)sp;
        memcpy(t->mtexts + w, s, (size_t)sp);
        memcpy(t->mtexts + w + sp, s + sp + 1, (size_t)(n - sp - 1));
        const char *k = t->mtexts + w;
        uint64_t i = (hash_bytes(k, len) ^ ((uint64_t)split * 0x9E3779B97F4A7C15ull)) & t->mmask;
        int dup = 0;
        for (;;) {
            int32_t o = t->mslot[i];
            if (o < 0) break;
            if (t->mlen[o] == len && t->msplit[o] == split && memcmp(t->mtexts + t->mstart[o], k, (size_t)len) == 0) {
                dup = 1;   /* the first rank of a repeated merge wins (map emplace semantics) */
                break;
            }
            i = (i + 1) & t->mmask;
        }
        if (dup) continue;
        t->mstart[m] = w; t->mlen[m] = len; t->msplit[m] = split; t->mrank[m] = r;
        t->mslot[i] = m;
        w += len;
        m++;
    }
    t->n_merges = m;
    return 0;
}

/* ---- special-text trie ---- */

static int trie_grow_nodes(g4_trie *tr) {
    int32_t cap = tr->cap_nodes ? tr->cap_nodes * 2 : 1024;
    int32_t *term = realloc(tr->term, sizeof(int32_t) * (size_t)cap);
    if (!term) return -1;
    tr->term = term;
    tr->cap_nodes = cap;
    return 0;
}

static int32_t trie_child(const g4_trie *tr, int32_t node, uint8_t c) {
    uint64_t key = (((uint64_t)node << 8) | c) + 1;
    uint64_t i = (key * 0x9E3779B97F4A7C15ull >> 20) & tr->mask;
    for (;;) {
        if (tr->key[i] == 0) return -1;
        if (tr->key[i] == key) return tr->child[i];
        i = (i + 1) & tr->mask;
    }
}

static int trie_build(g4_tok *t) {
    g4_trie *tr = &t->trie;
    int64_t edges = 0;
    for (int32_t id = 0; id < t->n; id++)
        if (t->flags[id] & (G4_TOKF_CONTROL | G4_TOKF_USER)) edges += t->offs[id + 1] - t->offs[id];
    uint64_t cap = pow2_at_least((uint64_t)edges * 2 + 1);
    tr->key = calloc(cap, sizeof(uint64_t));
    tr->child = malloc(cap * sizeof(int32_t));
    if (!tr->key || !tr->child || trie_grow_nodes(tr)) return -1;
    tr->mask = cap - 1;
    tr->n_nodes = 1;
    tr->term[0] = -1;
    for (int32_t id = 0; id < t->n; id++) {
        if (!(t->flags[id] & (G4_TOKF_CONTROL | G4_TOKF_USER))) continue;
        const char *s = t->texts + t->offs[id];
        int64_t n = t->offs[id + 1] - t->offs[id];
        if (n == 0) continue;
        int32_t node = 0;
        for (int64_t j = 0; j < n; j++) {
            uint8_t c = (uint8_t)s[j];
            int32_t ch = trie_child(tr, node, c);
            if (ch < 0) {
                if (tr->n_nodes == tr->cap_nodes && trie_grow_nodes(tr)) return -1;
                ch = tr->n_nodes++;
                tr->term[ch] = -1;
                uint64_t key = (((uint64_t)node << 8) | c) + 1;
                uint64_t i = (key * 0x9E3779B97F4A7C15ull >> 20) & tr->mask;
                while (tr->key[i] != 0) i = (i + 1) & tr->mask;
                tr->key[i] = key;
                tr->child[i] = ch;
            }
            node = ch;
        }
        if (tr->term[node] < 0) tr->term[node] = id;   /* duplicate special text: lowest id */
    }
    return 0;
}

void g4_tok_free(g4_tok *t) {
    if (!t) return;
    free((void *)t->texts); free(t->offs); free(t->scores); free(t->flags); free(t->map.slot);
    free(t->mtexts); free(t->mstart); free(t->mlen); free(t->msplit); free(t->mrank); free(t->mslot);
    free(t->trie.key); free(t->trie.child); free(t->trie.term);
    free(t);
}

g4_tok *g4_tok_new(int kind, int32_t n, const char *texts, const int64_t *offs, const float *scores,
                   const uint8_t *flags, int32_t n_merges, const char *mtexts, const int64_t *moffs,
                   int escape_ws, int add_space_prefix, char *msg, size_t msg_len) {
    if (kind != G4_TOK_SPM && kind != G4_TOK_BPE) { snprintf(msg, msg_len, "unknown tokenizer kind %d", kind); return NULL; }
    if (n <= 0) { snprintf(msg, msg_len, "empty vocabulary"); return NULL; }
    if (kind == G4_TOK_SPM && !scores) { snprintf(msg, msg_len, "an SPM vocabulary needs scores"); return NULL; }
    g4_tok *t = calloc(1, sizeof(g4_tok));
    if (!t) goto oom;
    t->kind = kind; t->n = n; t->escape_ws = escape_ws; t->add_space_prefix = add_space_prefix;
    int64_t total = offs[n] - offs[0];
    char *tx = malloc((size_t)total + 1);
    t->texts = tx;
    t->offs = malloc(sizeof(int64_t) * (size_t)(n + 1));
    t->flags = malloc((size_t)n);
    if (!tx || !t->offs || !t->flags) goto oom;
    memcpy(tx, texts + offs[0], (size_t)total);
    for (int32_t i = 0; i <= n; i++) t->offs[i] = offs[i] - offs[0];
    memcpy(t->flags, flags, (size_t)n);
    if (scores) {
        t->scores = malloc(sizeof(float) * (size_t)n);
        if (!t->scores) goto oom;
        memcpy(t->scores, scores, sizeof(float) * (size_t)n);
    }
    if (tmap_build(t)) goto oom;
    for (int b = 0; b < 256; b++) {
        char buf[7];
        snprintf(buf, sizeof buf, "<0x%02X>", b);
        int32_t id = g4_tok_lookup(t, buf, 6);
        if (id < 0 && kind == G4_TOK_SPM) {          /* SPM also accepts the raw byte as a token */
            char c = (char)b;
            id = g4_tok_lookup(t, &c, 1);
        }
        t->byte_tok[b] = id;
    }
    if (kind == G4_TOK_BPE && n_merges > 0 && merges_build(t, n_merges, mtexts, moffs)) goto oom;
    if (trie_build(t)) goto oom;
    return t;
oom:
    g4_tok_free(t);
    snprintf(msg, msg_len, "out of memory building the tokenizer");
    return NULL;
}

/* ---- output buffer ---- */

typedef struct {
    int32_t *out;
    int64_t cap, n;
} g4_outbuf;

static inline void emit(g4_outbuf *o, int32_t id) {
    if (o->n < o->cap) o->out[o->n] = id;
    o->n++;
}

/* ---- merge machinery shared by SPM and BPE ---- */

typedef struct {
    int32_t prev, next;
    int64_t start;
    int32_t n;
} g4_sym;

typedef struct {
    double prio;            /* larger first: SPM score, BPE -rank */
    int32_t left, right, size;
} g4_bigram;

typedef struct {
    g4_bigram *a;
    int64_t n, cap;
} g4_heap;

static inline int bg_before(const g4_bigram *x, const g4_bigram *y) {
    return x->prio > y->prio || (x->prio == y->prio && x->left < y->left);
}

static int heap_push(g4_heap *h, g4_bigram b) {
    if (h->n == h->cap) {
        int64_t cap = h->cap ? h->cap * 2 : 256;
        g4_bigram *a = realloc(h->a, sizeof(g4_bigram) * (size_t)cap);
        if (!a) return -1;
        h->a = a; h->cap = cap;
    }
    int64_t i = h->n++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!bg_before(&b, &h->a[p])) break;
        h->a[i] = h->a[p];
        i = p;
    }
    h->a[i] = b;
    return 0;
}

static g4_bigram heap_pop(g4_heap *h) {
    g4_bigram top = h->a[0];
    g4_bigram last = h->a[--h->n];
    int64_t i = 0;
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        const g4_bigram *best = &last;
        if (l < h->n && bg_before(&h->a[l], best)) { m = l; best = &h->a[l]; }
        if (r < h->n && bg_before(&h->a[r], best)) { m = r; }
        if (m == i) break;
        h->a[i] = h->a[m];
        i = m;
    }
    if (h->n > 0) h->a[i] = last;
    return top;
}

typedef struct {
    const g4_tok *t;
    const char *b;          /* the (escaped) text being merged */
    g4_sym *sym;
    int64_t n_sym, cap_sym;
    g4_heap heap;
} g4_session;

static inline int utf8_len(uint8_t c) {
    static const int lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[c >> 4];
}

static int split_chars(g4_session *s, int64_t start, int64_t n) {
    if (s->cap_sym < n) {
        g4_sym *a = realloc(s->sym, sizeof(g4_sym) * (size_t)n);
        if (!a) return -1;
        s->sym = a; s->cap_sym = n;
    }
    int64_t k = 0, off = 0;
    while (off < n) {
        int64_t len = utf8_len((uint8_t)s->b[start + off]);
        if (len > n - off) len = n - off;
        s->sym[k].start = start + off;
        s->sym[k].n = (int32_t)len;
        s->sym[k].prev = (int32_t)k - 1;
        off += len;
        s->sym[k].next = off == n ? -1 : (int32_t)k + 1;
        k++;
    }
    s->n_sym = k;
    return 0;
}

static int try_bigram(g4_session *s, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return 0;
    const g4_tok *t = s->t;
    const char *p = s->b + s->sym[l].start;
    int32_t size = s->sym[l].n + s->sym[r].n;
    g4_bigram bg = {0, l, r, size};
    if (t->kind == G4_TOK_SPM) {
        int32_t id = g4_tok_lookup(t, p, size);
        if (id < 0) return 0;
        bg.prio = t->scores[id];
    } else {
        int32_t rank = merge_rank(t, p, size, s->sym[l].n);
        if (rank < 0) return 0;
        bg.prio = -(double)rank;
    }
    return heap_push(&s->heap, bg);
}

static int merge_all(g4_session *s) {
    s->heap.n = 0;
    for (int32_t i = 1; i < (int32_t)s->n_sym; i++)
        if (try_bigram(s, i - 1, i)) return -1;
    while (s->heap.n > 0) {
        g4_bigram bg = heap_pop(&s->heap);
        g4_sym *l = &s->sym[bg.left], *r = &s->sym[bg.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != bg.size) continue;   /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) s->sym[r->next].prev = bg.left;
        if (try_bigram(s, l->prev, bg.left) || try_bigram(s, bg.left, l->next)) return -1;
    }
    return 0;
}

static void emit_symbols(g4_session *s, g4_outbuf *o) {
    const g4_tok *t = s->t;
    if (s->n_sym == 0) return;
    for (int32_t i = 0; i != -1; i = s->sym[i].next) {
        const g4_sym *y = &s->sym[i];
        if (y->n == 0) continue;
        int32_t id = g4_tok_lookup(t, s->b + y->start, y->n);
        if (id >= 0) { emit(o, id); continue; }
        for (int32_t j = 0; j < y->n; j++) {          /* byte fallback */
            int32_t bt = t->byte_tok[(uint8_t)s->b[y->start + j]];
            if (bt >= 0) emit(o, bt);
        }
    }
}

/* escape ' ' -> U+2581 into a fresh buffer (optionally with a leading space) */
static char *escape(const char *s, int64_t n, int esc, int prefix, int64_t *out_n) {
    char *b = malloc((size_t)(n + 1) * 3 + 1);
    if (!b) return NULL;
    int64_t w = 0;
    if (prefix) {
        if (esc) { b[w++] = (char)0xE2; b[w++] = (char)0x96; b[w++] = (char)0x81; }
        else b[w++] = ' ';
    }
    for (int64_t i = 0; i < n; i++) {
        if (esc && s[i] == ' ') { b[w++] = (char)0xE2; b[w++] = (char)0x96; b[w++] = (char)0x81; }
        else b[w++] = s[i];
    }
    *out_n = w;
    return b;
}

static int encode_text(g4_session *s, const char *text, int64_t n, int prefix, g4_outbuf *o) {
    const g4_tok *t = s->t;
    int64_t bn;
    char *b = escape(text, n, t->kind == G4_TOK_SPM ? 1 : t->escape_ws, prefix, &bn);
    if (!b) return -1;
    s->b = b;
    int rc = 0;
    if (t->kind == G4_TOK_SPM) {
        rc = split_chars(s, 0, bn);
        if (!rc) rc = merge_all(s);
        if (!rc) emit_symbols(s, o);
    } else {
        int64_t i = 0;
        while (i < bn && !rc) {                      /* words: runs of '\n' or of anything else */
            int nl = b[i] == '\n';
            int64_t j = i;
            while (j < bn && (b[j] == '\n') == nl) j++;
            int32_t whole = nl ? g4_tok_lookup(t, b + i, j - i) : -1;
            if (whole >= 0) {
                emit(o, whole);
            } else {
                rc = split_chars(s, i, j - i);
                if (!rc) rc = merge_all(s);
                if (!rc) emit_symbols(s, o);
            }
            i = j;
        }
    }
    free(b);
    s->b = NULL;
    return rc;
}

/* ---- special partition ---- */

typedef struct {
    int64_t pos;
    int32_t len, id;
} g4_match;

static int match_cmp(const void *a, const void *b) {
    const g4_match *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    return x->pos < y->pos ? -1 : (x->pos > y->pos);
}

static int match_pos_cmp(const void *a, const void *b) {
    const g4_match *x = a, *y = b;
    return x->pos < y->pos ? -1 : (x->pos > y->pos);
}

/* Candidates (every occurrence of every special text) are kept while there are at most this many
 * (-1: 4 per text byte + 65536). Nested special texts (whitespace runs of 1..31 in Gemma, or a
 * hostile vocabulary's "a", "aa", ... "a"*1000) give up to one per byte and nesting level; past
 * the limit the partition is computed per special text instead (same result, O(n) memory). */
static int64_t g4_match_limit = -1;

void g4_tok_set_match_limit(int64_t limit) { g4_match_limit = limit; }

static int id_len_cmp(const void *a, const void *b, void *arg) {
    const g4_tok *t = arg;
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const int64_t lx = t->offs[x + 1] - t->offs[x], ly = t->offs[y + 1] - t->offs[y];
    if (lx != ly) return lx > ly ? -1 : 1;
    return x < y ? -1 : (x > y);
}

/* The partition without the candidate list: the special texts that occur (one trie walk), longest
 * first, then by id; each one's occurrences leftmost first, taken when they overlap nothing taken
 * (llama.cpp's find loop over the remaining fragments). Fills m (capacity n) sorted by position;
 * returns the count, or -1 on allocation failure. */
static int64_t partition_per_text(const g4_tok *t, const char *s, int64_t n, int parse_special, g4_match *m,
                                  uint8_t *busy) {
    const g4_trie *tr = &t->trie;
    uint8_t *seen = calloc((size_t)t->n, 1);
    int32_t *ids = NULL;
    int64_t nid = 0, capid = 0, kept = 0;
    if (!seen) return -1;
    for (int64_t p = 0; p < n; p++) {
        int32_t node = 0;
        for (int64_t j = p; j < n; j++) {
            node = trie_child(tr, node, (uint8_t)s[j]);
            if (node < 0) break;
            int32_t id = tr->term[node];
            if (id < 0 || seen[id]) continue;
            if ((t->flags[id] & G4_TOKF_USER) || ((t->flags[id] & G4_TOKF_CONTROL) && parse_special)) {
                if (nid == capid) {
                    int64_t c2 = capid ? capid * 2 : 64;
                    int32_t *a = realloc(ids, sizeof(int32_t) * (size_t)c2);
                    if (!a) { free(ids); free(seen); return -1; }
                    ids = a; capid = c2;
                }
                seen[id] = 1;
                ids[nid++] = id;
            }
        }
    }
    free(seen);
    qsort_r(ids, (size_t)nid, sizeof(int32_t), id_len_cmp, (void *)t);
    for (int64_t k = 0; k < nid; k++) {
        const char *tx = t->texts + t->offs[ids[k]];
        const int64_t len = t->offs[ids[k] + 1] - t->offs[ids[k]];
        int64_t q = 0;
        while (q + len <= n) {
            const char *hit = memmem(s + q, (size_t)(n - q), tx, (size_t)len);
            if (!hit) break;
            const int64_t pos = hit - s;
            int64_t last_busy = -1;           /* an occurrence starting at or before it overlaps it too */
            for (int64_t b = len - 1; b >= 0; b--) if (busy[pos + b]) { last_busy = pos + b; break; }
            if (last_busy >= 0) { q = last_busy + 1; continue; }
            memset(busy + pos, 1, (size_t)len);
            m[kept].pos = pos; m[kept].len = (int32_t)len; m[kept].id = ids[k];
            kept++;
            q = pos + len;
        }
    }
    free(ids);
    qsort(m, (size_t)kept, sizeof(g4_match), match_pos_cmp);
    return kept;
}

int64_t g4_tok_encode(const g4_tok *t, const char *s, int64_t n, int parse_special,
                      int32_t *out, int64_t cap) {
    g4_outbuf o = {out, cap, 0};
    g4_session ss = {t, NULL, NULL, 0, 0, {NULL, 0, 0}};
    g4_match *m = NULL;
    uint8_t *busy = NULL;
    int64_t nm = 0, capm = 0, rc = 0, kept = 0;
    const int64_t limit = g4_match_limit >= 0 ? g4_match_limit : 4 * n + 65536;
    int per_text = 0;
    const g4_trie *tr = &t->trie;
    for (int64_t p = 0; p < n && !per_text; p++) {   /* every occurrence of every special text */
        int32_t node = 0;
        for (int64_t j = p; j < n; j++) {
            node = trie_child(tr, node, (uint8_t)s[j]);
            if (node < 0) break;
            int32_t id = tr->term[node];
            if (id < 0) continue;
            if ((t->flags[id] & G4_TOKF_USER) || ((t->flags[id] & G4_TOKF_CONTROL) && parse_special)) {
                if (nm >= limit) { per_text = 1; break; }
                if (nm == capm) {
                    int64_t c2 = capm ? capm * 2 : 64;
                    g4_match *a = realloc(m, sizeof(g4_match) * (size_t)c2);
                    if (!a) { rc = -1; goto done; }
                    m = a; capm = c2;
                }
                m[nm].pos = p; m[nm].len = (int32_t)(j - p + 1); m[nm].id = id;
                nm++;
            }
        }
    }
    if (per_text) {
        free(m);
        m = malloc(sizeof(g4_match) * (size_t)(n > 0 ? n : 1));
        busy = calloc((size_t)n, 1);
        if (!m || !busy) { rc = -1; goto done; }
        kept = partition_per_text(t, s, n, parse_special, m, busy);
        if (kept < 0) { rc = -1; goto done; }
    } else if (nm > 0) {                             /* longest first, then id, then leftmost */
        qsort(m, (size_t)nm, sizeof(g4_match), match_cmp);
        busy = calloc((size_t)n, 1);
        if (!busy) { rc = -1; goto done; }
        for (int64_t k = 0; k < nm; k++) {
            int free_run = 1;
            for (int32_t q = 0; q < m[k].len; q++) if (busy[m[k].pos + q]) { free_run = 0; break; }
            if (!free_run) continue;
            memset(busy + m[k].pos, 1, (size_t)m[k].len);
            m[kept++] = m[k];
        }
        qsort(m, (size_t)kept, sizeof(g4_match), match_pos_cmp);
    }
    int64_t at = 0;
    int prev_special = 1;
    for (int64_t k = 0; k <= kept; k++) {
        int64_t end = k < kept ? m[k].pos : n;
        if (end > at) {
            if (encode_text(&ss, s + at, end - at, t->add_space_prefix && prev_special, &o)) { rc = -1; goto done; }
            prev_special = 0;
        }
        if (k < kept) {
            emit(&o, m[k].id);
            at = m[k].pos + m[k].len;
            prev_special = 1;
        }
    }
    rc = o.n;
done:
    free(m); free(busy); free(ss.sym); free(ss.heap.a);
    return rc;
}
