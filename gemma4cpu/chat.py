"""Chat prompt rendering: a GGUF's ``tokenizer.chat_template`` (an HF-style Jinja2 template) or a
built-in Gemma template, rendered in jinja2's immutable sandbox.

The environment mirrors HF transformers' chat templating (``trim_blocks``/``lstrip_blocks``, the
``loopcontrols`` extension, a ``tojson`` filter that does not HTML-escape, ``raise_exception`` and
``strftime_now`` globals; variables ``messages``, ``add_generation_prompt``, ``bos_token``,
``eos_token`` plus any extras), so templates shipped in GGUF files render as they would there.

A chat template comes from the model file, so it is treated as untrusted code:

* attribute access the sandbox deems unsafe (dunders, ``func_globals``, list/dict mutators, ...)
  raises at once instead of rendering as an empty ``Undefined``;
* ``range`` is capped by the sandbox (MAX_RANGE), and ``**``/``*`` are checked so a template cannot
  build astronomically large numbers or strings;
* everything a template can raise is reported as :class:`ChatTemplateError`.

The sandbox alone is not a resource limiter, so rendering adds two limits of its own:

* time: a watchdog thread raises an exception inside the rendering thread when the render runs
  past ``timeout`` seconds (default DEFAULT_TIMEOUT), so nested loops of capped ranges stop there.
  It acts between Python bytecodes, which is where a template spends its time: the operations that
  could block in C for long (building a huge string in one step) are refused by the size limits;
* size: ``+``, ``~``, ``*``, ``%``, ``str.format`` / ``format`` widths and precisions, ``replace``,
  ``center``/``ljust``/``rjust``/``zfill``/``indent`` and ``tojson(indent=...)`` may not produce more
  than MAX_STR characters (lists: 2**20 items), the rendered text may not exceed MAX_STR either,
  and ``lipsum`` takes at most 1000 paragraphs.

The rendered text begins with ``bos_token`` (as the Gemma templates emit it): tokenize it with special
tokens parsed and do not add another BOS.
"""
from __future__ import annotations

import ctypes
import functools
import json
import re
import string
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = [
    "ChatTemplateError",
    "GEMMA3_TEMPLATE",
    "GEMMA4_TEMPLATE",
    "builtin_template",
    "validate_messages",
    "render",
]


class ChatTemplateError(ValueError):
    """A chat template could not be compiled or rendered, or the messages are invalid."""


# --- built-in templates ----------------------------------------------------------------------------
# Raw strings: the "\n" escapes are Jinja string-literal escapes, as in HF template files.

GEMMA3_TEMPLATE = r"""{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] | trim + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
    {%- if loop_messages | length == 0 -%}
        {{ raise_exception("A system message must be followed by a user message") }}
    {%- endif -%}
{%- else -%}
    {%- set first_user_prefix = '' -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if message['role'] == 'system' -%}
        {{ raise_exception("A system message is only allowed as the first message") }}
    {%- endif -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if message['role'] in ['assistant', 'model'] -%}
        {%- set role = 'model' -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\n' }}
{%- endif -%}
"""

GEMMA4_TEMPLATE = r"""{{ bos_token }}
{%- for message in messages -%}
    {%- if message['role'] == 'system' and not loop.first -%}
        {{ raise_exception("A system message is only allowed as the first message") }}
    {%- endif -%}
    {%- if message['role'] in ['assistant', 'model'] -%}
        {%- set role = 'model' -%}
    {%- elif message['role'] in ['system', 'user'] -%}
        {%- set role = message['role'] -%}
    {%- else -%}
        {{ raise_exception("Unknown role: " + message['role']) }}
    {%- endif -%}
    {{ '<|turn>' + role + '\n' + message['content'] | trim + '<turn|>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<|turn>model\n' }}
{%- endif -%}
"""

_BUILTIN = {"gemma4": GEMMA4_TEMPLATE, "gemma3": GEMMA3_TEMPLATE}


def builtin_template(arch: str) -> str:
    """The built-in chat template for a GGUF ``general.architecture`` ("gemma4" or "gemma3")."""
    try:
        return _BUILTIN[arch]
    except (KeyError, TypeError):
        raise ValueError(
            f"no built-in chat template for architecture {arch!r} (have: {', '.join(sorted(_BUILTIN))})"
        ) from None


# --- messages -------------------------------------------------------------------------------------

_ROLES = ("system", "user", "assistant")
_ROLE_ALIASES = {"model": "assistant"}
_KEYS = frozenset(("role", "content"))


