#include "rpg/tokenizer/bpe_trainer.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <queue>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/tokenizer/pretokenize.h"
#include "rpg/tokenizer/unicode.h"

namespace rpg::tok {

// Copied from tests/oracles/tokenizer_templates.py (QWEN25), which the chat-template tests
// check against transformers.
const std::string_view kQwen25ChatTemplate = R"TPL({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)TPL";

const std::string_view kChatMLChatTemplate =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

namespace {

using json = nlohmann::ordered_json;

// The same Qwen2 regex the loader recognises (pretokenize.cpp); written into tokenizer.json.
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-2's byte -> printable character map of the byte-level pre-tokenizer.
std::array<char32_t, 256> byte_chars() {
  std::array<char32_t, 256> m{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    m[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return m;
}

std::string byte_level(std::string_view bytes) {
  static const auto m = byte_chars();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) append_utf8(out, m[c]);
  return out;
}

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
int32_t key_left(uint64_t k) { return static_cast<int32_t>(k >> 32); }
int32_t key_right(uint64_t k) { return static_cast<int32_t>(k & 0xffffffffu); }

void check_options(const BpeTrainerOptions& o) {
  if (o.min_frequency < 1) throw ValueError(str("BPE training: min_frequency must be >= 1, got ", o.min_frequency));
  for (size_t i = 0; i < o.special_tokens.size(); ++i) {
    if (o.special_tokens[i].empty()) throw ValueError("BPE training: empty special token");
    std::string clean;
    if (!sanitize_utf8(o.special_tokens[i], clean))
      throw ValueError(str("BPE training: special token ", i, " is not valid UTF-8"));
    for (size_t j = 0; j < i; ++j)
      if (o.special_tokens[j] == o.special_tokens[i])
        throw ValueError(str("BPE training: special token ", o.special_tokens[i], " given twice"));
  }
  int64_t min_vocab = 256 + static_cast<int64_t>(o.special_tokens.size());
  if (o.vocab_size < min_vocab)
    throw ValueError(str("BPE training: vocab_size ", o.vocab_size, " is below ", min_vocab,
                         " (256 byte tokens + ", o.special_tokens.size(), " special tokens)"));
  for (const std::string* t : {&o.eos_token, &o.pad_token})
    if (!t->empty() && std::find(o.special_tokens.begin(), o.special_tokens.end(), *t) == o.special_tokens.end())
      throw ValueError(str("BPE training: ", *t, " is not one of the special tokens"));
  if (o.chat_template != "qwen2.5" && o.chat_template != "chatml")
    throw ValueError(str("BPE training: unknown chat template \"", o.chat_template, "\" (qwen2.5 or chatml)"));
}

// Piece counts of the corpus, seen as encode() sees text: special tokens cut out first,
// then NFC, then the split regex.
std::unordered_map<std::string, int64_t> count_pieces(const std::vector<std::string>& lines,
                                                      const std::vector<std::string>& specials) {
  std::unordered_map<std::string, int64_t> counts;
  std::vector<std::pair<uint32_t, uint32_t>> pieces;
  std::string clean, norm;
  auto count_segment = [&](std::string_view seg) {
    if (seg.empty()) return;
    if (normalize(NormalForm::kNFC, seg, norm)) seg = norm;
    pieces.clear();
    split_pieces(SplitPattern::kQwen2, seg, pieces);
    for (auto [b, e] : pieces) ++counts[std::string(seg.substr(b, e - b))];
  };
  for (const std::string& line : lines) {
    std::string_view text = line;
    if (!sanitize_utf8(text, clean)) text = clean;
    size_t pos = 0;
    while (pos < text.size()) {
      // Leftmost special token, longest at that position (as the tokenizer matches them).
      size_t best = std::string_view::npos, best_len = 0;
      for (const std::string& s : specials) {
        size_t at = text.find(s, pos);
        if (at < best || (at == best && at != std::string_view::npos && s.size() > best_len)) {
          best = at;
          best_len = s.size();
        }
      }
      if (best == std::string_view::npos) {
        count_segment(text.substr(pos));
        break;
      }
      count_segment(text.substr(pos, best - pos));
      pos = best + best_len;
    }
  }
  return counts;
}

}  // namespace

TrainedBpe train_bpe(const std::vector<std::string>& lines, const BpeTrainerOptions& options) {
  check_options(options);
  TrainedBpe out;
  // Byte tokens in the order of their byte-level characters.
  const auto chars = byte_chars();
  std::array<int, 256> order{};
  for (int b = 0; b < 256; ++b) order[b] = b;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return chars[a] < chars[b]; });
  std::array<int32_t, 256> byte_id{};
  for (int i = 0; i < 256; ++i) {
    byte_id[order[i]] = i;
    out.tokens.push_back(std::string(1, static_cast<char>(order[i])));
  }
  std::unordered_map<std::string, int32_t> token_ids;
  for (int32_t i = 0; i < 256; ++i) token_ids.emplace(out.tokens[i], i);

