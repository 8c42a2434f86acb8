"""Chat prompt rendering (gemma4cpu.chat): built-in Gemma templates, HF-style custom templates,
the sandbox against hostile templates, and message validation."""
import copy
import datetime

import pytest

from gemma4cpu import chat
from gemma4cpu.chat import (
    GEMMA3_TEMPLATE,
    GEMMA4_TEMPLATE,
    ChatTemplateError,
    builtin_template,
    render,
    validate_messages,
)

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Capital of France?"},
]

GEMMA3_EXPECTED = (
    "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
    "<start_of_turn>model\nHello!<end_of_turn>\n"
    "<start_of_turn>user\nCapital of France?<end_of_turn>\n"
    "<start_of_turn>model\n"
)

GEMMA4_EXPECTED = (
    "<bos><|turn>system\nBe brief.<turn|>\n"
    "<|turn>user\nHi<turn|>\n"
    "<|turn>model\nHello!<turn|>\n"
    "<|turn>user\nCapital of France?<turn|>\n"
    "<|turn>model\n"
)


# --- built-in templates ----------------------------------------------------------------------------

def test_gemma3_multi_turn_exact():
    assert render(CHAT, GEMMA3_TEMPLATE) == GEMMA3_EXPECTED


def test_gemma4_multi_turn_exact():
    assert render(CHAT, GEMMA4_TEMPLATE) == GEMMA4_EXPECTED


def test_default_template_follows_arch():
    assert render(CHAT) == GEMMA4_EXPECTED
    assert render(CHAT, arch="gemma4") == GEMMA4_EXPECTED
    assert render(CHAT, arch="gemma3") == GEMMA3_EXPECTED
    # an explicit template wins over arch
    assert render(CHAT, GEMMA3_TEMPLATE, arch="gemma4") == GEMMA3_EXPECTED


def test_builtin_template_lookup():
    assert builtin_template("gemma4") is GEMMA4_TEMPLATE
    assert builtin_template("gemma3") is GEMMA3_TEMPLATE
    assert GEMMA3_TEMPLATE != GEMMA4_TEMPLATE
    for bad in ("llama", "gemma2", "", "GEMMA4"):
        with pytest.raises(ValueError, match="no built-in chat template"):
            builtin_template(bad)
    with pytest.raises(ValueError):
        render(CHAT, arch="llama")


def test_no_generation_prompt():
    assert render(CHAT, GEMMA3_TEMPLATE, add_generation_prompt=False) == (
        GEMMA3_EXPECTED.removesuffix("<start_of_turn>model\n")
    )
    assert render(CHAT, GEMMA4_TEMPLATE, add_generation_prompt=False) == (
        GEMMA4_EXPECTED.removesuffix("<|turn>model\n")
    )
    # and the prompt really is the difference
    assert render(CHAT, GEMMA4_TEMPLATE, add_generation_prompt=False).endswith("France?<turn|>\n")


def test_bos_token_override():
    out = render([{"role": "user", "content": "x"}], GEMMA4_TEMPLATE, bos_token="")
    assert out == "<|turn>user\nx<turn|>\n<|turn>model\n"
    out = render([{"role": "user", "content": "x"}], GEMMA3_TEMPLATE, bos_token="[B]")
    assert out == "[B]<start_of_turn>user\nx<end_of_turn>\n<start_of_turn>model\n"


def test_model_alias():
    aliased = [dict(m, role="model") if m["role"] == "assistant" else m for m in CHAT]
    assert aliased[2]["role"] == "model"
    assert render(aliased, GEMMA3_TEMPLATE) == GEMMA3_EXPECTED
    assert render(aliased, GEMMA4_TEMPLATE) == GEMMA4_EXPECTED


def test_content_is_trimmed():
    msgs = [{"role": "system", "content": "  Be brief.\n"},
            {"role": "user", "content": "\n Hi  "},
            {"role": "assistant", "content": "Hello!\n\n"},
            {"role": "user", "content": "\tCapital of France?  "}]
    assert render(msgs, GEMMA3_TEMPLATE) == GEMMA3_EXPECTED
    assert render(msgs, GEMMA4_TEMPLATE) == GEMMA4_EXPECTED


