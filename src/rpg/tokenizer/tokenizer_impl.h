// Private to the tokenizer module: the state of a loaded tokenizer (Tokenizer::Impl) and
// the data structures it is made of, shared by loading (load.cpp: tokenizer.json and
// tokenizer_config.json) and encoding/decoding (tokenizer.cpp).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "rpg/jinja/jinja.h"
#include "rpg/tokenizer/pretokenize.h"
#include "rpg/tokenizer/tokenizer.h"
#include "rpg/tokenizer/unicode.h"

namespace rpg::tok {

namespace tokenizer_detail {

using tok::NormalForm;
using tok::SplitPattern;


// GPT-2's reversible byte <-> printable character map used by the byte-level
// pre-tokenizer: printable Latin-1 bytes stand for themselves, the other 68 bytes are
// shifted to U+0100.. in byte order.
struct ByteMap {
  std::array<char32_t, 256> to_char{};
  std::unordered_map<char32_t, uint8_t> to_byte;
  ByteMap() {
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_char[b] = printable ? static_cast<char32_t>(b) : next++;
      to_byte[to_char[b]] = static_cast<uint8_t>(b);
    }
  }
};
inline const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// A byte-level token string back to the bytes it stands for. Characters outside the map
// are kept as their own UTF-8, as the Hugging Face ByteLevel decoder does.
inline std::string token_to_bytes(std::string_view token) {
  const auto& m = byte_map();
  std::string out;
  for_each_codepoint(token, [&](const CodePoint& c) {
    auto it = c.valid ? m.to_byte.find(c.cp) : m.to_byte.end();
    if (it != m.to_byte.end()) out.push_back(static_cast<char>(it->second));
    else out.append(token.substr(c.pos, c.len));  // ill-formed bytes pass through
  });
  return out;
}

// Open-addressing map from a pair of token ids to (merge rank, merged id). The merge
// lookup is the innermost operation of BPE, so it avoids std::unordered_map's node chasing.
class MergeMap {
 public:
  struct Value {
    int32_t rank;
    int32_t id;
  };
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, Value{-1, -1});
    mask_ = cap - 1;
  }
  // Returns false when the pair is already present (the first, lowest rank wins).
  bool insert(int32_t a, int32_t b, Value v) {
    uint64_t k = key(a, b);
    size_t i = hash(k) & mask_;
    while (keys_[i] != kEmpty) {
      if (keys_[i] == k) return false;
      i = (i + 1) & mask_;
    }
    keys_[i] = k;
    vals_[i] = v;
    return true;
  }
  const Value* find(int32_t a, int32_t b) const {
    if (keys_.empty()) return nullptr;
    uint64_t k = key(a, b);
    size_t i = hash(k) & mask_;
    while (keys_[i] != kEmpty) {
      if (keys_[i] == k) return &vals_[i];
      i = (i + 1) & mask_;
    }
    return nullptr;
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  std::vector<uint64_t> keys_;
  std::vector<Value> vals_;
  size_t mask_ = 0;
};

struct AddedTok {
  std::string content;
  TokenId id;
  bool special, normalized, lstrip, rstrip;
};

