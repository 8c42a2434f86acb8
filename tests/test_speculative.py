"""Speculative decoding (gemma4cpu.speculative, gemma4cpu.assistant, Engine's draft-verify loop).

Tiny random HF Gemma 4 target (`dense`: sliding window 8) + its MTP assistant, converted to F32
GGUF. Checked:
  * greedy speculative output == greedy plain output, token for token, for draft_max 1..8, on
    several prompts and lengths, with the sliding ring wrapping (max_batch 4 -> ring of 24 slots);
    with the MTP drafter, a drafter that always misses, one that always hits, one in between;
  * sampled speculative output == sampled plain output for the same seed (one draw per emitted
    token, in the same order, from the same rows);
  * the C-backed draft step == the float64 reference draft step (bound from a float32 run) and
    our first-round drafts == HF's SinglePositionMultiTokenCandidateGenerator candidates;
    our greedy assisted output == HF generate(..., assistant_model=...);
  * a drafter for another target, a drafter without a Gemma 4 target, an assistant given as the
    model: refused with errors naming the values;
  * the n-gram drafter against a brute-force search; the draft-length tuner on synthetic costs.
"""
import numpy as np
import pytest

from gemma4cpu import speculative as spec
from gemma4cpu.assistant import Assistant, AssistantConfig, DrafterMismatchError
from gemma4cpu.convert import convert
from gemma4cpu.engine import Engine
from gemma4cpu.gguf_io import GGUFFile, GGUFFormatError

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from gemma4cpu.ref import hf_tiny  # noqa: E402
from gemma4cpu.ref.model import Assistant as RefAssistant  # noqa: E402
from gemma4cpu.ref.model import Model as RefModel  # noqa: E402

U32 = 2.0 ** -24


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.set_num_threads(2)
    d = tmp_path_factory.mktemp("spec")
    tgt = hf_tiny.build("dense", d / "target", seed=0)
    asst = hf_tiny.build("assistant", d / "assistant", seed=0)
    t_path = convert(d / "target", d / "target.gguf", "f32", quiet=True)
    a_path = convert(d / "assistant", d / "assistant.gguf", "f32", quiet=True)
    return dict(hf=tgt, hf_asst=asst, target=str(t_path), assistant=str(a_path), dir=d)


@pytest.fixture(scope="module")
def eng(tiny):
    # max_batch 4: the sliding ring holds 8 + max(16, 3) = 24 slots, so 60 tokens wrap it twice
    return Engine(tiny["target"], draft=tiny["assistant"], threads=2, n_ctx=128, max_batch=4,
                  cache_type_k="f32", cache_type_v="f32", progress=False)


def _prompts(n_list, seed=0):
    rng = np.random.default_rng(seed)
    return [[2] + rng.integers(3, hf_tiny.VOCAB, n - 1).tolist() for n in n_list]


PROMPTS = _prompts([3, 9, 21])


def test_ring_is_small_enough_to_wrap(eng):
    cache = eng.model.cache
    swa = [i for i, s in enumerate(cache.specs) if s.window]
    assert swa and all(cache.n_slots[i] == 24 for i in swa)


@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_mtp_equals_plain(eng, k):
    for ids in PROMPTS:
        plain = eng.generate(ids, max_tokens=45, spec_type="none")
        sp = eng.generate(ids, max_tokens=45, spec_type="mtp", draft_max=k)
        assert sp.tokens == plain.tokens, f"k={k}, prompt of {len(ids)}"
        s = sp.stats.spec
        assert s.kind == "mtp" and s.drafted > 0 and s.rounds > 0
        assert sum(s.drafted_by_pos) == s.drafted and sum(s.accepted_by_pos) == s.accepted
        assert max(len(ids) + 45, 0) > 24  # crosses the ring


