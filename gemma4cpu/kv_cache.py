"""KV cache of the producing layers and the attention call over it (spec 2.4-2.6, 4.6).

Layout per producing layer (the layers [0, n_layer_kv) that own K/V; KV-shared layers read the
cache of cfg.kv_source[il]):
  k, v     uint8 (n_slots, slot_bytes): slot rows of n_head_kv heads x head_dim values in the cache
           type ('f16' default, 'f32', 'q8_0', 'q4_0'; K and V may differ), the GGUF block layouts
  pos      int32 (n_slots,): the absolute position held by each slot, -1 = empty
Full-attention layers hold n_ctx slots, slot = position. Sliding layers hold a ring of
  n_slots = window + max(max_draft, max_batch - 1)
slots, slot = position % n_slots: enough that (a) every row of an appended batch of up to
max_batch positions still sees its whole window, and (b) rejected draft tokens can be dropped
after the ring has wrapped (style.md 11.8: the write position is the position itself, the logical
length is separate, and truncate only empties slots). The attention kernel masks by position, so
slots may be in any order.

Rollback limit, exactly: after truncate(n) the next query (position n) needs positions
[n - window + 1, n) of every sliding layer. A ring has lost every position below `lost` (the
highest end - n_slots any append reached), so truncate(n) is allowed iff n == 0 (a reset) or
lost <= max(0, n - window + 1);
with the sizing above that always holds for n >= len - max_draft - 1 (a verify batch of
k <= max_draft drafts: keep P + n_accepted + 1 of P + k + 1).

Two ways past that limit (for prefix reuse in multi-turn chats, gemma4cpu.engine):
  swa_full=True   sliding layers hold n_ctx slots (llama.cpp's --swa-full): any truncate works,
                  at the memory of full attention;
  snapshot()      copies the rings (the slots in use, positions, lengths) at the current length c;
                  restore(snap, n) puts them back and truncates to n, allowed iff every ring's
                  lost-at-c <= max(0, n - window + 1) and n <= the full layers' length. The caller
                  must know that positions [0, n) of the full layers still hold the tokens the
                  snapshot was taken with (Engine checks the token prefixes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from gemma4cpu import _kernels

KV_TYPES = dict(_kernels.KV_TYPES)  # name -> id (csrc/g4_attn.h g4_kv_type)


def kv_type_id(name: str) -> int:
    try:
        return KV_TYPES[name.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown cache type {name!r}; choose from {', '.join(KV_TYPES)}") from None


@dataclass(frozen=True)
class LayerSpec:
    n_head_kv: int
    head_dim: int
    window: int = 0  # 0: full attention; > 0: sliding window of `window` positions (self included)


def flash_attention(pool, q: np.ndarray, q_pos, k: np.ndarray, v: np.ndarray, kv_pos, n_head: int,
                    n_head_kv: int, head_dim: int, window: int = 0, scale: float = 1.0, softcap: float = 0.0,
                    type_k: str = "f16", type_v: str = "f16", out: np.ndarray | None = None) -> np.ndarray:
    """One C call for the whole layer over the pool (csrc/g4_attn.h): q (n_q, n_head*hd) or
    (n_q, n_head, hd) float32 at positions q_pos (n_q,); k, v cache rows (n_slots, slot_bytes) uint8
    with kv_pos (n_slots,) (-1 = empty). Returns out (n_q, n_head*hd) float32."""
    q = np.ascontiguousarray(q, dtype=np.float32)
    q = q.reshape(q.shape[0], -1)
    qp = np.ascontiguousarray(q_pos, dtype=np.int32).reshape(-1)
    kp = np.ascontiguousarray(kv_pos, dtype=np.int32).reshape(-1)
    if out is None:
        out = np.empty((q.shape[0], n_head * head_dim), dtype=np.float32)
    _kernels.flash_attn(pool, q, qp, k, v, kp, kv_type_id(type_k), kv_type_id(type_v), n_head, n_head_kv,
                        head_dim, int(window), float(scale), float(softcap), out)
    return out


@dataclass
class RingSnapshot:
    """KVCache.snapshot(): n = the cache length then; layers = {layer: (k, v, pos, len, lost)}."""
    n: int
    layers: dict

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes + p.nbytes for k, v, p, _, _ in self.layers.values())


class KVCache:
    """K/V rows of every producing layer by absolute position; see the module docstring."""

    def __init__(self, layers: Sequence[LayerSpec], n_ctx: int, max_draft: int = 0, max_batch: int | None = None,
                 type_k: str = "f16", type_v: str = "f16", kv_source: Sequence[int] | None = None,
                 swa_full: bool = False):
        if n_ctx < 1:
            raise ValueError(f"n_ctx must be >= 1, got {n_ctx}")
        if max_draft < 0:
            raise ValueError(f"max_draft must be >= 0, got {max_draft}")
        max_batch = max_draft + 1 if max_batch is None else int(max_batch)
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.n_ctx, self.max_draft, self.max_batch = int(n_ctx), int(max_draft), max_batch
        self.type_k, self.type_v = type_k.lower(), type_v.lower()
        self._tk, self._tv = kv_type_id(type_k), kv_type_id(type_v)
        self.specs = [LayerSpec(int(s.n_head_kv), int(s.head_dim), int(s.window)) for s in layers]
        self.source = list(range(len(self.specs))) if kv_source is None else [int(s) for s in kv_source]
        if any(not 0 <= s < len(self.specs) for s in self.source):
            raise ValueError(f"kv_source {self.source} names layers outside the {len(self.specs)} producing layers")
        self.k, self.v, self.pos, self.n_slots = [], [], [], []
        for il, s in enumerate(self.specs):
            if s.window < 0:
                raise ValueError(f"layer {il}: window must be >= 0, got {s.window}")
            ns = self.n_ctx if s.window == 0 or swa_full else \
                min(self.n_ctx, s.window + max(self.max_draft, max_batch - 1))
            kb = _kernels.kv_slot_bytes(self._tk, s.n_head_kv, s.head_dim)
            vb = _kernels.kv_slot_bytes(self._tv, s.n_head_kv, s.head_dim)
            self.k.append(np.zeros((ns, kb), np.uint8))
            self.v.append(np.zeros((ns, vb), np.uint8))
            self.pos.append(np.full(ns, -1, np.int32))
            self.n_slots.append(ns)
        self.swa_full = bool(swa_full)
        self._len = [0] * len(self.specs)   # next position of each layer
        self._lost = [0] * len(self.specs)  # positions below this are no longer held (rings)

    @classmethod
    def from_config(cls, cfg, n_ctx: int, max_draft: int = 0, max_batch: int | None = None,
                    type_k: str = "f16", type_v: str = "f16", swa_full: bool = False) -> "KVCache":
        """Layers [0, cfg.n_layer_kv) own a cache; every model layer reads cfg.kv_source[il]."""
        specs = [LayerSpec(cfg.n_head_kv[il], cfg.head_dim[il], cfg.sliding_window if cfg.is_swa[il] else 0)
                 for il in range(cfg.n_layer_kv)]
        return cls(specs, n_ctx, max_draft, max_batch, type_k, type_v, kv_source=cfg.kv_source,
                   swa_full=swa_full)

    # ---- state ------------------------------------------------------------------------------
    @property
    def n(self) -> int:
        """Logical length: positions [0, n) are held by every producing layer."""
        return min(self._len) if self._len else 0

    def layer_len(self, layer: int) -> int:
        return self._len[layer]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k) + sum(a.nbytes for a in self.v)

    def _check_layer(self, layer: int) -> LayerSpec:
        if not 0 <= layer < len(self.specs):
            raise ValueError(f"layer {layer} is not a producing layer (0..{len(self.specs) - 1})")
        return self.specs[layer]

    # ---- writes -----------------------------------------------------------------------------
    def append(self, layer: int, k_rows: np.ndarray, v_rows: np.ndarray, positions=None):
        """Store K and V rows (m, n_head_kv, hd) or (m, n_head_kv*hd) for positions len..len+m-1 of
        `layer` (positions, if given, must be exactly those: the cache grows in order)."""
        s = self._check_layer(layer)
        width = s.n_head_kv * s.head_dim
        k_rows = np.ascontiguousarray(k_rows, dtype=np.float32)
        v_rows = np.ascontiguousarray(v_rows, dtype=np.float32)
        m = k_rows.shape[0] if k_rows.ndim else 0
        if k_rows.size != m * width or v_rows.shape[:1] != (m,) or v_rows.size != m * width:
            raise ValueError(f"layer {layer}: k {k_rows.shape} and v {v_rows.shape} must both be "
                             f"(m, {s.n_head_kv}, {s.head_dim}) or (m, {width})")
        p0 = self._len[layer]
        if positions is not None:
            positions = np.asarray(positions).reshape(-1)
            if positions.size != m or (m and not np.array_equal(positions, np.arange(p0, p0 + m))):
                raise ValueError(f"layer {layer}: positions must be {p0}..{p0 + m - 1} (the cache grows in order), "
                                 f"got {positions.tolist()[:8]}{'...' if positions.size > 8 else ''}")
        if m == 0:
            return
        if p0 + m > self.n_ctx:
            raise ValueError(f"layer {layer}: context full: {p0} + {m} positions > n_ctx={self.n_ctx}")
        ns = self.n_slots[layer]
        lost = self._lost_after(layer, p0, m)
        slots = np.arange(p0, p0 + m, dtype=np.int64) % ns
        _kernels.kv_store(self._tk, k_rows.reshape(m, width), s.n_head_kv, s.head_dim, self.k[layer], slots)
        _kernels.kv_store(self._tv, v_rows.reshape(m, width), s.n_head_kv, s.head_dim, self.v[layer], slots)
        self.pos[layer][slots] = np.arange(p0, p0 + m, dtype=np.int32)
        self._len[layer] = p0 + m
        self._lost[layer] = lost

    def _lost_after(self, layer: int, p0: int, m: int) -> int:
        """The lowest position `layer` still holds after positions p0..p0+m-1 are written (rings lose
        the oldest), or ValueError when its ring cannot take them: more than max_batch at once, or a
        position still inside the window of p0 would be overwritten. Changes nothing."""
        s, ns, lost = self.specs[layer], self.n_slots[layer], self._lost[layer]
        if s.window and ns < self.n_ctx:
            if m > self.max_batch:
                raise ValueError(f"layer {layer}: {m} positions in one append > max_batch={self.max_batch} "
                                 f"(the sliding ring of {ns} slots would overwrite window history the first rows "
                                 f"still need; append in chunks or build the cache with a larger max_batch)")
            lost = max(lost, p0 + m - ns)
            if lost > max(0, p0 - s.window + 1):
                raise ValueError(f"layer {layer}: appending {p0}..{p0 + m - 1} would drop position {lost - 1}, "
                                 f"still inside the window of position {p0}")
        return lost

    def reserve(self, m: int) -> list[int]:
        """Book m new positions n..n+m-1 in every producing layer for a writer that stores the rows
        itself (the C layer loop, csrc/g4_layers.c: slot = position % n_slots, kv_pos[slot] = position):
        append's checks (_lost_after) for every layer first (nothing changes if one fails), then the lengths
        and ring limits. Returns, per producing layer, the slots its attention reads afterwards (what
        view() gives). A writer that stops part-way leaves slots unwritten: truncate back to n."""
        m = int(m)
        p0 = self.n
        if m < 1:
            raise ValueError(f"reserve needs m >= 1, got {m}")
        if any(ln != p0 for ln in self._len):
            raise ValueError(f"layers hold different lengths {sorted(set(self._len))}; append per layer instead")
        if p0 + m > self.n_ctx:
            raise ValueError(f"context full: {p0} + {m} positions > n_ctx={self.n_ctx}")
        lost = [self._lost_after(il, p0, m) for il in range(len(self.specs))]
        self._len = [p0 + m] * len(self.specs)
        self._lost = lost
        return self.used_slots()

    def used_slots(self) -> list[int]:
        """Per producing layer, the slots view() gives to the attention (for writers and readers in C)."""
        return [ns if lo > 0 else ln for ns, lo, ln in zip(self.n_slots, self._lost, self._len)]

    def truncate(self, n: int):
        """Roll the logical length back to n (drop positions >= n in every layer), also after a
        ring has wrapped, as long as each ring still holds the window of position n."""
        n = int(n)
        if not 0 <= n <= self.n:
            raise ValueError(f"cannot truncate a cache of {self.n} positions to {n}")
        for il, s in enumerate(self.specs):
            if s.window and n > 0 and self._lost[il] > max(0, n - s.window + 1):
                raise ValueError(
                    f"cannot roll layer {il} back to {n} positions: its ring of {self.n_slots[il]} slots "
                    f"(window {s.window} + {self.n_slots[il] - s.window} spare) no longer holds positions "
                    f"{max(0, n - s.window + 1)}..{self._lost[il] - 1}; rollback after a wrap is limited "
                    f"to max_draft + 1 = {self.max_draft + 1} positions")
        for il in range(len(self.specs)):
            p = self.pos[il]
            p[p >= n] = -1
            self._len[il] = n
            self._lost[il] = min(self._lost[il], n)  # truncate(0) after a wrap is a reset

    # ---- ring snapshots (prefix reuse beyond the rollback limit) ------------------------------
    def ring_layers(self) -> list[int]:
        """The producing layers whose ring can lose positions (sliding, fewer slots than n_ctx)."""
        return [il for il, s in enumerate(self.specs) if s.window and self.n_slots[il] < self.n_ctx]

    def snapshot(self) -> "RingSnapshot":
        """Copy of every ring at the current length (only the slots in use)."""
        layers = {}
        for il in self.ring_layers():
            used = self.n_slots[il] if self._lost[il] > 0 else self._len[il]
            layers[il] = (self.k[il][:used].copy(), self.v[il][:used].copy(), self.pos[il].copy(),
                          self._len[il], self._lost[il])
        return RingSnapshot(self.n, layers)

    def can_restore(self, snap: "RingSnapshot", n: int) -> bool:
        """Whether restore(snap, n) is allowed (see the module docstring)."""
        if not 0 <= n <= snap.n:
            return False
        full_len = min((self._len[il] for il in range(len(self.specs)) if il not in snap.layers), default=snap.n)
        if n > full_len:
            return False
        return n == 0 or all(lost <= max(0, n - self.specs[il].window + 1)
                             for il, (_, _, _, _, lost) in snap.layers.items())

    def restore(self, snap: "RingSnapshot", n: int):
        """Put the rings back as they were at snap.n, then truncate every layer to n."""
        if not self.can_restore(snap, n):
            raise ValueError(f"cannot restore the ring snapshot taken at {snap.n} positions and truncate to {n} "
                             f"(cache at {self.n} positions)")
        for il, (k, v, pos, ln, lost) in snap.layers.items():
            used = k.shape[0]
            self.k[il][:used] = k
            self.v[il][:used] = v
            self.pos[il][:] = pos
            self._len[il], self._lost[il] = ln, lost
        self.truncate(n)

    def reset(self):
        for il in range(len(self.specs)):
            self.pos[il].fill(-1)
            self._len[il] = 0
            self._lost[il] = 0

    # ---- reads ------------------------------------------------------------------------------
    def view(self, layer: int):
        """(k, v, kv_pos) of producing layer `layer` for the attention call: the slots in use
        ([0, len) until a ring first wraps, then all its slots). Views, not copies."""
        self._check_layer(layer)
        used = self.n_slots[layer] if self._lost[layer] > 0 else self._len[layer]
        return self.k[layer][:used], self.v[layer][:used], self.pos[layer][:used]

    def attention(self, pool, il: int, q: np.ndarray, q_pos, n_head: int, scale: float = 1.0,
                  softcap: float = 0.0, window: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """Attention of model layer il (reading cache kv_source[il]) for q (n_q, n_head*hd) at q_pos.
        window: the reading layer's sliding window (default: the producing layer's; 0 = full)."""
        if not 0 <= il < len(self.source):
            raise ValueError(f"layer {il} outside the {len(self.source)} layers this cache serves")
        src = self.source[il]
        s = self.specs[src]
        k, v, kp = self.view(src)
        return flash_attention(pool, q, q_pos, k, v, kp, n_head, s.n_head_kv, s.head_dim,
                               s.window if window is None else window, scale, softcap,
                               self.type_k, self.type_v, out)