def validate_messages(messages) -> list[dict]:
    """Check a chat and return a fresh copy: a non-empty list of ``{"role": str, "content": str}``.

    Roles are system/user/assistant; "model" is accepted and normalized to "assistant". Keys other
    than role/content are rejected (rather than silently dropped). Errors name the message index.
    Where system messages may appear and whether roles must alternate is up to the template.
    """
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise ChatTemplateError(f"messages must be a list of dicts, got {type(messages).__name__}")
    if len(messages) == 0:
        raise ChatTemplateError("messages is empty: need at least one message")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise ChatTemplateError(f"messages[{i}]: expected a dict, got {type(msg).__name__}")
        missing = [k for k in ("role", "content") if k not in msg]
        if missing:
            raise ChatTemplateError(f"messages[{i}]: missing key(s) {', '.join(map(repr, missing))}")
        extra = sorted(map(repr, set(msg) - _KEYS))
        if extra:
            raise ChatTemplateError(
                f"messages[{i}]: unsupported key(s) {', '.join(extra)} (only 'role' and 'content')"
            )
        role, content = msg["role"], msg["content"]
        if not isinstance(role, str):
            raise ChatTemplateError(f"messages[{i}]: role must be a str, got {type(role).__name__}")
        role = _ROLE_ALIASES.get(role, role)
        if role not in _ROLES:
            raise ChatTemplateError(
                f"messages[{i}]: unknown role {msg['role']!r} (expected system, user, assistant or model)"
            )
        if not isinstance(content, str):
            raise ChatTemplateError(
                f"messages[{i}]: content must be a str, got {type(content).__name__}"
            )
        out.append({"role": role, "content": content})
    return out


# --- environment ----------------------------------------------------------------------------------

_MAX_POW_BITS = 4096        # largest integer ** may produce (bits)
_MAX_REPEAT_LEN = 1 << 20   # longest str/list/tuple `*` may produce (items)
MAX_STR = 1 << 26           # longest string/list any other operation, or the whole render, may produce
DEFAULT_TIMEOUT = 2.0       # seconds a render may take (a real chat template takes milliseconds)
_EXPANDING_METHODS = frozenset(["center", "ljust", "rjust", "zfill", "expandtabs", "replace"])
_FMT_NUMBER = re.compile(r"\d+")
_PCT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")


def _too_big(n) -> bool:
    return n > MAX_STR


def _check_len(n, what):
    if _too_big(n):
        raise SecurityError(f"the result of {what} would be too large ({n} > {MAX_STR})")


def _check_format_spec(fmt: str):
    """str.format strings: every width/precision number <= MAX_STR, no nested replacement fields in
    specs (a width taken from an argument cannot be checked here)."""
    try:
        parts = list(string.Formatter().parse(fmt))
    except ValueError:
        return          # malformed: str.format itself raises
    for _lit, _name, spec, _conv in parts:
        if spec:
            if "{" in spec:
                raise SecurityError("nested replacement fields in a format spec are not allowed")
            for m in _FMT_NUMBER.findall(spec):
                _check_len(int(m), "a format width")


def _check_percent(fmt: str, args):
    for m in _PCT_SPEC.finditer(fmt):
        for g in m.groups():
            if g == "*":
                raise SecurityError("'*' widths in % formatting are not allowed")
            if g:
                _check_len(int(g), "a % format width")


def _raise_exception(message):
    raise ChatTemplateError(str(message))


def _strftime_now(fmt):
    return datetime.now().strftime(str(fmt))


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # as transformers: plain json.dumps, no HTML escaping (autoescape is off)
    if isinstance(indent, int) and indent > 64:
        raise SecurityError(f"tojson indent {indent} is too large")
    if isinstance(indent, str) and len(indent) > 64:
        raise SecurityError("tojson indent string is too long")
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _checked_join(env_join):
    """The concatenation `~` compiles to (str_join), with the result size checked first."""
    def join(seq):
        seq = [x if isinstance(x, str) else str(x) for x in seq]
        _check_len(sum(len(x) for x in seq), "~")
        return env_join(seq)
    return join