def test_without_system():
    msgs = CHAT[1:]
    assert render(msgs, GEMMA3_TEMPLATE) == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nCapital of France?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert render(msgs, GEMMA4_TEMPLATE) == GEMMA4_EXPECTED.replace("<|turn>system\nBe brief.<turn|>\n", "")


@pytest.mark.parametrize("roles", [
    ["user", "user"],
    ["assistant", "user"],
    ["system", "assistant"],
    ["user", "assistant", "assistant"],
    ["system", "user", "user"],
])
def test_gemma3_roles_must_alternate(roles):
    msgs = [{"role": r, "content": f"m{i}"} for i, r in enumerate(roles)]
    with pytest.raises(ChatTemplateError, match="Conversation roles must alternate user/assistant"):
        render(msgs, GEMMA3_TEMPLATE)


@pytest.mark.parametrize("template", [GEMMA3_TEMPLATE, GEMMA4_TEMPLATE])
def test_system_not_first_raises(template):
    msgs = [{"role": "user", "content": "Hi"}, {"role": "system", "content": "late"}]
    with pytest.raises(ChatTemplateError, match="only allowed as the first message"):
        render(msgs, template)
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"},
            {"role": "system", "content": "late"}, {"role": "user", "content": "?"}]
    with pytest.raises(ChatTemplateError, match="only allowed as the first message"):
        render(msgs, template)


def test_gemma3_system_only_raises():
    with pytest.raises(ChatTemplateError, match="followed by a user message"):
        render([{"role": "system", "content": "Be brief."}], GEMMA3_TEMPLATE)


def test_gemma4_system_only():
    assert render([{"role": "system", "content": "S"}], GEMMA4_TEMPLATE) == (
        "<bos><|turn>system\nS<turn|>\n<|turn>model\n"
    )


def test_caller_messages_untouched():
    msgs = copy.deepcopy(CHAT)
    msgs[2]["role"] = "model"
    before = copy.deepcopy(msgs)
    render(msgs, GEMMA3_TEMPLATE)
    assert msgs == before


# --- custom HF-style templates ---------------------------------------------------------------------

CUSTOM = """{{ bos_token }}
{% for message in messages %}
  {% if loop.first %}
[{{ loop.length }} messages]
  {% endif %}
{{ loop.index }}. {{ message.role | upper }}: {{ message | tojson }}
{% endfor %}
{% if tools %}
tools={{ tools | tojson }}
{% endif %}
{% if add_generation_prompt %}
>>> {% endif %}{{ eos_token }}"""


def test_custom_template():
    msgs = [{"role": "user", "content": "héllo \"q\""}, {"role": "assistant", "content": "<ok>"}]
    out = render(msgs, CUSTOM, bos_token="[BOS]", eos_token="[EOS]")
    # trim_blocks drops the newline after each block tag (not after {{ }}), lstrip_blocks the
    # indentation before it
    assert out == (
        "[BOS]\n"
        "[2 messages]\n"
        '1. USER: {"role": "user", "content": "héllo \\"q\\""}\n'
        '2. ASSISTANT: {"role": "assistant", "content": "<ok>"}\n'
        ">>> [EOS]"
    )
    out = render(msgs, CUSTOM, add_generation_prompt=False, tools=[{"name": "f"}])
    assert out == (
        "<bos>\n"
        "[2 messages]\n"
        '1. USER: {"role": "user", "content": "héllo \\"q\\""}\n'
        '2. ASSISTANT: {"role": "assistant", "content": "<ok>"}\n'
        'tools=[{"name": "f"}]\n'
        "<eos>"
    )


def test_custom_template_loopcontrols_and_globals():
    t = ("{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
         "{{ m.content }};{% if loop.index == 3 %}{% break %}{% endif %}{% endfor %}"
         "|{{ strftime_now('%Y') }}")
    out = render(CHAT, t)
    years = {str(datetime.datetime.now().year), str(datetime.datetime.now().year + 1)}
    body, year = out.split("|")
    assert body == "Hi;Hello!;"
    assert year in years


