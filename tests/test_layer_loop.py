"""The C layer loop (csrc/g4_layers.c) against the Python layer loop of gemma4cpu.model: the same
bits for decode and verify steps on every variant it serves, the Python loop kept for the variants it
does not (experts, per-layer embeddings), the cache bookkeeping (KVCache.reserve) refusing what append
refuses without changing anything, and an interrupt part-way leaving a cache that continues exactly.

Models: tiny random HF variants (gemma4cpu.ref.hf_tiny: dense Gemma 4 with K=V full layers, V norm and
proportional partial RoPE; Gemma 3), converted to Q8_0 and F32, sliding window 8, so a 20-token
run crosses the window and, with max_batch 3 / max_draft 1, wraps the rings."""
import signal

import numpy as np
import pytest

from gemma4cpu.convert import convert
from gemma4cpu.model import LOOP_MAX_TOK, Model

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from gemma4cpu.ref import hf_tiny  # noqa: E402

IDS = [int(v) for v in np.random.default_rng(5).integers(3, hf_tiny.VOCAB, 40)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    torch.set_num_threads(2)
    out = {}
    for name in ("dense", "gemma3", "moe", "e"):
        d = tmp_path_factory.mktemp("ll" + name)
        hf_tiny.build(name, d / "hf", seed=1)
        out[name] = {q: convert(d / "hf", d / f"{q}.gguf", q, quiet=True) for q in ("q8_0", "f32")}
    return out


def _steps(m: Model, c_loop: bool, split=(3, 1, 1, 5, 1, 2, 16, 1)):
    """A prompt and then steps of the sizes in `split` (1 = decode, > 1 = a verify batch), logits of
    every row, then a rollback of 2 and a redo."""
    m.layer_loop = c_loop
    m.cache.truncate(0)
    out, i = [], 0
    for n in split:
        out.append(m.forward(IDS[i:i + n], "all")[0])
        i += n
    m.cache.truncate(i - 2)
    out.append(m.forward(IDS[i - 2:i], "all")[0])
    return out


@pytest.mark.parametrize("name", ["dense", "gemma3"])
@pytest.mark.parametrize("quant", ["q8_0", "f32"])
@pytest.mark.parametrize("cache", ["f16", "q8_0", "q4_0", "f32"])
def test_c_loop_equals_python_loop(files, name, quant, cache):
    m = Model(files[name][quant], n_ctx=64, threads=2, cache_type_k=cache, cache_type_v=cache, max_batch=16,
              max_draft=3, progress=False)
    assert m._layer_loop() is not None
    py, c = _steps(m, False), _steps(m, True)
    for i, (a, b) in enumerate(zip(py, c)):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32), err_msg=f"call {i}")


@pytest.mark.parametrize("name", ["dense", "gemma3"])
def test_ring_wrap_in_the_c_loop(files, name):
    """Rings of window 8 + 2 slots, written only by the C loop (steps of <= 3 tokens): they wrap
    twice; a rollback of 2 after the wrap, then the same tokens again, gives the same bits, and the
    whole run equals the Python loop's."""
    m = Model(files[name]["q8_0"], n_ctx=64, threads=2, max_batch=3, max_draft=1, progress=False)
    assert min(m.cache.n_slots) == 10
    split = (3, 1, 2, 3, 1, 3, 1, 3, 2, 1, 3)
    py, c = _steps(m, False, split), _steps(m, True, split)
    assert m.cache.n == sum(split) and m.cache._lost[0] > 0  # the ring wrapped
    for i, (a, b) in enumerate(zip(py, c)):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32), err_msg=f"call {i}")
    np.testing.assert_array_equal(c[-1].view(np.uint32), c[-2][-2:].view(np.uint32))


@pytest.mark.parametrize("name", ["moe", "e"])
def test_variants_outside_the_loop_keep_python(files, name):
    m = Model(files[name]["q8_0"], n_ctx=32, threads=2, progress=False)
    assert m._layer_loop() is None
    assert np.isfinite(m.forward(IDS[:4])[0]).all()


def test_env_turns_the_loop_off(files, monkeypatch):
    monkeypatch.setenv("GEMMA4CPU_LAYER_LOOP", "python")
    m = Model(files["dense"]["q8_0"], n_ctx=32, threads=2, progress=False)
    assert m._layer_loop() is None


def test_env_refuses_an_unknown_value(files, monkeypatch):
    monkeypatch.setenv("GEMMA4CPU_LAYER_LOOP", "pyhton")
    with pytest.raises(ValueError, match="GEMMA4CPU_LAYER_LOOP='pyhton'"):
        Model(files["dense"]["q8_0"], n_ctx=32, threads=2, progress=False)
    monkeypatch.setenv("GEMMA4CPU_LAYER_LOOP", " C ")
    assert Model(files["dense"]["q8_0"], n_ctx=32, threads=2, progress=False)._layer_loop() is not None


