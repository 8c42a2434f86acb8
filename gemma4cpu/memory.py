"""Memory needed by a model, estimated before anything large is allocated, and checked against the
memory this process can really get, so that a model that does not fit is refused with
"needs X GiB, has Y GiB" instead of the process being killed by the OOM killer mid-load.

What must be resident (`MemoryPlan`):
  weights   bytes of weights that have to sit in anonymous memory. Mapped weights (the default)
            count 0: they are clean file pages the kernel can drop and re-read, never a reason to
            kill the process. Copies count: the expert matrices of a MoE file in the split form
            (gate and up stacked per expert, gemma4cpu.weights._moe), and every copy the placement
            makes of the file's tensors (`copies`, gemma4cpu.placement.weight_copies): one when the
            file is read instead of mapped (`--no-mmap`) or put on huge pages (THP), one per memory
            node with `--numa mirror`.
  kv_cache  exactly what KVCache allocates for n_ctx: full layers n_ctx slots, sliding layers
            window + max(max_draft, max_batch - 1) slots (n_ctx with swa_full), K and V in their
            cache types.
  extra     what else the engine will hold beside the model, by name: the MTP assistant (`-md`;
            its weights are mapped, so its copied norm vectors, centroid clusters and step buffers,
            `assistant_bytes`) and the ring checkpoints (`--ctx-checkpoints` copies of the
            sliding-window rings, `ring_bytes`).
  buffers   activations of one forward chunk of max_batch tokens (an upper estimate of the numpy
            arrays alive at once), the hidden states of a whole n_ctx prompt, the logits of a verify
            batch, the pool's quantized-activation scratch, and a fixed allowance for the
            vocabulary and interpreter objects.

Available memory (`available_bytes`): psutil's MemAvailable, lowered to the cgroup's remaining
limit when the process runs in a memory-limited cgroup (v2 or v1), which is the limit that gets a
container killed. GEMMA4CPU_MEM_LIMIT=<size> (bytes or 512M / 2G / 1.5GiB) replaces it (tests use a
fake small limit; `off` disables the check), as does the `mem_limit` argument of Model / Engine.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

GIB = 1 << 30
OVERHEAD = 128 << 20          # vocabulary tables, Python objects, the kernels' small buffers
ENV = "GEMMA4CPU_MEM_LIMIT"


class InsufficientMemoryError(MemoryError):
    """The model, its KV cache and buffers need more memory than is available."""


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.I)


def parse_size(text) -> int:
    """'123', '512M', '2G', '1.5GiB', '64kb' -> bytes (binary units)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"memory size must be >= 0, got {text}")
        return int(text)
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"cannot read {text!r} as a memory size (e.g. 8G, 512M, 1073741824)")
    return int(float(m.group(1)) * (1 << (10 * " kmgt".index(m.group(2).lower() or " "))))


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _cgroup_available() -> int | None:
    """Bytes left under this process's cgroup memory limit (reclaimable file cache counted as
    free), or None when no limit applies."""
    cg = _read("/proc/self/cgroup") or ""
    for line in cg.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, ctrl, path = parts
        if hier == "0" and ctrl == "":          # cgroup v2
            base = "/sys/fs/cgroup" + (path if path != "/" else "")
            lim, cur = _read(base + "/memory.max"), _read(base + "/memory.current")
            stat = _read(base + "/memory.stat") or ""
        elif "memory" in ctrl.split(","):       # cgroup v1
            base = "/sys/fs/cgroup/memory" + (path if path != "/" else "")
            lim, cur = _read(base + "/memory.limit_in_bytes"), _read(base + "/memory.usage_in_bytes")
            stat = _read(base + "/memory.stat") or ""
        else:
            continue
        if not lim or not cur or not lim.isdigit() or not cur.isdigit() or int(lim) >= 1 << 60:
            continue
        inactive = 0
        for s in stat.splitlines():
            k, _, v = s.partition(" ")
            if k in ("inactive_file", "total_inactive_file") and v.isdigit():
                inactive = int(v)
        return max(0, int(lim) - int(cur) + inactive)
    return None


def available_bytes(limit=None) -> tuple[int | None, str]:
    """(bytes this process can still allocate, where the figure comes from); (None, ...) when the
    check is turned off. `limit` (bytes or a size string) overrides, then GEMMA4CPU_MEM_LIMIT."""
    for value, src in ((limit, "mem_limit"), (os.environ.get(ENV), ENV)):
        if value is None or value == "":
            continue
        if isinstance(value, str) and value.strip().lower() in ("off", "none", "unlimited"):
            return None, f"{src}=off"
        return parse_size(value), f"{src}={value}"
    import psutil
    avail = psutil.virtual_memory().available
    cg = _cgroup_available()
    if cg is not None and cg < avail:
        return cg, "cgroup memory limit"
    return avail, "MemAvailable"


@dataclass
class MemoryPlan:
    weights: int = 0
    kv_cache: int = 0
    buffers: int = 0
    extra: dict = field(default_factory=dict)      # name -> bytes (the assistant, ring checkpoints)

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.buffers + sum(self.extra.values())

    def line(self) -> str:
        return (f"weights {self.weights / GIB:.2f} GiB resident + KV cache {self.kv_cache / GIB:.2f} GiB + "
                f"buffers {self.buffers / GIB:.2f} GiB"
                + "".join(f" + {name} {b / GIB:.2f} GiB" for name, b in self.extra.items()))


def _slots(cfg, il: int, n_ctx: int, max_draft: int, max_batch: int, swa_full: bool) -> int:
    w = cfg.sliding_window if cfg.is_swa[il] else 0
    return n_ctx if w == 0 or swa_full else min(n_ctx, w + max(max_draft, max_batch - 1))