  // Words in sorted order, so the run never depends on hash-map iteration.
  auto counts = count_pieces(lines, options.special_tokens);
  std::vector<std::pair<std::string, int64_t>> sorted(counts.begin(), counts.end());
  counts.clear();
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::vector<int32_t>> words(sorted.size());
  std::vector<int64_t> freq(sorted.size());
  for (size_t w = 0; w < sorted.size(); ++w) {
    freq[w] = sorted[w].second;
    for (unsigned char c : sorted[w].first) words[w].push_back(byte_id[c]);
  }
  sorted.clear();

  std::unordered_map<uint64_t, int64_t> pair_count;
  // Words that contained the pair at some point; may hold stale or repeated entries.
  std::unordered_map<uint64_t, std::vector<uint32_t>> where;
  for (uint32_t w = 0; w < words.size(); ++w)
    for (size_t i = 0; i + 1 < words[w].size(); ++i) {
      uint64_t k = pair_key(words[w][i], words[w][i + 1]);
      pair_count[k] += freq[w];
      where[k].push_back(w);
    }
  struct Entry {
    int64_t count;
    uint64_t pair;
    // Max-heap on count, then the smallest (left, right) first.
    bool operator<(const Entry& o) const { return count != o.count ? count < o.count : pair > o.pair; }
  };
  std::priority_queue<Entry> heap;
  {
    std::vector<std::pair<uint64_t, int64_t>> init(pair_count.begin(), pair_count.end());
    std::sort(init.begin(), init.end());
    for (auto [k, c] : init) heap.push({c, k});
  }

  const int64_t target_model = options.vocab_size - static_cast<int64_t>(options.special_tokens.size());
  std::unordered_map<uint64_t, int64_t> delta;
  while (static_cast<int64_t>(out.tokens.size()) < target_model && !heap.empty()) {
    Entry top = heap.top();
    heap.pop();
    auto pc = pair_count.find(top.pair);
    int64_t current = pc == pair_count.end() ? 0 : pc->second;
    if (current != top.count) {
      // Counts of a pair only fall, except when a merge recreates an existing token (then a
      // fresh entry was pushed); re-queue a stale entry at its true count.
      if (current > 0 && current < top.count) heap.push({current, top.pair});
      continue;
    }
    if (top.count < options.min_frequency) break;
    const int32_t a = key_left(top.pair), b = key_right(top.pair);
    std::string merged = out.tokens[a] + out.tokens[b];
    int32_t id;
    // Two merges can spell the same bytes ("a"+"bc", "ab"+"c"); they share one token, as
    // in Hugging Face's trainer.
    auto known = token_ids.find(merged);
    if (known != token_ids.end()) {
      id = known->second;
    } else {
      id = static_cast<int32_t>(out.tokens.size());
      out.tokens.push_back(merged);
      token_ids.emplace(std::move(merged), id);
    }
    out.merges.emplace_back(a, b);

    std::vector<uint32_t> affected = std::move(where[top.pair]);
    where.erase(top.pair);
    std::sort(affected.begin(), affected.end());
    affected.erase(std::unique(affected.begin(), affected.end()), affected.end());
    delta.clear();
    for (uint32_t w : affected) {
      auto& sym = words[w];
      bool has = false;
      for (size_t i = 0; i + 1 < sym.size() && !has; ++i) has = sym[i] == a && sym[i + 1] == b;
      if (!has) continue;
      const int64_t f = freq[w];
      for (size_t i = 0; i + 1 < sym.size(); ++i) delta[pair_key(sym[i], sym[i + 1])] -= f;
      size_t j = 0;
      for (size_t i = 0; i < sym.size(); ++j) {
        if (i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b) {
          sym[j] = id;
          i += 2;
        } else {
          sym[j] = sym[i];
          i += 1;
        }
      }
      sym.resize(j);
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        uint64_t k = pair_key(sym[i], sym[i + 1]);
        delta[k] += f;
        if (sym[i] == id || sym[i + 1] == id) where[k].push_back(w);
      }
    }
    std::vector<std::pair<uint64_t, int64_t>> grown;
    for (auto [k, d] : delta) {
      if (d == 0) continue;
      int64_t& c = pair_count[k];
      c += d;
      if (d > 0) grown.emplace_back(k, c);
      if (c == 0) pair_count.erase(k);
    }
    std::sort(grown.begin(), grown.end());
    for (auto [k, c] : grown) heap.push({c, k});
  }
  for (const std::string& s : options.special_tokens) out.tokens.push_back(s);
  out.num_special = static_cast<int64_t>(options.special_tokens.size());
  return out;
}

