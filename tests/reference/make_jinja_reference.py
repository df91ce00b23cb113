"""Reference renders for Orchard's Jinja subset (tests/golden/jinja_test.cpp).

Renders every template in tests/fixtures/chat_templates/ against a set of
conversations, and a list of single expressions, with Jinja2 set up as
transformers sets it up for apply_chat_template: a sandboxed environment
with trim_blocks, lstrip_blocks and loop controls, transformers' tojson
(no key sorting, no HTML escaping) and raise_exception. strftime_now is left
undefined so Llama 3.2's template uses its fixed date.

Run from the repository root (needs only jinja2):
    python3 tests/reference/make_jinja_reference.py
"""
import json
import os

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.join("tests", "fixtures", "chat_templates")


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def environment():
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def m(role, content):
    return {"role": role, "content": content}


CONVERSATIONS = [
    [m("user", "Hi")],
    [m("user", "What is 2+2?"), m("assistant", "4")],
    [m("system", "You are terse."), m("user", "Hi"), m("assistant", "Hello!"),
     m("user", "Again")],
    [m("system", "  Be brief.\n"), m("user", "  padded  "),
     m("assistant", "  spaced reply \n"), m("user", "x"), m("assistant", "y")],
    [m("user", "héllo 世界 \"quotes\" 'single' {{ not jinja }}"),
     m("assistant", "ok\n\nnew lines\tand tabs")],
    [m("user", "a"), m("user", "b")],  # not alternating: some refuse
    [m("system", "only a system message")],
    [m("user", ""), m("assistant", "")],
    [m("user", "2+2?"),
     m("assistant", "<think>\nadd them\n</think>\n\nIt is 4.")],
]

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]

EXPRESSIONS = [
    ("{{ s[1:] }}|{{ s[:2] }}|{{ s[:-1] }}|{{ s[1:-1] }}|{{ s[-2:] }}|{{ s[::-1] }}|{{ s[::2] }}", {}),
    ("{{ items[1:] | length }}{{ items[:-1] | join(',') }}{{ items[-1] }}{{ items[5] }}", {}),
    ("{{ nope is defined }} {{ bound is defined }} {{ nope is not defined }}", {}),
    ("{{ n is number }} {{ s is string }} {{ d is mapping }} {{ nothing is none }} {{ items is iterable }}", {}),
    ("{{ 7 % 3 }} {{ -7 % 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 2 - 5 }} {{ 3 * 4 }} {{ -1 }} {{ 10 - -2 }} {{ 7 / 2 }} {{ 2 ** 10 }}", {}),
    ("{{ nope or 'fb' }} {{ bound or 'fb' }} {{ zero or 'fb' }} {{ bound and 'last' }} [{{ '' and 'never' }}]", {}),
    ("{{ s | length }} {{ items | length }} {{ d | tojson }} {{ d | tojson(indent=2) }}", {}),
    ("{{ 'a' ~ 1 ~ none ~ true }} {{ none }} {{ true }} {{ 1.5 }} {{ [1, 'x'] }} {{ {'k': 'v'} }}", {}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }}{% if not loop.last %}, {% endif %}{% endfor %}", {}),
    ("{% for x in items if x != 'y' %}{{ loop.index }}:{{ x }}/{{ loop.length }} {% else %}none{% endfor %}", {}),
    ("{% for x in [] %}x{% else %}empty{% endfor %}", {}),
    ("{% for x in items %}{% if x == 'y' %}{% continue %}{% endif %}{% if x == 'z' %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("{% set ns = namespace(count=0) %}{% for x in items %}{% set ns.count = ns.count + 1 %}{% endfor %}{{ ns.count }}", {}),
    ("{% set x = 1 %}{% for i in [5] %}{% set x = i %}{{ x }}{% endfor %}{{ x }}", {}),
    ("{{ '  pad  ' | trim }}|{{ '  pad  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ ' a b  c '.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a b c'.split(' ', 1) }}", {}),
    ("{{ 'Hello'.upper() }} {{ 'Hello'.lower() }} {{ 'hello world'.title() }} {{ 'hello World'.capitalize() }} {{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'a-b'.replace('-', '+') }}", {}),
    ("{{ msgs | selectattr('role', 'equalto', 'user') | list | length }} {{ msgs | rejectattr('role', 'equalto', 'user') | map(attribute='content') | join('/') }}", {}),
    ("{{ msgs | map(attribute='role') | list }} {{ msgs[0] == msgs[0] }} {{ msgs[0] == msgs[1] }} {{ 'role' in msgs[0] }} {{ 'y' in items }} {{ 'bc' in s }} {{ 'q' not in s }}", {}),
    ("{{ 'yes' if zero else 'no' }} {{ 'yes' if bound }}|{{ d.get('a') }} {{ d.get('zz', 'dflt') }} {{ d['b'] }} {{ d.b }}", {}),
    ("{{ nope | default('dv') }} {{ '' | default('dv', true) }} {{ items | first }} {{ items | last }} {{ items | reverse | join }}", {}),
    ("{%- if true -%}\n   a   \n{%- endif -%}\n  b  {# comment #}\n{% if true %}\n    c\n{% endif %}\n  {% if false %}x{% endif %}d", {}),
    ("  {%+ if true %}keep{% endif %}\n{{ 'e' }}\n  {% set q = 1 %}\n{{ q }}", {}),
    ("{% set block %}in a block {{ s }}{% endset %}[{{ block }}]{{ range(3) | list }}{{ range(1, 7, 2) | list }}", {}),
    ("{{ (1, 2) | length }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 'abc' is lower }} {{ s[0] }}{{ s[-1] }} {{ items.0 }}", {}),
    ("{{ 'a' 'b' }} {{ \"it's\" }} {{ 'esc\\n' | length }} {{ 'x' * 3 }} {{ [1] + [2] }} {{ 10 > 3 and 3 >= 3 and 2 < 3 <= 3 }}", {}),
    ("{{ dict(a=1) | tojson }} {{ 'é世' | length }} {{ 'é世'[1] }} {{ {'k': [1, none, true, 'q\"']} | tojson }}", {}),
]

