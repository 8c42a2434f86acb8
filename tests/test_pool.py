"""The C thread pool: pinning read back from /proc, dispatch under stress, clean shutdown."""
import os
import threading

import numpy as np
import pytest

from gemma4cpu import kernels as K
from gemma4cpu.synth import random_rows


def _allowed_cpus(tid):
    with open(f"/proc/self/task/{tid}/status") as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                spec = line.split(":", 1)[1].strip()
                out = set()
                for part in spec.split(","):
                    a, _, b = part.partition("-")
                    out.update(range(int(a), int(b or a) + 1))
                return out
    raise AssertionError("no Cpus_allowed_list")


@pytest.fixture
def restore_affinity():
    saved = os.sched_getaffinity(0)
    yield sorted(saved)
    os.sched_setaffinity(0, saved)


def _threads():
    return set(os.listdir("/proc/self/task"))


def test_workers_pinned_where_told(restore_affinity):
    cpus = restore_affinity
    plan = list(reversed(cpus))[:2] if len(cpus) >= 2 else cpus * 2
    pool = K.Pool(len(plan), plan)
    w = random_rows("Q8_0", 64, 256, np.random.default_rng(0))
    K.matmul(pool, "Q8_0", w, 256, np.ones((1, 256), np.float32))  # the caller becomes worker 0
    pins = pool.pin_plan()
    assert [p[1] for p in pins] == plan
    tids = [p[2] for p in pins]
    assert tids[0] == threading.get_native_id()
    assert len(set(tids)) == len(tids) and all(t > 0 for t in tids)
    for (_, cpu, tid) in pins:
        assert _allowed_cpus(tid) == {cpu}, f"worker tid {tid} not pinned to {cpu}"
    pool.close()


def test_unpinned_pool_leaves_affinity_alone(restore_affinity):
    before = os.sched_getaffinity(0)
    pool = K.Pool(2)
    w = random_rows("Q8_0", 64, 256, np.random.default_rng(0))
    K.matmul(pool, "Q8_0", w, 256, np.ones((1, 256), np.float32))
    assert os.sched_getaffinity(0) == before
    assert all(cpu == -1 for _, cpu, _ in pool.pin_plan())
    pool.close()


def test_dispatch_stress_is_exact():
    """Thousands of back-to-back dispatches (spin and sleep paths) give exact results."""
    rng = np.random.default_rng(3)
    w = random_rows("Q4_K", 48, 256, rng)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    want = K.matmul(K.Pool(1), "Q4_K", w, 256, x)
    for spin_us in (0, 200):
        pool = K.Pool(2, spin_us=spin_us)
        out = np.empty_like(want)
        for i in range(2000):
            out.fill(np.nan)
            K.matmul(pool, "Q4_K", w, 256, x, out=out)
            if i % 97 == 0 or i == 1999:
                np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
        pool.close()


def test_pools_shut_down_without_leaking_threads():
    before = _threads()
    for _ in range(20):
        p = K.Pool(3)
        p.close()
    del p
    assert _threads() == before


def test_closed_pool_refuses_work():
    p = K.Pool(2)
    p.close()
    with pytest.raises(RuntimeError, match="closed"):
        K.matmul(p, "Q8_0", np.zeros((1, 34), np.uint8), 32, np.zeros((1, 32), np.float32))


@pytest.mark.parametrize("kwargs,match", [
    (dict(n_threads=0), "out of range"),
    (dict(n_threads=2, cpus=[0]), "need 2 CPUs"),
    (dict(n_threads=1, cpus=[100000]), "out of range"),
])
def test_bad_pool_arguments(kwargs, match):
    with pytest.raises((ValueError, RuntimeError), match=match):
        K.Pool(**kwargs)


def test_concurrent_callers_are_serialised():
    """Two Python threads sharing one pool get correct results (the wrapper holds a lock)."""
    rng = np.random.default_rng(5)
    w = random_rows("Q8_0", 96, 512, rng)
    xs = [rng.standard_normal((2, 512)).astype(np.float32) for _ in range(2)]
    wants = [K.matmul(K.Pool(1), "Q8_0", w, 512, x) for x in xs]
    pool = K.Pool(2)
    errors = []

    def run(i):
        for _ in range(300):
            y = K.matmul(pool, "Q8_0", w, 512, xs[i])
            if not np.array_equal(y.view(np.uint32), wants[i].view(np.uint32)):
                errors.append(i)
                return

    ts = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    pool.close()
    assert not errors
