"""Oracle for the reward parity tests: builds a corpus of (response, ground truth) pairs
(hand-written tricky cases + a seeded generator of variations) and scores every pair with
verl's own scorers, called live:
  verl.utils.reward_score.math_dapo.compute_score   (default and strict_box_verify=True)
  verl.utils.reward_score.math_reward.compute_score (lighteval/MATH)
and, for a subset, math-verify (a figure to report, not a requirement).

usage: reward_cases.py OUT.jsonl [--seed S] [--generated N] [--math-verify M]
Each output line: {"r": hex(response bytes), "g": hex(gt bytes),
  "dapo": [score, acc, hex(pred) | null], "strict": [...], "light": [score, hex(pred) | null],
  "mv": 0/1 | null}.
Strings are Python str; bytes that are not UTF-8 travel as surrogate escapes, so the C++
side sees the exact bytes.
"""
import argparse
import json
import random
import sys

from verl.utils.reward_score import math_dapo, math_reward


def b(s):
    return s.encode("utf-8", "surrogateescape")


def hexs(s):
    return None if s is None else b(s).hex()


ANSWERS = [
    "42", "-7", "0", "1,000", "1{,}000", "12,345,678", "1,23", "3.14", ".5", "0.5", "-0.25", "5.",
    "\\frac{1}{2}", "\\dfrac{1}{2}", "\\tfrac{1}{2}", "\\frac12", "\\frac 12", "\\frac1{2}", "1/2", "-3/4",
    "\\frac{\\sqrt{3}}{2}", "\\sqrt{2}", "\\sqrt2", "2\\sqrt{3}", "3\\sqrt 5", "sqrt3", "\\sqrt{x}",
    "5 cm", "10 \\text{ cm}", "12 inches", "30^\\circ", "30^{\\circ}", "45 degrees", "7 \\text{m}",
    "\\text{(A)}", "(A)", "\\textbf{B}", "\\mbox{C}", "\\overline{AB}", "\\text{Evelyn}",
    "\\$5", "$5$", "$\\frac{1}{2}$", "\\$1,000", "5 dollars", "25 cents", "50\\%", "50%",
    "(1, 2]", "[-3, \\infty)", "(0,1) \\cup (2,3)", "\\left( 1, 2 \\right)", "x = 5", "a = 3, b = 4",
    "k=10", "y = 2x + 1", "\\boxed{42}", "\\boxed{\\frac{1}{2}}", "42.", "\\;42", "4\\,200",
    "10^{10}", "2^{10}", "\\pi", "2\\pi", "\\frac{\\pi}{4}", "e^{i\\pi}", "x^2+1", "\\{1,2,3\\}",
    "5 \\text{ ways}", "6 ways", "an 8", "a 9", "\\text{and}", "1 \\text{and} 2", "3,\\text{and}4",
    "1,\\!000", "\\dots", "1, 2, \\ldots", "\\mathrm{th}", "5^\\text{th}", "\"7\"", "12 units",
    "100 points", "60 mph", "3 hours", "2 km", "9 meters", "4 feet", "15 minutes", "4 digits",
    "１２", "²", "٣", "1,٢", "\u00a042\u00a0", "\u300042", "\\infty", "-\\infty", "\\emptyset",
    "\\frac{a}{b}", "\\fracab", "\\frac{1}{2}x", "fraction", "\\sqrt{}", "\\text{}", "$", "$$",
    "\\boxed{}", "[INVALID]", "", " ", "=", "x=", "\\in", "4=4", "\\frac{1}2", "12\\text{s}",
    "\\text{.}", "13^\\circ\\text{C}", "\\text{m}", "1.5\\text{m}", "0.50", "050", "1e3",
]

PREFIXES = [
    "", "Let's think step by step.\n", "We compute the sum: $1+2=3$.\n\n",
    "First, note that the answer is not 5.\n", "Hence\n", "**Solution**\n",
    "The answer: we find it below.\n", "ANSWER-related text\n",
]