class _ChatCodeGenerator(jinja2.compiler.CodeGenerator):
    """Compiles `a ~ b` to a size-checked join (environment.checked_concat) instead of str_join."""

    def visit_Concat(self, node, frame):
        self.write("environment.checked_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _ChatSandbox(ImmutableSandboxedEnvironment):
    """Immutable sandbox that fails loudly on unsafe access and bounds ``**`` and ``*``."""

    intercepted_binops = frozenset(["**", "*", "+", "%"])
    code_generator_class = _ChatCodeGenerator

    @staticmethod
    def checked_concat(parts):
        parts = [p if isinstance(p, str) else str(p) for p in parts]
        _check_len(sum(len(p) for p in parts), "~")
        return "".join(parts)

    def wrap_str_format(self, value):
        fn = super().wrap_str_format(value)
        if fn is not None:
            _check_format_spec(value.__self__)
        return fn

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's signature)
        owner = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "")
        if isinstance(owner, str) and name in _EXPANDING_METHODS:
            nums = [a for a in list(args) + list(kwargs.values()) if isinstance(a, int) and not isinstance(a, bool)]
            if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
                count = owner.count(args[0]) if args[0] else len(owner) + 1
                _check_len(len(owner) + count * max(0, len(args[1]) - len(args[0])), "replace")
            elif name == "expandtabs":
                _check_len(len(owner) * max(nums or [8]), "expandtabs")
            else:
                for n in nums:
                    _check_len(n, name)
        return super().call(__context, __obj, *args, **kwargs)

    def unsafe_undefined(self, obj, attribute):
        # the stock sandbox returns an Undefined that only raises when used further, so
        # `{{ x.__class__ }}` would silently render as ""; refuse at the access instead
        raise SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
        )

    def call_binop(self, context, operator, left, right):
        if operator == "+":
            if isinstance(left, str) and isinstance(right, str):
                _check_len(len(left) + len(right), "+")
            elif isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
                if len(left) + len(right) > _MAX_REPEAT_LEN:
                    raise SecurityError("the result of + would be too large")
        elif operator == "%":
            if isinstance(left, str):
                _check_percent(left, right)
        elif operator == "**":
            if _is_int(left) and _is_int(right) and right > 0 and left not in (0, 1, -1):
                if abs(left).bit_length() * right > _MAX_POW_BITS:
                    raise SecurityError("the result of ** would be too large")
        elif operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, bytes, list, tuple)) and _is_int(n):
                    if len(seq) * n > _MAX_REPEAT_LEN:
                        raise SecurityError("the result of * would be too large")
        return super().call_binop(context, operator, left, right)


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


@functools.lru_cache(maxsize=1)
def _env() -> _ChatSandbox:
    env = _ChatSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        keep_trailing_newline=False,
        extensions=[jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.filters["center"] = _checked_filter(env.filters["center"], "center", 1)
    env.filters["indent"] = _checked_indent(env.filters["indent"])
    env.filters["replace"] = _checked_replace(env.filters["replace"])
    env.filters["format"] = _checked_format(env.filters["format"])
    env.globals["lipsum"] = _checked_lipsum(env.globals["lipsum"])
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _checked_lipsum(fn):
    def lipsum(n=5, html=True, min=20, max=100):  # noqa: A002 (jinja's parameter names)
        if not all(isinstance(v, int) and 0 <= v <= 1000 for v in (n, min, max)):
            raise SecurityError("lipsum arguments must be integers in 0..1000")
        return fn(n, html, min, max)
    return lipsum


def _checked_filter(fn, what, width_pos):
    def f(value, *args, **kwargs):
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, int) and not isinstance(a, bool):
                _check_len(a, what)
        return fn(value, *args, **kwargs)
    return f


def _checked_indent(fn):
    def f(s, width=4, *args, **kwargs):
        w = len(width) if isinstance(width, str) else width
        if isinstance(w, int):
            _check_len((str(s).count("\n") + 1) * w + len(str(s)), "indent")
        return fn(s, width, *args, **kwargs)
    return f


def _checked_replace(fn):
    def f(eval_ctx, s, old, new, count=None):
        s, old, new = str(s), str(old), str(new)
        n = s.count(old) if old else len(s) + 1
        if count is not None and isinstance(count, int):
            n = min(n, max(count, 0))
        _check_len(len(s) + n * max(0, len(new) - len(old)), "replace")
        return fn(eval_ctx, s, old, new, count)
    f.jinja_pass_arg = getattr(fn, "jinja_pass_arg", None)
    return f


def _checked_format(fn):
    def f(value, *args, **kwargs):
        _check_percent(str(value), args)
        return fn(value, *args, **kwargs)
    return f