def test_tojson_options():
    out = render([{"role": "user", "content": "x"}], "{{ {'b': 1, 'a': [1, 2]} | tojson(indent=2, sort_keys=True) }}")
    assert out == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}'


def test_raise_exception_in_custom_template():
    t = "{% if messages | length > 1 %}{{ raise_exception('only one message, please') }}{% endif %}ok"
    assert render([{"role": "user", "content": "x"}], t) == "ok"
    with pytest.raises(ChatTemplateError) as ei:
        render(CHAT, t)
    assert str(ei.value) == "only one message, please"


def test_syntax_error_names_line():
    t = "{{ bos_token }}\n{% for m in messages %}\n{{ m.content }\n{% endfor %}"
    with pytest.raises(ChatTemplateError, match=r"syntax error at line 3"):
        render(CHAT, t)
    with pytest.raises(ChatTemplateError, match=r"syntax error at line 2"):
        render(CHAT, "ok\n{% if %}\n")
    with pytest.raises(ChatTemplateError, match=r"syntax error"):
        render(CHAT, "{% for m in messages %}unclosed")


def test_runtime_error_is_chat_template_error():
    with pytest.raises(ChatTemplateError, match=r"line 2.*ZeroDivisionError"):
        render(CHAT, "a\n{{ 1 / 0 }}")
    with pytest.raises(ChatTemplateError, match="undefined"):
        render(CHAT, "{{ nothing.here }}")


def test_bad_template_argument():
    with pytest.raises(ChatTemplateError, match="empty"):
        render(CHAT, "  \n")
    with pytest.raises(ChatTemplateError, match="must be a str"):
        render(CHAT, b"{{ bos_token }}")


def test_templates_compiled_once():
    t = "{{ messages | length }}:{{ bos_token }}  # unique-cache-probe"
    chat._compile.cache_clear()
    assert render(CHAT, t) == "4:<bos>  # unique-cache-probe"
    assert render(CHAT, t, bos_token="B") == "4:B  # unique-cache-probe"
    info = chat._compile.cache_info()
    assert info.misses == 1 and info.hits == 1
    assert chat._compile(t) is chat._compile(t)


# --- hostile templates -----------------------------------------------------------------------------

HOSTILE = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ ''.__class__ }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ joiner.__init__.__globals__ }}",
    "{{ lipsum.__globals__['os'] }}",
    "{{ raise_exception.__globals__ }}",
    "{{ messages.append(1) }}",
    "{{ messages.pop() }}",
    "{{ messages[0].update({'role': 'system'}) }}",
    "{{ messages[0].clear() }}",
    "{{ ().__class__.__base__.__subclasses__() }}",
    "{{ self.__init__.__globals__ }}",
    "{{ (1).__class__ }}",
    "{{ '{0}'.format.__globals__ }}",
    "{{ '{0.__class__}'.format(1) }}",
]


@pytest.mark.parametrize("template", HOSTILE)
def test_hostile_template_blocked(template):
    msgs = copy.deepcopy(CHAT)
    with pytest.raises(ChatTemplateError) as ei:
        render(msgs, template)
    msg = str(ei.value).lower()
    assert "unsafe" in msg and "sandbox" in msg
    assert msgs == CHAT  # nothing was mutated


def test_hostile_template_never_executes(tmp_path):
    marker = tmp_path / "pwned"
    templates = [
        "{{ cycler.__init__.__globals__.os.system('touch ' ~ path) }}",
        "{{ lipsum.__globals__['os'].system('touch ' ~ path) }}",
        "{% for c in ''.__class__.__mro__[1].__subclasses__() %}"
        "{% if c.__name__ == 'Popen' %}{{ c(['touch', path]) }}{% endif %}{% endfor %}",
        "{{ namespace.__init__.__globals__['__builtins__']['open'](path, 'w').write('x') }}",
    ]
    for t in templates:
        with pytest.raises(ChatTemplateError, match="unsafe"):
            render(CHAT, t, path=str(marker))
        assert not marker.exists()