def test_reserve_refuses_like_append_and_changes_nothing(files):
    m = Model(files["dense"]["q8_0"], n_ctx=32, threads=2, max_batch=3, max_draft=1, progress=False)
    m.forward(IDS[:3])
    state = (list(m.cache._len), list(m.cache._lost))
    with pytest.raises(ValueError, match="max_batch"):
        m.cache.reserve(4)       # more than a ring may take in one append
    with pytest.raises(ValueError, match="context full"):
        m.forward(IDS[:3] * 10)  # 30 > 32 - 3
    with pytest.raises(ValueError, match="m >= 1"):
        m.cache.reserve(0)
    assert (list(m.cache._len), list(m.cache._lost)) == state
    used = m.cache.reserve(2)
    assert used == [min(5, ns) for ns in m.cache.n_slots] and m.cache.n == 5


def test_loop_is_rebuilt_for_a_new_cache(files):
    m = Model(files["gemma3"]["q8_0"], n_ctx=32, threads=2, progress=False)
    a = m.forward(IDS[:4])[0]
    loop = m._layer_loop()
    from gemma4cpu.kv_cache import KVCache
    m.cache = KVCache.from_config(m.cfg, 32, max_draft=16, max_batch=256)
    assert m._layer_loop() is not loop
    np.testing.assert_array_equal(m.forward(IDS[:4])[0].view(np.uint32), a.view(np.uint32))


def test_interrupt_inside_the_loop_leaves_a_cache_that_continues_exactly(files):
    """SIGALRM raises at arbitrary moments of a run of decode steps (often inside the C loop, whose
    interrupt checks sit between half layers). After each interrupt the cache holds exactly the
    steps that returned, and finishing the run gives the uninterrupted bits."""
    m = Model(files["dense"]["q8_0"], n_ctx=64, threads=1, max_batch=3, max_draft=1, progress=False)
    ref = _steps(m, True, (1,) * 20)

    class Stop(Exception):
        pass

    where = []
    armed = [False]  # raise only inside the try below: an alarm before it or after the 20 steps
                     # (they can finish first at the longer delays) must not escape the test

    def boom(_sig, frame):
        if not armed[0]:
            return
        where.append(frame.f_code.co_name if frame is not None else "")
        raise Stop

    old = signal.signal(signal.SIGALRM, boom)
    in_loop = 0
    # where an alarm lands depends on the host's timing (a busy CI machine stretches the Python
    # parts): the sweep of 12 delays is repeated, up to 4 times, until one landed inside the loop
    delays = [d for sweep in range(4) for d in np.geomspace(5e-5, 5e-3, 12)]
    try:
        for k, delay in enumerate(delays):
            if in_loop and k % 12 == 0:
                break
            m.cache.truncate(0)
            done = []
            signal.setitimer(signal.ITIMER_REAL, delay)
            try:
                armed[0] = True
                for i in range(20):
                    p0 = m.cache.n
                    done.append(m.forward(IDS[i:i + 1], "all")[0])
                armed[0] = False
            except Stop:
                if where[-1] == "_run_layers":  # raised by the loop's check between half layers
                    in_loop += 1
                    assert m.cache.n == p0 == len(done)  # rolled back by forward
                else:
                    assert m.cache.n in (len(done), len(done) + 1)
                    m.cache.truncate(len(done))
            finally:
                armed[0] = False
                signal.setitimer(signal.ITIMER_REAL, 0)
            for i in range(len(done), 20):
                done.append(m.forward(IDS[i:i + 1], "all")[0])
            for i, (a, b) in enumerate(zip(ref, done)):
                np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32), err_msg=f"delay {delay} step {i}")
    finally:
        signal.signal(signal.SIGALRM, old)
    assert in_loop >= 1, where  # at least one run was cut inside the C loop


def test_max_tok_matches_the_kernel_tile():
    assert LOOP_MAX_TOK == 16  # one 16-token tile of the small-batch kernels per product


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    torch.set_num_threads(2)
    d = tmp_path_factory.mktemp("lld")
    hf_tiny.build("dense", d / "t", seed=2)
    hf_tiny.build("assistant", d / "a", seed=2)
    return convert(d / "t", d / "t.gguf", "q8_0", quiet=True), convert(d / "a", d / "a.gguf", "q8_0", quiet=True)


@pytest.mark.parametrize("cache", ["f16", "q4_0"])
def test_drafter_c_loop_equals_python_loop(drafter, cache):
    """The MTP assistant's Q-only layers run as the C loop's KV-shared layers over the target's cache:
    the same draft logits and next hidden, bit for bit, at positions inside and past the sliding window."""
    from gemma4cpu.assistant import Assistant
    m = Model(drafter[0], n_ctx=64, threads=2, cache_type_k=cache, cache_type_v=cache, progress=False)
    a = Assistant(drafter[1], m)
    assert a._layer_loop() is not None
    for P in (3, 12, 21):
        m.cache.truncate(0)
        _, h = m.forward(IDS[:P], "all")
        out = {}
        for c_loop in (False, True):
            m.layer_loop = c_loop
            lg, hn = a.step(IDS[P - 1], h[-1], P)
            lg2, _ = a.step(int(np.argmax(lg)), hn, P)
            out[c_loop] = (lg, hn, lg2)
        for x, y in zip(out[False], out[True]):
            np.testing.assert_array_equal(x.view(np.uint32), y.view(np.uint32), err_msg=f"P={P}")
