"""python -m gemma4cpu.serve -m MODEL [-md DRAFT]: an OpenAI-compatible HTTP server.

Endpoints (also without the /v1 prefix, as llama-server has them):
  POST /v1/completions        prompt (text, or a list of token ids), max_tokens, temperature,
                              top_p, seed, stop, stream (+ stream_options.include_usage)
  POST /v1/chat/completions   messages (system/developer, user, assistant; text content or text
                              parts), the same options
  GET  /v1/models             the loaded model
  GET  /health                {"status": "ok", ...queue and request counters}
Defaults are OpenAI's (temperature 1, top_p 1; max_tokens: -n, else until the context is full).
Extensions llama-server clients send are accepted: top_k, min_p, repeat_penalty, repeat_last_n,
n_predict (= max_tokens), cache_prompt (always on). Other unknown fields are ignored, as llama-server
does; known fields with a wrong type or an out-of-range value, malformed JSON, a prompt longer than
the context, and unsupported features (n > 1, logprobs, tools, non-zero presence/frequency
penalty) get a 4xx with an OpenAI-style {"error": {"message", "type", "param", "code"}} body,
streamed requests too (the prompt is rendered, tokenized and checked before the stream starts).

One engine, one generation at a time: requests wait in a FIFO queue (--max-queue; beyond it 503)
and are served in order by one engine thread. A request whose client goes away (a closed stream or
connection) is cancelled: a queued one is dropped at once (its queue slot is free again; /health
counts it under "dropped"), a running one stops at its next token. Stop
strings are held back while they might still be forming, so they never appear in streamed text;
greedy streamed text equals non-streamed text.

Multi-turn chats reuse the KV cache of the longest common prompt prefix (usage.
prompt_tokens_details.cached_tokens and timings.cache_n show it). Sliding-window layers keep a ring
of window + ubatch - 1 positions, which can roll back ubatch - 1 positions after it has wrapped;
further back, the engine resumes from the newest ring checkpoint (--ctx-checkpoints, taken at the end
of every prompt: a re-tokenized or rewritten previous answer costs that answer, not the whole chat),
or --swa-full keeps the whole context in every sliding layer.

Needs the serve extra: pip install 'gemma4cpu[serve]' (fastapi, uvicorn).
"""
# no `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request) at run time
import argparse
import asyncio
import json
import math
import os
import queue
import sys
import threading
import time
import uuid

MAX_BODY = 16 << 20


class APIError(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.code, self.type = status, param, code, type_

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}


# ---- request validation ----------------------------------------------------------------------

def _num(body, name, lo, hi, default, lo_open=False, integer=False):
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int)):
        raise APIError(f"'{name}' must be {'an integer' if integer else 'a number'}, got {json.dumps(v)[:40]}",
                       param=name)
    if isinstance(v, float) and not math.isfinite(v):
        raise APIError(f"'{name}' must be finite, got {v}", param=name)
    if (v <= lo if lo_open else v < lo) or v > hi:
        raise APIError(f"'{name}' must be in {'(' if lo_open else '['}{lo}, {hi}], got {v}", param=name)
    return v


def _bool(body, name, default=False):
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise APIError(f"'{name}' must be a boolean, got {json.dumps(v)[:40]}", param=name)
    return v


