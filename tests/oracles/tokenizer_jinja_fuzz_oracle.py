"""Differential oracle for the chat-template interpreter: generates random templates from a
grammar of the supported Jinja subset and renders each with transformers' jinja2
environment (the one apply_chat_template uses).

    tokenizer_jinja_fuzz_oracle.py OUT N SEED
writes OUT (JSON lines): {"template", "vars", "expected"} or {"template", "vars", "error"}.
"""
import copy
import json
import random
import sys

from transformers.utils.chat_template_utils import _compile_jinja_template

STRINGS = ["''", "'a'", "'abc'", "' padded  '", "'x,y,z'", "'Hello World'", "'中文'", "'😀'", "'\\n'",
           "'tab\\there'", "\"dq 'q'\"", "'<think>r</think>ans'", "'123'", "'2.5'", "'a b  c'", "'AbC'"]
NUMS = ["0", "1", "2", "3", "-1", "7", "10", "0.5", "2.0", "1e-5", "3.25", "100"]
NAMES = ["messages", "x", "y", "s", "n", "f", "flag", "d", "empty", "undef_name", "ns.a", "ns.b"]
# `reverse` is left out: on lists and undefined values jinja2 returns a lazy iterator whose
# printed form holds a memory address and which is truthy even when empty.
FILTERS = ["trim", "length", "upper", "lower", "title", "capitalize", "tojson", "string", "list", "first",
           "last", "int", "float", "abs", "round", "join(', ')", "join", "default('dflt')",
           "default('d', true)", "unique | list", "sort | list", "tojson(indent=2)", "replace('a', 'o')",
           "map(attribute='role') | list", "selectattr('role', 'equalto', 'user') | list", "items | list",
           "dictsort", "wordcount", "indent(2)", "sum", "min", "max", "count", "select('odd') | list"]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable",
         "sequence", "boolean", "true", "false", "even", "odd", "divisibleby(3)", "equalto(1)", "in('abc')",
         "callable", "lower", "upper"]
METHODS = ["strip()", "strip('a')", "lstrip()", "rstrip('\\n ')", "split()", "split(',')", "split(' ', 1)",
           "upper()", "lower()", "title()", "startswith('a')", "endswith('c')", "replace('b', 'B')",
           "find('b')", "count('a')", "items() | list", "keys() | list", "values() | list", "get('k', 'none')"]
SUBSCRIPTS = ["[0]", "[-1]", "[1:]", "[:2]", "[::-1]", "[::2]", "[1:-1]", ".role", "['role']", ".content", ".k"]
OPS = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">", "<=", ">=", "and", "or", "in", "not in"]


def expr(r, depth=0):
    k = r.random()
    if depth > 2 or k < 0.3:
        c = r.random()
        if c < 0.35:
            return r.choice(STRINGS)
        if c < 0.6:
            return r.choice(NUMS)
        if c < 0.9:
            return r.choice(NAMES)
        return r.choice(["true", "false", "none", "[1, 2, 3]", "['b', 'a', 'b']", "{'k': 1, 'j': 'v'}", "(1, 'a')", "[]"])
    if k < 0.45:
        return f"({expr(r, depth + 1)} {r.choice(OPS)} {expr(r, depth + 1)})"
    if k < 0.6:
        return f"{expr(r, depth + 1)} | {r.choice(FILTERS)}"
    if k < 0.68:
        return f"({expr(r, depth + 1)} is {r.choice(['', 'not '])}{r.choice(TESTS)})"
    if k < 0.76:
        return f"{r.choice(NAMES + STRINGS)}.{r.choice(METHODS)}"
    if k < 0.84:
        return r.choice(NAMES + STRINGS) + r.choice(SUBSCRIPTS)
    if k < 0.9:
        return f"({expr(r, depth + 1)} if {expr(r, depth + 1)} else {expr(r, depth + 1)})"
    if k < 0.95:
        return f"not {expr(r, depth + 1)}"
    return f"-{r.choice(NUMS + ['n', 'f'])}"


