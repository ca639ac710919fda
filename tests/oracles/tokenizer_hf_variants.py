"""BPE tokenizer.json variants beyond plain byte-level BPE, built with Hugging Face
`tokenizers` (trained here; nothing is downloaded), for tokenizer_oracle.py:

  sp_bpe         SentencePiece-style BPE as Llama 2 / TinyLlama ship it: normalizer
                 Prepend("▁") + Replace(" " -> "▁"), no pre-tokenizer, BPE over characters
                 with byte_fallback (<0x00>..<0xFF> in the vocab), fuse_unk, decoder
                 Replace + ByteFallback + Fuse + Strip, post-processor "<s> $A"
  sp_meta_first  Mistral-style: Metaspace pre-tokenizer (prepend_scheme "first", split
                 false), Metaspace decoder, no byte tokens (unknown characters -> <unk>)
  sp_meta_split  Metaspace with split true, written in the older add_prefix_space
                 spelling; byte_fallback with only some <0xNN> tokens
  bytes_unk      byte-level BPE whose vocabulary lacks some byte characters (as the real
                 StarCoder / SmolLM vocabulary does): they become the unknown token, not fused
  bytes_drop     the same without an unknown token: those bytes are dropped
  bytes_fallback the same with byte_fallback, fuse_unk and a few <0xNN> tokens, and the
                 SmolLM2 decoder chain ByteFallback + Fuse + Replace + ByteLevel

Each builder returns the tokenizer.json as a dict; HF loads each one (checked here).
"""
import json

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

SP = "\u2581"
# Byte characters the byte-level variants lack: control bytes and bytes that never occur
# in valid UTF-8, as in the SmolLM2 vocabulary, plus 'q' (0x71), which text does contain.
MISSING_BYTES = [4, 6, 19, 20, 22, 29, 0x71, 192, 193] + list(range(245, 256))


def _sp_train(corpus, *, normalizer, pre_tokenizer, limit_alphabet, vocab=1500):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=["<unk>", "<s>", "</s>"],
                                  limit_alphabet=limit_alphabet, show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    return json.loads(tok.to_str())


def _with_byte_tokens(data, which):
    """Inserts <0xNN> tokens for the bytes in `which` right after the 3 special tokens, as
    SentencePiece lays them out; the trained ids move up."""
    vocab = data["model"]["vocab"]
    names = ["<0x%02X>" % b for b in which]
    shifted = {}
    for tok, i in vocab.items():
        shifted[tok] = i if i < 3 else i + len(names)
    for k, n in enumerate(names):
        shifted[n] = 3 + k
    data["model"]["vocab"] = dict(sorted(shifted.items(), key=lambda kv: kv[1]))
    for a in data["added_tokens"]:
        if a["id"] >= 3:
            a["id"] += len(names)
    return data


def _bos_post(data):
    bos = data["model"]["vocab"]["<s>"]
    data["post_processor"] = json.loads(processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]).__getstate__())
    return data


def _check(data):
    Tokenizer.from_str(json.dumps(data))  # HF loads it
    return data


def sp_bpe(corpus):
    data = _sp_train(corpus, normalizer=normalizers.Sequence([normalizers.Prepend(SP), normalizers.Replace(" ", SP)]),
                     pre_tokenizer=None, limit_alphabet=120)
    data = _with_byte_tokens(data, range(256))
    data["decoder"] = json.loads(decoders.Sequence([
        decoders.Replace(SP, " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]).__getstate__())
    return _check(_bos_post(data))


def sp_meta_first(corpus):
    data = _sp_train(corpus, normalizer=None,
                     pre_tokenizer=pre_tokenizers.Metaspace(replacement=SP, prepend_scheme="first", split=False),
                     limit_alphabet=150)
    data["decoder"] = json.loads(decoders.Metaspace(replacement=SP, prepend_scheme="first", split=False).__getstate__())
    return _check(_bos_post(data))


def sp_meta_split(corpus):
    data = _sp_train(corpus, normalizer=None,
                     pre_tokenizer=pre_tokenizers.Metaspace(replacement=SP, prepend_scheme="always", split=True),
                     limit_alphabet=100)
    # Bytes of some characters only: a character whose bytes are not all there becomes <unk>.
    data = _with_byte_tokens(data, list(range(0x20, 0x7F)) + [0xC3, 0xA9, 0xE4, 0xB8, 0xAD, 0xE2, 0x80])
    for part in ("pre_tokenizer", "decoder"):
        data[part] = {"type": "Metaspace", "replacement": SP, "add_prefix_space": True, "split": True}
    data["decoder"].pop("split")
    return _check(data)


def _drop_bytes(data, byte_char):
    """Removes the characters of MISSING_BYTES from a byte-level tokenizer: their tokens, every
    token containing them and every merge that makes or uses such a token. The ids keep
    their values (the vocabulary then has gaps, which HF accepts)."""
    gone = {byte_char[b] for b in MISSING_BYTES}
    model = data["model"]
    model["vocab"] = {t: i for t, i in model["vocab"].items() if not (set(t) & gone)}
    model["merges"] = [m for m in model["merges"] if not (set(m[0] + m[1]) & gone)]
    return data


def bytes_unk(gpt2_data, byte_char):
    data = _drop_bytes(json.loads(json.dumps(gpt2_data)), byte_char)
    data["model"]["unk_token"] = "<|endoftext|>"
    data["model"]["fuse_unk"] = False
    return _check(data)


def bytes_drop(gpt2_data, byte_char):
    data = _drop_bytes(json.loads(json.dumps(gpt2_data)), byte_char)
    data["model"]["unk_token"] = None
    return _check(data)


def bytes_fallback(gpt2_data, byte_char):
    data = _drop_bytes(json.loads(json.dumps(gpt2_data)), byte_char)
    model = data["model"]
    model.update(unk_token="<|endoftext|>", fuse_unk=True, byte_fallback=True)
    # U+0104 (byte 4's character) is C4 84 in UTF-8 and U+0106 (byte 6's) C4 86: both
    # bytes exist for the first only, so byte 4 falls back and byte 6 becomes <unk>.
    top = max(max(model["vocab"].values()), max(a["id"] for a in data["added_tokens"])) + 1
    for k, b in enumerate([0xC4, 0x84, 0xC5, 0xB1]):
        model["vocab"]["<0x%02X>" % b] = top + k
    data["decoder"] = json.loads(decoders.Sequence([
        decoders.ByteFallback(), decoders.Fuse(), decoders.Replace(SP, " "),
        decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)]).__getstate__())
    return _check(data)


def every_byte_strings():
    """Each byte value alone, between letters and in a run; the characters whose byte-level
    spelling uses the lead bytes 0xF1-0xF4; long runs."""
    out = []
    for b in range(256):
        out += [bytes([b]), b"a" + bytes([b]) + b"b", bytes([b]) * 5, b" " + bytes([b]) + b" x"]
    out.append(bytes(range(256)))
    out.append(bytes(range(255, -1, -1)))
    for cp in (0x40000, 0x50000, 0x10FFFD, 0xF0000, 0x104, 0x106, 0x171, 0xC0, 0x4E2D, 0xE9):
        c = chr(cp).encode("utf-8")
        out += [c, b"x" + c + c + b"y " + c, c * 30]
    out += [b"\x04" * 100, b"\x04\x06\x04 q\x06q\x04", b"qqq quiet queue", (b"q" * 64) + b" " + (b"\x06" * 64),
            ("▁" * 10 + " ▁a ▁ ▁▁b").encode("utf-8"), "  a  b  ".encode("utf-8"), b" " * 300, b"x" * 2000]
    return out
