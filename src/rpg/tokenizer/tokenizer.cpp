#include "rpg/tokenizer/tokenizer.h"
#include "rpg/tokenizer/tokenizer_impl.h"

#include <algorithm>
#include <cctype>
#include <array>
#include <atomic>
#include <queue>
#include <thread>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/jinja/jinja.h"
#include "rpg/tokenizer/pretokenize.h"
#include "rpg/tokenizer/unicode.h"

namespace rpg::tok {

using json = nlohmann::json;
using tok::NormalForm;
using tok::SplitPattern;


// The symbols BPE starts from, as Hugging Face's BPE::merge_word makes them: each
// character of the piece (a byte's character for byte-level tokenizers) that is in the
// vocabulary is its token; one that is not becomes its UTF-8 bytes as <0xNN> tokens when
// byte_fallback is on and all of them exist, else the unknown token (a run of them fused
// into one with fuse_unk), else nothing. A pending unknown token is written out when the
// next known character comes, not before byte-fallback tokens (Hugging Face's order).
void Tokenizer::Impl::initial_symbols(std::string_view piece, std::vector<TokenId>& out) const {
  bool unk_pending = false;
  auto known = [&](TokenId id) {
    if (unk_pending) out.push_back(unk_id), unk_pending = false;
    out.push_back(id);
  };
  auto unknown = [&](std::string_view ch) {
    if (byte_fallback &&
        std::all_of(ch.begin(), ch.end(), [&](char b) { return fallback_id[static_cast<unsigned char>(b)] >= 0; })) {
      for (char b : ch) out.push_back(fallback_id[static_cast<unsigned char>(b)]);
      return;
    }
    if (unk_token.empty()) return;
    if (unk_id < 0)
      throw FormatError(str(origin, ": model.unk_token ", nlohmann::json(unk_token).dump(),
                            " is not in model.vocab (needed for a character the vocabulary lacks)"));
    if (unk_pending && !fuse_unk) out.push_back(unk_id);
    unk_pending = true;
  };
  if (byte_level) {
    const auto& bm = byte_map();
    for (unsigned char b : piece) {
      if (byte_id[b] >= 0) {
        known(byte_id[b]);
      } else {
        std::string ch;
        tok::append_utf8(ch, bm.to_char[b]);
        unknown(ch);
      }
    }
  } else {
    for_each_codepoint(piece, [&](const CodePoint& c) {
      std::string_view ch = piece.substr(c.pos, c.len);
      if (const TokenId* id = char_ids.find(ch)) known(*id);
      else unknown(ch);
    });
  }
  if (unk_pending) out.push_back(unk_id);
}

void Tokenizer::Impl::bpe(std::string_view piece, std::vector<TokenId>& out) const {
  if (ignore_merges) {
    if (const TokenId* id = bytes_ids.find(piece)) {
      out.push_back(*id);
      return;
    }
  }
  if (all_bytes && piece.size() == 1) {
    out.push_back(byte_id[static_cast<unsigned char>(piece[0])]);
    return;
  }
  bool cacheable = piece.size() <= PieceCache::kMaxPieceBytes;
  if (cacheable && cache.get(piece, out)) return;

  // Symbols form a linked list over the piece's initial symbols; a min-heap of candidate
  // merges is ordered by (rank, position) so the lowest-ranked, leftmost pair merges first,
  // which is Hugging Face's order. Stale heap entries are recognised and skipped on pop.
  struct Sym {
    TokenId id;
    int32_t prev, next;
  };
  struct Cand {
    int32_t rank, pos;
    TokenId left, right, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  thread_local std::vector<Sym> syms;
  thread_local std::vector<Cand> heap;
  thread_local std::vector<TokenId> init;
  syms.clear();
  heap.clear();
  if (all_bytes) {
    int32_t n = static_cast<int32_t>(piece.size());
    for (int32_t i = 0; i < n; ++i)
      syms.push_back({byte_id[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1});
  } else {
    init.clear();
    initial_symbols(piece, init);
    int32_t n = static_cast<int32_t>(init.size());
    for (int32_t i = 0; i < n; ++i) syms.push_back({init[i], i - 1, i + 1 < n ? i + 1 : -1});
  }
  if (syms.empty()) {
    if (cacheable) cache.put(piece, nullptr, 0);
    return;
  }
  const int32_t n = static_cast<int32_t>(syms.size());
  auto cmp = std::greater<Cand>{};
  auto consider = [&](int32_t pos) {
    int32_t nx = syms[pos].next;
    if (nx < 0) return;
    if (const auto* m = merges.find(syms[pos].id, syms[nx].id)) {
      heap.push_back({m->rank, pos, syms[pos].id, syms[nx].id, m->id});
      std::push_heap(heap.begin(), heap.end(), cmp);
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    Cand c = heap.back();
    heap.pop_back();
    Sym& s = syms[c.pos];
    if (s.id != c.left || s.next < 0 || syms[s.next].id != c.right) continue;
    int32_t gone = s.next;
    s.id = c.merged;
    s.next = syms[gone].next;
    if (s.next >= 0) syms[s.next].prev = c.pos;
    syms[gone].id = -1;  // dead; stale entries pointing at it fail the id check
    if (s.prev >= 0) consider(s.prev);
    consider(c.pos);
  }
  size_t before = out.size();
  for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
  if (cacheable) cache.put(piece, out.data() + before, out.size() - before);
}

namespace {

// Every occurrence of `pattern` (non-empty) in `s` replaced by `content`, left to right.
std::string replace_all(std::string_view s, std::string_view pattern, std::string_view content) {
  std::string out;
  size_t from = 0;
  for (size_t at; (at = s.find(pattern, from)) != std::string_view::npos; from = at + pattern.size())
    out.append(s.substr(from, at - from)).append(content);
  out.append(s.substr(from));
  return out;
}

}  // namespace

std::string_view Tokenizer::Impl::normalize(std::string_view s, std::string (&buf)[2]) const {
  int k = 0;
  for (const NormalizerStep& n : normalizers) {
    switch (n.kind) {
      case NormalizerStep::Kind::kForm:
        if (!tok::normalize(n.form, s, buf[k])) continue;
        break;
      case NormalizerStep::Kind::kPrepend:
        if (s.empty()) continue;
        buf[k].assign(n.content).append(s);
        break;
      case NormalizerStep::Kind::kReplace:
        if (s.find(n.pattern) == std::string_view::npos) continue;
        buf[k] = replace_all(s, n.pattern, n.content);
        break;
    }
    s = buf[k];
    k ^= 1;
  }
  return s;
}

void Tokenizer::Impl::encode_normalized(std::string_view text, bool at_origin, std::vector<TokenId>& out) const {
  if (!byte_level) {
    if (!metaspace.on) {
      if (!text.empty()) bpe(text, out);
      return;
    }
    // Metaspace: spaces become the replacement, which is prepended per the scheme, and each
    // replacement character starts a piece (the delimiter merged with what follows it).
    const std::string& rep = metaspace.replacement;
    std::string t = replace_all(text, " ", rep);
    bool prepend = metaspace.scheme == PrependScheme::kAlways ||
                   (metaspace.scheme == PrependScheme::kFirst && at_origin);
    if (prepend && t.compare(0, rep.size(), rep) != 0) t.insert(0, rep);
    if (t.empty()) return;
    if (!metaspace.split) {
      bpe(t, out);
      return;
    }
    size_t begin = 0;
    for (size_t at = t.find(rep, 1); at != std::string::npos; at = t.find(rep, at + rep.size())) {
      if (at > begin) bpe(std::string_view(t).substr(begin, at - begin), out);
      begin = at;
    }
    bpe(std::string_view(t).substr(begin), out);
    return;
  }
  thread_local std::vector<std::pair<uint32_t, uint32_t>> pieces;
  std::string prefixed;
  if (prefix_space && !text.empty() && text[0] != ' ') {
    prefixed.reserve(text.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(text);
    text = prefixed;
  }
  pieces.clear();
  tok::split_pieces(split, text, pieces);
  // bpe() can recurse into nothing that uses `pieces`, but copy the bounds out anyway so
  // the thread_local is free for reuse as soon as splitting is done.
  for (auto [b, e] : pieces) bpe(text.substr(b, e - b), out);
}

// Cuts `trie`'s tokens out of text, honouring lstrip / rstrip (whitespace swallowed by
// the token), and hands the gaps to `gap`.
template <class Gap>
static void split_added(const Tokenizer::Impl& t, const TokenTrie& trie, std::string_view text,
                        std::vector<TokenId>& out, Gap&& gap) {
  if (trie.empty()) {
    gap(text);
    return;
  }
  size_t pos = 0, emitted = 0;
  while (true) {
    auto [start, len, index] = trie.find(text, pos);
    if (start == std::string_view::npos) break;
    const AddedTok& tk = t.added[static_cast<size_t>(index)];
    size_t b = start, e = start + len;
    // An added token's lstrip / rstrip absorb the whitespace beside it (ill-formed bytes stop).
    if (tk.lstrip) b = rstrip_codepoints(text, emitted, b, tok::is_space);
    if (tk.rstrip)
      e += for_each_codepoint(
          text.substr(e), [](const CodePoint& c) { return tok::is_space(c.cp); }, InvalidUtf8::kStop);
    if (b > emitted) gap(text.substr(emitted, b - emitted));
    out.push_back(tk.id);
    emitted = pos = e;
  }
  if (emitted < text.size()) gap(text.substr(emitted));
}

void Tokenizer::Impl::encode_text(std::string_view text, std::vector<TokenId>& out) const {
  split_added(*this, raw_trie, text, out, [&](std::string_view seg) {
    std::string norm_buf[2];
    const bool seg_at_origin = seg.data() == text.data();
    std::string_view s = normalize(seg, norm_buf);
    split_added(*this, normalized_trie, s, out, [&](std::string_view rest) {
      encode_normalized(rest, seg_at_origin && rest.data() == s.data(), out);
    });
  });
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special_tokens) out.insert(out.end(), impl_->post_prefix.begin(), impl_->post_prefix.end());
  std::string clean;
  if (!tok::sanitize_utf8(text, clean)) text = clean;
  impl_->encode_text(text, out);
  if (add_special_tokens) out.insert(out.end(), impl_->post_suffix.begin(), impl_->post_suffix.end());
  return out;
}

std::vector<std::vector<TokenId>> Tokenizer::batch_encode(const std::vector<std::string>& texts,
                                                          bool add_special_tokens, int threads) const {
  std::vector<std::vector<TokenId>> out(texts.size());
  size_t n = threads > 0 ? static_cast<size_t>(threads) : std::max(1u, std::thread::hardware_concurrency());
  n = std::min(n, texts.size());
  if (n <= 1) {
    for (size_t i = 0; i < texts.size(); ++i) out[i] = encode(texts[i], add_special_tokens);
    return out;
  }
  // Texts are claimed in small chunks from a shared counter so long and short texts
  // balance across threads.
  std::atomic<size_t> next{0};
  constexpr size_t kChunk = 16;
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> pool;
  for (size_t w = 0; w < n; ++w) {
    pool.emplace_back([&, w] {
      try {
        for (size_t b; (b = next.fetch_add(kChunk)) < texts.size();)
          for (size_t i = b; i < std::min(b + kChunk, texts.size()); ++i) out[i] = encode(texts[i], add_special_tokens);
      } catch (...) {
        errors[w] = std::current_exception();
      }
    });
  }
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return out;
}

namespace {

std::string lossy_utf8(std::string bytes) {
  std::string clean;
  return tok::sanitize_utf8(bytes, clean) ? bytes : clean;
}

// Hugging Face's decoders, step by step over the list of token strings.
void apply_decoder_step(const DecoderStep& d, std::vector<std::string>& toks) {
  using K = DecoderStep::Kind;
  switch (d.kind) {
    case K::kByteLevel: {
      std::string bytes;
      for (const auto& t : toks) append_token_bytes(bytes, t);
      toks.assign(1, lossy_utf8(std::move(bytes)));
      return;
    }
    case K::kByteFallback: {
      // Runs of <0xNN> tokens become their bytes' text when that is valid UTF-8, else one
      // U+FFFD per byte.
      std::vector<std::string> out;
      std::string run;
      size_t run_len = 0;
      auto flush = [&] {
        if (run_len == 0) return;
        std::string clean;
        if (tok::sanitize_utf8(run, clean)) out.push_back(run);
        else
          for (size_t i = 0; i < run_len; ++i) out.emplace_back("\xEF\xBF\xBD");
        run.clear();
        run_len = 0;
      };
      for (auto& t : toks) {
        int byte = -1;
        if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && std::isxdigit(static_cast<unsigned char>(t[3])) &&
            std::isxdigit(static_cast<unsigned char>(t[4])))
          byte = std::stoi(t.substr(3, 2), nullptr, 16);
        if (byte >= 0) {
          run.push_back(static_cast<char>(byte));
          ++run_len;
        } else {
          flush();
          out.push_back(std::move(t));
        }
      }
      flush();
      toks = std::move(out);
      return;
    }
    case K::kFuse: {
      std::string all;
      for (const auto& t : toks) all += t;
      toks.assign(1, std::move(all));
      return;
    }
    case K::kReplace:
      for (auto& t : toks)
        if (t.find(d.pattern) != std::string::npos) t = replace_all(t, d.pattern, d.content);
      return;
    case K::kStrip:
      for (auto& t : toks) {
        std::vector<std::pair<size_t, size_t>> cps;  // (offset, length) of each character
        std::vector<char32_t> cs;
        for_each_codepoint(t, [&](const CodePoint& c) {
          cps.emplace_back(c.pos, c.len);
          cs.push_back(c.cp);
        });
        size_t b = 0, e = cs.size();
        while (b < std::min(d.start, cs.size()) && cs[b] == d.strip_char) ++b;
        for (size_t i = 0; i < std::min(d.stop, cs.size() - b) && cs[e - 1] == d.strip_char; ++i) --e;
        size_t from = b < cps.size() ? cps[b].first : t.size();
        size_t to = e > 0 && e <= cps.size() ? cps[e - 1].first + cps[e - 1].second : from;
        t = to > from ? t.substr(from, to - from) : std::string();
      }
      return;
    case K::kMetaspace:
      // The replacement becomes a space, except in the first token, where it is dropped
      // (every occurrence, as Hugging Face does) unless the scheme never prepends.
      for (size_t i = 0; i < toks.size(); ++i) {
        const bool drop = i == 0 && d.scheme != PrependScheme::kNever;
        toks[i] = replace_all(toks[i], d.content, drop ? "" : " ");
      }
      return;
  }
}

}  // namespace

std::string Tokenizer::Impl::decode_run(std::span<const TokenId> run) const {
  if (run.empty()) return {};
  if (plain_byte_level_decoder) {
    std::string bytes;
    for (TokenId id : run) bytes.append(id_bytes[id]);
    return lossy_utf8(std::move(bytes));
  }
  std::vector<std::string> toks;
  toks.reserve(run.size());
  for (TokenId id : run) toks.emplace_back(id_token[id]);
  for (const DecoderStep& d : decoder) apply_decoder_step(d, toks);
  std::string out;
  for (const auto& t : toks) out += t;
  return out;
}

// Hugging Face passes the whole list of tokens, added tokens' content included (skipped
// special tokens left out), through the decoder chain at once.
std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special_tokens) const {
  std::vector<TokenId> kept;
  kept.reserve(ids.size());
  for (TokenId id : ids) {
    IdKind k = impl_->kind_of(id);
    if (k == IdKind::kSpecial && skip_special_tokens) continue;
    kept.push_back(id);
  }
  return impl_->decode_run(kept);
}

// Emits what can no longer change. With the plain byte-level decoder that is every byte
// up to a possibly incomplete last character. With another decoder chain the tokens so far
// are decoded again on each push and the new text is emitted, holding back a trailing
// U+FFFD (incomplete bytes or byte-fallback tokens) and trailing characters a Strip step
// may cut.
std::string Tokenizer::StreamDecoder::push(TokenId id) {
  const Impl& t = *tok_->impl_;
  IdKind k = t.kind_of(id);
  std::string out;
  if (k == IdKind::kSpecial && skip_special_) return out;
  if (t.plain_byte_level_decoder) {
    pending_.append(t.id_bytes[id]);
    size_t stable = tok::utf8_stable_prefix(pending_);
    if (stable > 0) {
      out = lossy_utf8(pending_.substr(0, stable));
      pending_.erase(0, stable);
    }
    return out;
  }
  run_.push_back(id);
  std::string text = t.decode_run(run_);
  size_t stable = text.size();
  for (;;) {
    if (stable >= 3 && text.compare(stable - 3, 3, "\xEF\xBF\xBD") == 0) {
      stable -= 3;
      continue;
    }
    bool cut = false;
    for (const DecoderStep& d : t.decoder)
      if (d.kind == DecoderStep::Kind::kStrip && d.stop > 0 && stable > 0) {
        std::string c;
        tok::append_utf8(c, d.strip_char);
        if (stable >= c.size() && text.compare(stable - c.size(), c.size(), c) == 0) stable -= c.size(), cut = true;
      }
    if (!cut) break;
  }
  if (stable > emitted_ && text.compare(0, emitted_, emitted_text_) == 0) {
    out = text.substr(emitted_, stable - emitted_);
    emitted_text_.append(out);
    emitted_ = stable;
  }
  return out;
}

std::string Tokenizer::StreamDecoder::finish() {
  const Impl& t = *tok_->impl_;
  std::string out;
  if (t.plain_byte_level_decoder) {
    out = lossy_utf8(std::move(pending_));
  } else {
    std::string text = t.decode_run(run_);
    // The emitted text is always a prefix of the run's text (decoders only change the tail).
    out = text.size() > emitted_ ? text.substr(emitted_) : std::string();
  }
  pending_.clear();
  run_.clear();
  emitted_text_.clear();
  emitted_ = 0;
  return out;
}

std::string Tokenizer::apply_chat_template(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                           const nlohmann::ordered_json& extra) const {
  if (!impl_->chat_template) throw FormatError(str(impl_->origin, ": the model has no chat_template"));
  if (!messages.is_array()) throw ValueError("apply_chat_template: messages must be a list");
  nlohmann::ordered_json vars = nlohmann::ordered_json::object();
  // transformers passes the special tokens first, then the caller's arguments.
  auto put = [&](const char* key, const std::string& v) {
    if (!v.empty()) vars[key] = v;
  };
  put("bos_token", impl_->bos);
  put("eos_token", impl_->eos);
  put("unk_token", impl_->unk);
  put("pad_token", impl_->pad);
  vars["messages"] = messages;
  vars["tools"] = nullptr;
  vars["documents"] = nullptr;
  vars["add_generation_prompt"] = add_generation_prompt;
  if (!extra.is_null()) {
    if (!extra.is_object()) throw ValueError("apply_chat_template: extra variables must be an object");
    for (auto it = extra.begin(); it != extra.end(); ++it) vars[it.key()] = it.value();
  }
  return impl_->chat_template->render(vars);
}

std::string Tokenizer::apply_chat_template(const nlohmann::ordered_json& messages, bool add_generation_prompt) const {
  return apply_chat_template(messages, add_generation_prompt, nlohmann::ordered_json::object());
}

std::string Tokenizer::apply_chat_template(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (auto& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
  return apply_chat_template(list, add_generation_prompt);
}

bool Tokenizer::has_chat_template() const { return impl_->chat_template.has_value(); }
size_t Tokenizer::vocab_size() const { return impl_->id_kind.size(); }

std::string Tokenizer::id_to_token(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_kind.size() || impl_->id_kind[id] == IdKind::kNone)
    throw ValueError(str("token id ", id, " is not in the vocabulary of ", impl_->origin));
  return std::string(impl_->id_token[id]);
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  const TokenId* id = impl_->token_ids.find(token);
  if (!id) return std::nullopt;
  return *id;
}

bool Tokenizer::is_special(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_kind.size() && impl_->id_kind[id] == IdKind::kSpecial;
}

std::optional<TokenId> Tokenizer::bos_id() const { return impl_->id_of(impl_->bos); }
std::optional<TokenId> Tokenizer::eos_id() const { return impl_->id_of(impl_->eos); }
std::optional<TokenId> Tokenizer::pad_id() const { return impl_->id_of(impl_->pad); }
const std::string& Tokenizer::bos_token() const { return impl_->bos; }
const std::string& Tokenizer::eos_token() const { return impl_->eos; }
const std::string& Tokenizer::pad_token() const { return impl_->pad; }

ChatTemplateKwargs::ChatTemplateKwargs() : value_(std::make_shared<const nlohmann::ordered_json>(nlohmann::ordered_json::object())) {}

ChatTemplateKwargs ChatTemplateKwargs::parse(std::string_view text, const std::string& what) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) return {};
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(str(what, ": not valid JSON (", e.what(), ")"));
  }
  return from_json(j, what);
}

ChatTemplateKwargs ChatTemplateKwargs::from_json(const nlohmann::ordered_json& kwargs, const std::string& what) {
  if (kwargs.is_null()) return {};
  if (!kwargs.is_object())
    throw ValueError(str(what, ": got ", kwargs.dump(), ", expected a JSON object such as {\"enable_thinking\": false}"));
  // transformers' PreTrainedTokenizerBase.apply_chat_template parameters other than tools /
  // documents, and render_jinja_template's own arguments.
  static const char* const kReserved[] = {
      "conversation", "messages", "chat_template", "add_generation_prompt", "continue_final_message", "tokenize",
      "padding", "truncation", "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
      "tokenizer_kwargs", "conversations"};
  for (const char* r : kReserved)
    if (kwargs.contains(r))
      throw ValueError(str(what, ": key '", r,
                           "' is a parameter of apply_chat_template, not a template variable (not supported here)"));
  ChatTemplateKwargs out;
  out.value_ = std::make_shared<const nlohmann::ordered_json>(kwargs);
  return out;
}

}  // namespace rpg::tok