def test_private_attribute_of_extra_object_blocked():
    calls = []

    class Obj:
        def _secret(self):
            calls.append("called")
            return "leaked"

    with pytest.raises(ChatTemplateError, match="unsafe"):
        render(CHAT, "{{ obj._secret() }}", obj=Obj())
    assert calls == []


def test_huge_range_blocked():
    with pytest.raises(ChatTemplateError, match="(?i)unsafe|sandbox") as ei:
        render(CHAT, "{% for x in range(10**9) %}{{ x }}{% endfor %}")
    assert "MAX_RANGE" in str(ei.value) or "range" in str(ei.value).lower()
    # ranges within the sandbox limit still work
    assert render(CHAT, "{% for x in range(3) %}{{ x }}{% endfor %}") == "012"


@pytest.mark.parametrize("template", [
    "{{ 9 ** 99999999 }}",
    "{{ 'ab' * 1000000000 }}",
    "{{ [0] * 10 ** 8 }}",
])
def test_huge_values_blocked(template):
    with pytest.raises(ChatTemplateError, match="unsafe"):
        render(CHAT, template)


def test_small_arithmetic_still_allowed():
    assert render(CHAT, "{{ 2 ** 10 }} {{ '-' * 3 }} {{ 3 * 4 }} {{ [1] * 2 }}") == "1024 --- 12 [1, 1]"


def test_unbounded_recursion_is_chat_template_error():
    with pytest.raises(ChatTemplateError, match="recursed"):
        render(CHAT, "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}")


# --- validate_messages -----------------------------------------------------------------------------

def test_validate_messages_ok():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "model", "content": "m"}, {"role": "assistant", "content": "a"}]
    out = validate_messages(msgs)
    assert out == [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                   {"role": "assistant", "content": "m"}, {"role": "assistant", "content": "a"}]
    assert msgs[2]["role"] == "model"  # input not modified
    assert out[0] is not msgs[0]
    assert validate_messages(tuple(msgs)) == out


@pytest.mark.parametrize("messages, pattern", [
    ([{"role": "user", "content": "a"}, "hello"], r"messages\[1\]: expected a dict"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user"}],
     r"messages\[2\]: missing key\(s\) 'content'"),
    ([{"content": "a"}], r"messages\[0\]: missing key\(s\) 'role'"),
    ([{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}], r"messages\[1\]: unknown role 'tool'"),
    ([{"role": "User", "content": "a"}], r"messages\[0\]: unknown role 'User'"),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": ["part"]}],
     r"messages\[1\]: content must be a str, got list"),
    ([{"role": "user", "content": None}], r"messages\[0\]: content must be a str, got NoneType"),
    ([{"role": 3, "content": "a"}], r"messages\[0\]: role must be a str, got int"),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": "b", "name": "x"}],
     r"messages\[1\]: unsupported key\(s\) 'name'"),
])
def test_validate_messages_names_bad_index(messages, pattern):
    with pytest.raises(ChatTemplateError, match=pattern):
        validate_messages(messages)
    with pytest.raises(ChatTemplateError, match=pattern):  # render validates before rendering
        render(messages)


@pytest.mark.parametrize("messages", [[], (), "hi", {"role": "user", "content": "x"}, None, 5])
def test_validate_messages_bad_container(messages):
    with pytest.raises(ChatTemplateError, match="messages"):
        validate_messages(messages)


def test_chat_template_error_is_value_error():
    assert issubclass(ChatTemplateError, ValueError)
    with pytest.raises(ValueError):
        validate_messages([])


# --- resource limits (issue 8): a hostile template fails safely within a time limit -----------------

def _render_in_thread(template, limit_s, **kw):
    """Render in a worker thread and wait at most limit_s + 30 s for it, so a broken limit fails this
    test instead of hanging the suite. Returns (exception or result, seconds)."""
    import threading
    import time
    box = {}

    def run():
        t0 = time.perf_counter()
        try:
            box["out"] = render(CHAT, template, timeout=limit_s, **kw)
        except BaseException as e:  # noqa: BLE001
            box["out"] = e
        box["s"] = time.perf_counter() - t0

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(limit_s + 30)
    assert not th.is_alive(), "the render did not stop"
    return box["out"], box["s"]


