"""Oracle for tests/tokenizer: builds byte-level BPE tokenizers with Hugging Face
`tokenizers` (trained here on a generated corpus; nothing is downloaded) and records what
Hugging Face does with them.

    tokenizer_oracle.py build OUT   train tokenizers into OUT/<name>/ and write
                                    OUT/cases.jsonl: per test string (hex bytes) the ids,
                                    ids with special tokens, and both decodes, per tokenizer
    tokenizer_oracle.py chat OUT    write OUT/chat/<name>/ model dirs whose
                                    tokenizer_config.json holds a real or fixture chat
                                    template, and OUT/chat_cases.jsonl with the prompts
                                    transformers' apply_chat_template renders
"""
import json
import os
import random
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

import tokenizer_hf_variants as variants

QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
            r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<思考>"]
LLAMA_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                 "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>",
                 "<|reserved_special_token_0|>"]

WORDS = ("the of and to in is was he for it with as his on be at by had are but from or "
         "have an they which one you were her all she there would their we him been has when "
         "who will more no if out so said what up its about into than them can only other new "
         "some could time these two may then do first any my now such like our over man me "
         "even most made after also did many before must through back years where much your "
         "way well down should because each just those people how too little state good very "
         "make world still own see men work long get here between both life being under never "
         "day same another know while last might us great old year off come since against go "
         "came right used take three theorem integer prime polynomial triangle probability "
         "answer solve compute therefore hence equation function derivative matrix vector "
         "Python return lambda self import numpy tensor gradient").split()
CONTRACTIONS = ["don't", "I'm", "you're", "we've", "they'll", "she'd", "it's", "DON'T",
                "I'M", "YOU'RE", "WE'VE", "THEY'LL", "SHE'D", "It'S", "o'clock", "rock'n'roll"]
CJK = "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可自会那后能对着事其里所去行过家十用发天如然作方成者多日都三小军二无同么经法当起与好看学进种将还分此心前面又定见只主没公从"
JAPANESE = "ひらがなカタカナ日本語のテキストですこんにちは世界ありがとうございます"
KOREAN = "한국어텍스트안녕하세요세계감사합니다"
ARABIC = "مرحبا بالعالم هذا نص عربي للاختبار ١٢٣ ٤٥٦"
HEBREW = "שלום עולם זה טקסט בעברית"
THAI = "สวัสดีชาวโลกภาษาไทย"
DEVANAGARI = "नमस्ते दुनिया हिन्दी"
EMOJI = ["😀", "👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "🇺🇸", "1️⃣", "❤️", "🧑🏿‍💻",
         "👩‍❤️‍💋‍👨", "🤖", "🦄", "✨", "🔥", "#️⃣", "😂😂😂"]
COMBINING = ["e\u0301", "a\u0308", "n\u0303", "o\u0302\u0323", "Å", "A\u030a", "ệ", "e\u0323\u0302",
             "\u0301", "x\u0336y\u0336", "Z\u0351\u0352\u0353", "ḱ", "k\u0301", "한", "\u1112\u1161\u11ab"]
DIGITS = ["0", "7", "42", "123", "1234", "12345", "1234567", "3.14159", "1,000,000", "2024-11-30",
          "０１２３", "²³", "½", "Ⅻ", "٣٤٥", "१२३", "๑๒๓", "1e-5", "-17", "0x1F", "10^9+7"]
SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n ", "\n \n", " \t\n",
          "\u00a0", "\u3000", "\u2028", "\u0085", "\u200b", "\u2003", "\x0b", "\x0c", "\x1c", "\r"]
PUNCT = list(".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`") + ["...", "—", "–", "«", "»", "“", "”", "¿", "¡", "•", "→", "€", "$$", "\\frac", "\\boxed{", "'s", "'T", "'ſ"]


def rand_word(r):
    k = r.random()
    if k < 0.55:
        w = r.choice(WORDS)
    elif k < 0.65:
        w = r.choice(CONTRACTIONS)
    elif k < 0.72:
        w = "".join(r.choice(CJK) for _ in range(r.randint(1, 6)))
    elif k < 0.75:
        w = r.choice([JAPANESE, KOREAN, ARABIC, HEBREW, THAI, DEVANAGARI])
        a = r.randint(0, len(w) - 1)
        w = w[a:a + r.randint(1, 8)]
    elif k < 0.82:
        w = r.choice(DIGITS) if r.random() < 0.5 else str(r.randint(0, 10 ** r.randint(1, 12)))
    elif k < 0.86:
        w = r.choice(EMOJI)
    elif k < 0.89:
        w = r.choice(COMBINING)
    else:
        w = r.choice(PUNCT)
    if r.random() < 0.1:
        w = w.capitalize()
    elif r.random() < 0.03:
        w = w.upper()
    return w


def rand_text(r, n_words):
    out = []
    for _ in range(n_words):
        out.append(rand_word(r))
        k = r.random()
        if k < 0.75:
            out.append(" ")
        elif k < 0.85:
            out.append("")
        else:
            out.append(r.choice(SPACES))
    return "".join(out)