def ws(r):
    return r.choice(["", "", " ", "\n", "  \n", "\n  ", "\t", "\n\n"])


def ctl(r):
    return r.choice(["", "", "-", "+"]) if r.random() < 0.5 else ""


def stmt(r, depth=0):
    k = r.random()
    if depth > 2 or k < 0.35:
        return ws(r) + r.choice(["text", "A", " b ", "c\n", "", "é"]) + ws(r) + "{{" + ctl(r).replace("+", "") + " " + expr(r) + " " + ctl(r).replace("+", "") + "}}" + ws(r)
    if k < 0.55:
        body = "".join(stmt(r, depth + 1) for _ in range(r.randint(1, 2)))
        out = f"{{%{ctl(r)} if {expr(r)} {ctl(r)}%}}{body}"
        if r.random() < 0.4:
            out += f"{{%{ctl(r)} elif {expr(r)} {ctl(r)}%}}{stmt(r, depth + 1)}"
        if r.random() < 0.5:
            out += f"{{%{ctl(r)} else {ctl(r)}%}}{stmt(r, depth + 1)}"
        return ws(r) + out + f"{{%{ctl(r)} endif {ctl(r)}%}}" + ws(r)
    if k < 0.75:
        it = r.choice(["messages", "[1, 2, 3]", "'abc'", "d", "d.items()", "range(3)", "messages[::-1]", "empty", "undef_name", "x"])
        target = "a, b" if it == "d.items()" else "item"
        body = "".join(stmt(r, depth + 1) for _ in range(r.randint(1, 2)))
        lv = r.choice(["{{ loop.index }}", "{{ loop.index0 }}{{ loop.first }}", "{{ loop.last }}{{ loop.length }}",
                       "{{ loop.revindex }}", "{{ item }}", "{{ loop.cycle('x', 'y') }}", ""])
        cond = f" if {expr(r)}" if r.random() < 0.2 else ""
        els = f"{{% else %}}{stmt(r, depth + 1)}" if r.random() < 0.2 else ""
        brk = r.choice(["", "", "{% if loop.index > 1 %}{% break %}{% endif %}", "{% if loop.first %}{% continue %}{% endif %}"])
        return ws(r) + f"{{%{ctl(r)} for {target} in {it}{cond} {ctl(r)}%}}{lv}{brk}{body}{els}{{%{ctl(r)} endfor {ctl(r)}%}}" + ws(r)
    if k < 0.9:
        tgt = r.choice(["x", "y", "s", "ns.a", "ns.b", "z"])
        return ws(r) + f"{{%{ctl(r)} set {tgt} = {expr(r)} {ctl(r)}%}}" + ws(r)
    return ws(r) + f"{{#{ctl(r)} comment {{{{ x }}}} {ctl(r)}#}}" + ws(r)


VARS = {
    "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "Hi there"},
                 {"role": "assistant", "content": "<think>r</think>ok"}],
    "x": "abc", "y": 3, "s": " spaced text ", "n": 7, "f": 2.5, "flag": True, "d": {"k": 1, "b": [1, 2]},
    "empty": [], "add_generation_prompt": True,
}


def main(out, n, seed):
    r = random.Random(seed)
    ok = 0
    with open(out, "w", encoding="utf-8") as f:
        for _ in range(n):
            src = "{% set ns = namespace(a=1, b='q') %}" + "".join(stmt(r) for _ in range(r.randint(1, 4)))
            rec = {"template": src, "vars": VARS}
            try:
                # A copy: jinja2's indent filter extends a list argument in place.
                rec["expected"] = _compile_jinja_template(src).render(**copy.deepcopy(VARS))
                ok += 1
            except Exception as e:  # noqa: BLE001 - any jinja2 error means rpg must raise too
                rec["error"] = f"{type(e).__name__}: {e}"
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(ok)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
