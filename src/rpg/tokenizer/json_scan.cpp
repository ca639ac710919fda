// tokenizer.json's syntax (json_scan.h): the fast scanner for what Hugging Face writes and the
// full SAX parser it falls back to.
#include "rpg/tokenizer/json_scan.h"

#include "rpg/core/error.h"
#include "rpg/core/text.h"
#include "rpg/tokenizer/tokenizer_impl.h"
#include "rpg/tokenizer/unicode.h"

namespace rpg::tok::tokenizer_detail {

using json = nlohmann::json;

namespace {

[[noreturn]] void bad(const std::string& origin, const std::string& what) {
  throw FormatError(str(origin, ": ", what));
}

// tokenizer.json read in one pass without a DOM for its two big parts: model.vocab (an
// object of ~150k entries) and model.merges (an array of ~150k pairs) are streamed into
// flat vectors; every other part becomes a DOM as json::parse would build it (model.vocab
// / model.merges are left null there). Entries that are not what a byte-level BPE file
// holds fail with the same messages as the DOM path. A vocab that is not an object or
// merges that are not an array are left to the DOM and its checks.
class TokenizerJsonSax {
 public:
  TokenizerJsonSax(json& root, StreamedModel& out, const std::string& origin)
      : out_(out), dom_(root), origin_(origin) {}

  bool null() { return mode_ != Mode::kNone ? other() : dom_.null(); }
  bool boolean(bool v) { return mode_ != Mode::kNone ? other() : dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { return mode_ != Mode::kNone ? integer(v) : dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) {
    return mode_ != Mode::kNone ? integer(static_cast<int64_t>(v)) : dom_.number_unsigned(v);
  }
  bool number_float(json::number_float_t v, const std::string& text) {
    return mode_ != Mode::kNone ? other() : dom_.number_float(v, text);
  }
  bool binary(json::binary_t& v) { return mode_ != Mode::kNone ? other() : dom_.binary(v); }
  bool string(std::string& v) {
    if (mode_ == Mode::kNone) return dom_.string(v);
    if (mode_ == Mode::kMerges && pair_depth_ == 0) {
      size_t sp = v.find(' ');
      if (sp == std::string::npos || v.find(' ', sp + 1) != std::string::npos)
        bad(origin_, str("model.merges[", out_.merges.size(), "]: expected \"left right\", got ", json(v).dump()));
      std::string_view whole = out_.own(std::move(v));
      out_.merges.push_back({whole.substr(0, sp), whole.substr(sp + 1), true});
      return true;
    }
    if (mode_ == Mode::kMerges && pair_.size() < 2) {
      pair_.push_back(std::move(v));
      return true;
    }
    return other();
  }
  bool start_object(std::size_t n) {
    if (mode_ != Mode::kNone) return other();
    if (at_model_key("vocab") && !out_.have_vocab) {
      mode_ = Mode::kVocab;
      out_.have_vocab = true;
      return true;
    }
    frames_.push_back({true, {}});
    return dom_.start_object(n);
  }
  bool key(std::string& k) {
    if (mode_ == Mode::kVocab) {
      key_ = std::move(k);
      return true;
    }
    if (mode_ != Mode::kNone) return other();
    frames_.back().key = k;
    return dom_.key(k);
  }
  bool end_object() {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kNone;
      return true;
    }
    if (mode_ != Mode::kNone) return other();
    frames_.pop_back();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    if (mode_ == Mode::kMerges && pair_depth_ == 0) {
      pair_depth_ = 1;
      pair_.clear();
      return true;
    }
    if (mode_ != Mode::kNone) return other();
    if (at_model_key("merges") && !out_.have_merges) {
      mode_ = Mode::kMerges;
      out_.have_merges = true;
      return true;
    }
    frames_.push_back({false, {}});
    return dom_.start_array(n);
  }
  bool end_array() {
    if (mode_ == Mode::kMerges) {
      if (pair_depth_ == 0) {
        mode_ = Mode::kNone;
        return true;
      }
      if (pair_.size() != 2) other();
      std::string_view a = out_.own(std::move(pair_[0])), b = out_.own(std::move(pair_[1]));
      out_.merges.push_back({a, b, false});
      pair_depth_ = 0;
      return true;
    }
    if (mode_ != Mode::kNone) return other();
    frames_.pop_back();
    return dom_.end_array();
  }
  bool parse_error(std::size_t pos, const std::string& token, const nlohmann::detail::exception& e) {
    return dom_.parse_error(pos, token, e);
  }

 private:
  enum class Mode { kNone, kVocab, kMerges };
  struct Frame {
    bool object;
    std::string key;
  };
  // The next value is root.model.<name>.
  bool at_model_key(const char* name) const {
    return frames_.size() == 2 && frames_[0].object && frames_[0].key == "model" && frames_[1].object &&
           frames_[1].key == name;
  }
  bool integer(int64_t id) {
    if (mode_ != Mode::kVocab) return other();
    if (id < 0 || id > (1 << 28)) bad(origin_, str("model.vocab[", json(key_).dump(), "]: id ", id, " out of range"));
    out_.vocab.push_back({out_.own(std::move(key_)), id});
    return true;
  }
  // Anything else inside the streamed parts.
  [[noreturn]] bool other() {
    if (mode_ == Mode::kVocab) bad(origin_, str("model.vocab[", json(key_).dump(), "]: expected an integer id"));
    bad(origin_, str("model.merges[", out_.merges.size(), "]: expected a pair of strings"));
  }

