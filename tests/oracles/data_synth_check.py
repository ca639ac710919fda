"""Oracle: re-derives every answer of `rpg data synth` JSONL independently.

Usage: data_synth_check.py FILE.jsonl
Each line holds problem, answer, response (the worked solution), difficulty and prompt.
The problem text is parsed back into numbers and evaluated with fractions.Fraction (an
AST walk over + - * / only, never eval), and so is every equality the worked solution
states. The answer must be the canonical str(Fraction). Exits 1 naming the first failures.
"""
import ast
import json
import re
import sys
from fractions import Fraction


def value(expr):
    """Exact value of an arithmetic expression over integers with + - * / and parentheses."""

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.BinOp):
            a, b = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                return a * b
            if isinstance(node.op, ast.Div):
                return a / b
        raise ValueError(f"not plain arithmetic: {expr!r}")

    return walk(ast.parse(expr, mode="eval"))


def count_ops(expr):
    return sum(isinstance(n, ast.BinOp) for n in ast.walk(ast.parse(expr, mode="eval")))


def digits_sum(n):
    return sum(int(d) for d in str(n))


ASK = re.compile(r"^(?:What is (?P<a>.+)\?|Compute (?P<b>.+)\.|Evaluate (?P<c>.+)\.)$")
EQUATION = re.compile(r"^Solve for ([a-z]): (-?\d+)\1 ([+-]) (\d+) = (-?\d+)\.$")
DIGIT_SUM = re.compile(r"^What is the sum of the digits of (\d+)\?$")
DIGIT_SUM_PRODUCT = re.compile(r"^What is the sum of the digits of (\d+) \* (\d+)\?$")
DIGIT_PRODUCT = re.compile(r"^What is the product of the digits of (\d+)\?$")
FRACTIONS = re.compile(r"^What is (\d+)/(\d+) ([-+*]) (\d+)/(\d+)\? Write the answer in lowest terms\.$")
ARITHMETIC_LINE = re.compile(r"^[-0-9+*/() =]+\.?$")


def check_chain(line, expected, where):
    """A line 'e1 = e2 = ... = en' (trailing '.' allowed): every part equals `expected`."""
    parts = line.rstrip(".").split(" = ")
    for part in parts:
        if value(part) != expected:
            raise AssertionError(f"{where}: '{part}' = {value(part)} in '{line}', expected {expected}")