@pytest.mark.parametrize("template", [
    "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}",        # 1e10 steps
    "{% for a in range(99999) %}{% for b in range(99999) %}{{ '' }}{% endfor %}{% endfor %}",
    "{% macro f(n) %}{% for i in range(99999) %}{% endfor %}{{ f(n) if n < 30 else '' }}{% endmacro %}{{ f(0) }}",
])
def test_huge_loop_stops_at_the_time_limit(template):
    """Nested loops within the sandbox's range limit would run for hours; the watchdog stops them at
    the limit (0.3 s here). The bound on the elapsed time is the limit plus scheduling delay on a
    loaded 2-core host (the watchdog thread must get the GIL: <= 5 ms switch interval, plus being
    scheduled at all): 3 s is a 10x margin over what was measured (0.31 s)."""
    import threading
    before = threading.active_count()
    out, secs = _render_in_thread(template, 0.3)
    assert isinstance(out, ChatTemplateError) and "time limit of 0.3 s" in str(out), out
    assert 0.3 <= secs < 3.0
    assert threading.active_count() == before        # the watchdog thread is gone


def test_time_limit_does_not_fire_after_a_quick_render():
    """A render that ends before its deadline is never interrupted later (the withdrawn exception)."""
    import time
    for _ in range(20):
        assert render(CHAT, "{{ messages[0]['content'] }}", timeout=0.05) == CHAT[0]["content"]
    time.sleep(0.1)                                   # past every deadline: nothing pending fires here
    assert render(CHAT, "{% for i in range(1000) %}x{% endfor %}", timeout=None) == "x" * 1000


@pytest.mark.parametrize("template", [
    "{% set ns = namespace(s='xx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{% set ns = namespace(s='xx') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "{% set ns = namespace(s=[1]) %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "{{ ('x' * 100000) | replace('x', 'y' * 100000) }}",
    "{{ ('x' * 100000).replace('x', 'y' * 100000) }}",
    "{{ '%999999999s' % 'x' }}", "{{ '%.999999999f' % 1.0 }}", "{{ '%*s' % (999999999, 'x') }}",
    "{{ '{:>999999999}'.format(1) }}", "{{ '{:{w}}'.format(1, w=999999999) }}",
    "{{ 'x' | center(999999999) }}", "{{ 'x'.ljust(999999999) }}", "{{ 'x'.zfill(999999999) }}",
    "{{ ('a\n' * 1000000) | indent(1000) }}", "{{ messages | tojson(indent=999999999) }}",
    "{{ lipsum(n=999999999) }}", "{{ 'x%s' | format('y' * 10) ~ ('%999999999d' | format(1)) }}",
])
def test_memory_bombs_are_refused(template):
    """Each of these would build gigabytes in one step (or in a few doublings); each is refused by a
    size check before the allocation, fast (not by the time limit)."""
    out, secs = _render_in_thread(template, 10.0)
    assert isinstance(out, ChatTemplateError) and ("too large" in str(out) or "not allowed" in str(out)
                                                   or "lipsum" in str(out)), out
    assert secs < 5.0


def test_size_limits_leave_real_templates_alone():
    long = [{"role": "user", "content": "word " * 200000}]          # a 1 MB message renders fine
    assert len(render(long, GEMMA4_TEMPLATE)) > 1_000_000
    assert render(CHAT, "{{ '%5s|%-3d|%.2f' % ('ab', 7, 1.5) }} {{ '{:>4}'.format(1) }} {{ 'a'|center(5) }}") == \
        "   ab|7  |1.50    1   a  "
    assert render(CHAT, "{{ 'a-b'|replace('-', '+') }} {{ [1] + [2] }} {{ 'x' ~ 1 }}") == "a+b [1, 2] x1"