def sampling_options(body: dict, n_ctx: int, default_max: int) -> dict:
    """generate() keyword arguments from an OpenAI request body (validated)."""
    if not isinstance(body, dict):
        raise APIError(f"the request body must be a JSON object, got {type(body).__name__}")
    m = body.get("model")
    if m is not None and not isinstance(m, str):
        raise APIError("'model' must be a string", param="model")
    n = _num(body, "n", 1, 128, 1, integer=True)
    if n != 1:
        raise APIError("only n = 1 is supported (one engine generates one sequence at a time)", param="n")
    for name in ("logprobs", "top_logprobs", "echo", "suffix", "tools", "tool_choice", "functions",
                 "logit_bias"):
        v = body.get(name)
        if v not in (None, False, {}, [], "none"):
            raise APIError(f"'{name}' is not supported by gemma4cpu", param=name)
    rf = body.get("response_format")
    if rf is not None and not (isinstance(rf, dict) and rf.get("type") in (None, "text")):
        raise APIError("only response_format {'type': 'text'} is supported", param="response_format")
    for name in ("presence_penalty", "frequency_penalty"):
        if _num(body, name, -2.0, 2.0, 0.0) != 0:
            raise APIError(f"'{name}' is not supported (use repeat_penalty)", param=name)
    mt = None
    for name in ("max_tokens", "max_completion_tokens", "n_predict"):
        if body.get(name) is not None:
            lo = -1 if name == "n_predict" else 0
            mt = _num(body, name, lo, 1 << 30, None, integer=True)
            if mt == -1:
                mt = None
            break
    if mt is None:
        mt = default_max if default_max >= 0 else n_ctx
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise APIError("'stop' must be a string or a list of strings", param="stop")
    if len(stop) > 16:
        raise APIError(f"at most 16 stop strings, got {len(stop)}", param="stop")
    seed = body.get("seed")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise APIError("'seed' must be an integer", param="seed")
        seed = seed % (1 << 64)                 # OpenAI allows negative seeds; the sampler wants >= 0
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise APIError("'stream_options' must be an object", param="stream_options")
    kw = dict(max_tokens=int(mt), temperature=float(_num(body, "temperature", 0.0, 2.0, 1.0)),
              top_p=float(_num(body, "top_p", 0.0, 1.0, 1.0, lo_open=True)),
              top_k=int(_num(body, "top_k", 0, 1 << 30, 40, integer=True)),
              min_p=float(_num(body, "min_p", 0.0, 1.0, 0.0)),
              repeat_penalty=float(_num(body, "repeat_penalty", 0.0, 10.0, 1.0, lo_open=True)),
              repeat_last_n=int(_num(body, "repeat_last_n", 0, 1 << 20, 64, integer=True)),
              seed=seed, stop=stop)
    stream = _bool(body, "stream")
    include_usage = _bool(so or {}, "include_usage") if so else False
    _bool(body, "cache_prompt", True)
    return {"gen": kw, "stream": stream, "include_usage": include_usage}


def chat_messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise APIError("'messages' must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise APIError(f"messages[{i}] must be an object", param="messages")
        role = m.get("role")
        if not isinstance(role, str):
            raise APIError(f"messages[{i}].role must be a string", param="messages")
        role = {"developer": "system", "model": "assistant"}.get(role, role)
        if role not in ("system", "user", "assistant"):
            raise APIError(f"messages[{i}]: role {role!r} is not supported (system, developer, user, assistant)",
                           param="messages")
        if m.get("tool_calls") or m.get("function_call"):
            raise APIError(f"messages[{i}]: tool calls are not supported", param="messages")
        c = m.get("content")
        if c is None and role == "assistant":
            c = ""
        if isinstance(c, list):
            parts = []
            for j, p in enumerate(c):
                if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                    raise APIError(f"messages[{i}].content[{j}]: only text parts are supported", param="messages")
                parts.append(p["text"])
            c = "".join(parts)
        if not isinstance(c, str):
            raise APIError(f"messages[{i}].content must be a string or a list of text parts", param="messages")
        out.append({"role": role, "content": c})
    return out


def completion_prompt(body: dict, n_vocab: int):
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]
    if isinstance(p, str):
        return p
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        bad = [t for t in p if not 0 <= t < n_vocab]
        if bad:
            raise APIError(f"token ids must be in [0, {n_vocab}), got {bad[:5]}", param="prompt")
        return p
    if isinstance(p, list) and len(p) > 1 and all(isinstance(x, str) for x in p):
        raise APIError("one prompt per request (n = 1): send a string, not a list of several", param="prompt")
    raise APIError("'prompt' must be a string or a non-empty list of token ids", param="prompt")


# ---- the engine thread -----------------------------------------------------------------------