@pytest.mark.parametrize("p_hit", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_replay_drafters_equal_plain(eng, p_hit, k):
    """Always-miss, half and always-hit drafters replaying the known plain continuation; the
    MTP drafter runs inside (its compute is included, its output discarded)."""
    n_new = 40
    for seed, ids in enumerate(PROMPTS):
        plain = eng.generate(ids, max_tokens=n_new, spec_type="none")
        ref = ids + plain.tokens
        dr = spec.ReplayDrafter(ref, p_hit=p_hit, seed=seed, n_vocab=eng.n_vocab, compute=eng.drafter)
        saved = eng.drafter
        try:
            eng.drafter = dr
            sp = eng.generate(ids, max_tokens=n_new, spec_type="mtp", draft_max=k)
        finally:
            eng.drafter = saved
        assert sp.tokens == plain.tokens
        s = sp.stats.spec
        assert s.kind == "replay"
        # forwards after the first token; a round never drafts past max_tokens (the last step of an
        # always-miss run has no room for a draft, so it runs plain)
        if p_hit == 0.0:
            assert s.accepted == 0 and s.rounds == n_new - 2 and s.plain_steps == 1
        elif p_hit == 1.0:
            assert s.accepted == s.drafted and all(a == 1.0 for a in s.acceptance_by_pos)
            m, rounds = 1, 0                 # every round emits min(k, left - 1) + 1 tokens
            while m < n_new:
                kk = min(k, n_new - m - 1)
                rounds += kk > 0
                m += kk + 1
            assert s.rounds == rounds
        else:
            assert 0 < s.accepted < s.drafted


@pytest.mark.parametrize("kind", ["mtp", "ngram", "replay"])
def test_sampled_spec_equals_sampled_plain(eng, kind):
    kw = dict(max_tokens=40, temperature=0.9, top_k=20, top_p=0.95, seed=11)
    for ids in PROMPTS:
        plain = eng.generate(ids, spec_type="none", **kw)
        saved = eng.drafter
        try:
            if kind == "replay":  # drafts that are often right, so acceptance paths run
                eng.drafter = spec.ReplayDrafter(ids + plain.tokens, p_hit=0.8, seed=1, n_vocab=eng.n_vocab)
            sp = eng.generate(ids, spec_type="ngram" if kind == "ngram" else "mtp", draft_max=4, **kw)
        finally:
            eng.drafter = saved
        assert sp.tokens == plain.tokens
        if kind == "replay":
            assert sp.stats.spec.accepted > 0


def test_stop_inside_accepted_drafts_keeps_cache_exact(eng):
    """A stop after the 5th token while the always-hit drafter has 8 accepted in flight: the
    cache must hold exactly prompt + output[:-1]... and a follow-up call reuses it correctly."""
    ids = PROMPTS[1]
    plain = eng.generate(ids, max_tokens=30, spec_type="none")
    saved = eng.drafter
    try:
        eng.drafter = spec.ReplayDrafter(ids + plain.tokens, p_hit=1.0, n_vocab=eng.n_vocab)
        sp = eng.generate(ids, max_tokens=5, spec_type="mtp", draft_max=8)
        assert sp.tokens == plain.tokens[:5]
        assert eng._seq == (ids + sp.tokens)[:len(eng._seq)] and eng.model.cache.n == len(eng._seq)
        again = eng.generate(ids + sp.tokens, max_tokens=10, spec_type="mtp", draft_max=8)
    finally:
        eng.drafter = saved
    assert again.stats.n_cached > len(ids)
    assert again.tokens == plain.tokens[5:15]


def test_autotune_keeps_output(eng):
    for ids in PROMPTS:
        plain = eng.generate(ids, max_tokens=40, spec_type="none")
        sp = eng.generate(ids, max_tokens=40, spec_type="mtp", draft_max=6, spec_autotune=True)
        assert sp.tokens == plain.tokens


def test_draft_min_and_p_min(eng):
    ids = PROMPTS[2]
    plain = eng.generate(ids, max_tokens=20, spec_type="none")
    # p_min 1: no draft token is that sure -> every round runs without drafts
    sp = eng.generate(ids, max_tokens=20, spec_type="mtp", draft_max=3, draft_p_min=1.0)
    assert sp.tokens == plain.tokens and sp.stats.spec.drafted == 0 and sp.stats.spec.plain_steps == 19
    # n-gram proposals shorter than draft_min are dropped
    sp = eng.generate(ids, max_tokens=20, spec_type="ngram", draft_max=4, draft_min=4)
    assert sp.tokens == plain.tokens
    assert all(d == sp.stats.spec.rounds for d in sp.stats.spec.drafted_by_pos)


# ---- against the float64 reference and HF ---------------------------------------------------------


def _bound(r64, r32):
    return 8.0 * float(np.abs(r32 - r64).max()) + 16 * U32 * float(np.abs(r64).max())


def _step_vs_reference(case, P):
    """State after a P-token prompt: (engine, tok, our step (logits, h_next), float64 reference
    step, float32 reference step), all on the same prompt and token, f32 KV cache."""
    ids = _prompts([P], seed=P)[0]
    r64t, r32t = RefModel(case["target"]), RefModel(case["target"], np.float32)
    l64, h64, kv64 = r64t.forward(ids, return_kv=True)
    _, h32, kv32 = r32t.forward(ids, return_kv=True)
    tok = int(np.argmax(l64[-1]))
    ref64 = RefAssistant(case["assistant"]).step(r64t, kv64, tok, h64[-1], P)
    ref32 = RefAssistant(case["assistant"], np.float32).step(r32t, kv32, tok, h32[-1], P)
    e = Engine(case["target"], draft=case["assistant"], threads=2, n_ctx=64, progress=False,
               cache_type_k="f32", cache_type_v="f32")
    _, h = e.model.forward(ids, "last")
    return e, tok, h[-1], e.assistant.step(tok, h[-1], P), ref64, ref32


@pytest.mark.parametrize("P", [4, 7, 12, 19])
def test_draft_step_matches_reference(tiny, P):
    """Our C-backed step (f32 cache, C attention over the target's cache) vs the float64 numpy
    reference (llama.cpp windows), bound from a float32 reference run on the same state."""
    e, tok, h, (got_l, got_h), ref64, ref32 = _step_vs_reference(tiny, P)
    for got, r64, r32 in ((got_l, ref64[0], ref32[0]), (got_h, ref64[1], ref32[1])):
        tol = _bound(r64, r32)
        assert float(np.abs(got - r64).max()) <= tol
    # a wrong position changes the step by far more than the bound (the check can fail)
    wrong, _ = e.assistant.step(tok, h, P - 1)
    assert float(np.abs(wrong - ref64[0]).max()) > 10 * _bound(ref64[0], ref32[0])


def _hf_candidates(tiny, ids, k):
    """HF's SinglePositionMultiTokenCandidateGenerator loop for the first round after the prompt:
    returns (t, drafts, per-step top1-top2 margins)."""
    tgt, asst = tiny["hf"], tiny["hf_asst"]
    x = torch.tensor([ids])
    with torch.no_grad():
        out = tgt(x, output_hidden_states=True, return_shared_kv_states=True)
        t = int(out.logits[0, -1].argmax())
        h = out.hidden_states[-1][:, -1:]
        kv = out.shared_kv_states
        last, drafts, margins = torch.tensor([[t]]), [], []
        for _ in range(k):
            e = tgt.get_input_embeddings()(last)
            o = asst(inputs_embeds=torch.cat([e, h], dim=-1), position_ids=torch.tensor([[len(ids)]]),
                     shared_kv_states=kv, use_cache=False)
            lg = o.logits[0, -1]
            top2 = torch.topk(lg, 2).values
            margins.append(float(top2[0] - top2[1]))
            last = lg.argmax().view(1, 1)
            drafts.append(int(last))
            h = o.last_hidden_state
    return t, drafts, margins


@pytest.mark.parametrize("n", [3, 5, 7])
def test_first_round_drafts_equal_hf_candidates(tiny, n):
    """P = n < sliding window 8, where HF's and llama.cpp's assistant windows agree (spec 4.4).
    Compared up to the first step whose HF top-1/top-2 margin is below 1e-3 (float32 noise in
    the logits here is ~1e-6, so a disagreement above that margin is a bug)."""
    ids = _prompts([n], seed=100 + n)[0]
    k = 6
    t, want, margins = _hf_candidates(tiny, ids, k)
    e = Engine(tiny["target"], draft=tiny["assistant"], threads=2, n_ctx=64, progress=False,
               cache_type_k="f32", cache_type_v="f32")
    lg, h = e.model.forward(ids, "last")
    assert int(np.argmax(lg[-1])) == t
    got = e.assistant.draft(t, h[-1], n, k)
    m = next((i for i, g in enumerate(margins) if g < 1e-3), k)
    assert m >= 3, f"margins too small to compare: {margins}"
    assert got[:m] == want[:m]


def test_greedy_assisted_output_equals_hf_generate(tiny, eng):
    ids = _prompts([6], seed=5)[0]
    with torch.no_grad():
        want = tiny["hf"].generate(torch.tensor([ids]), assistant_model=tiny["hf_asst"], max_new_tokens=24,
                                   do_sample=False)[0, len(ids):].tolist()
        plain = tiny["hf"].generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)[0, len(ids):].tolist()
    assert want == plain  # HF's own exactness, on this prompt
    got = eng.generate(ids, max_tokens=24, spec_type="mtp", draft_max=3)
    assert got.tokens == want