// Finds added tokens in text: at each position the longest token starting there, the
// leftmost position first (Aho-Corasick LeftmostLongest semantics, as Hugging Face).
class TokenTrie {
 public:
  void add(std::string_view s, int index) {
    int node = 0;
    for (unsigned char c : s) {
      auto& kids = nodes_[node].next;
      auto it = std::find_if(kids.begin(), kids.end(), [&](auto& p) { return p.first == c; });
      if (it == kids.end()) {
        nodes_.push_back(Node{});
        nodes_[node].next.emplace_back(c, static_cast<int>(nodes_.size() - 1));
        node = static_cast<int>(nodes_.size() - 1);
      } else {
        node = it->second;
      }
    }
    nodes_[node].token = index;
    first_[static_cast<unsigned char>(s[0])] = true;
    empty_ = false;
  }
  bool empty() const { return empty_; }
  // Next match at or after `from`: returns (start, length, token index) or start = npos.
  std::tuple<size_t, size_t, int> find(std::string_view text, size_t from) const {
    for (size_t i = from; i < text.size(); ++i) {
      if (!first_[static_cast<unsigned char>(text[i])]) continue;
      int node = 0, best = -1;
      size_t best_len = 0;
      for (size_t j = i; j < text.size(); ++j) {
        int nxt = -1;
        for (auto& [c, k] : nodes_[node].next)
          if (c == static_cast<unsigned char>(text[j])) {
            nxt = k;
            break;
          }
        if (nxt < 0) break;
        node = nxt;
        if (nodes_[node].token >= 0) {
          best = nodes_[node].token;
          best_len = j + 1 - i;
        }
      }
      if (best >= 0) return {i, best_len, best};
    }
    return {std::string_view::npos, 0, -1};
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> next;
    int token = -1;
  };
  std::vector<Node> nodes_{Node{}};
  std::array<bool, 256> first_{};
  bool empty_ = true;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using PieceMap = std::unordered_map<std::string, std::vector<TokenId>, StringHash, std::equal_to<>>;

// Per-piece BPE results. Natural text repeats a small set of words, so most pieces are
// cache hits. One cache per thread (no locks on the hot path, and batch_encode threads do
// not contend); it belongs to one tokenizer at a time, identified by a process-unique id
// so a new tokenizer never sees another's entries.
class PieceCache {
 public:
  static constexpr size_t kMaxEntries = 1 << 16;
  static constexpr size_t kMaxPieceBytes = 64;
  explicit PieceCache(uint64_t owner) : owner_(owner) {}
  bool get(std::string_view piece, std::vector<TokenId>& out) const {
    Local& l = local();
    auto it = l.map.find(piece);
    if (it == l.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }
  void put(std::string_view piece, const TokenId* ids, size_t n) const {
    Local& l = local();
    if (l.map.size() >= kMaxEntries) l.map.clear();
    l.map.emplace(std::string(piece), std::vector<TokenId>(ids, ids + n));
  }

 private:
  struct Local {
    uint64_t owner = 0;
    PieceMap map;
  };
  Local& local() const {
    thread_local Local l;
    if (l.owner != owner_) {
      l.map.clear();
      l.owner = owner_;
    }
    return l;
  }
  uint64_t owner_;
};

inline uint64_t next_tokenizer_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

enum class IdKind : uint8_t { kNone, kModel, kAdded, kSpecial };

}  // namespace tokenizer_detail

using namespace tokenizer_detail;  // NOLINT: the module's own private names

struct Tokenizer::Impl {
  std::string origin;
  // Model.
  std::vector<std::string> id_bytes;   // raw bytes (model tokens) or content (added tokens)
  std::vector<std::string> id_token;   // the token string of tokenizer.json
  std::vector<IdKind> id_kind;
  std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>> token_ids;  // vocab + added
  std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>> bytes_ids;  // model vocab by bytes
  std::array<TokenId, 256> byte_id{};
  MergeMap merges;
  bool ignore_merges = false;
  // Text processing.
  std::vector<NormalForm> normalizers;
  SplitPattern split = SplitPattern::kQwen2;
  bool prefix_space = false;
  std::vector<AddedTok> added;
  TokenTrie raw_trie, normalized_trie;
  std::vector<TokenId> post_prefix, post_suffix;
  // tokenizer_config.json.
  std::string bos, eos, pad, unk;
  std::optional<jinja::Template> chat_template;
  PieceCache cache{next_tokenizer_id()};

  void bpe(std::string_view piece, std::vector<TokenId>& out) const;
  void encode_text(std::string_view text, std::vector<TokenId>& out) const;
  void encode_normalized(std::string_view text, std::vector<TokenId>& out) const;
  void append_decoded(std::string& out, std::string& pending, TokenId id, bool skip_special) const;
  std::optional<TokenId> id_of(const std::string& token) const {
    if (token.empty()) return std::nullopt;
    auto it = token_ids.find(token);
    if (it == token_ids.end()) return std::nullopt;
    return it->second;
  }
};

}  // namespace rpg::tok
