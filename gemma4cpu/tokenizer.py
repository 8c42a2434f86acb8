"""Tokenizer built from a GGUF vocabulary, giving the same ids as llama.cpp.

Two vocabulary kinds are supported, as GGUF names them in `tokenizer.ggml.model`:
- "llama": SentencePiece with scores (Gemma 3). Spaces become U+2581 and pieces merge pairwise
  by the score of the merged token.
- "gemma4": BPE with `tokenizer.ggml.merges` (Gemma 4). Spaces become U+2581, the text is split
  only into newline runs and other runs, and pieces merge by merge rank.
Both fall back to `<0xXX>` byte tokens for characters the vocabulary lacks, and both split out
special tokens first: user-defined tokens (Gemma's whitespace runs, HTML tags) always, control
tokens (`<start_of_turn>`, `<|turn>`, ...) only with `parse_special=True`.

Why not HF `tokenizers`: a Gemma 3 GGUF stores scores, not merges; deriving merges takes ~515k
pairs and ~6.5 s per load here, its added-token matching is leftmost-longest where llama.cpp takes
longest-first, and it would be one more runtime dependency. The core is C (csrc/g4_tok.c); this
module only reads the vocabulary, applies llama.cpp's attribute rules, adds BOS/EOS and
detokenizes. tests/test_tokenizer.py checks ids against llama.cpp's on a fixed corpus.
"""
from __future__ import annotations

import re

import numpy as np

from gemma4cpu import _kernels
from gemma4cpu.gguf_io import GGUFFormatError

_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # a byte token's text; anything else prints as text

# tokenizer.ggml.token_type values
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# texts llama.cpp treats as end of generation (and forces to control type); only those present
# in a vocabulary matter
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>",
              "<|eom_id|>", "<EOT>", "<|end_of_text|>", "<eos>", "<turn|>", "<|tool_response>")


class TokenizerError(GGUFFormatError):
    """A vocabulary this tokenizer cannot use (names the key or token). A GGUFFormatError: the
    vocabulary comes from the model file."""


def _str_key(kv, key, default=None):
    v = kv.get(key, default)
    if v is not None and not isinstance(v, str):
        raise TokenizerError(f"{key} must be a string, got {type(v).__name__}")
    return v


def _array(v, kinds: str, key: str, dtype) -> np.ndarray:
    """A numeric metadata array (numpy from a GGUF file, or a list given in code) as a fresh `dtype`
    array; strings, nested or ragged lists are a TokenizerError naming the key."""
    try:
        a = np.asarray(v) if isinstance(v, (np.ndarray, list, tuple)) else None
    except ValueError:
        a = None
    if a is None or a.ndim != 1 or (a.size and a.dtype.kind not in kinds):
        raise TokenizerError(f"{key} must be a numeric array, got {type(v).__name__}")
    return a.astype(dtype)


def _bool_key(kv, key, default: bool) -> bool:
    v = kv.get(key, default)
    if isinstance(v, (bool, np.bool_)) or (isinstance(v, (int, np.integer)) and v in (0, 1)):
        return bool(v)
    raise TokenizerError(f"{key} must be a bool, got {v!r:.40}")