def _layer_slots(cfg, n_ctx: int, max_draft: int, max_batch: int, type_k: str, type_v: str, swa_full: bool):
    """(layer, slots, K + V bytes per slot) for every layer that owns a cache, as KVCache sizes them."""
    from gemma4cpu import _kernels
    from gemma4cpu.kv_cache import kv_type_id
    tk, tv = kv_type_id(type_k), kv_type_id(type_v)
    for il in range(cfg.n_layer_kv):
        yield (il, _slots(cfg, il, n_ctx, max_draft, max_batch, swa_full),
               _kernels.kv_slot_bytes(tk, cfg.n_head_kv[il], cfg.head_dim[il])
               + _kernels.kv_slot_bytes(tv, cfg.n_head_kv[il], cfg.head_dim[il]))


def kv_cache_bytes(cfg, n_ctx: int, max_draft: int, max_batch: int, type_k: str, type_v: str,
                   swa_full: bool = False) -> int:
    """What KVCache.from_config(cfg, n_ctx, max_draft, max_batch, type_k, type_v, swa_full) allocates."""
    return sum(ns * sb for _, ns, sb in _layer_slots(cfg, n_ctx, max_draft, max_batch, type_k, type_v, swa_full))


def ring_bytes(cfg, n_ctx: int, max_draft: int, max_batch: int, type_k: str, type_v: str,
               swa_full: bool = False) -> int:
    """The most one ring checkpoint (KVCache.snapshot) holds: K, V and positions (4 bytes a slot)
    of every ring layer."""
    return sum(ns * (sb + 4) for il, ns, sb in _layer_slots(cfg, n_ctx, max_draft, max_batch, type_k, type_v, swa_full)
               if cfg.is_swa[il] and ns < n_ctx)


def resident_weight_bytes(f, cfg, copies: int = 0) -> int:
    """Weight bytes that must be anonymous memory (see the module docstring), from the tensor table:
    the split MoE expert matrices plus `copies` copies of the file's tensor data (0: mapped)."""
    split = 0
    if cfg.n_expert:
        for il in range(cfg.n_layer):
            p = f"blk.{il}."
            if p + "ffn_gate_up_exps.weight" not in f.tensors:
                for nm in ("ffn_gate_exps.weight", "ffn_up_exps.weight"):
                    t = f.tensors.get(p + nm)
                    split += t.n_bytes if t is not None else 0
    return split + sum(t.n_bytes for t in f.tensors.values()) * max(0, int(copies))


def assistant_bytes(f, cfg) -> int:
    """Anonymous memory of an MTP assistant (gemma4cpu.assistant; its matrices stay mapped): the norm
    vectors it copies as float32, the centroid clusters (int64 per token) and a draft step's arrays
    (logits and scores over the vocabulary), plus 8 MiB for the rest."""
    vecs = sum(4 * t.n_elements for t in f.tensors.values()
               if len(t.dims) == 1 and t.type_name in ("F32", "F16", "BF16"))
    clusters = 8 * cfg.n_vocab if cfg.use_ordered else 0
    return vecs + clusters + 4 * 4 * cfg.n_vocab + (8 << 20)


def buffer_bytes(cfg, n_ctx: int, max_draft: int, max_batch: int) -> int:
    """Upper estimate of the activation arrays of one forward chunk plus whole-call arrays."""
    nb = min(max_batch, n_ctx)
    hq = cfg.n_head * max(cfg.head_dim)
    hkv = max(h * d for h, d in zip(cfg.n_head_kv, cfg.head_dim))
    width = 6 * cfg.n_embd + 4 * max(cfg.n_ff) + 4 * hq + 3 * hkv + 2 * max(cfg.head_dim)
    if cfg.n_expert:
        width += 4 * cfg.n_ff_exp + 2 * cfg.n_expert
    if cfg.n_embd_per_layer:
        width += 3 * cfg.n_layer * cfg.n_embd_per_layer
    chunk = 2 * nb * width * 4                   # x2: numpy temporaries alive beside their inputs
    scratch = nb * max([cfg.n_embd, max(cfg.n_ff), hq]) * 2     # quantized activations (<= 1.1 B/value)
    whole = n_ctx * cfg.n_embd * 4               # forward's hidden (n, D) for a whole prompt
    logits = (max_draft + 1) * cfg.n_vocab * 4 * 2
    return chunk + scratch + whole + logits + OVERHEAD


def plan(f, cfg, n_ctx: int, type_k: str = "f16", type_v: str = "f16", max_draft: int = 16,
         max_batch: int = 256, copies: int = 0, swa_full: bool = False, extra: dict | None = None) -> MemoryPlan:
    return MemoryPlan(resident_weight_bytes(f, cfg, copies),
                      kv_cache_bytes(cfg, n_ctx, max_draft, max_batch, type_k, type_v, swa_full),
                      buffer_bytes(cfg, n_ctx, max_draft, max_batch), dict(extra or {}))


def check(p: MemoryPlan, what: str, limit=None) -> None:
    """Raise InsufficientMemoryError when plan p does not fit what is available."""
    avail, src = available_bytes(limit)
    if avail is None or p.total <= avail:
        return
    raise InsufficientMemoryError(
        f"{what} needs {p.total / GIB:.2f} GiB ({p.line()}), has {avail / GIB:.2f} GiB available ({src}); "
        "lower the context (-c / n_ctx), use a quantized KV cache (q8_0, q4_0), or free memory")