namespace {

json byte_level_step() {
  return json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
}

// A token's string as tokenizer.json spells it: byte-level characters for model tokens,
// the content itself for special tokens.
std::string token_string(const TrainedBpe& bpe, size_t id) {
  bool special = static_cast<int64_t>(id) >= static_cast<int64_t>(bpe.tokens.size()) - bpe.num_special;
  return special ? bpe.tokens[id] : byte_level(bpe.tokens[id]);
}

}  // namespace

std::string tokenizer_json(const TrainedBpe& bpe, const BpeTrainerOptions& options) {
  (void)options;
  json root;
  root["version"] = "1.0";
  root["truncation"] = nullptr;
  root["padding"] = nullptr;
  json added = json::array();
  const size_t first_special = bpe.tokens.size() - static_cast<size_t>(bpe.num_special);
  for (size_t id = first_special; id < bpe.tokens.size(); ++id)
    added.push_back(json{{"id", id}, {"content", bpe.tokens[id]}, {"single_word", false}, {"lstrip", false},
                         {"rstrip", false}, {"normalized", false}, {"special", true}});
  root["added_tokens"] = std::move(added);
  root["normalizer"] = json{{"type", "NFC"}};
  root["pre_tokenizer"] = json{
      {"type", "Sequence"},
      {"pretokenizers", json::array({json{{"type", "Split"},
                                          {"pattern", json{{"Regex", std::string(kQwen2Regex)}}},
                                          {"behavior", "Isolated"},
                                          {"invert", false}},
                                     byte_level_step()})}};
  root["post_processor"] = byte_level_step();
  root["decoder"] = byte_level_step();
  json vocab = json::object();
  for (size_t id = 0; id < first_special; ++id) vocab[token_string(bpe, id)] = id;
  json merges = json::array();
  for (auto [a, b] : bpe.merges) merges.push_back(json::array({token_string(bpe, a), token_string(bpe, b)}));
  root["model"] = json{{"type", "BPE"},
                       {"dropout", nullptr},
                       {"unk_token", nullptr},
                       {"continuing_subword_prefix", nullptr},
                       {"end_of_word_suffix", nullptr},
                       {"fuse_unk", false},
                       {"byte_fallback", false},
                       {"ignore_merges", false},
                       {"vocab", std::move(vocab)},
                       {"merges", std::move(merges)}};
  return root.dump(2, ' ', /*ensure_ascii=*/false) + "\n";
}

std::string tokenizer_config_json(const TrainedBpe& bpe, const BpeTrainerOptions& options) {
  json cfg;
  cfg["add_bos_token"] = false;
  cfg["add_prefix_space"] = false;
  json decoder = json::object();
  const size_t first_special = bpe.tokens.size() - static_cast<size_t>(bpe.num_special);
  for (size_t id = first_special; id < bpe.tokens.size(); ++id)
    decoder[std::to_string(id)] = json{{"content", bpe.tokens[id]}, {"lstrip", false}, {"normalized", false},
                                       {"rstrip", false}, {"single_word", false}, {"special", true}};
  cfg["added_tokens_decoder"] = std::move(decoder);
  cfg["bos_token"] = nullptr;
  cfg["chat_template"] = std::string(options.chat_template == "chatml" ? kChatMLChatTemplate : kQwen25ChatTemplate);
  cfg["clean_up_tokenization_spaces"] = false;
  cfg["eos_token"] = options.eos_token.empty() ? json(nullptr) : json(options.eos_token);
  cfg["errors"] = "replace";
  cfg["model_max_length"] = options.model_max_length;
  cfg["pad_token"] = options.pad_token.empty() ? json(nullptr) : json(options.pad_token);
  cfg["split_special_tokens"] = false;
  cfg["tokenizer_class"] = "Qwen2Tokenizer";
  cfg["unk_token"] = nullptr;
  return cfg.dump(2, ' ', /*ensure_ascii=*/false) + "\n";
}

TrainedBpe train_bpe_files(const std::vector<std::filesystem::path>& corpus_files,
                           const std::filesystem::path& out_dir, const BpeTrainerOptions& options) {
  check_options(options);
  if (corpus_files.empty()) throw ValueError("BPE training: no corpus file given");
  std::vector<std::string> lines;
  for (const auto& path : corpus_files) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw IoError(str("cannot open corpus ", path.string()));
    for (std::string line; std::getline(f, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (!line.empty()) lines.push_back(std::move(line));
    }
    if (f.bad()) throw IoError(str("cannot read corpus ", path.string()));
  }
  if (lines.empty()) throw ValueError("BPE training: the corpus is empty");
  TrainedBpe bpe = train_bpe(lines, options);
  AtomicDir dir(out_dir);
  write_file_atomic(dir.path() / "tokenizer.json", tokenizer_json(bpe, options));
  write_file_atomic(dir.path() / "tokenizer_config.json", tokenizer_config_json(bpe, options));
  dir.commit();
  return bpe;
}

}  // namespace rpg::tok