def corpus(seed=1):
    r = random.Random(seed)
    lines = [rand_text(r, r.randint(3, 40)) for _ in range(12000)]
    lines += [" ".join(r.choice(WORDS) for _ in range(20)) for _ in range(6000)]
    return lines


def train(name, regex, specials, added, nfc, ignore_merges, vocab=3000):
    tok = Tokenizer(models.BPE())
    if nfc:
        tok.normalizer = normalizers.NFC()
    if regex is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    tok.add_tokens(added)
    data = json.loads(tok.to_str())
    if ignore_merges:
        data["model"]["ignore_merges"] = True
        # Whole pieces that the merges do not reach (the trained model splits them into
        # several tokens): only ignore_merges finds them. The most frequent such pieces of the
        # test strings, so the path is exercised. They take the ids right after the trained
        # vocabulary; added tokens move up.
        vocab = data["model"]["vocab"]
        trained = Tokenizer.from_str(json.dumps(data))
        byte_char = bytes_to_unicode()
        counts = {}
        for b in test_strings():
            for piece, _ in pieces_of(trained, b.decode("utf-8", errors="replace")):
                counts[piece] = counts.get(piece, 0) + 1
        extra = []
        for piece, _ in sorted(counts.items(), key=lambda kv: -kv[1]):
            if len(extra) >= 40:
                break
            if piece not in vocab and len(trained.model.tokenize(piece)) > 1:
                extra.append(piece)
        assert len(extra) >= 10, extra
        base = max(vocab.values()) + 1
        for k, w in enumerate(extra):
            vocab[w] = base + k
        for a in data["added_tokens"]:
            if a["id"] >= base:
                a["id"] += len(extra)
    return data


