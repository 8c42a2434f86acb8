"""The kernel-backed gemma4cpu.model.Model against Hugging Face transformers and the float64 reference.

For each tiny random variant (gemma4cpu.ref.hf_tiny: dense K=V + partial RoPE, MoE, E-style with
PLE and KV sharing, gemma3): HF -> gemma4cpu.convert -> Model (C kernels, C flash attention, KV
cache). Checked:
  * F32 GGUF + f32 cache: logits and hidden states at every position of a 20-token prompt (the
    sliding window is 8) within a float32 noise bound measured on the same prompt; greedy
    continuation equal to HF generate(do_sample=False).
  * Q8_0 GGUF: top-1 agreement with HF >= 99% over the positions of several prompts.
  * every cache type (f16, q8_0, q4_0) against the f32 cache, within a bound derived from the
    cache type's rounding, and ring wrap + chunked prefill equal to one call bit for bit.
"""
import numpy as np
import pytest

from gemma4cpu.convert import convert
from gemma4cpu.model import Model
from gemma4cpu.ref.model import Model as RefModel

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from gemma4cpu.ref import hf_tiny  # noqa: E402

VARIANTS = ["dense", "moe", "e", "gemma3"]
N_PROMPT = 20
N_NEW = 10
U32 = 2.0 ** -24


@pytest.fixture(scope="module", params=VARIANTS)
def case(request, tmp_path_factory):
    torch.set_num_threads(2)
    d = tmp_path_factory.mktemp("c" + request.param)
    hf = hf_tiny.build(request.param, d / "hf", seed=0)
    f32 = convert(d / "hf", d / "f32.gguf", "f32", quiet=True)
    q8 = convert(d / "hf", d / "q8.gguf", "q8_0", quiet=True)
    tokens = torch.randint(3, hf_tiny.VOCAB, (1, N_PROMPT), generator=torch.Generator().manual_seed(7))
    return request.param, hf, f32, q8, tokens


def _tol(ref64: np.ndarray, ref32: np.ndarray) -> float:
    """Engine-vs-reference tolerance: see test_f32_logits_and_hidden_match_hf."""
    return 8.0 * float(np.abs(ref32 - ref64).max()) + 16 * U32 * float(np.abs(ref64).max())


def _hf(hf, tokens):
    with torch.no_grad():
        out = hf(tokens, output_hidden_states=True)
    return out.logits[0].double().numpy(), out.hidden_states[-1][0].double().numpy()


def test_f32_logits_and_hidden_match_hf(case):
    """The bound: HF (float32) and our engine (float32, other summation order, other exp) each
    deviate from the float64 reference by float32 rounding noise. We measure that noise as
    max|ref32 - ref64| of the numpy reference run in float32 on the same prompt; the engine's
    products sum per 32/256-blocks then across blocks (about as many roundings as numpy's
    pairwise sum, up to log2(#blocks) more), so 8x the measured noise covers engine-vs-ref64 and
    HF-vs-ref64 together; the floor 16 u max|x| covers a float32 run that happens to round almost
    exactly. A wrong layer scalar or norm is > 100x outside (asserted in test_ref_model_hf)."""
    name, hf, f32, _, tokens = case
    ids = tokens[0].numpy()
    hf_l, hf_h = _hf(hf, tokens)
    r64, r32 = RefModel(f32), RefModel(f32, np.float32)
    l64, h64 = r64.forward(ids)
    l32, h32 = r32.forward(ids)
    m = Model(f32, n_ctx=64, threads=2, cache_type_k="f32", cache_type_v="f32")
    lg, h = m.forward(ids, "all")
    for what, got, ref64, ref32, hfv in (("logits", lg, l64, l32, hf_l), ("hidden", h, h64, h32, hf_h)):
        tol = _tol(ref64, ref32)
        e_ref = float(np.abs(got - ref64).max())
        e_hf = float(np.abs(got - hfv).max())
        print(f"{name} {what}: |engine-ref64| {e_ref:.3g}, |engine-HF| {e_hf:.3g}, tol {tol:.3g}")
        assert e_ref <= tol, f"{name}: {what} differ from the float64 reference by {e_ref} > {tol}"
        assert e_hf <= tol, f"{name}: {what} differ from HF by {e_hf} > {tol}"


def test_f32_greedy_matches_hf_generate(case):
    name, hf, f32, _, tokens = case
    with torch.no_grad():
        want = hf.generate(tokens, max_new_tokens=N_NEW, do_sample=False)[0, N_PROMPT:].tolist()
    m = Model(f32, n_ctx=64, threads=2, cache_type_k="f32", cache_type_v="f32")
    lg, _ = m.forward(tokens[0].numpy())
    got = []
    for step in range(N_NEW):
        row = lg[-1]
        t = int(np.argmax(row))
        if t != want[step]:
            top2 = np.sort(row)[-2:]
            # acceptable only at a genuine tie (float32 noise decides it either way)
            assert top2[1] - top2[0] < 1e-4, f"{name}: step {step}: engine {t}, HF {want[step]}"
            pytest.skip(f"{name}: near-tie at step {step}")
        got.append(t)
        lg, _ = m.forward([t])
    assert got == want


