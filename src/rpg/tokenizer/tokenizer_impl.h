// Private to the tokenizer module: the state of a loaded tokenizer (Tokenizer::Impl) and
// the data structures it is made of, shared by loading (load.cpp: tokenizer.json and
// tokenizer_config.json) and encoding/decoding (tokenizer.cpp).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "rpg/core/error.h"
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
// The characters are all below U+0144, so the reverse map is a table.
struct ByteMap {
  static constexpr char32_t kChars = 256 + 68;
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, kChars> to_byte{};  // -1: not a byte character
  ByteMap() {
    to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_char[b] = printable ? static_cast<char32_t>(b) : next++;
      to_byte[to_char[b]] = static_cast<int16_t>(b);
    }
  }
  int byte_of(char32_t c) const { return c < kChars ? to_byte[c] : -1; }
};
inline const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// A byte-level token string back to the bytes it stands for, appended to `out`. A token
// with any character outside the map is kept whole as its own UTF-8, as the Hugging Face
// ByteLevel decoder does (all of a token's characters map, or none is mapped).
inline void append_token_bytes(std::string& out, std::string_view token) {
  const auto& m = byte_map();
  const size_t start = out.size();
  bool all = true;
  for_each_codepoint(token, [&](const CodePoint& c) {
    int b = c.valid ? m.byte_of(c.cp) : -1;
    if (b >= 0) out.push_back(static_cast<char>(b));
    else all = false;
  });
  if (!all) out.resize(start), out.append(token);
}
// Every character of `token` stands for a byte (it can come out of the byte-level pre-tokenizer).
inline bool is_byte_level_token(std::string_view token) {
  const auto& m = byte_map();
  bool all = true;
  for_each_codepoint(token, [&](const CodePoint& c) { all = all && c.valid && m.byte_of(c.cp) >= 0; });
  return all;
}
inline std::string token_to_bytes(std::string_view token) {
  std::string out;
  append_token_bytes(out, token);
  return out;
}

// Strings by token id, all in one buffer (a vocabulary is ~150k short strings: one
// std::string each costs an allocation or 32 bytes apiece). Filled while loading, then
// read-only.
class StringTable {
 public:
  size_t size() const { return spans_.size(); }
  void resize(size_t n) { spans_.resize(n, Span{0, 0}); }
  void reserve(size_t n, size_t bytes) {
    spans_.reserve(n);
    data_.reserve(bytes);
  }
  void set(size_t i, std::string_view s) {
    spans_[i] = Span{static_cast<uint32_t>(data_.size()), static_cast<uint32_t>(s.size())};
    data_.append(s);
  }
  std::string_view operator[](size_t i) const { return std::string_view(data_).substr(spans_[i].off, spans_[i].len); }

 private:
  struct Span {
    uint32_t off, len;
  };
  std::string data_;
  std::vector<Span> spans_;
};

// String -> token id, open addressing with linear probing; the keys live in one buffer.
// Replaces std::unordered_map<std::string, TokenId>, whose one node per entry made loading
// a 150k vocabulary slow (allocations, and cache misses on every merge's three lookups).
class StringIdMap {
 public:
  size_t size() const { return size_; }
  void clear() {
    keys_.clear();
    slots_.clear();
    size_ = mask_ = 0;
  }
  // Room for n keys without rehashing (load factor <= 0.7: a 150k vocabulary takes 2^18
  // slots, 4 MiB).
  void reserve(size_t n) {
    if (n * 10 > slots_.size() * 7) rehash(n * 10 / 7 + 1);
  }
  // Where the key's probe sequence starts: prefetched ahead of a find() on a batch of keys.
  void prefetch(std::string_view key) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[hash(key) & mask_]);
  }
  // Inserts `key` -> `id`, or finds the existing entry. Returns its value and whether it is new.
  std::pair<TokenId*, bool> try_emplace(std::string_view key, TokenId id) {
    if ((size_ + 1) * 10 > slots_.size() * 7) rehash(std::max<size_t>(16, slots_.size() * 2));
    uint32_t h = hash(key);
    size_t i = h & mask_;
    while (slots_[i].id >= 0) {
      if (slots_[i].hash == h && key_of(slots_[i]) == key) return {&slots_[i].id, false};
      i = (i + 1) & mask_;
    }
    slots_[i] = Slot{h, id, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(key.size())};
    keys_.append(key);
    ++size_;
    return {&slots_[i].id, true};
  }
  void insert_or_assign(std::string_view key, TokenId id) { *try_emplace(key, id).first = id; }
  const TokenId* find(std::string_view key) const {
    if (slots_.empty()) return nullptr;
    uint32_t h = hash(key);
    size_t i = h & mask_;
    while (slots_[i].id >= 0) {
      if (slots_[i].hash == h && key_of(slots_[i]) == key) return &slots_[i].id;
      i = (i + 1) & mask_;
    }
    return nullptr;
  }

 private:
  struct Slot {
    uint32_t hash;
    TokenId id;  // -1: empty
    uint32_t off, len;
  };
  static uint32_t hash(std::string_view s) {
    // FNV-1a over 8-byte words, then a 64-bit finaliser: token strings are short.
    uint64_t h = 0xcbf29ce484222325ULL ^ s.size();
    size_t i = 0;
    for (; i + 8 <= s.size(); i += 8) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      h = (h ^ w) * 0x100000001b3ULL;
    }
    uint64_t tail = 0;
    std::memcpy(&tail, s.data() + i, s.size() - i);
    h = (h ^ tail) * 0x100000001b3ULL;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return static_cast<uint32_t>(h);
  }
  std::string_view key_of(const Slot& s) const { return std::string_view(keys_).substr(s.off, s.len); }
  void rehash(size_t want) {
    size_t cap = 16;
    while (cap < want) cap <<= 1;
    std::vector<Slot> old(cap, Slot{0, -1, 0, 0});
    old.swap(slots_);
    mask_ = cap - 1;
    for (const Slot& s : old) {
      if (s.id < 0) continue;
      size_t i = s.hash & mask_;
      while (slots_[i].id >= 0) i = (i + 1) & mask_;
      slots_[i] = s;
    }
  }
  std::string keys_;
  std::vector<Slot> slots_;
  size_t size_ = 0, mask_ = 0;
};

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