# ---- refusals -------------------------------------------------------------------------------------


def _rewrite(src, dst, key=None, value=None, drop_tensor=None):
    import gguf
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        v = f.contents()
        if name == key:
            v = value
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, v, vt, sub_type=f.types[-1])
        else:
            w.add_key_value(name, v, vt)
    for t in r.tensors:
        if t.name == drop_tensor:
            continue
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=np.asarray(t.data).shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(dst)


def test_wrong_backbone_is_refused(tiny):
    bad = _rewrite(tiny["assistant"], tiny["dir"] / "bad_backbone.gguf",
                   key="gemma4-assistant.embedding_length_out", value=96)
    with pytest.raises(DrafterMismatchError, match=r"backbone width.*96 in the assistant but 64 in the target"):
        Engine(tiny["target"], draft=bad, threads=2, n_ctx=32, progress=False)


def test_wrong_kv_heads_are_refused(tiny):
    bad = _rewrite(tiny["assistant"], tiny["dir"] / "bad_kv.gguf",
                   key="gemma4-assistant.attention.head_count_kv", value=[4, 4, 4, 1])
    with pytest.raises(DrafterMismatchError, match=r"sliding-layer kv-head count.*4 in the assistant but 2"):
        Engine(tiny["target"], draft=bad, threads=2, n_ctx=32, progress=False)


