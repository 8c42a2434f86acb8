"""Every numeric parameter a user gives is range-checked before use, with an error naming it: context
size, max_tokens, sampling parameters, draft lengths, thread counts and CPU lists, token ids passed
to generate/logits (never truncated, wrapped or taken modulo the vocabulary). Runs on the fuzzer's
tiny Gemma 4 file, so nothing here needs a download."""
import numpy as np
import pytest

from gemma4cpu import fuzz


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("m") / "tiny.gguf"
    p.write_bytes(fuzz.seeds()["gemma4_bpe"])
    return p


@pytest.fixture(scope="module")
def eng(model_path):
    from gemma4cpu.engine import Engine
    return Engine(model_path, threads=1, n_ctx=32, progress=False)


@pytest.mark.parametrize("kw,match", [
    ({"n_ctx": 0}, r"n_ctx must be in 1\.\."), ({"n_ctx": -4}, "n_ctx"), ({"n_ctx": True}, "n_ctx must be an integer"),
    ({"n_ctx": 16.5}, "n_ctx must be an integer"), ({"n_ctx": 1 << 31}, r"n_ctx must be in 1\.\.2147483647"),
    ({"threads": 0}, "threads must be"), ({"threads": -1}, "threads must be"), ({"threads": 2.0}, "threads must be"),
    ({"threads": 5000}, r"threads"),   # the message is the NUMA planner's (gemma4cpu.placement)
    ({"cpus": [-1]}, r"(?i)cpu.*-1"), ({"cpus": [10**6]}, r"(?i)cpu.*1000000"), ({"cpus": []}, "CPU"),
    ({"max_batch": 0}, "max_batch"), ({"draft_max": 0}, r"draft_max must be an integer in 1\.\.16"),
    ({"draft_max": 17}, "draft_max"), ({"draft_min": 5}, r"draft_min must be an integer in 0\.\.draft_max=3"),
    ({"draft_p_min": 1.5}, "draft_p_min"), ({"cache_type_k": "q9"}, "unknown cache type"),
])
def test_engine_arguments(model_path, kw, match):
    from gemma4cpu.engine import Engine
    args = dict(threads=1, n_ctx=32, progress=False)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        Engine(model_path, **args)


@pytest.mark.parametrize("kw,match", [
    ({"max_tokens": -1}, "max_tokens"), ({"max_tokens": True}, "max_tokens"), ({"max_tokens": 2.0}, "max_tokens"),
    ({"temperature": -0.1}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"top_k": 2.5}, "top_k"), ({"top_k": "40"}, "top_k"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.1}, "top_p"),
    ({"min_p": -0.5}, "min_p"), ({"repeat_penalty": 0.0}, "repeat_penalty"), ({"repeat_last_n": -2}, "repeat_last_n"),
    ({"seed": -1}, "seed"), ({"draft_max": 99}, "draft_max"), ({"spec_type": "magic"}, "spec"),
])
def test_generate_arguments(eng, kw, match):
    with pytest.raises(ValueError, match=match):
        eng.generate("hello", **kw)
    assert eng.model.cache.n == len(eng._seq)        # a refused call changes nothing


@pytest.mark.parametrize("ids,exc,match", [
    ([1, 2.7], ValueError, r"token ids must be integers, got 2\.7"),
    ([1, True], ValueError, "token ids must be integers, got True"),
    ([1, "5"], ValueError, "token ids must be integers, got '5'"),
    ([1, -1], ValueError, r"token ids must be in \[0, 280\), got \[-1\]"),
    ([1, 280], ValueError, r"must be in \[0, 280\), got \[280\]"),
    ([1, 2**63], ValueError, r"must be in \[0, 280\)"),
    (np.array([1, 2**40]), ValueError, r"must be in \[0, 280\)"),
    ("not ids", None, None),                          # a string is a text prompt for generate
    (7, TypeError, "sequence of ints"),
])
def test_token_ids_to_generate_and_logits(eng, ids, exc, match):
    if exc is None:
        with pytest.raises(TypeError):
            eng.logits(ids)
        return
    with pytest.raises(exc, match=match):
        eng.generate(ids, max_tokens=1)
    with pytest.raises(exc, match=match):
        eng.logits(ids)


def test_numpy_integer_ids_are_fine(eng):
    a = eng.logits(np.array([1, 5, 9], dtype=np.int64))
    b = eng.logits([1, 5, 9])
    np.testing.assert_array_equal(a, b)
    assert eng.generate(np.array([2, 5], dtype=np.uint16), max_tokens=1).stats.n_prompt == 2


def test_model_forward_checks(model_path):
    from gemma4cpu.model import Model
    m = Model(model_path, n_ctx=8, threads=1, progress=False)
    for bad, match in [([300], r"token ids must be in \[0, 280\)"), ([-3], "token ids must be in"),
                       ([1.0], "integers"), ([], "at least one token"), (list(range(9)), "context full")]:
        with pytest.raises(ValueError, match=match):
            m.forward(bad)
    assert m.cache.n == 0


@pytest.mark.parametrize("args,match", [
    (("-c", "1"), "-c must be >= 2"), (("-n", "-3"), "-n must be >= 0"), (("--draft-max", "40"), "--draft-max"),
    (("--draft-min", "9"), "--draft-min"), (("--draft-p-min", "2"), "--draft-p-min"), (("-t", "0"), "threads"),
    (("-C", "5-2"), "--cpus"), (("--top-p", "0"), "top_p"),
])
def test_cli_refuses_bad_numbers(model_path, args, match):
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "gemma4cpu.run", "-m", str(model_path), "-q", "-p", "hello", *args],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and match in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)


@pytest.mark.parametrize("args,match", [
    (("-n", "-4"), "--max-tokens must be >= 0"), (("--temp", "-1"), "temperature"), (("--top-p", "0"), "top_p"),
    (("--min-p", "2"), "min_p"), (("--repeat-penalty", "0"), "repeat_penalty"), (("--seed", "-3"), "seed"),
    (("--workers", "0"), "--workers must be >= 1"), (("--ray-per-node", "0"), "--ray-per-node must be >= 1"),
    (("-c", "0"), "n_ctx"),
])
def test_batch_cli_refuses_bad_numbers_before_running(model_path, tmp_path, args, match):
    """A bad generation default is one error before the run, not an error record on every line."""
    import subprocess
    import sys
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"prompt": "hi"}\n')
    out = tmp_path / "out.jsonl"
    p = subprocess.run([sys.executable, "-m", "gemma4cpu.batch", str(inp), "-o", str(out), "-m", str(model_path),
                        "--no-progress", *args], capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and match in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
    assert not out.exists() or out.read_text() == ""


@pytest.mark.parametrize("args,match", [
    (("--port", "70000"), "--port must be in 0..65535"), (("--max-queue", "0"), "--max-queue must be >= 1"),
    (("-n", "-5"), "--n-predict must be >= -1"), (("-c", "0"), "n_ctx"), (("-t", "0"), "threads"),
    (("--draft-max", "99"), "draft_max"),
])
def test_serve_cli_refuses_bad_numbers(model_path, args, match):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "gemma4cpu.serve", "-m", str(model_path), "--port", "0", *args],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and match in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
