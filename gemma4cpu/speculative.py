"""Speculative decoding: drafters, the draft-length controller and the statistics (spec 4.6).

A round, for token t at position P (sampled by the target, not yet in its cache) and the target's
post-norm hidden h of the row that produced t:
  drafts  d1..dk = drafter.draft(context, k)
  verify  one target forward over [t, d1..dk] at P..P+k (the small-batch path; every kernel is
          batch-invariant, so row i equals the single-token result bit for bit)
  accept  y_i = the target's sampler on row i, in order, each with the history so far; keep going
          while y_i == d_{i+1}; all k equal -> y_k is a bonus token. Greedy this is exact; with
          sampling it draws from the target's own distribution at every position, so the output is
          that of plain sampling with the same seed (one uniform per emitted token, same order).
  rollback the cache keeps P..P+n (t and the n accepted drafts); the next round starts from
          y_n with the target's hidden row n.

Drafters:
  MTPDrafter     a Gemma 4 MTP assistant (gemma4cpu.assistant) reading the target's KV cache
  NGramDrafter   prompt lookup: the longest recent n-gram match in the context proposes what
                 followed it (any target, no model)
  ReplayDrafter  a controlled experiment for benchmarks and tests: proposes a known continuation,
                 each token right with probability `p_hit`, optionally running another drafter's
                 compute first so that its cost is included
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

SPEC_TYPES = ("none", "mtp", "ngram")
_ALIASES = {"draft-mtp": "mtp", "mtp": "mtp", "ngram": "ngram", "ngram-simple": "ngram", "none": "none",
            "off": "none", "": "none"}
MAX_DRAFT = 16


def spec_type_name(s: str | None) -> str | None:
    """Canonical speculative type: 'mtp' (also llama.cpp's 'draft-mtp'), 'ngram' or 'none'."""
    if s is None:
        return None
    try:
        return _ALIASES[str(s).strip().lower()]
    except KeyError:
        raise ValueError(f"unknown speculative type {s!r}; choose mtp (or draft-mtp), ngram or none") from None


@dataclass
class DraftContext:
    tokens: list[int]          # the whole sequence so far; tokens[-1] = t, at position pos
    hidden: np.ndarray | None  # target post-norm hidden (D_t,) of the row that produced t
    pos: int                   # = len(tokens) - 1


class Drafter:
    """Base: `draft(ctx, k)` returns up to k proposed tokens following ctx.tokens."""
    name = "drafter"
    needs_hidden = False

    def draft(self, ctx: DraftContext, k: int) -> list[int]:
        raise NotImplementedError

    def reset(self):
        pass


class MTPDrafter(Drafter):
    name = "mtp"
    needs_hidden = True

    def __init__(self, assistant, p_min: float = 0.0):
        self.assistant = assistant
        self.p_min = float(p_min)

    def draft(self, ctx, k):
        return self.assistant.draft(ctx.tokens[-1], ctx.hidden, ctx.pos, k, self.p_min)


class NGramDrafter(Drafter):
    """Prompt lookup: for n from n_max down to n_min, find the most recent earlier occurrence of the
    last n tokens and propose the (up to k) tokens that followed it. An index of every n-gram's
    latest end position is kept and extended as the sequence grows (rebuilt when it is rewritten)."""
    name = "ngram"

    def __init__(self, n_min: int = 2, n_max: int = 4):
        if not 1 <= int(n_min) <= int(n_max):
            raise ValueError(f"need 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
        self.n_min, self.n_max = int(n_min), int(n_max)
        self.reset()

    def reset(self):
        self._seq: list[int] = []
        self._last: dict[tuple, int] = {}   # n-gram -> end index (exclusive) of its latest occurrence
        self._prev: dict[tuple, int] = {}   # n-gram -> end of the occurrence before the latest

    def _sync(self, tokens):
        n_old = len(self._seq)
        if n_old > len(tokens) or self._seq != tokens[:n_old]:
            self.reset()
            n_old = 0
        seq = self._seq
        seq.extend(tokens[n_old:])
        for end in range(n_old + 1, len(seq) + 1):
            for n in range(self.n_min, min(self.n_max, end) + 1):
                g = tuple(seq[end - n:end])
                if g in self._last:
                    self._prev[g] = self._last[g]
                self._last[g] = end

    def draft(self, ctx, k):
        self._sync(ctx.tokens)
        seq, L = self._seq, len(self._seq)
        for n in range(min(self.n_max, L - 1), self.n_min - 1, -1):
            g = tuple(seq[L - n:])
            end = self._last.get(g)
            if end == L:                        # the suffix itself: take the occurrence before it
                end = self._prev.get(g)
            if end is not None and end < L:
                return seq[end:end + int(k)]
        return []


class ReplayDrafter(Drafter):
    """Controlled experiment: `reference` is the full token sequence (prompt + the known
    continuation, e.g. plain greedy output). Each proposed token is the reference token with
    probability p_hit, else a wrong one; `compute` (another drafter, e.g. MTPDrafter) is run for
    the same k first and its proposals discarded, so its cost is part of the measurement."""
    name = "replay"

    def __init__(self, reference, p_hit: float = 1.0, seed: int = 0, n_vocab: int | None = None,
                 compute: Drafter | None = None):
        if not 0.0 <= float(p_hit) <= 1.0:
            raise ValueError(f"p_hit must be in [0, 1], got {p_hit}")
        self.reference = [int(t) for t in reference]
        self.p_hit, self.seed, self.compute = float(p_hit), int(seed), compute
        self.n_vocab = int(n_vocab) if n_vocab else max(self.reference) + 2
        self.needs_hidden = compute is not None and compute.needs_hidden
        self.reset()

    def reset(self):
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        if self.compute is not None:
            self.compute.reset()

    def draft(self, ctx, k):
        if self.compute is not None:
            self.compute.draft(ctx, k)
        out = []
        for j in range(ctx.pos + 1, min(ctx.pos + 1 + int(k), len(self.reference))):
            ref = self.reference[j]
            out.append(ref if self._rng.random() < self.p_hit else (ref + 1) % self.n_vocab)
        return out


@dataclass
class SpecStats:
    kind: str = "none"
    draft_max: int = 0
    rounds: int = 0                       # verify forwards that carried at least one draft
    drafted: int = 0
    accepted: int = 0
    drafted_by_pos: list[int] = field(default_factory=list)    # drafts proposed at position i (1-based)
    accepted_by_pos: list[int] = field(default_factory=list)   # of which accepted
    plain_steps: int = 0                  # forwards without drafts (no proposal / drafting off)
    draft_s: float = 0.0                  # time in the drafter
    verify_s: float = 0.0                 # time in target forwards with drafts
    plain_s: float = 0.0                  # time in target forwards without drafts

    def _grow(self, n):
        while len(self.drafted_by_pos) < n:
            self.drafted_by_pos.append(0)
            self.accepted_by_pos.append(0)

    def add_round(self, n_drafted: int, n_accepted: int):
        self.rounds += 1
        self.drafted += n_drafted
        self.accepted += n_accepted
        self._grow(n_drafted)
        for i in range(n_drafted):
            self.drafted_by_pos[i] += 1
            self.accepted_by_pos[i] += i < n_accepted

    @property
    def acceptance(self) -> float:
        """Accepted / drafted."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def acceptance_by_pos(self) -> list[float]:
        """Per draft position: accepted / proposed at that position."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_by_pos, self.drafted_by_pos)]

    @property
    def mean_accepted(self) -> float:
        """Mean accepted drafts per drafting round (tokens per round = this + 1)."""
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def plain_step_ms(self) -> float:
        return 1e3 * self.plain_s / self.plain_steps if self.plain_steps else 0.0

    def line(self) -> str:
        if self.kind == "none":
            return ""
        by = "/".join(f"{100 * a:.0f}" for a in self.acceptance_by_pos[:8])
        s = (f"draft {self.kind} k<={self.draft_max}: {self.accepted}/{self.drafted} accepted "
             f"({100 * self.acceptance:.1f}%) in {self.rounds} rounds, {self.mean_accepted + 1:.2f} tokens/round")
        if by:
            s += f", by position {by}%"
        if self.plain_steps:
            ms = self.plain_step_ms
            s += f", {self.plain_steps} plain steps of {ms:.1f} ms ({1e3 / ms if ms else 0:.1f} t/s without drafting)"
        return s

    def as_dict(self) -> dict:
        return dict(kind=self.kind, draft_max=self.draft_max, rounds=self.rounds, drafted=self.drafted,
                    accepted=self.accepted, acceptance=self.acceptance, acceptance_by_pos=self.acceptance_by_pos,
                    mean_accepted=self.mean_accepted, plain_steps=self.plain_steps, draft_s=self.draft_s,
                    verify_s=self.verify_s, plain_s=self.plain_s)


class DraftTuner:
    """Chooses the draft length per round. Fixed: always draft_max. Autotune: estimate the
    acceptance of each draft position (exponentially decayed counts, shrunk towards the pooled
    rate of all positions, itself with prior 1/2, so a depth rarely tried borrows the others' rate) and the cost of a
    target forward of n tokens and of a draft step (decayed mean times), then pick the k in
    0..draft_max with the most expected tokens per second,
        E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j,   cost(k) = c(k+1) + k * c_draft;
    k = 0 turns drafting off. To keep its estimates alive it drafts one deeper than the choice
    every 8th round, and with drafting off tries k = 1 every 16th step."""

    DECAY = 0.95

    def __init__(self, draft_max: int, draft_min: int = 0, autotune: bool = False):
        self.k_max, self.k_min, self.autotune = int(draft_max), int(draft_min), bool(autotune)
        self.acc = [0.0] * (self.k_max + 1)      # decayed accepted counts per position (1-based)
        self.seen = [0.0] * (self.k_max + 1)     # decayed proposed counts
        self.cost: dict[int, float] = {}         # n tokens -> seconds per target forward
        self.c_draft: float | None = None
        self._n = 0

    def _rate(self, i, pooled):
        return (self.acc[i] + 2.0 * pooled) / (self.seen[i] + 2.0)

    def _c(self, n: int) -> float:
        if n in self.cost:
            return self.cost[n]
        known = sorted(self.cost)
        if not known:
            return 1.0 + 0.05 * (n - 1)
        if len(known) == 1:
            return self.cost[known[0]] * (1.0 + 0.05 * (n - known[0]))
        lo = max([m for m in known if m < n], default=known[0])
        hi = min([m for m in known if m > n], default=known[-1])
        if lo == hi:  # extrapolate from the two nearest on one side
            a, b = (known[-2], known[-1]) if n > known[-1] else (known[0], known[1])
        else:
            a, b = lo, hi
        slope = max(0.0, (self.cost[b] - self.cost[a]) / (b - a))
        return max(1e-9, self.cost[a] + slope * (n - a))

    def best_k(self) -> int:
        if not self.autotune:
            return self.k_max
        best, best_rate = 0, 1.0 / self._c(1)
        e, p = 1.0, 1.0
        pooled = (sum(self.acc) + 1.0) / (sum(self.seen) + 2.0)
        for k in range(1, self.k_max + 1):
            p *= self._rate(k, pooled)
            e += p
            rate = e / (self._c(k + 1) + k * (self.c_draft or 0.0))
            if rate > best_rate * 1.0001:
                best, best_rate = k, rate
        return best

    def next_k(self) -> int:
        self._n += 1
        k = self.best_k()
        if self.autotune:
            if k == 0 and self._n % 16 == 0:
                k = 1
            elif 0 < k < self.k_max and self._n % 8 == 0:
                k += 1
        return k

    def observe(self, n_drafted: int, n_accepted: int, forward_s: float, draft_s: float):
        d = self.DECAY
        for i in range(1, min(n_drafted, n_accepted + 1) + 1):   # drafts past the first miss are never judged
            self.seen[i] = d * self.seen[i] + 1.0
            self.acc[i] = d * self.acc[i] + (1.0 if i <= n_accepted else 0.0)
        n = n_drafted + 1
        old = self.cost.get(n)
        self.cost[n] = forward_s if old is None else 0.8 * old + 0.2 * forward_s
        if n_drafted:
            per = draft_s / n_drafted
            self.c_draft = per if self.c_draft is None else 0.8 * self.c_draft + 0.2 * per