ANSWER_LINES = [
    "Answer: {a}", "answer: {a}", "ANSWER: {a}", "Answer:{a}", "Answer :  {a}", "Answer:\n{a}",
    "Answer:\n\n{a}", "**Answer:** {a}", "Answer: ${a}$", "Answer: \\({a}\\)", "Answer: {a}.",
    "Answer: {a}\n", "Answer: {a}\n\n", "Final Answer: {a}", "Answer:\t{a}", "Answer: {a}\r\n",
    "Answer\u00a0: {a}", "Answer:\u3000{a}", "Anſwer: {a}", "The final answer is $\\boxed{{{a}}}$.",
    "\\boxed{{{a}}}", "Answer: \\boxed{{{a}}}", "Answer: The answer is {a}", "Answer: x = {a}",
    "{a}", "Answer: {a} Answer: 99", "Answer: 99\nAnswer: {a}", "Answer: {a}\nAnswer:",
    "Answer: {a}\nAnswer: ", "Answer: {a}\nAnswer:\n", "Answer:", "Answer: ", "answer is {a}",
    "Answer: $\\boxed{{{a}}}$ cm", "Answer: {a} \\text{ cm}",
]


def hand_cases():
    cases = [
        ("Answer: 42", "42"), ("Answer: 1,000", "1000"), ("Answer: \\frac12", "\\frac{1}{2}"),
        ("Answer: \\dfrac{1}{2}", "\\frac{1}{2}"), ("no answer here", "5"), ("", "5"), ("", ""),
        ("Answer: [INVALID]", "[INVALID]"), ("nothing", "[INVALID]"), ("\\boxed{5}", "5"),
        ("\\boxed{5", "5"), ("\\boxed{{5}}", "{5}"), ("x" * 400 + "\nAnswer: 7", "7"),
        ("Answer: 7\n" + "y" * 400, "7"), ("Answer: 7" + "z" * 295, "7"), ("\\boxed{3}" + "w" * 95, "3"),
        ("\\boxed{3}" + "w" * 93, "3"), ("Answer:" + " " * 50, " "), ("Answer:\n\n\n", "5"),
        ("Answer: \n", " "), ("Answer:  \n", ""), ("Answer:\t\n", "\t"), ("Answer: a\u2028b", "a\u2028b"),
        ("Answer\n:\n 5", "5"), ("Answer: 5\rAnswer: 6", "6"), ("ANSWER: 12\n", "12"),
        ("Answer: $5$ and $6$", "5"), ("Answer: $5$ $6$ $7$", "5"), ("Answer: \\text{a}\\text{b}", "ab"),
        ("Answer: \\text{\\text{a}}", "a"), ("Answer: \\boxed{1}+\\boxed{2}", "1}+\\boxed{2"),
        ("Answer: \\fracabc", "\\frac{a}{b}c"), ("Answer: \\frac{a}bc", "x"), ("Answer: \\sqrtab", "\\sqrt{a}b"),
        ("Answer: fracfrac12", "?"), ("Answer: sqrtsqrt2", "?"), ("Answer: frac", "frac"),
        ("Answer: frac1", "frac1"), ("Answer: sqrt", "sqrt"), ("Answer: 1,2,3", "123"),
        ("Answer: １,２", "１２"), ("Answer: ², ³", "²³"), ("Answer: 5 = 6 = 7", "7"),
        ("Answer: an answer", "swer"), ("Answer: a a a a", "a"), ("Answer: \\$\\$", ""),
        ("Answer: anſwer", "anſwer"), ("anſwer: 9", "9"), ("Answer: 5\udcff", "5\udcff"),
        ("Answer: \udcc3(\udca9", "é"), ("\udcff" * 500 + "Answer: 3", "3"), ("Answer: é" * 40, "é"),
        ("Answer: 😀", "😀"), ("😀" * 299 + "Answer: 1", "1"), ("Answer: \\boxed{\\boxed{2}}", "2"),
        ("The final answer is \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("The final answer is \\boxed{\\frac{1}{2}}", "\\frac12"), ("\\boxed 5$", "5"),
        ("\\fbox{5}", "5"), ("\\boxed{5} and \\boxed {6}", "6"), ("\\boxed {6}", "6"),
        ("\\boxed{0.5}", "1/2"), ("\\boxed{.5}", "0.5"), ("\\boxed{k = 3}", "3"), ("\\boxed{abc = 3}", "3"),
        ("\\boxed{\\sqrt3}", "\\sqrt{3}"), ("\\boxed{\\sqrt}", "\\sqrt"), ("\\boxed{\\frac}", "\\frac"),
        ("\\boxed{\\frac1}", "\\frac1"), ("\\boxed{5\\text{ cm}}", "5"), ("\\boxed{5\\text{ a}\\text{ b}}", "5"),
        ("\\boxed{50\\%}", "50"), ("\\boxed{\\left(1,2\\right)}", "(1,2)"), ("\\boxed{10^\\circ}", "10"),
        ("\\boxed{3/4}", "\\frac{3}{4}"), ("\\boxed{-3/4}", "-\\frac{3}{4}"), ("\\boxed{03/4}", "\\frac{03}{4}"),
        ("\\boxed{-0/4}", "\\frac{-0}{4}"), ("\\boxed{1/2/3}", "1/2/3"), ("\\boxed{\\!5}", "5"),
        ("\\boxed{a\\\\b}", "a\\b"), ("\\boxed{\n5\n}", "5"), ("\\boxed{}", ""), ("\\boxed", "x"),
        ("\\boxedx{5}", "5"), ("$\\boxed{7}$", "7"), ("\\boxed{" + "1" * 4301 + "/2}", "\\frac{" + "1" * 4301 + "}{2}"),
        ("\\boxed{" + "1" * 4301 + "/2}", "1" * 4301 + "/2"), ("\\boxed{-" + "1" * 4300 + "/2}", "-\\frac{" + "1" * 4300 + "}{2}"),
        ("\\boxed{" + "1" * 4300 + "/2}", "\\frac{" + "1" * 4300 + "}{2}"),
    ]
    # The cuts at the last 300 (whole response) and 100 (strict box) characters, counted in
    # code points: answers that start just inside or just outside them.
    for filler in ("x", "é", "😀", "\udcff"):
        for total in range(296, 305):
            cases.append(("Answer: 5\n" + filler * (total - 10), "5"))
        for total in range(96, 105):
            cases.append(("\\boxed{5}\n" + filler * (total - 10), "5"))
    return cases


def random_text(rng, n):
    alphabet = "abcdefghij klmnop qrstuv wxyz0123456789,.;:!?$\\{}()=+-*/^_\n\t"
    return "".join(rng.choice(alphabet) for _ in range(n))


def mutate(rng, s):
    """Small spelling variations of an answer (the ground truth gets the canonical form)."""
    ops = [
        lambda x: x.replace("\\frac", "\\dfrac"), lambda x: x.replace("\\frac", "\\tfrac"),
        lambda x: x.replace("{", "").replace("}", ""), lambda x: " " + x + " ", lambda x: x + ".",
        lambda x: "$" + x + "$", lambda x: "\\text{" + x + "}", lambda x: x.replace(",", ""),
        lambda x: x + " units", lambda x: x + "^\\circ", lambda x: "x = " + x, lambda x: x.upper(),
        lambda x: x.replace(" ", ""), lambda x: "\\boxed{" + x + "}", lambda x: x + "\\%",
        lambda x: x.replace("\\sqrt{", "\\sqrt").replace("}", "", 1), lambda x: "\\left(" + x + "\\right)",
        lambda x: "\\$" + x, lambda x: x + " \\text{ cm}", lambda x: x,
    ]
    return rng.choice(ops)(s)


def generated_cases(rng, n):
    out = []
    for _ in range(n):
        a = rng.choice(ANSWERS)
        shown = mutate(rng, a) if rng.random() < 0.5 else a
        line = rng.choice(ANSWER_LINES).replace("{a}", "\x00").replace("{{", "{").replace("}}", "}").replace("\x00", shown)
        prefix = rng.choice(PREFIXES)
        r = rng.random()
        if r < 0.15:
            prefix += random_text(rng, rng.randint(200, 500))
        elif r < 0.25:
            prefix += "Answer: " + rng.choice(ANSWERS) + "\n"
        suffix = ""
        r = rng.random()
        if r < 0.08:
            suffix = "\n" + random_text(rng, rng.randint(50, 320))
        elif r < 0.14:
            suffix = "\n\\boxed{" + rng.choice(ANSWERS) + "}"
        resp = prefix + line + suffix
        if rng.random() < 0.05:  # bytes that are not UTF-8
            pos = rng.randint(0, len(resp))
            resp = resp[:pos] + chr(0xDC00 + rng.choice([0x80, 0xBF, 0xC3, 0xE2, 0xF0, 0xFF])) + resp[pos:]
        gt_choice = rng.random()
        if gt_choice < 0.45:
            gt = a
        elif gt_choice < 0.65:
            gt = shown
        elif gt_choice < 0.8:
            gt = mutate(rng, a)
        else:
            gt = rng.choice(ANSWERS)
        out.append((resp, gt))
    return out


SOUP = [
    "Answer", "answer", "ANSWER", "Anſwer", ":", " ", "  ", "\n", "\t", "\r", "\u00a0", "\u3000", "\u2028",
    "$", "\\$", "\\text{", "\\textbf{", "\\overline{", "\\boxed{", "\\boxed ", "\\fbox{", "\\mbox{",
    "{", "}", "frac", "\\frac", "\\dfrac", "\\tfrac", "sqrt", "\\sqrt", "=", ",", ".", "{,}", ",\\!", "\\!",
    "\\left", "\\right", "^\\circ", "^{\\circ}", "\\%", "%", "/", "-", "0", "1", "2", "12", "3.5", "1,000",
    "an ", "a ", "units", "cm", "sue", "\\text{m}", "\\text{and}", "\\text{ ", "\\ldots", "\\\\", "\"",
    "²", "٣", "１", "é", "😀", "x", "k", "(", ")", "[", "]", "[INVALID]", "\udc80", "\udcff", "\udce2",
]


def soup(rng, max_tokens):
    return "".join(rng.choice(SOUP) for _ in range(rng.randint(0, max_tokens)))


def soup_cases(rng, n):
    out = []
    for _ in range(n):
        resp = soup(rng, 40)
        if rng.random() < 0.2:
            resp = soup(rng, 200)
        gt = soup(rng, 6) if rng.random() < 0.7 else soup(rng, 30)
        if rng.random() < 0.3:  # make agreement likely: the ground truth is the tail of an Answer: line
            gt = resp.split("\n")[-1][-rng.randint(1, 12):]
        out.append((resp, gt))
    return out


def light_pred(resp):
    try:
        s = math_reward.last_boxed_only_string(resp)
        return None if s is None else math_reward.remove_boxed(s)
    except Exception:
        return None


def math_verify_acc(resp, gt):
    from math_verify.grader import verify
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig, parse

    try:
        gold = parse("\\boxed{" + gt + "}", (LatexExtractionConfig(),))
        pred = parse(resp, (ExprExtractionConfig(), LatexExtractionConfig()))
        if gold and pred:
            return int(any(verify(g, p) for g in gold for p in pred))
    except Exception:
        pass
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--generated", type=int, default=6000)
    ap.add_argument("--math-verify", type=int, default=0)
    ap.add_argument("--soup", type=int, default=0, help="random token-soup pairs")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    cases = hand_cases() + generated_cases(rng, args.generated) + soup_cases(rng, args.soup)
    import io, contextlib

    # Only strings that bytes can produce: escaped bytes must not form valid UTF-8 together.
    cases = [(r, g) for r, g in cases if b(r).decode("utf-8", "surrogateescape") == r
             and b(g).decode("utf-8", "surrogateescape") == g]
    with open(args.out, "w") as f:
        for i, (resp, gt) in enumerate(cases):
            d = math_dapo.compute_score(resp, gt)
            s = math_dapo.compute_score(resp, gt, strict_box_verify=True)
            with contextlib.redirect_stdout(io.StringIO()):  # math_reward prints its exceptions
                light = math_reward.compute_score(resp, gt)
            mv = None
            if i < args.math_verify and not any(0xDC80 <= ord(c) <= 0xDCFF for c in resp + gt):
                mv = math_verify_acc(resp, gt)
            rec = {
                "r": b(resp).hex(), "g": b(gt).hex(),
                "dapo": [d["score"], int(d["acc"]), hexs(d["pred"])],
                "strict": [s["score"], int(s["acc"]), hexs(s["pred"])],
                "light": [light, hexs(light_pred(resp))],
                "mv": mv,
            }
            f.write(json.dumps(rec) + "\n")
    print(len(cases))


if __name__ == "__main__":
    main()