def test_missing_projection_is_refused(tiny):
    bad = _rewrite(tiny["assistant"], tiny["dir"] / "bad_proj.gguf", drop_tensor="nextn.post_projection.weight")
    with pytest.raises(GGUFFormatError, match="nextn.post_projection.weight"):
        Engine(tiny["target"], draft=bad, threads=2, n_ctx=32, progress=False)


def test_drafter_needs_a_gemma4_target(tiny):
    e3 = Engine(threads=2, n_ctx=64, progress=False)   # the real Gemma 3 270M
    with pytest.raises(DrafterMismatchError, match="Gemma 4 targets; the target is 'gemma3'"):
        Assistant(tiny["assistant"], e3.model)
    with pytest.raises(ValueError, match="needs a drafter"):
        e3.generate("Hi", max_tokens=2, spec_type="mtp")


def test_assistant_is_not_a_model_and_target_is_not_an_assistant(tiny):
    with pytest.raises(GGUFFormatError, match="MTP assistant.*as a drafter"):
        Engine(tiny["assistant"], threads=2, n_ctx=32, progress=False)
    with pytest.raises(GGUFFormatError, match="not a Gemma 4 MTP assistant.*target model"):
        AssistantConfig.from_gguf(GGUFFile(tiny["target"]))


def test_option_errors(eng):
    with pytest.raises(ValueError, match="unknown speculative type 'eagle'"):
        eng.generate([2, 5], max_tokens=2, spec_type="eagle")
    with pytest.raises(ValueError, match="draft_max must be an integer in 1..16"):
        eng.generate([2, 5], max_tokens=2, draft_max=17)
    with pytest.raises(ValueError, match="draft_min must be"):
        eng.generate([2, 5], max_tokens=2, draft_max=2, draft_min=3)
    with pytest.raises(ValueError, match="draft_p_min"):
        eng.generate([2, 5], max_tokens=2, draft_p_min=1.5)
    assert spec.spec_type_name("draft-mtp") == "mtp" and spec.spec_type_name("NGRAM") == "ngram"


