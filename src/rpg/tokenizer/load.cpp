// Loading a tokenizer: the Hugging Face schema of tokenizer.json (read by json_scan.cpp:
// vocab and merges never become a JSON tree), tokenizer_config.json (special tokens, chat
// template) and chat_template.jinja.
#include "rpg/tokenizer/tokenizer_impl.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <deque>
#include <functional>
#include <queue>
#include <thread>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/text.h"
#include "rpg/jinja/jinja.h"
#include "rpg/tokenizer/json_scan.h"
#include "rpg/tokenizer/pretokenize.h"
#include "rpg/tokenizer/unicode.h"

namespace rpg::tok {

using json = nlohmann::json;
using tok::NormalForm;
using tok::SplitPattern;


namespace {

[[noreturn]] void bad(const std::string& origin, const std::string& what) {
  throw FormatError(str(origin, ": ", what));
}

const json& field(const json& obj, const char* key, const std::string& origin, const std::string& where) {
  if (!obj.is_object()) bad(origin, where + ": expected an object");
  auto it = obj.find(key);
  if (it == obj.end()) bad(origin, str(where, ": missing \"", key, "\""));
  return *it;
}

bool opt_bool(const json& obj, const char* key, bool dflt, const std::string& origin, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) bad(origin, str(where, ".", key, ": expected a boolean"));
  return it->get<bool>();
}

std::string get_string(const json& v, const std::string& origin, const std::string& where) {
  if (!v.is_string()) bad(origin, where + ": expected a string");
  return v.get<std::string>();
}

std::string opt_string(const json& obj, const char* key, const std::string& dflt, const std::string& origin,
                       const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  return get_string(*it, origin, str(where, ".", key));
}

// {"String": s} patterns only (Regex patterns are refused by name).
std::string string_pattern(const Tokenizer::Impl& t, const json& obj, const std::string& where) {
  const json& pat = field(obj, "pattern", t.origin, where);
  if (!pat.is_object() || !pat.contains("String")) bad(t.origin, where + ".pattern: only {\"String\": ...} patterns are supported");
  std::string s = get_string(pat["String"], t.origin, where + ".pattern.String");
  if (s.empty()) bad(t.origin, where + ".pattern.String: empty");
  return s;
}

// One character, as UTF-8.
std::string one_char(const Tokenizer::Impl& t, const json& obj, const char* key, const std::string& where) {
  std::string s = get_string(field(obj, key, t.origin, where), t.origin, str(where, ".", key));
  size_t n = 0;
  for_each_codepoint(s, [&](const CodePoint&) { ++n; });
  if (n != 1) bad(t.origin, str(where, ".", key, ": expected one character, got ", json(s).dump()));
  return s;
}

// Metaspace's prepend scheme: `prepend_scheme` ("always" / "first" / "never"), or in older
// files `add_prefix_space` (true = always, false = never); default always.
PrependScheme prepend_scheme(const Tokenizer::Impl& t, const json& obj, const std::string& where) {
  auto it = obj.find("prepend_scheme");
  if (it != obj.end() && !it->is_null()) {
    std::string v = get_string(*it, t.origin, where + ".prepend_scheme");
    if (v == "always") return PrependScheme::kAlways;
    if (v == "first") return PrependScheme::kFirst;
    if (v == "never") return PrependScheme::kNever;
    bad(t.origin, str(where, ".prepend_scheme: got ", json(v).dump(), ", expected \"always\", \"first\" or \"never\""));
  }
  return opt_bool(obj, "add_prefix_space", true, t.origin, where) ? PrependScheme::kAlways : PrependScheme::kNever;
}

void load_normalizer(Tokenizer::Impl& t, const json& n, const std::string& where) {
  if (n.is_null()) return;
  std::string type = get_string(field(n, "type", t.origin, where), t.origin, where + ".type");
  using K = NormalizerStep::Kind;
  if (type == "Sequence") {
    const json& list = field(n, "normalizers", t.origin, where);
    if (!list.is_array()) bad(t.origin, where + ".normalizers: expected an array");
    for (size_t i = 0; i < list.size(); ++i) load_normalizer(t, list[i], str(where, ".normalizers[", i, "]"));
  } else if (type == "NFC") {
    t.normalizers.push_back({K::kForm, NormalForm::kNFC, {}, {}});
  } else if (type == "NFD") {
    t.normalizers.push_back({K::kForm, NormalForm::kNFD, {}, {}});
  } else if (type == "NFKC") {
    t.normalizers.push_back({K::kForm, NormalForm::kNFKC, {}, {}});
  } else if (type == "NFKD") {
    t.normalizers.push_back({K::kForm, NormalForm::kNFKD, {}, {}});
  } else if (type == "Prepend") {
    std::string p = get_string(field(n, "prepend", t.origin, where), t.origin, where + ".prepend");
    t.normalizers.push_back({K::kPrepend, NormalForm::kNFC, {}, std::move(p)});
  } else if (type == "Replace") {
    std::string pat = string_pattern(t, n, where);
    std::string content = get_string(field(n, "content", t.origin, where), t.origin, where + ".content");
    t.normalizers.push_back({K::kReplace, NormalForm::kNFC, std::move(pat), std::move(content)});
  } else {
    bad(t.origin, str(where, ": unsupported normalizer type \"", type, "\""));
  }
}

struct PreTokenizerSeen {
  bool split = false, byte_level = false, metaspace = false;
};

void load_pre_tokenizer(Tokenizer::Impl& t, const json& p, const std::string& where, PreTokenizerSeen& seen) {
  if (p.is_null()) return;  // the whole normalized text is one piece
  std::string type = get_string(field(p, "type", t.origin, where), t.origin, where + ".type");
  if (type == "Sequence") {
    const json& list = field(p, "pretokenizers", t.origin, where);
    if (!list.is_array()) bad(t.origin, where + ".pretokenizers: expected an array");
    for (size_t i = 0; i < list.size(); ++i)
      load_pre_tokenizer(t, list[i], str(where, ".pretokenizers[", i, "]"), seen);
  } else if (type == "Split") {
    if (seen.split || seen.byte_level || seen.metaspace)
      bad(t.origin, where + ": unsupported pre-tokenizer order (one Split, then ByteLevel)");
    const json& pat = field(p, "pattern", t.origin, where);
    if (!pat.is_object() || !pat.contains("Regex"))
      bad(t.origin, where + ".pattern: only {\"Regex\": ...} patterns are supported");
    std::string re = get_string(pat["Regex"], t.origin, where + ".pattern.Regex");
    auto kind = tok::split_pattern_from_regex(re);
    if (!kind) bad(t.origin, str(where, ".pattern.Regex: unsupported split regex ", json(re).dump()));
    const std::string behavior = opt_string(p, "behavior", "Isolated", t.origin, where);
    if (behavior != "Isolated") bad(t.origin, str(where, ".behavior: unsupported \"", behavior, "\""));
    if (opt_bool(p, "invert", false, t.origin, where)) bad(t.origin, where + ".invert: unsupported true");
    t.split = *kind;
    seen.split = true;
  } else if (type == "ByteLevel") {
    if (seen.byte_level) bad(t.origin, where + ": ByteLevel given twice");
    if (seen.metaspace) bad(t.origin, where + ": ByteLevel together with Metaspace is unsupported");
    bool use_regex = opt_bool(p, "use_regex", true, t.origin, where);
    t.prefix_space = opt_bool(p, "add_prefix_space", false, t.origin, where);
    if (use_regex) {
      if (seen.split) bad(t.origin, where + ": ByteLevel with use_regex after a Split is unsupported");
      t.split = SplitPattern::kGpt2;
      seen.split = true;
    } else if (t.prefix_space) {
      bad(t.origin, where + ": add_prefix_space with use_regex=false is unsupported");
    }
    seen.byte_level = true;
  } else if (type == "Metaspace") {
    if (seen.metaspace || seen.byte_level || seen.split)
      bad(t.origin, where + ": Metaspace is supported only as the sole pre-tokenizer");
    t.metaspace.on = true;
    t.metaspace.replacement = one_char(t, p, "replacement", where);
    t.metaspace.scheme = prepend_scheme(t, p, where);
    t.metaspace.split = opt_bool(p, "split", true, t.origin, where);
    seen.metaspace = true;
  } else {
    bad(t.origin, str(where, ": unsupported pre-tokenizer type \"", type, "\""));
  }
}

void load_post_processor(Tokenizer::Impl& t, const json& p, const std::string& where) {
  if (p.is_null()) return;
  std::string type = get_string(field(p, "type", t.origin, where), t.origin, where + ".type");
  if (type == "Sequence") {
    const json& list = field(p, "processors", t.origin, where);
    if (!list.is_array()) bad(t.origin, where + ".processors: expected an array");
    for (size_t i = 0; i < list.size(); ++i) load_post_processor(t, list[i], str(where, ".processors[", i, "]"));
  } else if (type == "ByteLevel") {
    // Only adjusts offsets; ids are unchanged.
  } else if (type == "TemplateProcessing") {
    const json& single = field(p, "single", t.origin, where);
    if (!single.is_array()) bad(t.origin, where + ".single: expected an array");
    const json& specials = p.contains("special_tokens") ? p["special_tokens"] : json::object();
    bool seen_seq = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const json& piece = single[i];
      std::string w = str(where, ".single[", i, "]");
      if (piece.is_object() && piece.contains("Sequence")) {
        if (seen_seq) bad(t.origin, w + ": more than one sequence");
        seen_seq = true;
      } else if (piece.is_object() && piece.contains("SpecialToken")) {
        std::string name = get_string(field(piece["SpecialToken"], "id", t.origin, w), t.origin, w + ".id");
        const json& spec = specials.is_object() && specials.contains(name) ? specials[name] : json();
        std::vector<TokenId> ids;
        if (spec.is_object() && spec.contains("ids") && spec["ids"].is_array()) {
          for (auto& v : spec["ids"]) {
            if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
              bad(t.origin, str(where, ".special_tokens.", name, ".ids: expected token ids"));
            ids.push_back(static_cast<TokenId>(v.get<int64_t>()));
          }
        } else if (auto id = t.id_of(name)) {
          ids.push_back(*id);
        } else {
          bad(t.origin, str(w, ": unknown special token \"", name, "\""));
        }
        auto& dst = seen_seq ? t.post_suffix : t.post_prefix;
        dst.insert(dst.end(), ids.begin(), ids.end());
      } else {
        bad(t.origin, w + ": expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      }
    }
    if (!seen_seq) bad(t.origin, where + ".single: no $A sequence");
  } else {
    bad(t.origin, str(where, ": unsupported post-processor type \"", type, "\""));
  }
}

void load_decoder(Tokenizer::Impl& t, const json& d, const std::string& where) {
  if (d.is_null()) bad(t.origin, where + ": a decoder is required (none: tokens joined by spaces is unsupported)");
  std::string type = get_string(field(d, "type", t.origin, where), t.origin, where + ".type");
  using K = DecoderStep::Kind;
  DecoderStep step;
  if (type == "Sequence") {
    const json& list = field(d, "decoders", t.origin, where);
    if (!list.is_array()) bad(t.origin, where + ".decoders: expected an array");
    for (size_t i = 0; i < list.size(); ++i) load_decoder(t, list[i], str(where, ".decoders[", i, "]"));
    return;
  } else if (type == "ByteLevel") {
    step.kind = K::kByteLevel;
  } else if (type == "ByteFallback") {
    step.kind = K::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = K::kFuse;
  } else if (type == "Replace") {
    step.kind = K::kReplace;
    step.pattern = string_pattern(t, d, where);
    step.content = get_string(field(d, "content", t.origin, where), t.origin, where + ".content");
  } else if (type == "Strip") {
    step.kind = K::kStrip;
    std::string c = one_char(t, d, "content", where);
    size_t bad_len = 0;
    tok::decode_utf8(c, 0, step.strip_char, bad_len);
    for (const char* k : {"start", "stop"}) {
      const json& v = field(d, k, t.origin, where);
      if (!v.is_number_unsigned() || v.get<uint64_t>() > (1u << 20)) bad(t.origin, str(where, ".", k, ": expected a count"));
      (std::string(k) == "start" ? step.start : step.stop) = v.get<size_t>();
    }
  } else if (type == "Metaspace") {
    step.kind = K::kMetaspace;
    step.content = one_char(t, d, "replacement", where);
    step.scheme = prepend_scheme(t, d, where);
  } else {
    bad(t.origin, str(where, ": unsupported decoder type \"", type, "\""));
  }
  t.decoder.push_back(std::move(step));
}

// `where` names the entry (model.vocab["x"], added_tokens[3]) for the error of an id that
// an earlier entry gave to different text: decoding would show one of them for both, and
// the prompt would render wrong without a word. The same text twice under one id is what
// Hugging Face files do for special tokens (in model.vocab and in added_tokens): accepted.
void set_token(Tokenizer::Impl& t, TokenId id, std::string_view token, std::string_view bytes, IdKind kind,
               const std::function<std::string()>& where) {
  if (id < 0 || id > (1 << 28)) bad(t.origin, str("token id ", id, " out of range"));
  if (static_cast<size_t>(id) < t.id_kind.size() && t.id_kind[id] != IdKind::kNone && t.id_token[id] != token)
    bad(t.origin, str(where(), ": id ", id, " is already the token ", json(std::string(t.id_token[id])).dump(),
                      "; one id cannot stand for two tokens"));
  size_t need = static_cast<size_t>(id) + 1;
  if (t.id_kind.size() < need) {
    t.id_kind.resize(need, IdKind::kNone);
    t.id_bytes.resize(need);
    t.id_token.resize(need);
  }
  t.id_kind[id] = kind;
  t.id_bytes.set(id, bytes);
  t.id_token.set(id, token);
}

void load_model(Tokenizer::Impl& t, const json& m, const StreamedModel& streamed) {
  const std::string w = "model";
  if (!m.is_object()) bad(t.origin, "model: expected an object");
  std::string type = m.contains("type") ? get_string(m["type"], t.origin, "model.type") : "BPE";
  if (type != "BPE") bad(t.origin, str("model.type: unsupported \"", type, "\" (byte-level BPE only)"));
  t.byte_fallback = opt_bool(m, "byte_fallback", false, t.origin, w);
  t.fuse_unk = opt_bool(m, "fuse_unk", false, t.origin, w);
  if (m.contains("unk_token") && !m["unk_token"].is_null()) {
    t.unk_token = get_string(m["unk_token"], t.origin, "model.unk_token");
    if (t.unk_token.empty()) bad(t.origin, "model.unk_token: empty");
  }
  if (m.contains("dropout") && !m["dropout"].is_null()) bad(t.origin, "model.dropout: unsupported");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && !m[k].is_null() && !(m[k].is_string() && m[k].get<std::string>().empty()))
      bad(t.origin, str("model.", k, ": unsupported"));
  t.ignore_merges = opt_bool(m, "ignore_merges", false, t.origin, w);
  std::string bytes;
  auto add_vocab = [&t, &bytes](std::string_view token, int64_t id, bool in_token_ids = false) {
    bytes.clear();
    append_token_bytes(bytes, token);
    set_token(t, static_cast<TokenId>(id), token, bytes, IdKind::kModel,
              [&] { return str("model.vocab[", json(std::string(token)).dump(), "]"); });
    if (!in_token_ids) t.token_ids.insert_or_assign(token, static_cast<TokenId>(id));
    // ignore_merges looks the piece up whole: by its bytes when BPE runs on bytes (only a
    // token whose every character is a byte's can match), else by its text.
    if (t.ignore_merges) {
      if (!t.byte_level) t.bytes_ids.try_emplace(token, static_cast<TokenId>(id));
      else if (is_byte_level_token(token)) t.bytes_ids.try_emplace(bytes, static_cast<TokenId>(id));
    }
  };
  if (streamed.have_vocab) {
    const auto& vocab = streamed.vocab;
    size_t text_bytes = 0;
    for (const auto& e : vocab) text_bytes += e.token.size();
    t.token_ids.reserve(vocab.size());
    if (t.ignore_merges) t.bytes_ids.reserve(vocab.size());
    t.id_token.reserve(vocab.size(), text_bytes);
    t.id_bytes.reserve(vocab.size(), text_bytes);
    // Keys are unique in every real file: add them in one pass.
    bool dups = false;
    for (size_t i = 0; i < vocab.size() && !dups; ++i) {
      dups = !t.token_ids.try_emplace(vocab[i].token, static_cast<TokenId>(vocab[i].id)).second;
      if (!dups) add_vocab(vocab[i].token, vocab[i].id, /*in_token_ids=*/true);
    }
    if (dups) {
      // A key given twice: the last id wins, as in a parsed JSON object, and only the last
      // occurrence names a token. Start again, knowing each key's last occurrence.
      t.token_ids.clear();
      t.bytes_ids.clear();
      t.id_kind.clear();
      t.id_token = StringTable();
      t.id_bytes = StringTable();
      StringIdMap last;
      for (size_t i = 0; i < vocab.size(); ++i) last.insert_or_assign(vocab[i].token, static_cast<TokenId>(i));
      for (size_t i = 0; i < vocab.size(); ++i)
        if (*last.find(vocab[i].token) == static_cast<TokenId>(i)) add_vocab(vocab[i].token, vocab[i].id);
    }
  } else {
    const json& vocab = field(m, "vocab", t.origin, w);
    if (!vocab.is_object()) bad(t.origin, "model.vocab: expected an object");
    t.token_ids.reserve(vocab.size());
    t.bytes_ids.reserve(vocab.size());
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it.value().is_number_integer()) bad(t.origin, str("model.vocab[", json(it.key()).dump(), "]: expected an integer id"));
      int64_t id = it.value().get<int64_t>();
      if (id < 0 || id > (1 << 28)) bad(t.origin, str("model.vocab[", json(it.key()).dump(), "]: id ", id, " out of range"));
      add_vocab(it.key(), id);
    }
  }
  const auto& bm = byte_map();
  t.all_bytes = t.byte_level;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    tok::append_utf8(s, bm.to_char[b]);
    const TokenId* id = t.token_ids.find(s);
    t.byte_id[b] = id ? *id : -1;
    t.all_bytes = t.all_bytes && id;
    static const char kHex[] = "0123456789ABCDEF";
    const char name[] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
    const TokenId* fb = t.token_ids.find(std::string_view(name, sizeof(name)));
    t.fallback_id[b] = fb ? *fb : -1;
  }
  if (!t.unk_token.empty())
    if (const TokenId* id = t.token_ids.find(t.unk_token)) t.unk_id = *id;
  if (!t.byte_level) {
    // The initial symbols of character-level BPE: the single-character tokens.
    for (size_t id = 0; id < t.id_kind.size(); ++id) {
      if (t.id_kind[id] != IdKind::kModel) continue;
      std::string_view tk = t.id_token[id];
      size_t n = 0;
      for_each_codepoint(tk, [&](const CodePoint&) { ++n; });
      if (n == 1 && *t.token_ids.find(tk) == static_cast<TokenId>(id)) t.char_ids.try_emplace(tk, static_cast<TokenId>(id));
    }
  }
  std::string joined;
  auto add_merge = [&t, &joined](size_t r, std::string_view a, std::string_view b, const auto& shown) {
    joined.assign(a).append(b);
    const TokenId *ia = t.token_ids.find(a), *ib = t.token_ids.find(b), *ic = t.token_ids.find(joined);
    if (!ia || !ib) bad(t.origin, str("model.merges[", r, "]: token not in vocab: ", shown()));
    if (!ic) bad(t.origin, str("model.merges[", r, "]: merged token ", json(joined).dump(), " not in vocab"));
    t.merges.insert(*ia, *ib, {static_cast<int32_t>(r), *ic});
  };
  if (streamed.have_merges) {
    const auto& merges = streamed.merges;
    t.merges.reserve(merges.size());
    // The lookups miss the cache; asking for the slots a few merges ahead overlaps the misses.
    constexpr size_t kAhead = 8;
    for (size_t r = 0; r < std::min(kAhead, merges.size()); ++r) {
      t.token_ids.prefetch(merges[r].a);
      t.token_ids.prefetch(merges[r].b);
    }
    for (size_t r = 0; r < merges.size(); ++r) {
      if (r + kAhead < merges.size()) {
        t.token_ids.prefetch(merges[r + kAhead].a);
        t.token_ids.prefetch(merges[r + kAhead].b);
      }
      const auto& e = merges[r];
      add_merge(r, e.a, e.b, [&] {
        return e.from_string ? json(str(e.a, " ", e.b)).dump() : json::array({std::string(e.a), std::string(e.b)}).dump();
      });
    }
    return;
  }
  const json& merges = field(m, "merges", t.origin, w);
  if (!merges.is_array()) bad(t.origin, "model.merges: expected an array");
  t.merges.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& e = merges[r];
    std::string a, b;
    // Two serialisations: "a b" (tokenizers < 0.20) and ["a", "b"].
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        bad(t.origin, str("model.merges[", r, "]: expected \"left right\", got ", e.dump()));
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      bad(t.origin, str("model.merges[", r, "]: expected a pair of strings"));
    }
    add_merge(r, a, b, [&] { return e.dump(); });
  }
}