class Job:
    def __init__(self, kind, prompt, gen, loop):
        self.kind, self.prompt, self.gen, self.loop = kind, prompt, gen, loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancel = threading.Event()
        self.state = "new"              # queued -> running, or dropped (EngineWorker, under its lock)
        self.t_submit = time.time()

    def emit(self, *ev):
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, ev)
        except RuntimeError:            # the loop is closed (server shutting down)
            self.cancel.set()


class EngineWorker:
    """Runs every generation on one thread, in submission order (an Engine is not thread-safe)."""

    def __init__(self, engine, max_queue: int = 64):
        self.engine, self.max_queue = engine, max_queue
        self.q: queue.Queue = queue.Queue()
        self.waiting = 0
        self.busy = False
        # cancelled: requests whose client went away (running or queued); dropped: the queued ones
        # among them, taken off the queue at once without running
        self.counts = {"requests": 0, "completed": 0, "cancelled": 0, "dropped": 0, "errors": 0, "rejected": 0}
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="gemma4cpu-engine", daemon=True)
        self.thread.start()

    def submit(self, job: Job):
        with self._lock:
            if self.waiting >= self.max_queue:
                self.counts["rejected"] += 1
                raise APIError(f"the queue is full ({self.max_queue} waiting requests); retry later", status=503,
                               type_="server_error", code="queue_full")
            self.waiting += 1
            self.counts["requests"] += 1
            job.state = "queued"
        self.q.put(job)

    def cancel(self, job: Job):
        """The client of `job` went away: a queued job leaves the queue now (its slot is free for
        --max-queue at once, and it never runs); a running one stops at its next token."""
        with self._lock:
            if job.state == "queued":
                job.state = "dropped"
                self.waiting -= 1
                self.counts["cancelled"] += 1
                self.counts["dropped"] += 1
        job.cancel.set()

    def _run(self):
        while True:
            job = self.q.get()
            if job is None:
                return
            with self._lock:
                if job.state == "dropped":          # counted by cancel()
                    continue
                job.state = "running"
                self.waiting -= 1
            if job.cancel.is_set():
                self.counts["cancelled"] += 1
                continue
            self.busy = True
            try:
                self._one(job)
            finally:
                self.busy = False

    def _one(self, job: Job):
        eng = self.engine
        try:
            # job.prompt: the token ids the request handler checked (Engine.prompt_ids / chat_ids)
            s = eng.generate(job.prompt, stream=True, **job.gen)
            for piece in s:
                if job.cancel.is_set():
                    s.close()
                    self.counts["cancelled"] += 1
                    job.emit("cancelled", None)
                    return
                job.emit("piece", piece)
            if job.cancel.is_set():
                self.counts["cancelled"] += 1
                job.emit("cancelled", None)
                return
            self.counts["completed"] += 1
            job.emit("done", s.result)
        except ValueError as e:       # a prompt the engine refuses (too long, bad template, ...)
            self.counts["errors"] += 1
            code = "context_length_exceeded" if "context" in str(e) else None
            job.emit("error", APIError(str(e), status=400, code=code))
        except Exception as e:        # never kill the engine thread
            self.counts["errors"] += 1
            job.emit("error", APIError(f"{type(e).__name__}: {e}", status=500, type_="server_error"))

    def stop(self):
        self.q.put(None)


# ---- the app ---------------------------------------------------------------------------------

def _finish(stop_reason: str) -> str:
    return "length" if stop_reason in ("length", "context") else "stop"


def _usage(st) -> dict:
    return {"prompt_tokens": st.n_prompt, "completion_tokens": st.n_generated,
            "total_tokens": st.n_prompt + st.n_generated, "prompt_tokens_details": {"cached_tokens": st.n_cached}}


def _timings(st) -> dict:
    t = {"cache_n": st.n_cached, "prompt_n": st.n_prompt - st.n_cached, "prompt_ms": st.prefill_s * 1e3,
         "prompt_per_second": st.prefill_tps, "predicted_n": st.n_generated, "predicted_ms": st.decode_s * 1e3,
         "predicted_per_second": st.decode_tps, "stop_reason": st.stop_reason}
    if st.spec is not None and st.spec.kind != "none":
        t["draft_n"], t["draft_n_accepted"] = st.spec.drafted, st.spec.accepted
    return t