# ---- n-gram drafter and tuner ------------------------------------------------------------------------


def _brute_ngram(seq, k, n_min, n_max):
    L = len(seq)
    for n in range(min(n_max, L - 1), n_min - 1, -1):
        suf = seq[L - n:]
        for end in range(L - 1, n - 1, -1):       # most recent earlier occurrence
            if seq[end - n:end] == suf:
                return seq[end:end + k]
    return []


def test_ngram_drafter_matches_brute_force():
    rng = np.random.default_rng(3)
    d = spec.NGramDrafter(n_min=1, n_max=3)
    seq = []
    for step in range(400):
        seq.append(int(rng.integers(0, 6)))
        if step % 97 == 96:              # a rewritten history forces a rebuild
            seq = seq[:len(seq) // 2] + [7]
        got = d.draft(spec.DraftContext(list(seq), None, len(seq) - 1), 4)
        assert got == _brute_ngram(seq, 4, 1, 3), step


def test_ngram_drafter_proposes_the_copy():
    d = spec.NGramDrafter()
    seq = [5, 6, 7, 8, 9, 10, 1, 2, 5, 6, 7]
    assert d.draft(spec.DraftContext(seq, None, len(seq) - 1), 3) == [8, 9, 10]
    assert d.draft(spec.DraftContext([1, 2, 3], None, 2), 3) == []


def test_tuner_fixed_and_autotuned():
    assert spec.DraftTuner(5).next_k() == 5
    # verification nearly free, drafts always right -> the longest draft
    t = spec.DraftTuner(6, autotune=True)
    for _ in range(50):
        k = t.next_k()
        t.observe(k, k, 1.0 + 0.01 * k, 0.001 * k)
    assert t.best_k() == 6
    # drafts always wrong and a 2-token forward costs 1.3x -> drafting off, with rare probes
    t = spec.DraftTuner(6, autotune=True)
    ks = []
    for _ in range(200):
        k = t.next_k()
        ks.append(k)
        t.observe(k, 0, 1.0 + 0.3 * k, 0.01 * k)
    assert t.best_k() == 0 and ks[-64:].count(0) >= 56
    # 80% acceptance, costs c(n) = 1 + 0.1 (n - 1): the best k by the model is interior
    t = spec.DraftTuner(8, autotune=True)
    rng = np.random.default_rng(0)
    for _ in range(400):
        k = t.next_k()
        n_acc = next((i for i in range(k) if rng.random() > 0.8), k)
        t.observe(k, n_acc, 1.0 + 0.1 * k, 0.0)
    rates = [(1 - 0.8 ** (k + 1)) / 0.2 / (1.0 + 0.1 * k) for k in range(9)]
    best = int(np.argmax(rates))
    assert abs(t.best_k() - best) <= 1


# ---- E-style (KV-shared target, centroid head) and the other on-disk schemas ------------------------


@pytest.fixture(scope="module")
def tiny_e(tmp_path_factory):
    torch.set_num_threads(2)
    d = tmp_path_factory.mktemp("spec_e")
    hf_tiny.build("e", d / "target", seed=0)
    hf_tiny.build("assistant_e", d / "assistant", seed=0)
    t_path = convert(d / "target", d / "target.gguf", "f32", quiet=True)
    a_path = convert(d / "assistant", d / "assistant.gguf", "f32", quiet=True)
    return dict(target=str(t_path), assistant=str(a_path), dir=d)


@pytest.mark.parametrize("P", [5, 13])
def test_centroid_head_step_matches_reference(tiny_e, P):
    """Our centroid head (top-k clusters of the centroid logits, their tokens scored, the rest at
    min - 1) vs the float64 reference of it (itself checked against HF's masked_embedding in
    test_ref_model_hf), on the KV-shared e target (the assistant reads target layers 3 and 4)."""
    e, _, _, (got_l, got_h), ref64, ref32 = _step_vs_reference(tiny_e, P)
    assert e.assistant.clusters is not None and [lw.target_layer for lw in e.assistant.layers] == [3, 3, 3, 4]
    cfg = e.assistant.cfg
    n_cand = cfg.centroid_top_k * cfg.n_vocab // cfg.n_centroids
    assert int((got_l > got_l.min()).sum()) == n_cand and np.array_equal(got_l > got_l.min(), ref64[0] > ref64[0].min())
    for got, r64, r32 in ((got_l, ref64[0], ref32[0]), (got_h, ref64[1], ref32[1])):
        assert float(np.abs(got - r64).max()) <= _bound(r64, r32)


def test_e_target_greedy_spec_equals_plain(tiny_e):
    e = Engine(tiny_e["target"], draft=tiny_e["assistant"], threads=2, n_ctx=96, max_batch=4, progress=False)
    for ids in _prompts([4, 15], seed=9):
        plain = e.generate(ids, max_tokens=40, spec_type="none")
        for k in (1, 3, 6):
            assert e.generate(ids, max_tokens=40, draft_max=k).tokens == plain.tokens


@pytest.mark.parametrize("schema", ["gemma4_mtp", "gemma4_assistant"])
@pytest.mark.parametrize("which", ["dense", "e"])
def test_other_schemas_draft_identically(tiny, tiny_e, schema, which):
    """ik_llama.cpp's gemma4_mtp (no rope_freqs, mtp_* names, token -> centroid map) and the
    gemma4_assistant spelling give the same drafter: identical step outputs bit for bit. For
    gemma4_mtp this includes the full layer's partial RoPE, taken from the target (spec 4.8-6)."""
    from assistant_schemas import rewrite_assistant
    case = tiny if which == "dense" else tiny_e
    dst = case["dir"] / f"asst_{schema}.gguf"
    rewrite_assistant(case["assistant"], dst, schema)
    assert GGUFFile(dst).arch == schema
    ids = _prompts([10], seed=4)[0]
    outs = []
    for path in (case["assistant"], str(dst)):
        e = Engine(case["target"], draft=path, threads=2, n_ctx=64, progress=False)
        _, h = e.model.forward(ids, "last")
        outs.append(e.assistant.step(7, h[-1], len(ids)) + (e.assistant.draft(7, h[-1], len(ids), 5),))
    assert np.array_equal(outs[0][0], outs[1][0]) and np.array_equal(outs[0][1], outs[1][1])
    assert outs[0][2] == outs[1][2]


# ---- the CLI ---------------------------------------------------------------------------------------


def _cli(*args):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "gemma4cpu.run", *args], capture_output=True, text=True, timeout=300)


