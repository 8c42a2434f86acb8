"""Token sampling: llama.cpp's default sampler chain, in float64 NumPy.

The chain and its order follow llama.cpp's default (``common/sampling``: penalties -> dry ->
top_n_sigma -> top_k -> typ_p -> top_p -> min_p -> xtc -> temperature -> dist), restricted to
the stages this engine supports (DRY, top-n-sigma, typical-p and XTC are not implemented, which is
the same as llama.cpp with those stages at their "off" defaults):

1. **repetition penalty** -- every *distinct* token among the last ``repeat_last_n`` tokens of the
   history has its logit divided by ``repeat_penalty`` if it is > 0 and multiplied by it otherwise
   (so a penalty > 1 always makes a seen token less likely). ``repeat_last_n = -1`` looks at the
   whole history, ``0`` (or ``repeat_penalty == 1``) turns the stage off.
2. **top-k** -- keep the ``top_k`` largest logits (``top_k <= 0`` or ``>= n_vocab``: off). Ties at
   the boundary are broken towards the *lowest token id*, so the kept set is deterministic.
3. **top-p** (nucleus) -- softmax of the remaining logits at temperature 1, sorted by descending
   probability (ties: lowest id first); keep the smallest prefix whose cumulative probability is
   ``>= top_p`` (at least one token). ``top_p == 1``: off.
4. **min-p** -- keep the remaining tokens whose probability (softmax at temperature 1 of the
   remaining tokens) is ``>= min_p * max probability``. ``min_p == 0``: off.
5. **temperature** -- divide the remaining logits by ``temperature``;
6. softmax (float64) and one draw from the result.

Note that top-p and min-p look at the temperature-1 distribution, because in llama.cpp's chain they
run before the temperature stage.

``temperature == 0`` is greedy: the argmax of the *penalized* logits (ties: lowest id). Top-k/p and
min-p cannot change the argmax, so they are skipped; a greedy ``sample`` does not consume the RNG.

Logits: a 1-D real array of length ``n_vocab`` (float32 or float64); the caller's array is never
modified. NaN entries are treated as -inf (never drawn); logits with no finite entry, or with a
+inf entry, are an error. Each ``Sampler`` owns a ``np.random.Generator(np.random.PCG64(seed))``
and each non-greedy ``sample`` consumes exactly one uniform double from it, so the same seed and
the same inputs give the same sequence of tokens.

Cost for a 262144-token vocabulary: one float64 copy, an O(n) selection for top-k (a partition of
a strided subsample picks a threshold, then only the entries above it are partitioned; exact), and
a sort of the top-k survivors only. Without top-k, top-p sorts only the largest 256, 2048, ...
logits until their mass reaches top_p (a full sort, as llama.cpp does, only for a broad nucleus);
without top-k and top-p nothing is sorted.
"""
from __future__ import annotations

import math
import numbers
import secrets
from dataclasses import dataclass

import numpy as np

__all__ = ["SamplingParams", "Sampler"]


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def _top_k_pos(x: np.ndarray, k: int) -> np.ndarray:
    """Ascending positions of the k largest entries of x; of the entries equal to the k-th largest
    value, the lowest positions are kept.

    Exact, and cheaper than partitioning the whole vocabulary: the k-th largest entry of a
    strided subsample is a value t with at least k entries of x >= t, so the k largest of x
    (and every tie of the k-th) are among the entries >= t -- usually ~k * stride of them.
    """
    stride = len(x) // max(8 * k, 4096)
    if stride > 1:
        sub = x[::stride]
        t = np.partition(sub, sub.size - k)[sub.size - k]
        cand = np.flatnonzero(x >= t)
    else:
        cand = np.arange(len(x))
    v = x[cand]
    kth = np.partition(v, v.size - k)[v.size - k]
    above = cand[v > kth]
    tied = cand[v == kth][: k - above.size]
    return np.sort(np.concatenate([above, tied]))


