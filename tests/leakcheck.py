"""Leak check shared by tests/test_interrupt.py (200 calls) and tools/leak_check.py (1,000 calls):
run many short generate / stream / chat / logits calls on one Engine and compare thread count, OS
threads (/proc/self/task), Python allocations (tracemalloc, after gc) and RSS before and after."""
import gc
import os
import threading
import time
import tracemalloc

PROMPTS = ["The capital of France is", "Water is made of", "Once upon a time", "1, 2, 3,", "Hello"]


def _tasks() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1


def _rss() -> int:
    import psutil
    return psutil.Process().memory_info().rss


def _one(eng, i):
    p = PROMPTS[i % len(PROMPTS)] + " " * (i % 3)
    kind = i % 10
    if kind in (3, 7):
        s = eng.generate(p, max_tokens=2, stream=True)
        next(s, None)
        s.close()                                     # abandoned stream
    elif kind == 5:
        eng.chat([{"role": "user", "content": p}], max_tokens=1)
    elif kind == 9:
        eng.logits(eng.tokenize(p))
    else:
        eng.generate(p, max_tokens=1 + i % 2, temperature=0.7 if i % 4 == 0 else 0.0, seed=i)


def run_calls(eng, n: int, warmup: int = 20) -> dict:
    for i in range(warmup):
        _one(eng, i)
    gc.collect()
    threads0, tasks0, rss0 = threading.active_count(), _tasks(), _rss()
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    gc.collect()
    traced0 = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    for i in range(n):
        _one(eng, warmup + i)
    secs = time.perf_counter() - t0
    gc.collect()
    traced1 = tracemalloc.get_traced_memory()[0]
    if started:
        tracemalloc.stop()
    return {"calls": n, "seconds": round(secs, 2), "threads_before": threads0, "threads_after": threading.active_count(),
            "tasks_before": tasks0, "tasks_after": _tasks(), "traced_growth": traced1 - traced0,
            "rss_growth": _rss() - rss0}
