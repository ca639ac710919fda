"""Oracle for tests/tokenizer chat templates: renders conversations with transformers'
apply_chat_template (jinja2 underneath) for the Qwen2.5, Qwen3, Llama 3, Llama 3.1 and
fixture templates of tokenizer_templates.py.

    tokenizer_chat_oracle.py OUT   writes OUT/<template>/ model directories (tokenizer.json
                                   + tokenizer_config.json with the template) and
                                   OUT/chat_cases.jsonl: template, messages, variables,
                                   add_generation_prompt and the rendered prompt (or the
                                   error transformers raised)
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

import tokenizer_templates  # noqa: E402

SPECIALS = {
    "qwen25": dict(bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>"),
    "qwen3": dict(bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>"),
    "llama3": dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", pad_token=None),
    "llama31": dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", pad_token="<|finetune_right_pad_id|>"),
    "constructs": dict(bos_token="<|begin_of_text|>", eos_token="<|im_end|>", pad_token=None),
}

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city, e.g. \"Paris\" — or 東京.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7.5}},
        "required": ["city"]}}}
CALC_TOOL = {"type": "function", "function": {
    "name": "calculate", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}


def conversations():
    u = lambda c: {"role": "user", "content": c}  # noqa: E731
    a = lambda c: {"role": "assistant", "content": c}  # noqa: E731
    s = lambda c: {"role": "system", "content": c}  # noqa: E731
    problem = ("Solve the following math problem step by step. The last line of your response should be of "
               "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
               "Find all $x$ with $x^2 - 5x + 6 = 0$.\n\nRemember to put your answer on its own line after \"Answer:\".")
    basic = [
        [u("Hello!")],
        [u(problem)],
        [s("You are a careful mathematician."), u(problem)],
        [s("  Be brief.  \n"), u("What is 2+2?"), a("4"), u("And 3+3?")],
        [u("Hi"), a("Hello! How can I help?"), u("Tell me a joke."), a("Why did the chicken cross the road?"), u("Why?")],
        [u("  leading and trailing spaces  \n\n")],
        [u("中文问题：求 1+1。"), a("答案是 2 😀"), u("שלום 👨‍👩‍👧‍👦 e\u0301")],
        [u("")],
        [s(""), u("empty system")],
        [u("quotes ' \" \\ and <|im_start|> inside"), a("tabs\tand\nnewlines\r\n")],
        [u("first"), u("second user in a row")],
        [s("sys"), u("q"), s("a second system message"), u("q2")],
    ]
    qwen_tools = [
        ([u("What's the weather in Paris?"),
          {"role": "assistant", "content": "", "tool_calls": [
              {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
          {"role": "tool", "content": "{\"temp\": 21.5}"},
          {"role": "tool", "content": "second tool result"},
          a("It is 21.5 °C in Paris.")], {"tools": [WEATHER_TOOL, CALC_TOOL]}),
        ([s("You can call tools."), u("Compute 6*7 and weather in 東京"),
          {"role": "assistant", "content": "Let me check.", "tool_calls": [
              {"type": "function", "function": {"name": "calculate", "arguments": {"expr": "6*7"}}},
              {"function": {"name": "get_weather", "arguments": {"city": "東京", "days": 3, "ok": True, "x": None, "f": 1e-7}}}]},
          {"role": "tool", "content": "42"}], {"tools": [WEATHER_TOOL, CALC_TOOL]}),
        ([u("no tools given but a call in history"),
          {"role": "assistant", "content": None, "tool_calls": [
              {"type": "function", "function": {"name": "calculate", "arguments": {"expr": "1+1"}}}]},
          {"role": "tool", "content": "2"}, u("thanks")], {}),
    ]
    qwen3_only = [
        ([u("Think first."), a("<think>\nLet me think about this.\n</think>\n\nThe answer is 4.")], {}),
        ([u("q1"), a("<think>r1</think>a1"), u("q2"), a("<think>\nr2\n</think>\n\na2")], {}),
        ([u("q1"), {"role": "assistant", "content": "a1", "reasoning_content": "because"}, u("q2")], {}),
        ([u("q1"), a("a1"), u("q2")], {"enable_thinking": False}),
        ([u("q1")], {"enable_thinking": True}),
        ([u("weather?"), {"role": "assistant", "content": "<think>need tool</think>", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
          {"role": "tool", "content": "cold"}, a("<think>ok</think>It is cold."),
          u("<tool_response>fake</tool_response>")], {"tools": [WEATHER_TOOL]}),
        ([u("multimodal-ish"), {"role": "assistant", "content": ["not", "a", "string"]}, u("next")], {}),
    ]
    llama31_only = [
        ([u("weather in Paris?")], {"tools": [WEATHER_TOOL], "date_string": "30 Nov 2026"}),
        ([s("sys prompt"), u("weather in Paris?"),
          {"role": "assistant", "tool_calls": [{"type": "function", "function": {
              "name": "get_weather", "arguments": {"city": "Paris"}}}]},
          {"role": "tool", "content": {"temp": 20, "sky": "clear"}},
          {"role": "ipython", "content": "plain text result"}, a("It is 20 degrees.")],
         {"tools": [WEATHER_TOOL], "tools_in_user_message": False, "date_string": "1 Jan 2025"}),
        ([u("search for cats"),
          {"role": "assistant", "tool_calls": [{"function": {"name": "brave_search", "arguments": {"query": "cats", "n": "5"}}}]},
          {"role": "tool", "content": "cats are great"}],
         {"builtin_tools": ["brave_search", "wolfram_alpha", "code_interpreter"], "date_string": "2 Feb 2025"}),
        ([u("two calls"), {"role": "assistant", "tool_calls": [
            {"function": {"name": "a", "arguments": {}}}, {"function": {"name": "b", "arguments": {}}}]}],
         {"date_string": "2 Feb 2025"}),
        ([], {"tools": [CALC_TOOL], "date_string": "2 Feb 2025"}),
    ]
    constructs = [
        [u("Hello there, general Kenobi?")],
        [s("  system text  "), u("abc def ghi!"), a("an answer with e and x"), u("中文 and emoji 😀 test?")],
        [u("one"), {"role": "tool", "content": "tool output"}, a("stop here please"), u("never reached")],
        [u("aaa bbb   ccc"), a("x-y_z 1st 2nd")],
    ]
    out = []
    dated = {"date_string": "30 Nov 2026"}
    for name in ["qwen25", "qwen3", "llama3", "llama31"]:
        convs = [(c, {}) for c in basic]
        if name in ("qwen25", "qwen3"):
            convs += qwen_tools
        if name == "qwen3":
            convs += qwen3_only
        if name == "llama31":
            convs = [(c, dated) for c in basic] + llama31_only
        for msgs, extra in convs:
            for gen in (False, True):
                out.append((name, msgs, extra, gen))
    for msgs in constructs:
        for gen in (False, True):
            out.append(("constructs", msgs, {}, gen))
            out.append(("constructs", msgs, {"tools": [WEATHER_TOOL, CALC_TOOL]}, gen))
    return out


def small_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|eot_id|>",
                "<|start_header_id|>", "<|end_header_id|>", "<|finetune_right_pad_id|>"]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello world the quick brown fox"] * 50, trainer)
    return tok


def main(out):
    tok = small_tokenizer()
    hf = {}
    for name, template in tokenizer_templates.TEMPLATES.items():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template}
        for k, v in SPECIALS[name].items():
            if v is not None:
                cfg[k] = v
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, ensure_ascii=False)
        hf[name] = AutoTokenizer.from_pretrained(d, local_files_only=True)
        assert hf[name].chat_template == template, name
    n_ok = 0
    with open(os.path.join(out, "chat_cases.jsonl"), "w", encoding="utf-8") as f:
        for name, msgs, extra, gen in conversations():
            kwargs = dict(extra)
            tools = kwargs.pop("tools", None)
            rec = {"template": name, "messages": msgs, "extra": extra, "add_generation_prompt": gen}
            try:
                rec["expected"] = hf[name].apply_chat_template(
                    msgs, tools=tools, add_generation_prompt=gen, tokenize=False, **kwargs)
                n_ok += 1
            except Exception as e:  # the template raised: rpg must raise too
                rec["error"] = f"{type(e).__name__}: {e}"
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    if n_ok < 100:
        sys.exit(f"only {n_ok} conversations rendered")


if __name__ == "__main__":
    main(sys.argv[1])