@dataclass(frozen=True)
class SamplingParams:
    """Sampler settings (llama.cpp names and meanings). ``validate()`` checks them; ``Sampler``
    calls it."""

    temperature: float = 0.0      # 0: greedy (argmax; ties -> lowest id); must be >= 0
    top_k: int = 40               # <= 0 or >= n_vocab: off
    top_p: float = 1.0            # 1.0: off; in (0, 1]
    min_p: float = 0.0            # 0: off; in [0, 1]
    repeat_penalty: float = 1.0   # 1.0: off; > 0
    repeat_last_n: int = 64       # tokens of history the penalty looks at (0: off, -1: all)
    seed: int | None = None       # None: drawn from OS entropy (see Sampler.seed)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad field and its value."""

        def bad(field: str, want: str):
            raise ValueError(f"SamplingParams.{field} must be {want}, got {getattr(self, field)!r}")

        def real(field: str) -> float:
            v = getattr(self, field)
            if not _is_real(v):
                bad(field, "a real number")
            v = float(v)
            if math.isnan(v):
                bad(field, "a number (not NaN)")
            return v

        t = real("temperature")
        if not (0.0 <= t < math.inf):
            bad("temperature", "finite and >= 0 (0 means greedy)")
        if not _is_int(self.top_k):
            bad("top_k", "an int (<= 0 turns top-k off)")
        p = real("top_p")
        if not (0.0 < p <= 1.0):
            bad("top_p", "in (0, 1] (1 turns top-p off)")
        m = real("min_p")
        if not (0.0 <= m <= 1.0):
            bad("min_p", "in [0, 1] (0 turns min-p off)")
        r = real("repeat_penalty")
        if not (0.0 < r < math.inf):
            bad("repeat_penalty", "finite and > 0 (1 turns the penalty off)")
        if not _is_int(self.repeat_last_n) or self.repeat_last_n < -1:
            bad("repeat_last_n", "an int >= -1 (0: off, -1: whole history)")
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            bad("seed", "None or an int >= 0")


