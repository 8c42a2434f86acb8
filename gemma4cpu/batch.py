"""python -m gemma4cpu.batch prompts.jsonl -o results.jsonl: one generation per input line.

Input: JSON Lines, one item per line, either a JSON string (the prompt) or an object with
  "prompt" (text, or a list of token ids) or "messages" (a chat, rendered with the model's template),
  optional "id" (echoed back) and per-item options overriding the command line: max_tokens,
  temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed, stop, spec_type,
  draft_max, draft_min, draft_p_min, spec_autotune. Unknown keys, bad JSON and blank lines become
  error records; nothing in one item stops the run.

Output: JSON Lines in input order, exactly one record per input line:
  {"line": 1-based input line, "id", "text", "tokens", "finish_reason" ("stop" | "length"),
   "stop_reason" (the engine's: eog, stop, length, context), "usage": {prompt_tokens,
   completion_tokens, cached_tokens}, "timings": {prefill_s, decode_s, prefill_tps, decode_tps},
   "spec" (speculative statistics or null), "seed", "worker", "input_sha1", "error": null}
  or, for a failed item, {"line", "id", "error": message, "error_type", "input_sha1", "worker"}.

Resumable: every finished record is written at once as one write() of a whole line (fsync'ed).
Records that finish ahead of an unfinished earlier line wait in OUTPUT.pending (same format), so
the output file always holds the results of lines 1..k in order, whole lines only. A rerun with
the same arguments skips every line already in OUTPUT or OUTPUT.pending (a record whose
input_sha1 does not match the current input line stops the run: the output belongs to another
input), cuts a torn last line (a crash of the machine mid-write), and finishes the rest; an
interrupt (Ctrl-C, SIGTERM) or kill -9 loses only the items in flight. OUTPUT.pending is
removed when the run is complete. --seed S gives line i the seed S + i (unless the item sets one),
so a resumed sampled run draws what an uninterrupted one would.

Workers (an Engine is not thread-safe: each worker is its own process with its own Engine):
  default         one Engine in this process
  --workers N     N processes (multiprocessing spawn), the allowed CPUs split into N groups
  --cpus G1:G2    one process per CPU group, e.g. 0-7:8-15, each Engine pinned to its group
  --cpus nodes    one process per NUMA node (its allowed CPUs; gemma4cpu.numa's topology);
  --cpus sockets  one per socket. cpu_groups() is the hook for other per-node layouts.
  --ray ADDRESS   one Ray actor per node of a Ray cluster (ADDRESS: auto, ray://host:10001, or
                  host:port); --ray-per-node K runs K actors per node (e.g. one per socket), each
                  pinned to the k-th group of --ray-cpus (default: that node's NUMA nodes, else
                  an even split of its CPUs). The model path must exist on every node. Ray is an
                  optional extra: pip install 'gemma4cpu[ray]'.
  --numa MODE, --numa-nodes LIST, -tb N, --smt, --thp (as in gemma4cpu.run) go to every engine, each
                  planned within its worker's CPU group; local plans are checked before any model loads.
Items go to whichever worker is free; a worker that dies is replaced and its item recorded as an
error. The same from Python:

    from gemma4cpu.batch import run_batch
    summary = run_batch("prompts.jsonl", "results.jsonl", workers=2, defaults={"max_tokens": 64})
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import signal
import sys
import time
from dataclasses import dataclass, field

OPTION_KEYS = {"max_tokens": int, "temperature": (int, float), "top_k": int, "top_p": (int, float),
               "min_p": (int, float), "repeat_penalty": (int, float), "repeat_last_n": int,
               "seed": (int, type(None)), "stop": (str, list), "spec_type": str, "draft_max": int,
               "draft_min": int, "draft_p_min": (int, float), "spec_autotune": bool}
ITEM_KEYS = {"prompt", "messages", "id", "add_bos", "parse_special"} | set(OPTION_KEYS)


class BatchError(Exception):
    """A problem with the run as a whole (not with one item): mismatched output, no engine."""


# ---- items -----------------------------------------------------------------------------------

def sha1(raw: str) -> str:
    return hashlib.sha1(raw.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def parse_item(raw: str) -> dict:
    """One input line -> {"prompt"|"messages", "id", options...}; ValueError with a message."""
    if not raw.strip():
        raise ValueError("empty line")
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"malformed JSON: {e}") from None
    if isinstance(obj, str):
        return {"prompt": obj}
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object or string, got {type(obj).__name__}")
    unknown = sorted(set(obj) - ITEM_KEYS)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(map(repr, unknown))} (known: {', '.join(sorted(ITEM_KEYS))})")
    if ("prompt" in obj) == ("messages" in obj):
        raise ValueError("give exactly one of 'prompt' and 'messages'")
    p = obj.get("prompt")
    if "prompt" in obj and not (isinstance(p, str) or (isinstance(p, list) and p and all(
            isinstance(t, int) and not isinstance(t, bool) for t in p))):
        raise ValueError("'prompt' must be a string or a non-empty list of token ids")
    if "messages" in obj and not isinstance(obj["messages"], list):
        raise ValueError("'messages' must be a list of {role, content} objects")
    for k, t in OPTION_KEYS.items():
        if k in obj:
            v = obj[k]
            if (isinstance(v, bool) and t is not bool) or not isinstance(v, t):
                raise ValueError(f"'{k}' has the wrong type: {type(v).__name__}")
    if isinstance(obj.get("stop"), list) and not all(isinstance(s, str) for s in obj["stop"]):
        raise ValueError("'stop' must be a string or a list of strings")
    return obj


def run_item(engine, item: dict, defaults: dict) -> dict:
    """Generate one item on `engine` (a gemma4cpu Engine): the record fields without line/worker."""
    kw = dict(defaults)
    kw.update({k: item[k] for k in OPTION_KEYS if k in item})
    for k in ("add_bos", "parse_special"):
        if k in item:
            kw[k] = bool(item[k])
    if "messages" in item:
        kw.pop("add_bos", None)
        kw.pop("parse_special", None)
        r = engine.chat(item["messages"], **kw)
    else:
        r = engine.generate(item["prompt"], **kw)
    st = r.stats
    return {"text": r.text, "tokens": list(r.tokens),
            "finish_reason": "length" if st.stop_reason in ("length", "context") else "stop",
            "stop_reason": st.stop_reason,
            "usage": {"prompt_tokens": st.n_prompt, "completion_tokens": st.n_generated,
                      "cached_tokens": st.n_cached},
            "timings": {"prefill_s": st.prefill_s, "decode_s": st.decode_s, "prefill_tps": st.prefill_tps,
                        "decode_tps": st.decode_tps},
            "spec": st.spec.as_dict() if st.spec is not None and st.spec.kind != "none" else None,
            "seed": st.seed, "error": None}


def error_record(e: BaseException) -> dict:
    return {"error": str(e) or type(e).__name__, "error_type": type(e).__name__}


def safe_run_item(engine, item, defaults) -> dict:
    try:
        return run_item(engine, item, defaults)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as e:            # every item error becomes a record, never fatal to the run
        return error_record(e)


# ---- CPU groups ------------------------------------------------------------------------------

def allowed_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def split_even(cpus: list[int], n: int) -> list[list[int]]:
    if not 1 <= n <= len(cpus):
        raise ValueError(f"cannot split {len(cpus)} CPUs into {n} groups")
    q, r = divmod(len(cpus), n)
    out, i = [], 0
    for k in range(n):
        m = q + (k < r)
        out.append(cpus[i:i + m])
        i += m
    return out


def cpu_groups(spec: str | None, workers: int | None = None, cpus: list[int] | None = None) -> list[list[int]] | None:
    """CPU groups, one worker each: 'A:B:...' taskset lists; 'nodes' (one per NUMA node) or
    'sockets' (one per package) from gemma4cpu.numa's topology, restricted to the allowed CPUs;
    None with workers N > 1: the allowed CPUs split into N contiguous groups; else None (one
    in-process worker, all CPUs). This is the hook for per-node placement policies."""
    cpus = allowed_cpus() if cpus is None else list(cpus)
    if spec:
        s = spec.strip().lower()
        if s in ("nodes", "node", "numa", "sockets", "socket"):
            from gemma4cpu import numa
            topo = numa.read_topology("/", allowed_cpus=cpus)
            al = set(topo.allowed_cpus)
            if s.startswith("node"):
                groups = [sorted(al & set(nd.cpus)) for _, nd in sorted(topo.nodes.items())]
            else:
                groups = [sorted(c for c, ci in topo.cpus.items() if ci.package == pk and c in al)
                          for pk in topo.packages]
            groups = [g for g in groups if g]
        else:
            from gemma4cpu.cpulist import parse_cpu_list
            groups = [parse_cpu_list(g) for g in spec.split(":") if g.strip()]
            seen: set[int] = set()
            for g in groups:
                if seen & set(g):
                    raise ValueError(f"CPU groups overlap in {spec!r}: {sorted(seen & set(g))}")
                seen |= set(g)
        if not groups:
            raise ValueError(f"no CPU groups from {spec!r}")
        if workers is not None and workers != len(groups):
            raise ValueError(f"--workers {workers} but {len(groups)} CPU groups in {spec!r}")
        return groups
    if workers is not None and workers > 1:
        return split_even(cpus, workers)
    return None


# ---- the output files ------------------------------------------------------------------------

def _read_records(path: str, repair: bool) -> list[dict]:
    """Whole records of a JSONL file; a torn last line (no newline, or not JSON) is cut off."""
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        data = f.read()
    recs, good = [], 0
    pos = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        line = data[pos:nl]
        try:
            r = json.loads(line)
            if not isinstance(r, dict) or not isinstance(r.get("line"), int):
                raise ValueError
        except ValueError:
            if data.find(b"\n", nl + 1) >= 0 or nl + 1 < len(data):
                raise BatchError(f"{path}: line {len(recs) + 1} is not a result record; not touching it "
                                 "(use another -o, or --overwrite)") from None
            break                               # a torn final line
        recs.append(r)
        pos = good = nl + 1
    if good < len(data) and repair:
        with open(path, "r+b") as f:
            f.truncate(good)
    return recs


class Writer:
    """Writes records so that OUTPUT holds lines 1..k in order (whole lines, fsync'ed) and records
    that are ahead wait in OUTPUT.pending; see the module docstring."""

    def __init__(self, path: str, shas: list[str], overwrite: bool = False, fsync: bool = True):
        self.path, self.pending_path, self.fsync = path, path + ".pending", fsync
        self.n = len(shas)
        if overwrite:
            for p in (path, self.pending_path):
                if os.path.exists(p):
                    os.remove(p)
        done: dict[int, dict] = {}
        for r in _read_records(path, True) + _read_records(self.pending_path, True):
            ln = r["line"]
            if not 1 <= ln <= self.n or r.get("input_sha1") != shas[ln - 1]:
                raise BatchError(f"{path}: the record for line {ln} does not match line {ln} of this input "
                                 "(the output belongs to another input: use another -o, or --overwrite)")
            done.setdefault(ln, r)
        self.done = set(done)
        # lay the files anew: the contiguous prefix in OUTPUT, the rest in OUTPUT.pending (atomic)
        self.next = 1
        while self.next in done:
            self.next += 1
        self.ahead = {ln: r for ln, r in done.items() if ln >= self.next}
        prefix = [done[ln] for ln in range(1, self.next)]
        self._rewrite(path, prefix)
        if self.ahead:
            self._rewrite(self.pending_path, [self.ahead[k] for k in sorted(self.ahead)])
        elif os.path.exists(self.pending_path):
            os.remove(self.pending_path)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._pfd = None

    @staticmethod
    def _line(r: dict) -> bytes:
        return (json.dumps(r, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass")

    def _rewrite(self, path: str, recs: list[dict]):
        existing = _read_records(path, False) if os.path.exists(path) else None
        if existing is not None and existing == recs:
            return
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            for r in recs:
                f.write(self._line(r))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _append(self, fd: int, r: dict):
        data = self._line(r)
        view = memoryview(data)
        while view:                       # one write() for a whole line (regular files write it all)
            k = os.write(fd, view)
            view = view[k:]
        if self.fsync:
            os.fsync(fd)

    def put(self, ln: int, r: dict):
        if ln in self.done:
            return
        self.done.add(ln)
        if ln != self.next:
            if self._pfd is None:
                self._pfd = os.open(self.pending_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._append(self._pfd, r)
            self.ahead[ln] = r
            return
        self._append(self._fd, r)
        self.next += 1
        while self.next in self.ahead:
            self._append(self._fd, self.ahead.pop(self.next))
            self.next += 1

    @property
    def complete(self) -> bool:
        return self.next > self.n

    def close(self):
        os.close(self._fd)
        if self._pfd is not None:
            os.close(self._pfd)
        if self.complete and os.path.exists(self.pending_path):
            os.remove(self.pending_path)


# ---- progress ----------------------------------------------------------------------------------

class Progress:
    def __init__(self, total: int, done: int, enabled: bool, file=None):
        self.total, self.done0, self.done = total, done, done
        self.errors = self.tokens = 0
        self.t0 = time.perf_counter()
        self.file = file or sys.stderr
        self.enabled = enabled
        self.tty = enabled and getattr(self.file, "isatty", lambda: False)()
        self._last = 0.0

    def update(self, rec: dict):
        self.done += 1
        if rec.get("error") is not None:
            self.errors += 1
        else:
            self.tokens += rec.get("usage", {}).get("completion_tokens", 0)
        self.show()

    def line(self) -> str:
        dt = time.perf_counter() - self.t0
        n = self.done - self.done0
        rate = self.tokens / dt if dt > 0 else 0.0
        eta = (self.total - self.done) * dt / n if n else float("nan")
        w = 24
        fill = int(w * self.done / self.total) if self.total else w
        return (f"[{'#' * fill}{'.' * (w - fill)}] {self.done}/{self.total} items"
                + (f", {self.errors} errors" if self.errors else "")
                + f" | {self.tokens} tokens, {rate:.1f} tok/s | {dt:.0f} s"
                + (f", ETA {eta:.0f} s" if eta == eta else ""))

    def show(self, final: bool = False):
        if not self.enabled:
            return
        now = time.perf_counter()
        if self.tty:
            self.file.write("\r" + self.line() + ("\n" if final else ""))
            self.file.flush()
        elif final or now - self._last >= 10.0:
            print(self.line(), file=self.file, flush=True)
            self._last = now


# ---- workers ---------------------------------------------------------------------------------

def _die_with_parent():
    try:                                   # Linux: SIGKILL this worker when the parent dies
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except Exception:
        pass


def _make_engine(engine_kw: dict, cpus):
    from gemma4cpu.engine import Engine
    kw = dict(engine_kw)
    if cpus is not None:
        kw["cpus"] = list(cpus)
        kw["threads"] = None
    kw.setdefault("progress", False)
    return Engine(**kw)


def _numa_mode(eng) -> str | None:
    """The NUMA mode an Engine runs (auto resolved), for the worker lines."""
    plan = getattr(getattr(eng, "model", None), "numa_plan", None)
    return getattr(plan, "mode", None)


def _worker_main(wid: int, cpus, engine_kw: dict, defaults: dict, tasks, results):
    """A worker process: load an Engine pinned to `cpus`, then generate items until None."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the parent handles Ctrl-C and stops us
    try:
        eng = _make_engine(engine_kw, cpus)
    except BaseException as e:
        results.put(("fatal", wid, f"{type(e).__name__}: {e}"))
        return
    results.put(("ready", wid, {"pid": os.getpid(), "cpus": list(cpus) if cpus else None,
                                "numa": _numa_mode(eng)}))
    while True:
        t = tasks.get()
        if t is None:
            return
        ln, item = t
        results.put(("done", wid, (ln, safe_run_item(eng, item, defaults))))


class LocalPool:
    """One Engine in this process."""
    kind = "local"

    def __init__(self, engine_kw, defaults, engine=None):
        self.engine = engine if engine is not None else _make_engine(engine_kw, None)
        self.defaults = defaults
        self.workers = [0]
        self._todo = None

    def describe(self):
        return [f"worker 0: this process, all allowed CPUs, numa {_numa_mode(self.engine)}"]

    def submit(self, wid, ln, item):
        self._todo = (ln, item)

    def poll(self, timeout):
        if self._todo is None:
            return [], []
        ln, item = self._todo
        self._todo = None
        return [(0, ln, safe_run_item(self.engine, item, self.defaults))], []

    def close(self, kill=False):
        pass


class ProcessPool:
    """One process per CPU group, each with its own pinned Engine (multiprocessing spawn)."""
    kind = "process"

    def __init__(self, engine_kw, defaults, groups, start_timeout=600.0):
        import multiprocessing as mp
        self.ctx = mp.get_context("spawn")
        self.engine_kw, self.defaults, self.groups = engine_kw, defaults, groups
        self.results = self.ctx.Queue()
        self.procs: dict = {}
        self.tasks: dict = {}
        self.info: dict = {}
        self._backlog: list = []        # results that arrived while a worker was being restarted
        self.workers = list(range(len(groups)))
        for wid in self.workers:
            self._start(wid)
        deadline = time.monotonic() + start_timeout
        while len(self.info) < len(self.workers):
            try:
                kind, wid, payload = self.results.get(timeout=1.0)
            except queue.Empty:
                dead = [w for w, p in self.procs.items() if not p.is_alive() and w not in self.info]
                if dead or time.monotonic() > deadline:
                    self.close(kill=True)
                    raise BatchError(f"worker(s) {dead} exited while loading the model" if dead
                                     else "the workers did not load the model in time")
                continue
            if kind == "fatal":
                self.close(kill=True)
                raise BatchError(f"worker {wid} could not load the model: {payload}")
            if kind == "ready":
                self.info[wid] = payload

    def _start(self, wid):
        q = self.ctx.Queue()
        p = self.ctx.Process(target=_worker_main, name=f"gemma4cpu-batch-{wid}", daemon=True,
                             args=(wid, self.groups[wid], self.engine_kw, self.defaults, q, self.results))
        p.start()
        self.procs[wid], self.tasks[wid] = p, q

    def describe(self):
        return [f"worker {w}: pid {self.info.get(w, {}).get('pid')}, CPUs {self.groups[w]}, "
                f"numa {self.info.get(w, {}).get('numa')}" for w in self.workers]

    def submit(self, wid, ln, item):
        self.tasks[wid].put((ln, item))

    def poll(self, timeout):
        out = [(w, p[0], p[1]) for k, w, p in self._backlog if k == "done"]
        self._backlog.clear()
        try:
            kind, wid, payload = self.results.get(timeout=0 if out else timeout)
            if kind == "done":
                out.append((wid, payload[0], payload[1]))
            while True:
                kind, wid, payload = self.results.get_nowait()
                if kind == "done":
                    out.append((wid, payload[0], payload[1]))
        except queue.Empty:
            pass
        got = {w for w, _, _ in out}
        dead = [w for w, p in self.procs.items() if not p.is_alive() and w not in got]
        return out, dead

    def restart(self, wid):
        p = self.procs[wid]
        code = p.exitcode
        self.info.pop(wid, None)
        self._start(wid)
        while True:                               # wait for it to load (its items wait meanwhile)
            kind, w, payload = self.results.get(timeout=600)
            if w == wid and kind == "ready":
                self.info[wid] = payload
                return code
            if w == wid and kind == "fatal":
                raise BatchError(f"worker {wid} could not reload the model: {payload}")
            self._backlog.append((kind, w, payload))   # another worker's result: poll returns it

    def close(self, kill=False):
        for wid, p in self.procs.items():
            if p.is_alive() and not kill:
                try:
                    self.tasks[wid].put(None)
                except Exception:
                    pass
        for p in self.procs.values():
            if kill and p.is_alive():
                p.terminate()
            p.join(timeout=5 if not kill else 2)
            if p.is_alive():
                p.kill()
                p.join(timeout=2)


def _ray_actor_class(ray):
    class BatchActor:
        def __init__(self, engine_kw, defaults, group_index, groups_per_node, cpus_spec):
            _die_with_parent()
            cpus = None
            if groups_per_node > 1 or cpus_spec:
                if cpus_spec:
                    groups = cpu_groups(cpus_spec)
                else:
                    try:
                        groups = cpu_groups("nodes")
                        if len(groups) != groups_per_node:
                            raise ValueError
                    except Exception:
                        groups = split_even(allowed_cpus(), groups_per_node)
                cpus = groups[group_index % len(groups)]
            self.cpus = cpus
            self.engine = _make_engine(engine_kw, cpus)
            self.defaults = defaults

        def info(self):
            import socket
            return {"pid": os.getpid(), "host": socket.gethostname(), "cpus": self.cpus,
                    "node_id": ray.get_runtime_context().get_node_id(), "numa": _numa_mode(self.engine)}

        def run(self, ln, item):
            return ln, safe_run_item(self.engine, item, self.defaults)
    return BatchActor


class RayPool:
    """One actor per alive node of a Ray cluster (times per_node), pinned to that node."""
    kind = "ray"

    def __init__(self, engine_kw, defaults, address, per_node=1, cpus_spec=None, num_cpus=None):
        try:
            import ray
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        except ImportError:
            raise BatchError("--ray needs Ray: pip install 'gemma4cpu[ray]'") from None
        self.ray = ray
        self._own = not ray.is_initialized()
        if self._own:
            ray.init(address=None if address in ("local",) else address, ignore_reinit_error=True,
                     log_to_driver=False, include_dashboard=False)
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        if not nodes:
            raise BatchError(f"the Ray cluster at {address} has no alive nodes")
        Actor = ray.remote(_ray_actor_class(ray))
        self.actors, self.node_of = [], []
        for n in sorted(nodes, key=lambda n: n["NodeID"]):
            ncpu = int(n.get("Resources", {}).get("CPU", 1))
            for k in range(per_node):
                opts = dict(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
                            num_cpus=num_cpus if num_cpus is not None else max(1, ncpu // per_node),
                            max_restarts=0)
                self.actors.append(Actor.options(**opts).remote(engine_kw, defaults, k, per_node, cpus_spec))
                self.node_of.append(n["NodeID"])
        try:
            self.info = ray.get([a.info.remote() for a in self.actors])
        except Exception as e:
            self.close(kill=True)
            raise BatchError(f"a Ray actor could not load the model: {e}") from None
        self.workers = list(range(len(self.actors)))
        self.inflight: dict = {}

    def describe(self):
        return [f"worker {w}: ray actor on {i['host']} (node {i['node_id'][:8]}), pid {i['pid']}, CPUs "
                f"{i['cpus'] or 'all'}, numa {i.get('numa')}" for w, i in enumerate(self.info)]

    def submit(self, wid, ln, item):
        self.inflight[self.actors[wid].run.remote(ln, item)] = wid

    def poll(self, timeout):
        if not self.inflight:
            return [], []
        ready, _ = self.ray.wait(list(self.inflight), num_returns=len(self.inflight), timeout=timeout)
        out, dead = [], []
        for ref in ready:
            wid = self.inflight.pop(ref)
            try:
                ln, rec = self.ray.get(ref)
                out.append((wid, ln, rec))
            except Exception as e:          # the actor died (RayActorError) or the call failed
                dead.append((wid, e))
        return out, dead

    def close(self, kill=False):
        for a in getattr(self, "actors", []):
            try:
                self.ray.kill(a)
            except Exception:
                pass
        if self._own:
            self.ray.shutdown()


# ---- the run ---------------------------------------------------------------------------------

@dataclass
class Summary:
    total: int
    skipped: int                 # lines already done before this run
    ok: int = 0
    errors: int = 0
    tokens: int = 0
    seconds: float = 0.0
    interrupted: bool = False
    output: str = ""
    workers: list = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def _read_input(path: str) -> list[str]:
    if path == "-":
        data = sys.stdin.buffer.read()
    else:
        with open(path, "rb") as f:
            data = f.read()
    text = data.decode("utf-8", "surrogateescape")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()                          # the newline that ends the last line
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def run_batch(input_path: str, output_path: str, model=None, draft=None, workers: int | None = None,
              cpus: str | list | None = None, ray: str | None = None, ray_per_node: int = 1,
              ray_cpus: str | None = None, defaults: dict | None = None, engine_kwargs: dict | None = None,
              seed: int | None = None, progress: bool = True, overwrite: bool = False, fsync: bool = True,
              engine=None, log=None) -> Summary:
    """Run every line of input_path and write output_path (see the module docstring).
    defaults: generate() options for every item (max_tokens, temperature, stop, ...);
    engine_kwargs: Engine options (threads, n_ctx, cache types, spec options...); cpus: a group
    spec ('0-7:8-15', 'nodes') or a list of CPU lists; engine: an existing Engine to use in this
    process (workers/cpus/ray must be unset). Returns a Summary."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    defaults = dict(defaults or {})
    ekw = dict(engine_kwargs or {})
    ekw["model_path"] = model
    ekw["draft"] = draft
    raws = _read_input(input_path)
    shas = [sha1(r) for r in raws]
    w = Writer(output_path, shas, overwrite=overwrite, fsync=fsync)
    todo = [ln for ln in range(1, len(raws) + 1) if ln not in w.done]
    summ = Summary(total=len(raws), skipped=len(raws) - len(todo), output=output_path)
    prog = Progress(len(raws), summ.skipped, progress)
    t0 = time.perf_counter()

    def finish(ln, rec, wid):
        rec = {"line": ln, "id": items.get(ln, {}).get("id") if isinstance(items.get(ln), dict) else None,
               **rec, "worker": wid, "input_sha1": shas[ln - 1]}
        w.put(ln, rec)
        if rec.get("error") is not None:
            summ.errors += 1
        else:
            summ.ok += 1
            summ.tokens += rec["usage"]["completion_tokens"]
        prog.update(rec)

    items: dict[int, dict] = {}
    queue_: list[int] = []
    for ln in todo:                              # bad lines are error records right away
        try:
            it = parse_item(raws[ln - 1])
        except ValueError as e:
            items[ln] = {}
            try:
                obj = json.loads(raws[ln - 1])
                if isinstance(obj, dict) and isinstance(obj.get("id"), (str, int)):
                    items[ln] = {"id": obj["id"]}
            except ValueError:
                pass
            finish(ln, error_record(e), None)
            continue
        if seed is not None and "seed" not in it:
            it["seed"] = seed + ln - 1
        items[ln] = it
        queue_.append(ln)

    pool = None
    stop = {"sig": None}

    def on_term(signum, frame):
        stop["sig"] = signum
        raise KeyboardInterrupt

    old_term = signal.signal(signal.SIGTERM, on_term) if _main_thread() else None
    try:
        if queue_:
            if ray:
                pool = RayPool(ekw, defaults, ray, per_node=ray_per_node, cpus_spec=ray_cpus)
            else:
                groups = cpus if isinstance(cpus, list) else cpu_groups(cpus, workers)
                if groups is None:
                    pool = LocalPool(ekw, defaults, engine=engine)
                else:
                    pool = ProcessPool(ekw, defaults, groups)
            summ.workers = pool.describe()
            for line in summ.workers:
                log(f"gemma4cpu.batch: {line}")
            log(f"gemma4cpu.batch: {len(raws)} lines, {summ.skipped} already done, {len(queue_)} to run "
                f"-> {output_path}")
            idle = list(pool.workers)
            busy: dict[int, int] = {}
            qi = 0
            while qi < len(queue_) or busy:
                while idle and qi < len(queue_):
                    wid = idle.pop(0)
                    ln = queue_[qi]
                    qi += 1
                    busy[wid] = ln
                    pool.submit(wid, ln, items[ln])
                done, dead = pool.poll(0.5)
                for wid, ln, rec in done:
                    busy.pop(wid, None)
                    idle.append(wid)
                    finish(ln, rec, wid)
                for d in dead:
                    wid, why = d if isinstance(d, tuple) else (d, None)
                    ln = busy.pop(wid, None)
                    if isinstance(pool, ProcessPool):
                        code = pool.restart(wid)
                        why = why or f"worker process exited with code {code}"
                        idle.append(wid)
                    else:
                        why = why or "worker died"
                    if ln is not None:
                        finish(ln, {"error": f"worker {wid} died while generating this item: {why}",
                                    "error_type": "WorkerDied"}, wid)
                if not idle and not busy:
                    raise BatchError("every worker died")
    except KeyboardInterrupt:
        summ.interrupted = True
        if pool is not None:
            pool.close(kill=True)
            pool = None
    finally:
        if pool is not None:
            pool.close()
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
        w.close()
        summ.seconds = time.perf_counter() - t0
        prog.show(final=True)
    return summ


def _main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


# ---- command line ----------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    from gemma4cpu import compat, numa_args
    p = argparse.ArgumentParser(
        prog="python -m gemma4cpu.batch",
        description="Generate for every line of a JSONL file; results in input order, resumable.",
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", help="prompts, one JSON item per line ('-' = stdin)")
    p.add_argument("-o", "--output", required=True, help="results JSONL (resumed if it exists)")
    p.add_argument("--overwrite", action="store_true", help="start over: remove OUTPUT and OUTPUT.pending")
    p.add_argument("-m", "--model", help="GGUF model (default: the embedded Gemma 3 270M)")
    p.add_argument("-md", "--model-draft", help="Gemma 4 MTP assistant GGUF (speculative decoding)")
    p.add_argument("-c", "--ctx-size", type=int, default=4096, metavar="N", help="context per engine (default 4096)")
    p.add_argument("-t", "--threads", type=int, default=None, metavar="N",
                   help="threads of the single in-process engine (workers use their CPU group)")
    numa_args.add_args(p, "threads and NUMA placement of every engine (each worker plans within its CPU group)")
    g = p.add_argument_group("workers")
    g.add_argument("--workers", type=int, default=None, metavar="N",
                   help="N worker processes over the allowed CPUs split in N groups")
    g.add_argument("--cpus", metavar="GROUPS",
                   help="one worker per CPU group: '0-7:8-15', 'nodes' (per NUMA node) or 'sockets'")
    g.add_argument("--ray", metavar="ADDRESS", help="run on a Ray cluster: auto, ray://HOST:10001 or HOST:PORT")
    g.add_argument("--ray-per-node", type=int, default=1, metavar="K", help="actors per Ray node (default 1)")
    g.add_argument("--ray-cpus", metavar="GROUPS",
                   help="CPU groups on each Ray node for --ray-per-node (default: its NUMA nodes)")
    s = p.add_argument_group("generation defaults (an item's own keys win)")
    s.add_argument("-n", "--n-predict", "--max-tokens", dest="max_tokens", type=int, default=128, metavar="N")
    s.add_argument("--temp", type=float, default=0.0)
    s.add_argument("--top-k", type=int, default=40)
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--min-p", type=float, default=0.0)
    s.add_argument("--repeat-penalty", type=float, default=1.0)
    s.add_argument("--seed", type=int, default=None, help="line i samples with seed SEED + i - 1")
    s.add_argument("--stop", action="append", default=[], metavar="TEXT")
    s.add_argument("--cache-type-k", default="f16", choices=["f16", "f32", "q8_0", "q4_0"])
    s.add_argument("--cache-type-v", default="f16", choices=["f16", "f32", "q8_0", "q4_0"])
    s.add_argument("--spec-type", default=None, help="mtp (with -md), ngram or none")
    s.add_argument("--draft-max", "--spec-draft-n-max", dest="draft_max", type=int, default=3)
    s.add_argument("--spec-autotune", action="store_true")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--no-fsync", action="store_true", help="do not fsync each record (faster, still whole lines)")
    compat.add_args(p)
    return p


def main(argv=None) -> int:
    from gemma4cpu import compat, numa_args
    a = build_parser().parse_args(argv)
    err = sys.stderr
    try:
        ckw = compat.engine_kwargs(a, note=lambda m: print("note: " + m, file=err))
    except ValueError as e:
        print(f"error: {e}", file=err)
        return 2
    if a.model and not os.path.exists(a.model):
        print(f"error: model file not found: {a.model}", file=err)
        return 2
    if a.input != "-" and not os.path.exists(a.input):
        print(f"error: input file not found: {a.input}", file=err)
        return 2
    if a.ray and (a.workers or a.cpus):
        print("error: --ray places one actor per node; use --ray-per-node / --ray-cpus, not --workers / --cpus",
              file=err)
        return 2
    if a.workers is not None and a.workers < 1:
        print(f"error: --workers must be >= 1, got {a.workers}", file=err)
        return 2
    defaults = dict(max_tokens=a.max_tokens, temperature=a.temp, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p,
                    repeat_penalty=a.repeat_penalty, stop=a.stop)
    # the generation defaults are checked once, here, rather than failing every line of the batch
    if a.max_tokens < 0:
        print(f"error: -n / --max-tokens must be >= 0, got {a.max_tokens}", file=err)
        return 2
    if a.ray_per_node < 1:
        print(f"error: --ray-per-node must be >= 1, got {a.ray_per_node}", file=err)
        return 2
    try:
        from gemma4cpu.sampling import SamplingParams
        SamplingParams(temperature=a.temp, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p,
                       repeat_penalty=a.repeat_penalty, seed=a.seed).validate()
    except ValueError as e:
        print(f"error: {e}", file=err)
        return 2
    try:                # threads and NUMA options, checked for each local worker before any model loads
        nkw = numa_args.engine_kwargs(a)
        if not a.ray:       # (a Ray node plans on its own machine)
            groups = cpu_groups(a.cpus, a.workers)
            for g in groups or [None]:
                numa_args.check(nkw, threads=a.threads if g is None else None, cpus=g)
    except ValueError as e:
        print(f"error: {e}", file=err)
        return 2
    ekw = dict(threads=a.threads, n_ctx=a.ctx_size, cache_type_k=a.cache_type_k, cache_type_v=a.cache_type_v,
               spec_type=a.spec_type, draft_max=a.draft_max, spec_autotune=a.spec_autotune, **nkw, **ckw)
    try:
        s = run_batch(a.input, a.output, model=a.model, draft=a.model_draft, workers=a.workers, cpus=a.cpus,
                      ray=a.ray, ray_per_node=a.ray_per_node, ray_cpus=a.ray_cpus, defaults=defaults,
                      engine_kwargs=ekw, seed=a.seed, progress=not a.no_progress, overwrite=a.overwrite,
                      fsync=not a.no_fsync)
    except (BatchError, ValueError, FileNotFoundError, OSError, MemoryError) as e:
        print(f"error: {e}", file=err)
        return 1
    print(f"gemma4cpu.batch: {s.ok} ok, {s.errors} errors, {s.skipped} skipped (already done) of {s.total}; "
          f"{s.tokens} tokens in {s.seconds:.1f} s ({s.tokens_per_s:.1f} tok/s)"
          + ("; interrupted: rerun the same command to finish" if s.interrupted else ""), file=err)
    return 130 if s.interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
