"""llama.cpp flags people paste from guides, for every gemma4cpu command line (run, serve, batch).

Honoured where they mean something here, otherwise accepted with a one-line note on stderr:

  -ub/--ubatch-size N   honoured: tokens per prefill forward (Engine max_batch, default 256); the
                        sliding rings grow with it (window + N - 1 slots)
  -b/--batch-size N     llama.cpp's logical batch; prefill runs in -ub chunks, so without -ub it
                        caps the chunk (min(N, 256)), otherwise a note
  --swa-full            honoured: sliding-window layers keep the whole context (Engine swa_full)
  --ctx-checkpoints N   honoured: ring checkpoints for prefix reuse (Engine ctx_checkpoints)
  --mlock, --no-mmap    honoured (Engine mlock / mmap; only added where a parser lacks them)
  -fa/--flash-attn [on|off|auto]   attention always runs the fused flash kernel: a note for off
  --jinja / --no-jinja  chat templates always run in jinja2's sandbox: a note for --no-jinja
  -np/--parallel N      one generation at a time per engine (requests queue): a note for N > 1
  -ngl/--n-gpu-layers/--gpu-layers N   CPU engine, nothing to offload: a note for N != 0
  -cb/--cont-batching, -nocb, --no-warmup, --no-webui   accepted, nothing to do

    p = argparse.ArgumentParser(); add_args(p)
    a = p.parse_args(argv); kw = engine_kwargs(a, note=lambda m: print("note: " + m, file=sys.stderr))
"""
from __future__ import annotations

import argparse

DEFAULT_UBATCH = 256


def _has(p: argparse.ArgumentParser, opt: str) -> bool:
    return opt in p._option_string_actions


def add_args(p: argparse.ArgumentParser, ctx_checkpoints_default: int = 0) -> argparse._ArgumentGroup:
    """Add the llama.cpp compatibility flags that `p` does not define yet."""
    g = p.add_argument_group("llama.cpp compatibility (honoured where meaningful, else a one-line note)")

    def add(*names, **kw):
        names = [n for n in names if not _has(p, n)]
        if names:
            g.add_argument(*names, **kw)

    add("-b", "--batch-size", dest="compat_batch", type=int, default=None, metavar="N",
        help="logical batch: prefill runs in -ub chunks (without -ub: chunks of min(N, 256))")
    add("-ub", "--ubatch-size", dest="compat_ubatch", type=int, default=None, metavar="N",
        help=f"tokens per prefill forward (default {DEFAULT_UBATCH}; the sliding rings hold window + N - 1)")
    add("--swa-full", dest="swa_full", action="store_true",
        help="sliding-window layers keep the whole context: any cached prefix is reusable, at "
             "full-attention KV memory")
    add("--ctx-checkpoints", "--swa-checkpoints", dest="ctx_checkpoints", type=int,
        default=ctx_checkpoints_default, metavar="N",
        help="keep N copies of the sliding-window rings (end of each prompt) so that prefix reuse "
             f"survives a rewritten earlier turn (default {ctx_checkpoints_default})")
    add("--mlock", dest="mlock", action="store_true", help="lock the weights in RAM")
    add("--no-mmap", dest="no_mmap", action="store_true", help="read the weights into memory instead of mapping")
    add("-fa", "--flash-attn", dest="compat_fa", nargs="?", const="on", default=None, metavar="on|off|auto",
        help="accepted: attention always runs the fused flash kernel")
    add("--jinja", dest="compat_jinja", action="store_true",
        help="accepted: chat templates always run in jinja2's sandbox")
    add("--no-jinja", dest="compat_no_jinja", action="store_true", help="accepted with a note")
    add("-np", "--parallel", dest="compat_np", type=int, default=None, metavar="N",
        help="accepted: one generation at a time per engine, requests queue")
    add("-ngl", "--n-gpu-layers", "--gpu-layers", dest="compat_ngl", default=None, metavar="N",
        help="accepted: a CPU engine has nothing to offload")
    for f in ("-cb", "--cont-batching", "-nocb", "--no-cont-batching", "--no-warmup", "--no-webui"):
        add(f, dest="compat_noop", action="append_const", const=f, help="accepted: nothing to do here")
    return g


def engine_kwargs(a: argparse.Namespace, note=None) -> dict:
    """Engine keyword arguments from the compatibility flags; `note(text)` gets one line per flag
    that is accepted without effect. Raises ValueError for values that cannot mean anything."""
    note = note or (lambda m: None)
    kw: dict = {}
    b, ub = getattr(a, "compat_batch", None), getattr(a, "compat_ubatch", None)
    for name, v in (("-b", b), ("-ub", ub)):
        if v is not None and not 1 <= v <= 65536:
            raise ValueError(f"{name} must be in 1..65536, got {v}")
    if ub is not None:
        kw["max_batch"] = ub
        if b is not None and b != ub:
            note(f"-b {b}: prefill runs in chunks of -ub {ub}; the logical batch has no separate meaning here")
    elif b is not None:
        kw["max_batch"] = min(b, DEFAULT_UBATCH)
        if b > DEFAULT_UBATCH:
            note(f"-b {b}: prefill runs in chunks of {DEFAULT_UBATCH} tokens (set -ub to change that)")
    if getattr(a, "swa_full", False):
        kw["swa_full"] = True
    cc = getattr(a, "ctx_checkpoints", None)
    if cc is not None:
        if cc < 0:
            raise ValueError(f"--ctx-checkpoints must be >= 0, got {cc}")
        kw["ctx_checkpoints"] = cc
    if getattr(a, "mlock", False):
        kw["mlock"] = True
    if getattr(a, "no_mmap", False):
        kw["mmap"] = False
    fa = getattr(a, "compat_fa", None)
    if fa is not None:
        if str(fa).lower() not in ("on", "off", "auto", "1", "0", "true", "false"):
            raise ValueError(f"-fa takes on, off or auto, got {fa!r}")
        if str(fa).lower() in ("off", "0", "false"):
            note("-fa off: attention always runs the fused flash kernel here (nothing to turn off)")
    if getattr(a, "compat_no_jinja", False):
        note("--no-jinja: chat templates always run in jinja2's sandbox here")
    np_ = getattr(a, "compat_np", None)
    if np_ is not None:
        if np_ < 1:
            raise ValueError(f"-np must be >= 1, got {np_}")
        if np_ > 1:
            note(f"-np {np_}: one generation at a time per engine; further requests wait in the queue")
    ngl = getattr(a, "compat_ngl", None)
    if ngl is not None and str(ngl).strip().lower() not in ("0",):
        note(f"-ngl {ngl}: CPU engine, no GPU layers to offload")
    return kw