def test_q8_0_top1_agrees_with_hf(case):
    """Q8_0 weights move the logits of position i of these tiny random models by up to delta_i
    (measured: the float64 reference on the Q8_0 file vs on the F32 file, i.e. weight rounding
    alone; in the MoE it can flip a top-2 routing and jump). Where HF's
    top-1 margin exceeds 2 delta, weight rounding cannot flip the argmax, so the engine (which adds
    only activation rounding of the same 1/254 relative size) must agree at >= 99% of those
    positions. Random 512-way logits have small margins, so the raw agreement is only printed;
    at least 16 positions must qualify, so that a single disagreement fails the check."""
    name, hf, f32, q8, _ = case
    m = Model(q8, n_ctx=64, threads=2)
    r8, r32 = RefModel(q8), RefModel(f32)
    agree = total = raw = n_all = 0
    for seed in range(4):
        tokens = torch.randint(3, hf_tiny.VOCAB, (1, 24), generator=torch.Generator().manual_seed(100 + seed))
        ids = tokens[0].numpy()
        hf_l, _ = _hf(hf, tokens)
        delta = np.abs(r8.forward(ids)[0] - r32.forward(ids)[0]).max(axis=1)  # per position
        m.cache.truncate(0)
        lg, _ = m.forward(ids, "all")
        top = np.sort(hf_l, axis=1)
        ok = (top[:, -1] - top[:, -2]) > 2 * delta
        same = lg.argmax(1) == hf_l.argmax(1)
        agree += int(same[ok].sum())
        total += int(ok.sum())
        raw += int(same.sum())
        n_all += same.size
    print(f"{name}: Q8_0 top-1 agreement {agree}/{total} where margin > 2 delta; {raw}/{n_all} overall")
    assert total >= 16, f"{name}: only {total}/{n_all} positions have a margin above 2 delta"
    assert agree >= 0.99 * total, f"{name}: Q8_0 top-1 agreement {agree}/{total} < 99%"


KV_REL = {"f16": 2.0 ** -11, "q8_0": 1.0 / 127, "q4_0": 1.0 / 7}  # relative rounding of one cached value


def test_cache_types_agree_with_f32_cache(case):
    """Quantised caches against the f32 cache. Each cached K, V value is stored with relative
    error <= r (f16: 2^-11 of itself; q8_0: half a step of amax/127, doubled for the f16 scale:
    1/127 of the block max; q4_0 likewise 1/7). For perturbations this small the logit change is
    first-order in r, so the measured f16 change d16 fixes the model's sensitivity and the other
    types must stay within d16 * r / r_f16, times 4 for the second-order terms (exp of a perturbed
    score) and for the block max exceeding a typical value. Errors must also rank by precision.
    Not for the MoE variant: there a cache rounding can flip a top-2 routing of these tiny random
    models and the logits jump (not a first-order change); the kernels' cache types are checked
    directly in tests/test_flash_attn.py."""
    name, _, f32, _, tokens = case
    if name == "moe":
        pytest.skip("top-2 routing of a tiny random MoE is discontinuous in the cache rounding")
    ids = tokens[0].numpy()
    base = Model(f32, n_ctx=64, threads=2, cache_type_k="f32", cache_type_v="f32").forward(ids, "all")[0]
    errs = {}
    for t in ("f16", "q8_0", "q4_0"):
        lg = Model(f32, n_ctx=64, threads=2, cache_type_k=t, cache_type_v=t).forward(ids, "all")[0]
        assert np.isfinite(lg).all()
        errs[t] = float(np.abs(lg - base).max())
    d16 = max(errs["f16"], 16 * U32 * float(np.abs(base).max()))
    for t in ("q8_0", "q4_0"):
        tol = 4.0 * d16 * KV_REL[t] / KV_REL["f16"]
        print(f"{name}: {t} cache max|dlogits| {errs[t]:.3g} (tol {tol:.3g}; f16 {errs['f16']:.3g})")
        assert errs[t] <= tol, f"{name}: {t} cache differs by {errs[t]} > {tol}"
    assert 0 < errs["f16"] < errs["q8_0"] < errs["q4_0"], f"{name}: cache errors do not rank by precision: {errs}"


def test_ring_wrap_and_chunking(case):
    """max_batch 3 and max_draft 1 make the sliding rings (window 8) 10 slots: a 20-token prompt
    overwrites every slot. Within one cache geometry, one call (chunked internally by 3), token-by-token
    decoding and a rollback after the wrap agree bit for bit. Against a cache that never wraps the
    keys sit in other slots, so the online softmax sums in another order: equal within float32
    noise (the bound of test_f32_logits_and_hidden_match_hf, measured the same way)."""
    name, _, f32, _, tokens = case
    ids = tokens[0].numpy()
    kw = dict(n_ctx=64, threads=2, cache_type_k="f32", cache_type_v="f32")
    ref_l, ref_h = Model(f32, max_batch=64, **kw).forward(ids, "all")
    small = Model(f32, max_batch=3, max_draft=1, **kw)
    assert min(small.cache.n_slots) <= N_PROMPT // 2  # every slot of the rings is overwritten
    lg, h = small.forward(ids, "all")
    r64, r32 = RefModel(f32), RefModel(f32, np.float32)
    l64, l32 = r64.forward(ids)[0], r32.forward(ids)[0]
    tol = _tol(l64, l32)
    assert np.abs(lg - ref_l).max() <= tol and np.abs(lg - l64).max() <= tol
    small.cache.truncate(N_PROMPT - 1)                   # reject one token after the wrap
    lg1, _ = small.forward(ids[-1:], "all")
    np.testing.assert_array_equal(lg1.view(np.uint32), lg[-1:].view(np.uint32))
    small.cache.truncate(0)
    parts = [small.forward(ids[:5], "all")[1]] + [small.forward([t], "all")[1] for t in ids[5:]]
    np.testing.assert_array_equal(np.concatenate(parts).view(np.uint32), h.view(np.uint32))