void load_added(Tokenizer::Impl& t, const json& list) {
  if (list.is_null()) return;
  if (!list.is_array()) bad(t.origin, "added_tokens: expected an array");
  for (size_t i = 0; i < list.size(); ++i) {
    const json& a = list[i];
    std::string w = str("added_tokens[", i, "]");
    const json& idv = field(a, "id", t.origin, w);
    if (!idv.is_number_integer() || idv.get<int64_t>() < 0 || idv.get<int64_t>() > (1 << 28))
      bad(t.origin, w + ".id: expected a non-negative integer");
    AddedTok tk;
    tk.id = static_cast<TokenId>(idv.get<int64_t>());
    tk.content = get_string(field(a, "content", t.origin, w), t.origin, w + ".content");
    if (tk.content.empty()) bad(t.origin, w + ".content: empty");
    tk.special = opt_bool(a, "special", false, t.origin, w);
    tk.normalized = opt_bool(a, "normalized", !tk.special, t.origin, w);
    tk.lstrip = opt_bool(a, "lstrip", false, t.origin, w);
    tk.rstrip = opt_bool(a, "rstrip", false, t.origin, w);
    if (opt_bool(a, "single_word", false, t.origin, w)) bad(t.origin, w + ".single_word: unsupported true");
    std::string valid;
    if (!tok::sanitize_utf8(tk.content, valid)) bad(t.origin, w + ".content: invalid UTF-8");
    // Decoding runs added tokens through the decoder too: a ByteLevel decoder maps their
    // characters as it maps a model token's.
    std::string bytes;
    append_token_bytes(bytes, tk.content);
    set_token(t, tk.id, tk.content, bytes, tk.special ? IdKind::kSpecial : IdKind::kAdded, [&] { return w; });
    t.token_ids.insert_or_assign(tk.content, tk.id);
    t.added.push_back(std::move(tk));
  }
  for (size_t i = 0; i < t.added.size(); ++i) {
    const AddedTok& tk = t.added[i];
    if (tk.normalized && !t.normalizers.empty()) {
      // Hugging Face matches these against normalized text, so normalize the pattern too.
      std::string buf[2];
      std::string_view s = t.normalize(tk.content, buf);
      if (!s.empty()) t.normalized_trie.add(std::string(s), static_cast<int>(i));
    } else if (tk.normalized) {
      t.normalized_trie.add(tk.content, static_cast<int>(i));
    } else {
      t.raw_trie.add(tk.content, static_cast<int>(i));
    }
  }
}