@functools.lru_cache(maxsize=32)
def _compile(template: str) -> jinja2.Template:
    try:
        return _env().from_string(template)
    except TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template syntax error at line {e.lineno}: {e.message}") from None
    except (RecursionError, MemoryError) as e:      # absurdly nested or huge templates
        raise ChatTemplateError(f"chat template cannot be compiled ({type(e).__name__})") from None
    except SecurityError as e:
        raise ChatTemplateError(f"chat template tried an unsafe operation, blocked by the sandbox: {e}") from None
    except TemplateError as e:
        raise ChatTemplateError(f"chat template cannot be compiled: {e}") from None


class _RenderTimeout(BaseException):
    """Raised inside the rendering thread by the watchdog (a BaseException, so that no `except
    Exception` on the way can swallow it)."""


_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc


class _Watchdog:
    """Raises _RenderTimeout in the thread that created it if stop() is not called within `seconds`."""

    def __init__(self, seconds: float):
        self.tid = threading.get_ident()
        self.lock = threading.Lock()
        self.done = self.fired = False
        self.ev = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(seconds,), daemon=True,
                                       name="gemma4cpu-template-watchdog")
        self.thread.start()

    def _run(self, seconds):
        if self.ev.wait(seconds):
            return
        with self.lock:
            if not self.done:
                self.fired = True
                _set_async_exc(ctypes.c_ulong(self.tid), ctypes.py_object(_RenderTimeout))

    def stop(self):
        with self.lock:
            self.done = True
            fired = self.fired
        self.ev.set()
        if fired:                     # not delivered yet (the render ended at the deadline): withdraw it
            _set_async_exc(ctypes.c_ulong(self.tid), None)
        self.thread.join()


def _template_line(exc: BaseException):
    """Template line where a render error happened (jinja rewrites tracebacks to template lines)."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _where(exc):
    line = _template_line(exc)
    return f" (template line {line})" if line else ""


def render(messages, template: str | None = None, *, arch: str = "gemma4",
           add_generation_prompt: bool = True, bos_token: str = "<bos>", eos_token: str = "<eos>",
           timeout: float | None = DEFAULT_TIMEOUT, **extra) -> str:
    """Render ``messages`` with ``template`` (default: the built-in template for ``arch``).

    ``extra`` keyword arguments become template variables (e.g. ``tools``, ``enable_thinking``).
    ``timeout``: seconds the compile + render may take (None: no limit).
    Raises :class:`ChatTemplateError` for invalid messages and for any template failure.
    """
    if template is None:
        template = builtin_template(arch)
    if not isinstance(template, str):
        raise ChatTemplateError(f"chat template must be a str, got {type(template).__name__}")
    if not template.strip():
        raise ChatTemplateError("chat template is empty")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not 0 < timeout < 1e6):
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
    msgs = validate_messages(messages)
    t0 = time.perf_counter()
    try:
        wd = _Watchdog(timeout) if timeout is not None else None
        try:
            tmpl = _compile(template)
            out, n = [], 0
            for piece in tmpl.generate(messages=msgs, add_generation_prompt=bool(add_generation_prompt),
                                       bos_token=bos_token, eos_token=eos_token, **extra):
                n += len(piece)
                _check_len(n, "the rendered prompt")
                out.append(piece)
            return "".join(out)
        finally:
            if wd is not None:
                wd.stop()
    except _RenderTimeout:
        raise ChatTemplateError(f"chat template rendering exceeded its time limit of {timeout} s "
                                f"(stopped after {time.perf_counter() - t0:.2f} s)") from None
    except ChatTemplateError:
        raise  # raise_exception(...) from the template: its message is the template author's
    except SecurityError as e:
        raise ChatTemplateError(
            f"chat template tried an unsafe operation, blocked by the sandbox{_where(e)}: {e}"
        ) from e
    except OverflowError as e:  # e.g. range() beyond the sandbox's MAX_RANGE
        raise ChatTemplateError(
            f"chat template exceeded a sandbox or numeric limit (unsafe operation){_where(e)}: {e}"
        ) from e
    except RecursionError:
        raise ChatTemplateError("chat template recursed too deeply") from None
    except MemoryError:
        raise ChatTemplateError("chat template ran out of memory") from None
    except TemplateError as e:
        raise ChatTemplateError(f"chat template failed{_where(e)}: {e}") from e
    except Exception as e:  # TypeError, ZeroDivisionError, ... from template expressions
        raise ChatTemplateError(
            f"chat template failed{_where(e)}: {type(e).__name__}: {e}"
        ) from e