def solve(problem, difficulty, steps):
    """The exact answer of the problem, checking the worked steps along the way."""
    m = re.match(r"^What is (\d+) \+ (\d)\?$", problem)
    if m and difficulty == 6:
        a, b = int(m.group(1)), int(m.group(2))
        if not (1 <= a <= 99 and 1 <= b <= 9) or (a, b) in ((4, 3), (12, 5)):
            raise AssertionError("level 6 adds 1..9 to 1..99 (never the few-shot examples 4 + 3, 12 + 5)")
        if steps != [f"{a} + {b} = {a + b}."]:
            raise AssertionError(f"level 6 steps {steps}")
        return Fraction(a + b)
    m = ASK.match(problem)
    if m and difficulty in (0, 1, 2):
        expr = m.group("a") or m.group("b") or m.group("c")
        v = value(expr)
        if difficulty == 0:
            terms = expr.split(" + ")
            if len(terms) != 3 or not all(t.isdigit() and len(t) == 1 for t in terms):
                raise AssertionError("level 0 adds three one-digit numbers")
            want = [expr, f"= {int(terms[0]) + int(terms[1])} + {terms[2]}", f"= {v}"]
            if steps != want:
                raise AssertionError(f"level 0 steps {steps} != {want}")
        elif difficulty == 1:
            if count_ops(expr) != 1 or len(steps) != 1:
                raise AssertionError("level 1 is one operation solved in one line")
            check_chain(steps[0], v, "step")
            if not steps[0].startswith(expr + " = "):
                raise AssertionError("the step does not restate the problem")
        else:
            if count_ops(expr) < 2 or "(" not in expr:
                raise AssertionError("level 2 needs several operations and parentheses")
            if steps[0] != expr or not all(s.startswith("= ") for s in steps[1:]):
                raise AssertionError("level 2 steps are the expression, then '= ...' lines")
            for s in steps[1:]:
                check_chain(s[2:], v, "step")
            # Each line does exactly one operation.
            ops = [count_ops(steps[0])] + [count_ops(s[2:]) for s in steps[1:]]
            if ops != list(range(ops[0], -1, -1)):
                raise AssertionError(f"level 2 steps do not reduce one operation per line: {ops}")
        return v
    m = EQUATION.match(problem)
    if m and difficulty == 3:
        var, a, sign, b, c = m.group(1), int(m.group(2)), m.group(3), int(m.group(4)), int(m.group(5))
        b = b if sign == "+" else -b
        if a in (0, 1, -1):
            raise AssertionError("the coefficient must not be 0 or +-1")
        x = Fraction(c - b, a)
        if x.denominator != 1 or a * x + b != c:
            raise AssertionError(f"no integer solution: {a}{var} + {b} = {c}")
        move = f"Subtract {b} from" if b > 0 else f"Add {-b} to"
        want = [f"{a}{var} {sign} {abs(b)} = {c}", f"{move} both sides: {a}{var} = {c - b}.",
                f"Divide both sides by {a}: {var} = {x}."]
        if steps != want:
            raise AssertionError(f"level 3 steps {steps} != {want}")
        return x
    m = DIGIT_SUM.match(problem)
    if m and difficulty == 4:
        n = m.group(1)
        if not steps[-1].startswith(" + ".join(n) + " = "):
            raise AssertionError("the sum does not add the digits")
        check_chain(steps[-1], Fraction(digits_sum(n)), "digit sum")
        return Fraction(digits_sum(n))
    m = DIGIT_SUM_PRODUCT.match(problem)
    if m and difficulty == 4:
        a, b = int(m.group(1)), int(m.group(2))
        check_chain(steps[0], Fraction(a * b), "product")
        if not steps[-1].startswith(" + ".join(str(a * b)) + " = "):
            raise AssertionError("the sum does not add the digits of the product")
        check_chain(steps[-1], Fraction(digits_sum(a * b)), "digit sum")
        return Fraction(digits_sum(a * b))
    m = DIGIT_PRODUCT.match(problem)
    if m and difficulty == 4:
        p = 1
        for d in m.group(1):
            p *= int(d)
        if not steps[-1].startswith(" * ".join(m.group(1)) + " = "):
            raise AssertionError("the product does not multiply the digits")
        check_chain(steps[-1], Fraction(p), "digit product")
        return Fraction(p)
    m = FRACTIONS.match(problem)
    if m and difficulty == 5:
        x, y = Fraction(int(m.group(1)), int(m.group(2))), Fraction(int(m.group(4)), int(m.group(5)))
        for num, den in ((m.group(1), m.group(2)), (m.group(4), m.group(5))):
            if not 0 < int(num) < int(den) or Fraction(int(num), int(den)).denominator != int(den):
                raise AssertionError(f"{num}/{den} is not a proper fraction in lowest terms")
        v = {"+": x + y, "-": x - y, "*": x * y}[m.group(3)]
        if len(steps) != 1:
            raise AssertionError("level 5 is solved in one line")
        check_chain(steps[0], v, "step")
        return v
    raise AssertionError(f"no level-{difficulty} pattern matches the problem")


def main():
    failures, levels, n = [], {}, 0
    with open(sys.argv[1], encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            rec = json.loads(line)
            n += 1
            problem, answer, response = rec["problem"], rec["answer"], rec["response"]
            difficulty = rec["difficulty"]
            levels[difficulty] = levels.get(difficulty, 0) + 1
            try:
                lines = response.split("\n")
                if lines[-1] != f"Answer: {answer}":
                    raise AssertionError(f"last line {lines[-1]!r} is not 'Answer: {answer}'")
                if f"\n\n{problem}\n\n" not in rec["prompt"]:
                    raise AssertionError("the prompt does not contain the problem")
                for s in lines[:-1]:
                    if not (ARITHMETIC_LINE.match(s) or difficulty in (3, 4)):
                        raise AssertionError(f"unexpected text in a step: {s!r}")
                v = solve(problem, difficulty, lines[:-1])
                if answer != str(v):
                    raise AssertionError(f"answer {answer!r}, but the problem evaluates to {v}")
            except (AssertionError, ValueError, SyntaxError, ZeroDivisionError) as e:
                failures.append(f"line {line_no}: {problem!r}: {e}")
    if failures:
        print(f"{len(failures)} of {n} problems wrong; first: " + " | ".join(failures[:3]), file=sys.stderr)
        sys.exit(1)
    print(json.dumps({"checked": n, "levels": {str(k): levels[k] for k in sorted(levels)}}))


if __name__ == "__main__":
    main()