def test_cli_ngram_matches_plain_and_reports_stats():
    prompt = "a = [1, 2, 3]\nb = [1, 2, 3]\nc = [1, 2, 3]\nd ="
    plain = _cli("-p", prompt, "-n", "24", "-t", "2", "--no-echo")
    sp = _cli("-p", prompt, "-n", "24", "-t", "2", "--no-echo", "--spec-type", "ngram", "--spec-draft-n-max", "4")
    assert plain.returncode == 0 and sp.returncode == 0, sp.stderr
    assert sp.stdout == plain.stdout
    assert "draft ngram k<=4:" in sp.stderr and "accepted" in sp.stderr and "tokens/round" in sp.stderr


def test_cli_spec_errors(tiny, tmp_path):
    cases = [(("--spec-type", "mtp"), "needs the assistant model: -md"),
             (("-md", str(tmp_path / "none.gguf")), "draft model file not found"),
             (("--spec-type", "medusa"), "unknown speculative type"),
             (("--draft-max", "17"), "--draft-max must be in 1..16"),
             (("--draft-min", "5", "--draft-max", "3"), "--draft-min must be"),
             (("--draft-p-min", "2"), "--draft-p-min must be in [0, 1]"),
             (("-md", tiny["assistant"]), "drafts for Gemma 4 targets; the target is 'gemma3'"),
             (("-m", tiny["assistant"]), "MTP assistant")]
    for args, msg in cases:
        p = _cli("-n", "2", "-t", "2", *args)
        assert p.returncode != 0 and msg in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
