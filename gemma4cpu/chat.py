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

The sandbox is not a resource limiter: it does not bound total CPU time (nested loops of capped
ranges still run) or memory (e.g. a string doubled in a loop through a namespace), so a caller
rendering templates from unknown sources should also bound time/memory if that matters.

The rendered text begins with ``bos_token`` (as the Gemma templates emit it): tokenize it with special
tokens parsed and do not add another BOS.
"""
from __future__ import annotations

import functools
import json
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


def _raise_exception(message):
    raise ChatTemplateError(str(message))


def _strftime_now(fmt):
    return datetime.now().strftime(str(fmt))


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # as transformers: plain json.dumps, no HTML escaping (autoescape is off)
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


class _ChatSandbox(ImmutableSandboxedEnvironment):
    """Immutable sandbox that fails loudly on unsafe access and bounds ``**`` and ``*``."""

    intercepted_binops = frozenset(["**", "*"])

    def unsafe_undefined(self, obj, attribute):
        # the stock sandbox returns an Undefined that only raises when used further, so
        # `{{ x.__class__ }}` would silently render as ""; refuse at the access instead
        raise SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
        )

    def call_binop(self, context, operator, left, right):
        if operator == "**":
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
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@functools.lru_cache(maxsize=32)
def _compile(template: str) -> jinja2.Template:
    try:
        return _env().from_string(template)
    except TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template syntax error at line {e.lineno}: {e.message}") from None


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
           **extra) -> str:
    """Render ``messages`` with ``template`` (default: the built-in template for ``arch``).

    ``extra`` keyword arguments become template variables (e.g. ``tools``, ``enable_thinking``).
    Raises :class:`ChatTemplateError` for invalid messages and for any template failure.
    """
    if template is None:
        template = builtin_template(arch)
    if not isinstance(template, str):
        raise ChatTemplateError(f"chat template must be a str, got {type(template).__name__}")
    if not template.strip():
        raise ChatTemplateError("chat template is empty")
    msgs = validate_messages(messages)
    tmpl = _compile(template)
    try:
        return tmpl.render(
            messages=msgs,
            add_generation_prompt=bool(add_generation_prompt),
            bos_token=bos_token,
            eos_token=eos_token,
            **extra,
        )
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
    except TemplateError as e:
        raise ChatTemplateError(f"chat template failed{_where(e)}: {e}") from e
    except Exception as e:  # TypeError, ZeroDivisionError, ... from template expressions
        raise ChatTemplateError(
            f"chat template failed{_where(e)}: {type(e).__name__}: {e}"
        ) from e