EXPRESSION_CONTEXT = {
    "items": ["x", "y", "z"], "s": "abcdef", "n": 7, "zero": 0, "bound": "B",
    "d": {"b": 2, "a": 1}, "nothing": None,
    "msgs": [m("system", "S"), m("user", "U1"), m("assistant", "A1"),
             m("user", "U2")],
}


def render(env, source, context):
    try:
        return {"expected": env.from_string(source).render(**context)}
    except jinja2.exceptions.TemplateError as e:
        return {"error": str(e)}


def main():
    env = environment()
    cases = []
    for name in sorted(os.listdir(HERE)):
        if not name.endswith(".jinja"):
            continue
        source = open(os.path.join(HERE, name), encoding="utf-8").read()
        for c, conv in enumerate(CONVERSATIONS):
            for gen in (False, True):
                ctx = {"messages": conv, "add_generation_prompt": gen,
                       "bos_token": "<s>", "eos_token": "</s>"}
                case = {"template": name, "conversation": c,
                        "add_generation_prompt": gen}
                case.update(render(env, source, ctx))
                cases.append(case)
        ctx = {"messages": CONVERSATIONS[2], "add_generation_prompt": True,
               "bos_token": "<s>", "eos_token": "</s>", "tools": TOOLS}
        case = {"template": name, "conversation": 2,
                "add_generation_prompt": True, "tools": True}
        case.update(render(env, source, ctx))
        cases.append(case)
    expressions = []
    for source, extra in EXPRESSIONS:
        ctx = dict(EXPRESSION_CONTEXT, **extra)
        e = {"source": source}
        e.update(render(env, source, ctx))
        expressions.append(e)
    out = {
        "about": "made by tests/reference/make_jinja_reference.py with jinja2 " +
                 jinja2.__version__,
        "conversations": CONVERSATIONS, "tools": TOOLS,
        "expression_context": EXPRESSION_CONTEXT,
        "cases": cases, "expressions": expressions,
    }
    with open(os.path.join(HERE, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(len(cases), "cases,", len(expressions), "expressions")


if __name__ == "__main__":
    main()
