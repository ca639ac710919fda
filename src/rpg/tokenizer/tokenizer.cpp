#include "rpg/tokenizer/tokenizer.h"
#include "rpg/tokenizer/tokenizer_impl.h"

#include <algorithm>
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


void Tokenizer::Impl::bpe(std::string_view piece, std::vector<TokenId>& out) const {
  if (ignore_merges) {
    if (const TokenId* id = bytes_ids.find(piece)) {
      out.push_back(*id);
      return;
    }
  }
  if (piece.size() == 1) {
    out.push_back(byte_id[static_cast<unsigned char>(piece[0])]);
    return;
  }
  bool cacheable = piece.size() <= PieceCache::kMaxPieceBytes;
  if (cacheable && cache.get(piece, out)) return;

  // Symbols form a linked list over the piece's bytes; a min-heap of candidate merges is
  // ordered by (rank, position) so the lowest-ranked, leftmost pair merges first, which
  // is Hugging Face's order. Stale heap entries are recognised and skipped on pop.
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
  syms.clear();
  heap.clear();
  int32_t n = static_cast<int32_t>(piece.size());
  for (int32_t i = 0; i < n; ++i)
    syms.push_back({byte_id[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1});
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

void Tokenizer::Impl::encode_normalized(std::string_view text, std::vector<TokenId>& out) const {
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
    std::string_view s = seg;
    int k = 0;
    for (NormalForm f : normalizers) {
      if (tok::normalize(f, s, norm_buf[k])) {
        s = norm_buf[k];
        k ^= 1;
      }
    }
    split_added(*this, normalized_trie, s, out, [&](std::string_view rest) { encode_normalized(rest, out); });
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

// Hugging Face decodes the bytes of consecutive model tokens together (lossy UTF-8) and
// inserts added tokens' content verbatim between such runs. `pending` holds the bytes of
// the current run.
void Tokenizer::Impl::append_decoded(std::string& out, std::string& pending, TokenId id, bool skip_special) const {
  if (id < 0 || static_cast<size_t>(id) >= id_kind.size() || id_kind[id] == IdKind::kNone)
    throw ValueError(str("decode: token id ", id, " is not in the vocabulary of ", origin));
  IdKind k = id_kind[id];
  if (k == IdKind::kModel) {
    pending.append(id_bytes[id]);
    return;
  }
  if (k == IdKind::kSpecial && skip_special) return;
  std::string clean;
  out.append(tok::sanitize_utf8(pending, clean) ? pending : clean);
  pending.clear();
  out.append(id_bytes[id]);
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special_tokens) const {
  std::string out, pending;
  for (TokenId id : ids) impl_->append_decoded(out, pending, id, skip_special_tokens);
  std::string clean;
  out.append(tok::sanitize_utf8(pending, clean) ? pending : clean);
  return out;
}

std::string Tokenizer::StreamDecoder::push(TokenId id) {
  std::string out;
  tok_->impl_->append_decoded(out, pending_, id, skip_special_);
  // Emit what can no longer change: everything up to a possibly incomplete last character.
  size_t stable = tok::utf8_stable_prefix(pending_);
  if (stable > 0) {
    std::string clean;
    std::string_view head(pending_.data(), stable);
    out.append(tok::sanitize_utf8(head, clean) ? std::string(head) : clean);
    pending_.erase(0, stable);
  }
  return out;
}

std::string Tokenizer::StreamDecoder::finish() {
  std::string clean;
  std::string out = tok::sanitize_utf8(pending_, clean) ? pending_ : clean;
  pending_.clear();
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
