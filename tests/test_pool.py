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
    me = threading.get_native_id()
    with pool.pinned():                        # the caller is worker 0, held on plan[0]
        K.matmul(pool, "Q8_0", w, 256, np.ones((1, 256), np.float32))
        pins = pool.pin_plan()
        assert [p[1] for p in pins] == plan
        tids = [p[2] for p in pins]
        assert tids[0] == me
        assert len(set(tids)) == len(tids) and all(t > 0 for t in tids)
        for (_, cpu, tid) in pins:
            assert _allowed_cpus(tid) == {cpu}, f"worker tid {tid} not pinned to {cpu}"
    assert _allowed_cpus(me) == set(cpus)     # given back on leaving the block
    pool.close()


def test_caller_affinity_given_back_after_each_call(restore_affinity):
    """A pinned pool pins the calling thread only while it works: after a call (or a pinned
    block, nested or not) the caller has the affinity it had, also a narrowed one."""
    cpus = restore_affinity
    pool = K.Pool(1, [cpus[-1]])
    w = random_rows("Q8_0", 64, 256, np.random.default_rng(0))
    x = np.ones((1, 256), np.float32)
    me = threading.get_native_id()
    K.matmul(pool, "Q8_0", w, 256, x)
    assert os.sched_getaffinity(0) == set(cpus) and _allowed_cpus(me) == set(cpus)
    with pool.pinned():
        with pool.pinned():
            K.matmul(pool, "Q8_0", w, 256, x)
        assert os.sched_getaffinity(0) == {cpus[-1]}   # the outer block still holds it
    assert os.sched_getaffinity(0) == set(cpus)
    os.sched_setaffinity(0, {cpus[0]})
    K.matmul(pool, "Q8_0", w, 256, x)
    assert os.sched_getaffinity(0) == {cpus[0]}
    pool.close()


def test_pinned_block_of_another_thread_does_not_leak():
    """While one thread holds the pool's pinned block, another thread's calls pin and restore
    per call and its leave does not end the holder's block."""
    cpus = sorted(os.sched_getaffinity(0))
    pool = K.Pool(1, [cpus[-1]])
    w = random_rows("Q8_0", 64, 256, np.random.default_rng(0))
    x = np.ones((1, 256), np.float32)
    seen = {}
    go = threading.Event()

    def other():  # started before the block: a thread inherits its creator's affinity
        go.wait()
        with pool.pinned():
            K.matmul(pool, "Q8_0", w, 256, x)
        seen["other"] = os.sched_getaffinity(0)

    t = threading.Thread(target=other)
    t.start()
    with pool.pinned():
        go.set()
        t.join()
        seen["holder"] = os.sched_getaffinity(0)
    assert seen == {"other": set(cpus), "holder": {cpus[-1]}}
    assert os.sched_getaffinity(0) == set(cpus)
    pool.close()


def test_groups_and_row_placement_are_bit_identical():
    """Rows split per worker group (NUMA distribute), with or without per-group copies (mirror),
    give the same bits as the plain static split, for decode and tiled prefill batches."""
    rng = np.random.default_rng(7)
    w = random_rows("Q4_K", 200, 512, rng)
    plain = K.Pool(1)
    pool = K.Pool(2)
    assert pool.groups == (0, 2)
    pool.set_groups([0, 1, 2])
    assert pool.groups == (0, 1, 2)
    copy = w.copy()
    for n in (1, 3, 40):
        x = rng.standard_normal((n, 512)).astype(np.float32)
        want = K.matmul(plain, "Q4_K", w, 512, x)
        for place in (K.RowPlacement([0, 96, 200]), K.RowPlacement([0, 0, 200]),
                      K.RowPlacement([0, 112, 200], copies=[w, copy])):
            out = np.full_like(want, np.nan)
            K.matmul(pool, "Q4_K", w, 512, x, out=out, placement=place)
            np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
        out = np.full_like(want, np.nan)               # a partial row range meets the split
        K.matmul(pool, "Q4_K", w, 512, x, out=out, r0=80, r1=130, placement=K.RowPlacement([0, 96, 200]))
        np.testing.assert_array_equal(out[:, 80:130].view(np.uint32), want[:, 80:130].view(np.uint32))
        assert np.isnan(out[:, :80]).all() and np.isnan(out[:, 130:]).all()
    # the copy of group 1 is really what group 1 reads: corrupt it and only its rows change
    bad = copy.copy()
    bad[150:] = w[0]
    x = rng.standard_normal((1, 512)).astype(np.float32)
    want = K.matmul(plain, "Q4_K", w, 512, x)
    out = K.matmul(pool, "Q4_K", w, 512, x, placement=K.RowPlacement([0, 112, 200], copies=[w, bad]))
    np.testing.assert_array_equal(out[:, :150], want[:, :150])
    assert np.all(out[0, 150:] == want[0, 0])
    pool.close()


@pytest.mark.parametrize("bounds,copies,match", [
    ([0, 200], None, "1 groups, the pool 2"),
    ([0, 50, 100], None, "for 100 rows, the matrix has 200"),
    ([5, 50, 200], None, "start at 0"),
    ([0, 150, 100, 200], None, "not decrease"),
    ([0, 100, 200], "one", "2 groups need 2 copies"),
])
def test_bad_row_placement(bounds, copies, match):
    w = random_rows("Q8_0", 200, 256, np.random.default_rng(0))
    pool = K.Pool(2)
    pool.set_groups([0, 1, 2])
    with pytest.raises(ValueError, match=match):
        place = K.RowPlacement(bounds, copies=[w] if copies == "one" else None)
        K.matmul(pool, "Q8_0", w, 256, np.ones((1, 256), np.float32), placement=place)
    with pytest.raises(ValueError, match="groups over 2 workers|empty"):
        pool.set_groups([0, 2, 2])
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