  StreamedModel& out_;
  nlohmann::detail::json_sax_dom_parser<json> dom_;
  const std::string& origin_;
  std::vector<Frame> frames_;
  Mode mode_ = Mode::kNone;
  std::string key_;
  int pair_depth_ = 0;
  std::vector<std::string> pair_;
};

// The fast path for tokenizer.json: a scanner made for what Hugging Face writes. It reads
// model.vocab and model.merges straight into StreamedModel (views of the text: no copy of a
// string without escapes) and hands the rest of the file, with those two values replaced by
// `null`, to nlohmann (a few kB: added_tokens, normalizer, pre_tokenizer, ...). Anything it
// does not handle (a control character, a surrogate escape, invalid UTF-8, a non-integer or
// out-of-range id, a duplicate "model"/"vocab"/"merges" key, a merge that is not "a b" or
// ["a", "b"], ...) makes it give up and the file is read again by the full parser (the SAX
// path above), which accepts or rejects it with its own messages. So it accepts only what
// the full parser accepts, with the same result (test RealQwenVocab.FastLoadEqualsFullParse
// and the tokenizer_json fuzz target compare the two).
class FastTokenizerJson {
 public:
  FastTokenizerJson(std::string_view text, StreamedModel& out) : p_(text.data()), end_(text.data() + text.size()), out_(out) {}

  // False: not handled here (use the full parser). Else `rest` is the file without the two.
  bool run(std::string& rest) {
    const char* copied = p_;
    bool seen_model = false;
    ws();
    const bool ok = members([&](std::string_view key) {
      if (key != "model") return skip_value();
      if (seen_model || !at('{')) return false;
      seen_model = true;
      return model(rest, copied);
    });
    if (!ok) return false;
    ws();
    if (p_ != end_ || !seen_model) return false;
    rest.append(copied, end_);
    return true;
  }

 private:
  const char* p_;
  const char* end_;
  StreamedModel& out_;

  void ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  bool at(char c) const { return p_ < end_ && *p_ == c; }
  bool eat(char c) {
    if (!at(c)) return false;
    ++p_;
    return true;
  }

  // open [element (',' element)*] close, JSON whitespace between; false on anything else.
  template <class Element>
  bool elements(char open, char close, Element&& element) {
    if (!eat(open)) return false;
    ws();
    if (eat(close)) return true;
    for (;;) {
      if (!element()) return false;
      ws();
      if (!eat(',')) return eat(close);
      ws();
    }
  }
  // {"key": value, ...}: member(key) reads the value.
  template <class Member>
  bool members(Member&& member) {
    return elements('{', '}', [&] {
      std::string_view key;
      if (!string(key)) return false;
      ws();
      if (!eat(':')) return false;
      ws();
      return member(key);
    });
  }

  // The object that is root.model: vocab and merges are read here and replaced by null in `rest`.
  bool model(std::string& rest, const char*& copied) {
    return members([&](std::string_view key) {
      const bool is_vocab = key == "vocab", is_merges = key == "merges";
      if (!is_vocab && !is_merges) return skip_value();
      bool& have = is_vocab ? out_.have_vocab : out_.have_merges;
      if (have) return false;
      const char* start = p_;
      if (!(is_vocab ? vocab() : merges())) return false;
      have = true;
      rest.append(copied, start).append("null");
      copied = p_;
      return true;
    });
  }

  // {"token": id, ...}
  bool vocab() {
    return members([&](std::string_view token) {
      int64_t id = 0;
      if (!integer(id)) return false;
      out_.vocab.push_back({token, id});
      return true;
    });
  }

  // ["a b", ...] or [["a", "b"], ...]
  bool merges() {
    return elements('[', ']', [&] {
      if (at('"')) {
        std::string_view both;
        if (!string(both)) return false;
        size_t sp = both.find(' ');
        if (sp == std::string_view::npos || both.find(' ', sp + 1) != std::string_view::npos) return false;
        out_.merges.push_back({both.substr(0, sp), both.substr(sp + 1), true});
        return true;
      }
      std::string_view a, b;
      if (!eat('[')) return false;
      ws();
      if (!string(a)) return false;
      ws();
      if (!eat(',')) return false;
      ws();
      if (!string(b)) return false;
      ws();
      if (!eat(']')) return false;
      out_.merges.push_back({a, b, false});
      return true;
    });
  }

  // A non-negative integer id up to 2^28, as JSON writes it (no sign, no leading zero,
  // no fraction or exponent).
  bool integer(int64_t& v) {
    const char* s = p_;
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9' && p_ - s < 10) v = v * 10 + (*p_++ - '0');
    if (p_ == s || (*s == '0' && p_ - s > 1) || v > (1 << 28)) return false;
    return !(p_ < end_ && (*p_ == '.' || *p_ == 'e' || *p_ == 'E' || (*p_ >= '0' && *p_ <= '9')));
  }