// bos_token etc. are either a string or an AddedToken object {"content": ...}.
std::string config_token(const json& cfg, const char* key, const std::string& origin) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  bad(origin, str(key, ": expected a string or {\"content\": ...}"));
}

json parse_json(std::string_view text, const std::string& origin) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    bad(origin, str("invalid JSON: ", short_json_error(e.what())));
  }
}

}  // namespace

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, const std::string& origin,
                               std::string_view tokenizer_config_json, const std::string& config_origin) {
  auto t = std::make_shared<Impl>();
  t->origin = origin;
  StreamedModel streamed;
  const json root = scan_tokenizer_json(tokenizer_json, origin, streamed);
  if (!root.is_object()) bad(origin, "expected a JSON object");
  const json& model = field(root, "model", origin, "root");
  if (root.contains("truncation") && !root["truncation"].is_null()) bad(origin, "truncation: unsupported");
  if (root.contains("padding") && !root["padding"].is_null()) bad(origin, "padding: unsupported");
  load_normalizer(*t, root.value("normalizer", json()), "normalizer");
  // The pre-tokenizer decides what BPE starts from (bytes or characters): read it first.
  PreTokenizerSeen seen;
  load_pre_tokenizer(*t, root.value("pre_tokenizer", json()), "pre_tokenizer", seen);
  t->byte_level = seen.byte_level;
  if (seen.byte_level && !seen.split) bad(origin, "pre_tokenizer: no split regex");
  if (seen.split && !seen.byte_level) bad(origin, "pre_tokenizer: a Split without ByteLevel is unsupported");
  load_model(*t, model, streamed);
  load_added(*t, root.value("added_tokens", json()));
  load_post_processor(*t, root.value("post_processor", json()), "post_processor");
  load_decoder(*t, root.value("decoder", json()), "decoder");
  t->plain_byte_level_decoder = t->decoder.size() == 1 && t->decoder[0].kind == DecoderStep::Kind::kByteLevel;

  if (!tokenizer_config_json.empty()) {
    json cfg = parse_json(tokenizer_config_json, config_origin);
    if (!cfg.is_object()) bad(config_origin, "expected a JSON object");
    t->bos = config_token(cfg, "bos_token", config_origin);
    t->eos = config_token(cfg, "eos_token", config_origin);
    t->pad = config_token(cfg, "pad_token", config_origin);
    t->unk = config_token(cfg, "unk_token", config_origin);
    auto ct = cfg.find("chat_template");
    if (ct != cfg.end() && !ct->is_null()) {
      std::string src;
      if (ct->is_string()) {
        src = ct->get<std::string>();
      } else if (ct->is_array()) {
        // Named templates: [{"name": "default", "template": ...}, ...]; prompts use "default".
        for (auto& e : *ct)
          if (e.is_object() && e.contains("name") && e["name"] == "default" && e.contains("template") &&
              e["template"].is_string())
            src = e["template"].get<std::string>();
        if (src.empty()) bad(config_origin, "chat_template: no template named \"default\"");
      } else {
        bad(config_origin, "chat_template: expected a string or a list of named templates");
      }
      t->chat_template = jinja::Template::parse(src, config_origin + ":chat_template");
    }
  }
  return Tokenizer(std::move(t));
}

Tokenizer Tokenizer::from_dir(const std::filesystem::path& dir) {
  auto tok_path = dir / "tokenizer.json";
  auto cfg_path = dir / "tokenizer_config.json";
  std::string tok_text = read_file(tok_path, kTokenizerJsonBudget, "tokenizer.json");
  std::string cfg_text = std::filesystem::exists(cfg_path)
                             ? read_file(cfg_path, kTokenizerConfigBudget, "tokenizer_config.json")
                             : std::string();
  Tokenizer t = from_json(tok_text, tok_path.string(), cfg_text, cfg_path.string());
  auto jinja_path = dir / "chat_template.jinja";
  if (!t.impl_->chat_template && std::filesystem::exists(jinja_path))
    t.impl_->chat_template =
        jinja::Template::parse(read_file(jinja_path, kSmallJsonBudget, "chat template"), jinja_path.string());
  return t;
}

}  // namespace rpg::tok
