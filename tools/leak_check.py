"""1,000 short generate / stream / chat / logits calls on the embedded Gemma 3 270M: no leaked
threads or memory (issue 8). The test suite runs 200 (tests/test_interrupt.py).

    python tools/leak_check.py [--calls 1000] [--threads 2]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from leakcheck import run_calls  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    from gemma4cpu.engine import Engine
    eng = Engine(threads=a.threads, n_ctx=512, progress=False)
    res = run_calls(eng, a.calls, warmup=50)
    print(json.dumps(res))
    ok = (res["threads_after"] <= res["threads_before"] and res["tasks_after"] <= res["tasks_before"]
          and res["traced_growth"] < 1 << 20 and res["rss_growth"] < 64 << 20)
    print("no leak" if ok else "LEAK")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