  // A string at '"': its value as a view of the text, or of a decoded copy when it has escapes.
  bool string(std::string_view& value) {
    if (!eat('"')) return false;
    const char* s = p_;
    bool ascii = true;
    while (p_ < end_) {
      unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '"' || c == '\\' || c < 0x20) break;
      ascii = ascii && c < 0x80;
      ++p_;
    }
    if (p_ == end_ || static_cast<unsigned char>(*p_) < 0x20) return false;
    if (*p_ == '"') {
      value = std::string_view(s, static_cast<size_t>(p_ - s));
      ++p_;
      return ascii || valid_utf8(value);
    }
    std::string decoded(s, static_cast<size_t>(p_ - s));
    while (p_ < end_ && *p_ != '"') {
      unsigned char c = static_cast<unsigned char>(*p_);
      if (c < 0x20) return false;
      if (c != '\\') {
        decoded.push_back(static_cast<char>(c));
        ++p_;
        continue;
      }
      if (end_ - p_ < 2) return false;
      char e = p_[1];
      p_ += 2;
      switch (e) {
        case '"': decoded.push_back('"'); break;
        case '\\': decoded.push_back('\\'); break;
        case '/': decoded.push_back('/'); break;
        case 'b': decoded.push_back('\b'); break;
        case 'f': decoded.push_back('\f'); break;
        case 'n': decoded.push_back('\n'); break;
        case 'r': decoded.push_back('\r'); break;
        case 't': decoded.push_back('\t'); break;
        case 'u': {
          if (end_ - p_ < 4) return false;
          char32_t cp = 0;
          for (int k = 0; k < 4; ++k) {
            char h = *p_++;
            int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (d < 0) return false;
            cp = cp * 16 + static_cast<char32_t>(d);
          }
          if (cp >= 0xD800 && cp <= 0xDFFF) return false;  // surrogates: the full parser
          tok::append_utf8(decoded, cp);
          break;
        }
        default: return false;
      }
    }
    if (!eat('"') || !valid_utf8(decoded)) return false;
    value = out_.own(std::move(decoded));
    return true;
  }

  // Any other value, skipped: nlohmann parses (and checks) it with the rest of the file.
  bool skip_value() {
    if (at('"')) return skip_string();
    if (at('{') || at('[')) {
      int depth = 0;
      while (p_ < end_) {
        char c = *p_;
        if (c == '"') {
          if (!skip_string()) return false;
          continue;
        }
        ++p_;
        if (c == '{' || c == '[') ++depth;
        else if ((c == '}' || c == ']') && --depth == 0) return true;
      }
      return false;
    }
    const char* s = p_;
    while (p_ < end_ && *p_ != ',' && *p_ != '}' && *p_ != ']' && *p_ != ' ' && *p_ != '\n' && *p_ != '\r' && *p_ != '\t') ++p_;
    return p_ > s;
  }
  bool skip_string() {
    ++p_;
    while (p_ < end_) {
      if (*p_ == '\\') p_ += 2;
      else if (*p_++ == '"') return true;
    }
    return false;
  }

  // Well-formed UTF-8 as JSON parsers require it (no overlong forms, surrogates or code
  // points above U+10FFFF).
  static bool valid_utf8(std::string_view s) {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    const auto* e = p + s.size();
    while (p < e) {
      unsigned c = *p;
      if (c < 0x80) {
        ++p;
        continue;
      }
      int n;
      char32_t cp;
      if (c >= 0xC2 && c <= 0xDF) n = 1, cp = c & 0x1F;
      else if (c >= 0xE0 && c <= 0xEF) n = 2, cp = c & 0x0F;
      else if (c >= 0xF0 && c <= 0xF4) n = 3, cp = c & 0x07;
      else return false;
      if (e - p <= n) return false;
      for (int k = 1; k <= n; ++k) {
        if ((p[k] & 0xC0) != 0x80) return false;
        cp = (cp << 6) | (p[k] & 0x3F);
      }
      if (n == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return false;
      if (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)) return false;
      p += n + 1;
    }
    return true;
  }
};

}  // namespace

json scan_tokenizer_json(std::string_view text, const std::string& origin, StreamedModel& streamed) {
  json root;
  bool fast = false;
  if (!full_json_parse_only()) {
    std::string rest;
    if (FastTokenizerJson(text, streamed).run(rest)) {
      try {
        root = json::parse(rest);
        const json& m = root.at("model");
        fast = m.is_object() && (!streamed.have_vocab || m.at("vocab").is_null()) &&
               (!streamed.have_merges || m.at("merges").is_null());
      } catch (const json::exception&) {
        fast = false;
      }
    }
  }
  if (fast) {
    ++fast_json_loads();
    return root;
  }
  root = json();
  streamed = StreamedModel();
  TokenizerJsonSax sax(root, streamed, origin);
  try {
    json::sax_parse(text.begin(), text.end(), &sax);
  } catch (const json::exception& e) {
    bad(origin, str("invalid JSON: ", short_json_error(e.what())));
  }
  return root;
}

}  // namespace rpg::tok::tokenizer_detail