class Tokenizer:
    """`encode(text, add_bos=True, parse_special=False)` -> list of ids; `decode(ids)` -> str;
    `piece(id)` -> bytes of one token's text as it is printed. `bos_id`, `eos_id`, `eog_ids`,
    `n_vocab`, `kind` ("spm" or "bpe")."""

    def __init__(self, kv: dict):
        model = _str_key(kv, "tokenizer.ggml.model")
        if model is None:
            raise TokenizerError("GGUF has no tokenizer (key tokenizer.ggml.model is missing)")
        tokens = kv.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list) or not tokens:
            raise TokenizerError("tokenizer.ggml.tokens is missing or empty")
        n = len(tokens)
        if n > (1 << 31) - 1:
            raise TokenizerError(f"tokenizer.ggml.tokens has {n} entries (token ids are int32)")
        types = kv.get("tokenizer.ggml.token_type")
        types = np.full(n, NORMAL, np.int32) if types is None else _array(types, "iu", "tokenizer.ggml.token_type",
                                                                          np.int32)
        if types.shape != (n,):
            raise TokenizerError(f"tokenizer.ggml.token_type has {types.size} entries for {n} tokens")
        scores = kv.get("tokenizer.ggml.scores")
        if scores is not None:
            scores = _array(scores, "fiu", "tokenizer.ggml.scores", np.float32)
            if scores.shape != (n,):
                raise TokenizerError(f"tokenizer.ggml.scores has {scores.size} entries for {n} tokens")
        merges = None
        pre = _str_key(kv, "tokenizer.ggml.pre", "")
        if model == "llama":
            self.kind = "spm"
            if scores is None:
                raise TokenizerError("SentencePiece vocabulary (tokenizer.ggml.model = 'llama') "
                                     "needs tokenizer.ggml.scores")
            escape_ws, default_bos = True, True
            self.add_space_prefix = _bool_key(kv, "tokenizer.ggml.add_space_prefix", True)
        elif model == "gemma4":
            self.kind = "bpe"
            merges = kv.get("tokenizer.ggml.merges")
            if not isinstance(merges, list) or not merges:
                raise TokenizerError("BPE vocabulary (tokenizer.ggml.model = 'gemma4') needs "
                                     "tokenizer.ggml.merges")
            if pre not in ("", "gemma4"):
                raise TokenizerError(f"tokenizer.ggml.pre = {pre!r} is not supported with "
                                     "tokenizer.ggml.model = 'gemma4' (expected 'gemma4')")
            escape_ws, default_bos = True, True
            self.add_space_prefix = False
        elif model == "none":      # no tokenizer (e.g. gemma4cpu.convert's placeholder vocab): ids only
            self.kind = "none"
            escape_ws, default_bos = False, False
            self.add_space_prefix = False
        else:
            raise TokenizerError(f"tokenizer.ggml.model = {model!r} is not supported "
                                 "(supported: 'llama' for Gemma 3, 'gemma4' for Gemma 4, 'none' for ids only)")
        self.tokens = tokens
        self.n_vocab = n
        index = {t: i for i, t in enumerate(tokens)}          # later duplicates win, as in llama.cpp

        def special(key, default):
            v = kv.get(key, default)
            if v is None:
                return None
            if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)):
                raise TokenizerError(f"{key} must be an integer token id, got {v!r:.40}")
            if not 0 <= int(v) < n:
                raise TokenizerError(f"{key} = {v} is outside the vocabulary of {n} tokens")
            return int(v)

        self.bos_id = special("tokenizer.ggml.bos_token_id", index.get("<bos>"))
        self.eos_id = special("tokenizer.ggml.eos_token_id", index.get("<eos>"))
        self.add_bos = _bool_key(kv, "tokenizer.ggml.add_bos_token", default_bos) or model == "gemma4"
        self.add_eos = _bool_key(kv, "tokenizer.ggml.add_eos_token", False)
        if self.add_bos and self.bos_id is None:
            raise TokenizerError("the vocabulary adds BOS but has no tokenizer.ggml.bos_token_id")

        # llama.cpp's text-based rules: end-of-generation texts become control tokens, except that
        # a vocabulary with <|tool_response> (Gemma 4) keeps '</s>' a normal token
        eog = {i for t in _EOG_TEXTS if (i := index.get(t)) is not None}
        if "<|tool_response>" in index and "</s>" in index:
            s_id = index["</s>"]
            eog.discard(s_id)
            types[s_id] = NORMAL
        for i in eog:
            if types[i] != CONTROL and types[i] != UNKNOWN:
                types[i] = CONTROL
        if self.eos_id is not None:
            eog.add(self.eos_id)
        self.eog_ids = frozenset(eog)
        self.types = types

        flags = np.zeros(n, np.uint8)
        flags[(types == CONTROL) | (types == UNKNOWN)] = 1
        flags[types == USER_DEFINED] = 2
        self._core = None if self.kind == "none" else _kernels.TokCore(
            0 if self.kind == "spm" else 1, tokens, scores, flags, merges, escape_ws, self.add_space_prefix)
        self._pieces = None

    # ---- text -> ids ----
    def encode(self, text: str, add_bos: bool = True, parse_special: bool = False,
               add_eos: bool | None = None) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be str, not {type(text).__name__}")
        if self._core is None:
            raise TokenizerError("this model's vocabulary has no tokenizer (tokenizer.ggml.model = 'none'): "
                                 "give the prompt as token ids")
        ids = self._core.encode(text, parse_special).tolist()
        if add_bos and self.add_bos:
            ids.insert(0, self.bos_id)
        if (self.add_eos if add_eos is None else add_eos) and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    def token_id(self, text: str) -> int | None:
        if self._core is None:
            return next((i for i, t in enumerate(self.tokens) if t == text), None)
        i = self._core.lookup(text)
        return None if i < 0 else i

    # ---- ids -> text ----
    def _piece_table(self):
        if self._pieces is None:
            pieces = []
            for t, ty in zip(self.tokens, self.types.tolist()):
                if ty == BYTE and _BYTE_TOKEN.fullmatch(t):
                    pieces.append(bytes([int(t[3:5], 16)]))
                elif ty == NORMAL:
                    pieces.append(t.replace("\u2581", " ").encode("utf-8"))
                elif ty == UNUSED:
                    pieces.append(b"")        # llama.cpp prints nothing for unused-only tokens
                else:
                    pieces.append(t.encode("utf-8"))
            self._pieces = pieces
        return self._pieces

    def piece(self, token_id: int, special: bool = True) -> bytes:
        """Bytes one token prints as (llama.cpp's token_to_piece): control tokens print their text
        only when `special`; byte tokens are one raw byte (a UTF-8 character may span several)."""
        if not 0 <= token_id < self.n_vocab:
            raise ValueError(f"token id {token_id} is outside the vocabulary of {self.n_vocab}")
        ty = self.types[token_id]
        if not special and ty in (CONTROL, UNKNOWN):
            return b""
        return self._piece_table()[token_id]

    def decode(self, ids, skip_special: bool = False) -> str:
        """Text of ids. Byte tokens are joined before UTF-8 decoding; incomplete sequences become
        U+FFFD. Unlike llama.cpp's detokenize this does not 'clean' spaces before punctuation, so
        decode(encode(text, add_bos=False)) == text."""
        out = b"".join(self.piece(int(i), not skip_special) for i in ids)
        return out.decode("utf-8", errors="replace")


class StreamDecoder:
    """Turns tokens into text pieces as they arrive, holding back bytes of an unfinished UTF-8
    character so a streamed piece never contains a broken character. The pieces joined equal
    Tokenizer.decode of all tokens."""

    def __init__(self, tok: Tokenizer, skip_special: bool = True):
        self.tok, self.skip_special, self.buf = tok, skip_special, b""

    def push(self, token_id: int) -> str:
        self.buf += self.tok.piece(token_id, not self.skip_special)
        # keep a trailing incomplete UTF-8 sequence (at most 3 bytes) for the next token
        cut = len(self.buf)
        for back in range(1, min(4, len(self.buf)) + 1):
            c = self.buf[-back]
            if c & 0xC0 == 0x80:
                continue                      # continuation byte: look further back
            need = 1 if c < 0x80 else 2 if c >> 5 == 6 else 3 if c >> 4 == 14 else 4 if c >> 3 == 30 else 1
            if need > back:
                cut = len(self.buf) - back
            break
        text, self.buf = self.buf[:cut], self.buf[cut:]
        return text.decode("utf-8", errors="replace")

    def flush(self) -> str:
        text, self.buf = self.buf, b""
        return text.decode("utf-8", errors="replace")