// One step of tokenizer.json's normalizer (a Sequence is flattened into these).
struct NormalizerStep {
  enum class Kind { kForm, kPrepend, kReplace } kind = Kind::kForm;
  NormalForm form = NormalForm::kNFC;
  std::string pattern, content;  // kPrepend: content; kReplace: pattern -> content
};

enum class PrependScheme { kAlways, kFirst, kNever };

// The Metaspace pre-tokenizer of SentencePiece-style BPE (Llama 2, Mistral, TinyLlama):
// spaces become `replacement`, one is prepended per `scheme`, and with `split` each
// replacement character starts a new piece.
struct MetaspaceRule {
  bool on = false;
  std::string replacement;  // one character, as UTF-8
  PrependScheme scheme = PrependScheme::kAlways;
  bool split = true;
};

// One step of tokenizer.json's decoder chain (a Sequence is flattened into these). Each
// step maps the list of token strings to a new list, as Hugging Face's decode_chain does.
struct DecoderStep {
  enum class Kind { kByteLevel, kByteFallback, kFuse, kReplace, kStrip, kMetaspace } kind = Kind::kByteLevel;
  std::string pattern, content;  // kReplace: pattern -> content; kMetaspace: content = replacement
  char32_t strip_char = 0;       // kStrip
  size_t start = 0, stop = 0;    // kStrip
  PrependScheme scheme = PrependScheme::kAlways;  // kMetaspace
};

// Test switch: true makes the loader skip its fast tokenizer.json scanner and read every
// file with the full JSON parser, so tests can compare the two (load.cpp).
inline bool& full_json_parse_only() {
  static bool only = false;
  return only;
}
// How many tokenizer.json files the fast scanner has read (the rest went to the full parser).
inline std::atomic<int64_t>& fast_json_loads() {
  static std::atomic<int64_t> n{0};
  return n;
}

}  // namespace tokenizer_detail

using namespace tokenizer_detail;  // NOLINT: the module's own private names

struct Tokenizer::Impl {
  std::string origin;
  // Model.
  StringTable id_bytes;  // what the ByteLevel decoder makes of each token's string
  StringTable id_token;  // the token string of tokenizer.json
  std::vector<IdKind> id_kind;
  StringIdMap token_ids;  // vocab + added
  StringIdMap bytes_ids;  // model vocab by bytes (built only with ignore_merges, its only user)
  std::array<TokenId, 256> byte_id{};  // byte-level: the vocab id of each byte's character, -1 if none
  MergeMap merges;
  bool ignore_merges = false;
  // Characters that are not in the vocabulary: their UTF-8 bytes as <0xNN> tokens when all
  // exist (byte_fallback), else the unknown token (consecutive ones fused into one with
  // fuse_unk), else nothing.
  bool byte_fallback = false, fuse_unk = false;
  std::string unk_token;  // model.unk_token; may be absent from the vocab (an error once needed)
  TokenId unk_id = -1;
  std::array<TokenId, 256> fallback_id{};  // <0xNN> ids, -1 if absent
  StringIdMap char_ids;  // single-character model tokens (the initial symbols without ByteLevel)
  // Text processing.
  std::vector<NormalizerStep> normalizers;
  bool byte_level = true;   // a ByteLevel pre-tokenizer: BPE starts from bytes, else from characters
  bool all_bytes = true;    // byte_level and every byte has its character in the vocab
  SplitPattern split = SplitPattern::kQwen2;
  bool prefix_space = false;
  MetaspaceRule metaspace;
  std::vector<DecoderStep> decoder;
  bool plain_byte_level_decoder = true;  // decoder is ByteLevel alone: decode by id_bytes
  std::vector<AddedTok> added;
  TokenTrie raw_trie, normalized_trie;
  std::vector<TokenId> post_prefix, post_suffix;
  // tokenizer_config.json.
  std::string bos, eos, pad, unk;
  std::optional<jinja::Template> chat_template;
  PieceCache cache{next_tokenizer_id()};

  void bpe(std::string_view piece, std::vector<TokenId>& out) const;
  void initial_symbols(std::string_view piece, std::vector<TokenId>& out) const;
  void encode_text(std::string_view text, std::vector<TokenId>& out) const;
  // `at_origin`: the segment starts at offset 0 of the caller's text (Metaspace's "first").
  void encode_normalized(std::string_view text, bool at_origin, std::vector<TokenId>& out) const;
  // Applies the normalizer steps; returns `s` itself when nothing changed, else a view of a buffer.
  std::string_view normalize(std::string_view s, std::string (&buf)[2]) const;
  // The text of a list of tokens through the decoder chain (id_bytes + lossy UTF-8 for the
  // plain byte-level decoder).
  std::string decode_run(std::span<const TokenId> run) const;
  IdKind kind_of(TokenId id) const {
    if (id < 0 || static_cast<size_t>(id) >= id_kind.size() || id_kind[id] == IdKind::kNone)
      throw ValueError(str("decode: token id ", id, " is not in the vocabulary of ", origin));
    return id_kind[id];
  }
  std::optional<TokenId> id_of(const std::string& token) const {
    if (token.empty()) return std::nullopt;
    const TokenId* id = token_ids.find(token);
    if (!id) return std::nullopt;
    return *id;
  }
};

}  // namespace rpg::tok