class Sampler:
    """Draws token ids from logits with the chain described in the module docstring.

    ``seed`` is the seed actually used (drawn from OS entropy when ``params.seed`` is None), so a
    run can be reproduced by passing it back in.
    """

    def __init__(self, params: SamplingParams, n_vocab: int):
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        params.validate()
        if not _is_int(n_vocab) or n_vocab < 1:
            raise ValueError(f"n_vocab must be an int >= 1, got {n_vocab!r}")
        self.params = params
        self.n_vocab = int(n_vocab)
        self.seed: int = int(params.seed) if params.seed is not None else secrets.randbits(64)
        self.greedy = float(params.temperature) == 0.0
        k = int(params.top_k)
        self._top_k = k if 0 < k < self.n_vocab else 0          # 0: off
        self._top_p = float(params.top_p)
        self._min_p = float(params.min_p)
        self._penalty = float(params.repeat_penalty)
        self._last_n = int(params.repeat_last_n)
        self._temp = float(params.temperature)
        self.reset()

    def reset(self) -> None:
        """Restart the random stream from ``self.seed``."""
        self._rng = np.random.Generator(np.random.PCG64(self.seed))

    # -- the chain -------------------------------------------------------------------------------

    def _penalized(self, logits, history) -> np.ndarray:
        """float64 copy of the logits (NaN -> -inf) with the repetition penalty applied."""
        a = np.asarray(logits)
        if a.ndim != 1 or a.shape[0] != self.n_vocab:
            raise ValueError(f"logits must be a 1-D array of length n_vocab={self.n_vocab}, "
                             f"got shape {a.shape}")
        if a.dtype.kind not in "fiu":
            raise ValueError(f"logits must be a real numeric array, got dtype {a.dtype}")
        x = np.array(a, dtype=np.float64)              # always a copy: the caller's array is kept
        xmax = x.max()
        if xmax != xmax:                                # NaN somewhere: never drawn
            x[np.isnan(x)] = -np.inf
            xmax = x.max()

        if self._penalty != 1.0 and self._last_n != 0:
            if not isinstance(history, (np.ndarray, list, tuple)):
                history = list(history)                 # any iterable of ints
        if self._penalty != 1.0 and self._last_n != 0 and len(history):
            if self._last_n > 0:
                history = history[-self._last_n:]      # before converting: histories grow long
            h = np.asarray(history)
            if h.ndim != 1 or h.dtype.kind not in "iu":
                raise ValueError(f"history must be a 1-D sequence of token ids, got dtype {h.dtype} "
                                 f"shape {h.shape}")
            lo, hi = int(h.min()), int(h.max())
            if lo < 0 or hi >= self.n_vocab:
                raise ValueError(f"history holds token ids outside [0, {self.n_vocab}): {lo}..{hi}")
            # gather, penalize, scatter: a repeated id writes the same once-penalized value again,
            # so each distinct token is penalized exactly once
            v = x[h]
            with np.errstate(over="ignore"):
                x[h] = np.where(v > 0, v / self._penalty, v * self._penalty)
            xmax = x.max()
        if xmax == -np.inf:
            raise ValueError("logits have no finite entry (all NaN or -inf): nothing to sample")
        if xmax == np.inf:
            raise ValueError(f"logits contain +inf (token {int(np.argmax(x))}, after the repetition "
                             "penalty): cannot form a distribution")
        return x

    def _candidates(self, logits, history) -> tuple[np.ndarray, np.ndarray]:
        """(token ids, float64 probabilities summing to 1) of the final distribution; ids with zero
        probability are dropped. Non-greedy only."""
        x = self._penalized(logits, history)

        # top-k (ids ascending; ties at the k-th value: lowest ids)
        if self._top_k:
            ids = _top_k_pos(x, self._top_k)
            v = x[ids]
        else:
            ids, v = None, x                            # None: every id, in order
        fin = v > -np.inf
        if not fin.all():
            ids = np.flatnonzero(fin) if ids is None else ids[fin]
            v = v[fin]
        if ids is None:
            ids = np.arange(self.n_vocab)
        vmax = v.max()

        if self._top_p < 1.0 or self._min_p > 0.0:
            e = np.exp(v - vmax)                        # unnormalized temperature-1 probabilities
            if self._top_p < 1.0:
                order = self._nucleus(v, e)
                ids, v, e = ids[order], v[order], e[order]
            if self._min_p > 0.0:
                # p_i >= min_p * p_max  <=>  e_i >= min_p (e_max == 1); the max always survives
                keep = e >= self._min_p
                ids, v = ids[keep], v[keep]

        if self._temp >= 1e-6:
            w = np.exp((v - vmax) / self._temp)
        else:                                           # (v - vmax) / T may overflow to -inf: fine
            with np.errstate(over="ignore", under="ignore"):
                w = np.exp((v - vmax) / self._temp)
        nz = w > 0.0
        if not nz.all():
            ids, w = ids[nz], w[nz]
        return ids, w / w.sum()

    def _nucleus(self, v: np.ndarray, e: np.ndarray) -> np.ndarray:
        """Positions (into v, whose ids ascend) of the top-p prefix, in descending-logit order
        (ties: lowest id first).

        p = e / sum(e) in id order; the prefix is the shortest one whose running sum (np.cumsum,
        sequential) reaches top_p. Rather than sorting everything, sort the m largest for
        m = 256, 2048, ... (then everything): the m largest (ties to the lowest ids) are exactly the
        first m of the full sorted order, so once their running sum reaches top_p the answer is the
        same as with a full sort. Model distributions are peaked, so this usually stops at m = 256.
        """
        total = e.sum()
        m = 256
        while True:
            if m >= v.size:
                pos = (-v).argsort(kind="stable")
            else:
                pos = _top_k_pos(v, m)
                pos = pos[(-v[pos]).argsort(kind="stable")]
            cum = (e[pos] / total).cumsum()
            n = int(cum.searchsorted(self._top_p, side="left"))
            if n < pos.size:
                return pos[: n + 1]
            if m >= v.size:
                return pos                              # rounding kept the sum just below top_p
            m = m * 8 if m * 8 <= v.size // 8 else v.size    # large nucleus: one full sort

    # -- public ----------------------------------------------------------------------------------

    def probs(self, logits, history=()) -> np.ndarray:
        """float64 (n_vocab,) distribution ``sample`` draws from for these inputs (one-hot when
        greedy), after every filter; sums to 1. Does not touch the RNG."""
        out = np.zeros(self.n_vocab, dtype=np.float64)
        if self.greedy:
            out[int(np.argmax(self._penalized(logits, history)))] = 1.0
        else:
            ids, p = self._candidates(logits, history)
            out[ids] = p
        return out

    def sample(self, logits, history=()) -> int:
        """Draw one token id. Greedy: the argmax of the penalized logits (no RNG use); otherwise
        consumes one uniform double from this sampler's generator."""
        if self.greedy:
            if self._penalty == 1.0 or self._last_n == 0:
                # fast path (no float64 copy): the same first-maximum index whenever the maximum
                # is finite; NaN / inf cases take the checked path below
                a = np.asarray(logits)
                if a.ndim == 1 and a.shape[0] == self.n_vocab and a.dtype.kind == "f":
                    i = int(np.argmax(a))
                    if np.isfinite(a[i]):
                        return i
            return int(np.argmax(self._penalized(logits, history)))
        ids, p = self._candidates(logits, history)
        u = self._rng.random()
        i = int(p.cumsum().searchsorted(u, side="right"))
        return int(ids[min(i, ids.size - 1)])