def create_app(engine, model_name: str | None = None, max_queue: int = 64, default_max_tokens: int = -1):
    """The FastAPI app serving `engine` (a gemma4cpu Engine); one EngineWorker thread."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from gemma4cpu.engine import ContextLengthError
    from gemma4cpu.sampling import SamplingParams

    name = model_name or os.path.basename(engine.model_path)
    worker = EngineWorker(engine, max_queue=max_queue)
    created = int(time.time())
    app = FastAPI(title="gemma4cpu", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.worker = worker

    def err(e: APIError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(APIError)
    async def _api_error(request, e: APIError):
        return err(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, e):
        return err(APIError(str(e.detail), status=e.status_code,
                            type_="invalid_request_error" if e.status_code < 500 else "server_error"))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request, e):
        return err(APIError(f"invalid request: {e.errors()[:3]}"))

    @app.exception_handler(Exception)
    async def _internal(request, e):
        return err(APIError(f"internal error: {type(e).__name__}: {e}", status=500, type_="server_error"))

    async def read_json(request: Request) -> dict:
        # any Content-Type: curl -d sends form-urlencoded, and llama-server parses the body anyway
        raw = await request.body()
        if len(raw) > MAX_BODY:
            raise APIError(f"request body over {MAX_BODY >> 20} MiB", status=413)
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise APIError(f"malformed JSON in the request body: {e}") from None
        if not isinstance(body, dict):
            raise APIError(f"the request body must be a JSON object, got {type(body).__name__}")
        return body

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": name, "busy": worker.busy, "queue": worker.waiting, **worker.counts}

    @app.get("/v1/models")
    @app.get("/models")
    async def models():
        e = engine
        return {"object": "list", "data": [{
            "id": name, "object": "model", "created": created, "owned_by": "gemma4cpu",
            "meta": {"path": e.model_path, "arch": e.arch, "n_ctx": e.n_ctx, "n_vocab": e.n_vocab,
                     "draft": getattr(e.assistant, "path", None) if e.assistant is not None else None,
                     "spec_type": e._spec_defaults["spec_type"]}}]}

    def prompt_ids(kind: str, prompt) -> list[int]:
        """The token ids the engine will run, with every refusal generate() would make before its
        first token (template errors, an empty prompt, a prompt that does not fit the context), as a
        4xx now: a streamed request must get it before its 200 and the event stream begin."""
        param = "messages" if kind == "chat" else "prompt"
        try:
            return engine.chat_ids(prompt) if kind == "chat" else engine.prompt_ids(prompt)
        except ContextLengthError as e:
            raise APIError(str(e), param=param, code="context_length_exceeded") from None
        except ValueError as e:
            raise APIError(str(e), param=param) from None

    async def run(request: Request, kind: str):
        body = await read_json(request)
        opts = sampling_options(body, engine.n_ctx, default_max_tokens)
        g = opts["gen"]
        try:                  # the engine's own parameter checks (sampling_options' ranges are narrower)
            SamplingParams(**{k: g[k] for k in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty",
                                                 "repeat_last_n", "seed")}).validate()
        except ValueError as e:
            raise APIError(str(e)) from None
        prompt = chat_messages(body) if kind == "chat" else completion_prompt(body, engine.n_vocab)
        # rendering and tokenizing touch no engine state: off the event loop, beside a running generation
        ids = await asyncio.to_thread(prompt_ids, kind, prompt)
        job = Job(kind, ids, g, asyncio.get_running_loop())
        worker.submit(job)
        rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        obj = "chat.completion" if kind == "chat" else "text_completion"
        if opts["stream"]:
            return StreamingResponse(_stream(job, rid, obj, kind, opts["include_usage"]),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _whole(request, job, rid, obj, kind)

    async def _whole(request, job, rid, obj, kind):
        parts = []
        try:
            while True:
                try:
                    ev, val = await asyncio.wait_for(job.events.get(), timeout=0.5)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        worker.cancel(job)
                        return JSONResponse({"error": {"message": "client disconnected"}}, status_code=499)
                    continue
                if ev == "piece":
                    parts.append(val)
                elif ev == "error":
                    return err(val)
                elif ev == "cancelled":
                    return JSONResponse({"error": {"message": "cancelled"}}, status_code=499)
                elif ev == "done":
                    r = val
                    break
        except asyncio.CancelledError:
            worker.cancel(job)
            raise
        st = r.stats
        text = "".join(parts)
        choice = {"index": 0, "finish_reason": _finish(st.stop_reason), "logprobs": None}
        if kind == "chat":
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {"id": rid, "object": obj, "created": int(job.t_submit), "model": name, "choices": [choice],
                "usage": _usage(st), "timings": _timings(st), "system_fingerprint": "gemma4cpu"}

    async def _stream(job, rid, obj, kind, include_usage):
        chunk_obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        base = {"id": rid, "object": chunk_obj, "created": int(job.t_submit), "model": name,
                "system_fingerprint": "gemma4cpu"}

        def sse(d):
            return f"data: {json.dumps(d, ensure_ascii=False)}\n\n"

        def choice(piece=None, finish=None, role=False):
            if kind == "chat":
                delta = {}
                if role:
                    delta["role"] = "assistant"
                if piece is not None:
                    delta["content"] = piece
                return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            return {"index": 0, "text": piece or "", "finish_reason": finish, "logprobs": None}

        try:
            if kind == "chat":
                yield sse({**base, "choices": [choice("", role=True)]})
            while True:
                ev, val = await job.events.get()
                if ev == "piece":
                    yield sse({**base, "choices": [choice(val)]})
                elif ev == "error":
                    yield sse(val.body())
                    break
                elif ev == "cancelled":
                    break
                elif ev == "done":
                    st = val.stats
                    yield sse({**base, "choices": [choice(None if kind == "chat" else "",
                                                          finish=_finish(st.stop_reason))],
                               "timings": _timings(st)})
                    if include_usage:
                        yield sse({**base, "choices": [], "usage": _usage(st)})
                    break
            yield "data: [DONE]\n\n"
        finally:                      # the client went away (the generator is closed / cancelled)
            worker.cancel(job)

    @app.post("/v1/completions")
    @app.post("/completions")
    async def completions(request: Request):
        return await run(request, "completion")

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat_completions(request: Request):
        return await run(request, "chat")

    return app


# ---- command line ----------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    from gemma4cpu import compat, numa_args
    p = argparse.ArgumentParser(prog="python -m gemma4cpu.serve",
                                description="OpenAI-compatible server (completions, chat, SSE streaming) for a "
                                            "Gemma GGUF on the CPU.",
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", help="GGUF model (default: the embedded Gemma 3 270M)")
    p.add_argument("-md", "--model-draft", help="Gemma 4 MTP assistant GGUF (speculative decoding)")
    p.add_argument("--alias", "-a", dest="alias", help="model id reported by /v1/models (default: the file name)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 = any free port, printed)")
    p.add_argument("-c", "--ctx-size", type=int, default=4096, metavar="N", help="context length (default 4096)")
    p.add_argument("-n", "--n-predict", type=int, default=-1, metavar="N",
                   help="default max_tokens when a request gives none (-1 = until the context is full)")
    p.add_argument("-t", "--threads", type=int, default=None, metavar="N", help="worker threads")
    p.add_argument("-C", "--cpus", metavar="LIST", help="taskset-style CPU list to pin the workers to")
    numa_args.add_args(p)           # -tb --numa --numa-nodes --smt --no-mmap --mlock --thp, as gemma4cpu.run
    p.add_argument("--cache-type-k", "-ctk", default="f16", choices=["f16", "f32", "q8_0", "q4_0"])
    p.add_argument("--cache-type-v", "-ctv", default="f16", choices=["f16", "f32", "q8_0", "q4_0"])
    p.add_argument("--spec-type", default=None, help="mtp (default with -md), ngram or none")
    p.add_argument("--draft-max", "--spec-draft-n-max", "--draft", dest="draft_max", type=int, default=3)
    p.add_argument("--draft-min", "--spec-draft-n-min", dest="draft_min", type=int, default=0)
    p.add_argument("--spec-autotune", action="store_true")
    p.add_argument("--max-queue", type=int, default=64, metavar="N",
                   help="requests that may wait for the engine; more get 503 (default 64)")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    compat.add_args(p, ctx_checkpoints_default=4)
    return p


def main(argv=None) -> int:
    from gemma4cpu import compat, numa_args
    a = build_parser().parse_args(argv)
    err = sys.stderr
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError:
        print("error: the server needs FastAPI and uvicorn: pip install 'gemma4cpu[serve]'", file=err)
        return 2
    try:
        ckw = compat.engine_kwargs(a, note=lambda m: print("note: " + m, file=err))
    except ValueError as e:
        print(f"error: {e}", file=err)
        return 2
    for bad, msg in ((not 0 <= a.port <= 65535, f"--port must be in 0..65535, got {a.port}"),
                     (a.max_queue < 1, f"--max-queue must be >= 1, got {a.max_queue}"),
                     (a.n_predict < -1, f"-n / --n-predict must be >= -1 (-1: until the context is full), "
                                        f"got {a.n_predict}")):
        if bad:
            print(f"error: {msg}", file=err)
            return 2
    for path, what in ((a.model, "model"), (a.model_draft, "draft model")):
        if path and not os.path.exists(path):
            print(f"error: {what} file not found: {path}", file=err)
            return 2
    cpus = None
    if a.cpus:
        from gemma4cpu.cpulist import parse_cpu_list
        try:
            cpus = parse_cpu_list(a.cpus)
        except ValueError as e:
            print(f"error: --cpus: {e}", file=err)
            return 2
    try:                # threads and NUMA options checked against this machine before the model loads
        nkw = numa_args.engine_kwargs(a)
        numa_args.check(nkw, threads=a.threads, cpus=cpus)
    except ValueError as e:
        print(f"error: {e}", file=err)
        return 2
    from gemma4cpu.engine import Engine
    try:
        eng = Engine(a.model, draft=a.model_draft, threads=a.threads, cpus=cpus, n_ctx=a.ctx_size,
                     cache_type_k=a.cache_type_k, cache_type_v=a.cache_type_v, spec_type=a.spec_type,
                     draft_max=a.draft_max, draft_min=a.draft_min, spec_autotune=a.spec_autotune, **nkw, **ckw)
    except KeyboardInterrupt:
        return 130
    except (ValueError, FileNotFoundError, NotImplementedError, OSError, MemoryError) as e:
        print(f"error: {e}", file=err)
        return 1
    app = create_app(eng, a.alias, max_queue=a.max_queue, default_max_tokens=a.n_predict)
    rings = eng.model.cache.ring_layers()
    plan = eng.model.numa_plan
    print(f"gemma4cpu.serve: {os.path.basename(eng.model_path)} ({eng.arch}), n_ctx {eng.n_ctx}, "
          f"numa {plan.mode}, {plan.decode.threads} threads"
          + (f" ({plan.batch.threads} for batches)" if plan.batch is not plan.decode else "") + ", "
          f"KV cache {eng.model.cache.nbytes / 2**20:.0f} MiB"
          + (f", {eng.ctx_checkpoints} ring checkpoints of up to "
             f"{sum(eng.model.cache.k[i].nbytes + eng.model.cache.v[i].nbytes for i in rings) / 2**20:.0f} MiB each"
             if rings and eng.ctx_checkpoints else "")
          + "; one generation at a time, requests queue", file=err, flush=True)
    config = uvicorn.Config(app, host=a.host, port=a.port, log_level=a.log_level, access_log=False,
                            timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)

    async def serve():
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            for s in server.servers:
                for sock in s.sockets:
                    host, port = sock.getsockname()[:2]
                    print(f"gemma4cpu.serve: listening on http://{host}:{port}", file=err, flush=True)
        await task
    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