def bytes_to_unicode():
    """GPT-2's byte -> printable character map of the byte-level pre-tokenizer."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


def pieces_of(tok, text):
    return tok.pre_tokenizer.pre_tokenize_str(text)


def finish(data, post):
    if post == "llama3":
        bos = next(a["id"] for a in data["added_tokens"] if a["content"] == "<|begin_of_text|>")
        data["post_processor"] = {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                      {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                      {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bos],
                                                      "tokens": ["<|begin_of_text|>"]}}}]}
    else:
        data["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False,
                                  "trim_offsets": False, "use_regex": False}
    return data


def build_tokenizers():
    qwen_added = [AddedToken(t, special=False, normalized=False) for t in QWEN_ADDED]
    # A normalized added token: matched after NFC, written decomposed on purpose.
    qwen_added.append(AddingNormalized("cafe\u0301!"))
    llama_added = [AddedToken("<|mask|>", special=True, normalized=False, lstrip=True, rstrip=True)]
    gpt2 = finish(train("gpt2", None, ["<|endoftext|>"], [], False, False, vocab=2000), "gpt2")
    byte_char = bytes_to_unicode()
    text = corpus()
    return {
        "qwen2": finish(train("qwen2", QWEN2_RE, QWEN_SPECIAL, qwen_added, True, False), "qwen2"),
        "llama3": finish(train("llama3", LLAMA3_RE, LLAMA_SPECIAL, llama_added, False, True), "llama3"),
        "gpt2": gpt2,
        # Beyond plain byte-level BPE (tokenizer_hf_variants.py).
        "sp_bpe": variants.sp_bpe(text),
        "sp_meta_first": variants.sp_meta_first(text),
        "sp_meta_split": variants.sp_meta_split(text),
        "bytes_unk": variants.bytes_unk(gpt2, byte_char),
        "bytes_drop": variants.bytes_drop(gpt2, byte_char),
        "bytes_fallback": variants.bytes_fallback(gpt2, byte_char),
    }


def AddingNormalized(content):
    return AddedToken(content, special=False, normalized=True)


def test_strings():
    r = random.Random(7)
    fixed = [
        "", " ", "a", "Hello world", "Hello, world!", "  leading", "trailing  ", "a  b   c",
        "don't I'm you're we've they'll she'd", "DON'T I'M YOU'RE 'S 'ſ 'Re", "x's 'll'd'm",
        "1234567890", "a1b22c333d4444", "3.14159265358979", "1,234,567.89", "ｆｕｌｌｗｉｄｔｈ１２３",
        "你好，世界！这是一个测试。", "日本語とEnglishの混在テキスト", "한국어 텍스트",
        "مرحبا بالعالم 123", "שלום עולם", "👨‍👩‍👧‍👦 family", "🏳️‍🌈🇯🇵🇺🇸", "e\u0301 vs é",
        "Ångström A\u030angstro\u0308m", "\t\tindented\n\n\nnewlines\r\n\r\nwindows",
        "    def f(x):\n        return x ** 2\n", "x\n \n \ny", "a \n b", "a\u00a0b\u3000c\u2028d\u0085e",
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "<|im_start|><|im_end|>",
        "<|im_sta", "<think>reasoning</think>answer", "text<|endoftext|>more", "<<|im_start|>>",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
        "a <|mask|> b", "a<|mask|>b", "  <|mask|>  ", "café! cafe\u0301! CAFÉ!", "<思考>中文</思考>",
        "\\frac{1}{2} + \\sqrt{3} = \\boxed{42}", "$$x^2 + y^2 = z^2$$", "Answer: 42",
        "\x00\x01\x02 control \x7f", "\u200b\u200c\u200d zero width", "\ufeffBOM", "\U0001F600" * 20,
        "a" * 300, " " * 100, "\n" * 50, "ab" * 200, "1" * 100, "😀" * 50, "中" * 200,
        "Z\u0351\u0352\u0353\u0354\u0355\u0356\u0357\u0358", "ﬁ ﬂ ﬀ", "K Å Ω", "ß ẞ ſ", "İ ı", "'ſt 'ſand 'ſ1 'ſ", "'S'T'RE'VE'M'LL'D'x", "'re're", "a'b'c", "\u2060\u180e\u3164\uffa0",
        "\U0001F1E6\U0001F1E8 \U000E0067", "١٢٣٤٥٦٧ ۱۲۳ ⑴⑵ ⅷ 𝟙𝟚𝟛", "x\x85y\u2029z\x1d\x1e\x1f", "\t \t\n\t \n", " \r\n \r \n",
        "<|im_end|><|im_end|>\n<|im_start|>", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
    ]
    out = [s.encode("utf-8") for s in fixed] + variants.every_byte_strings()
    specials = QWEN_SPECIAL + LLAMA_SPECIAL + QWEN_ADDED + ["<|mask|>", "cafe\u0301!", "café!"]
    for i in range(5200):
        s = rand_text(r, r.randint(1, 30))
        if i % 7 == 0:
            pos = r.randint(0, len(s))
            s = s[:pos] + r.choice(specials) + s[pos:]
        if i % 11 == 0:
            # Arbitrary code points from assigned blocks, not just our word lists.
            blocks = [(0x20, 0x7e), (0xa0, 0x24f), (0x300, 0x36f), (0x370, 0x3ff), (0x400, 0x4ff),
                      (0x590, 0x6ff), (0x900, 0x97f), (0xe00, 0xe5b), (0x1100, 0x11ff),
                      (0x2000, 0x206f), (0x2100, 0x22ff), (0x3000, 0x30ff), (0x4e00, 0x9fff),
                      (0xac00, 0xd7a3), (0xff00, 0xffef), (0x1f300, 0x1f64f), (0x1f900, 0x1f9ff),
                      (0x20000, 0x2a6df)]
            s += "".join(chr(r.randint(*r.choice(blocks))) for _ in range(r.randint(1, 20)))
        b = s.encode("utf-8")
        if i % 13 == 0:
            bad = [b"\xff", b"\xfe", b"\xc0\x80", b"\xed\xa0\x80", b"\xf0\x9f\x98", b"\xe4\xb8",
                   b"\x80", b"\xbf\xbf", b"\xf5\x80\x80\x80", b"\xe0\x80\xaf", b"\xf4\x90\x80\x80",
                   b"\xc3", b"\xf0\x9f", bytes([r.randint(0x80, 0xff)])]
            for _ in range(r.randint(1, 3)):
                pos = r.randint(0, len(b))
                b = b[:pos] + r.choice(bad) + b[pos:]
        out.append(b)
    return out


def cmd_build(out):
    toks = {}
    for name, data in build_tokenizers().items():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False)
        cfg = {"tokenizer_class": "PreTrainedTokenizerFast"}
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f)
        toks[name] = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    # The older "left right" merges serialisation of the same Qwen-style model.
    legacy = json.load(open(os.path.join(out, "qwen2", "tokenizer.json"), encoding="utf-8"))
    legacy["model"]["merges"] = [" ".join(m) for m in legacy["model"]["merges"]]
    d = os.path.join(out, "qwen2_legacy")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(legacy, f, ensure_ascii=False)
    toks["qwen2_legacy"] = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))

    strings = test_strings()
    with open(os.path.join(out, "cases.jsonl"), "w", encoding="utf-8") as f:
        for b in strings:
            text = b.decode("utf-8", errors="replace")
            rec = {"hex": b.hex(), "tok": {}}
            for name, tok in toks.items():
                ids = tok.encode(text, add_special_tokens=False).ids
                rec["tok"][name] = {
                    "ids": ids,
                    "sp": tok.encode(text, add_special_tokens=True).ids,
                    "dec": tok.decode(ids, skip_special_tokens=False).encode("utf-8").hex(),
                    "skip": tok.decode(ids, skip_special_tokens=True).encode("utf-8").hex(),
                }
            f.write(json.dumps(rec) + "\n")
    # A benchmark / throughput corpus in the same style.
    r = random.Random(99)
    with open(os.path.join(out, "bench.txt"), "w", encoding="utf-8") as f:
        for _ in range(20000):
            f.write(rand_text(r, r.randint(5, 60)) + "\n")


if __name__ == "__main__":
    cmd, out = sys.argv[1], sys.argv[2]
    if cmd == "build":
        cmd_build(out)
    elif cmd == "chat":
        import tokenizer_chat_oracle
        tokenizer_chat_oracle.cmd_chat(out)
    else:
        sys.exit(f"unknown command {cmd}")
