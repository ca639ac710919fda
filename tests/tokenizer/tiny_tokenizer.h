// A small but complete byte-level BPE tokenizer.json, built in code for tests and fuzz
// targets that must not depend on an oracle run: the 256 byte symbols in GPT-2's
// byte-to-character map (a format constant), merges that spell a list of words, and
// Qwen-style added tokens.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace rpg::test {

inline std::string byte_symbol(unsigned char b) {
  int n = 0;
  auto printable = [](int x) { return (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255); };
  int cp = b;
  if (!printable(b)) {
    for (int x = 0; x < b; ++x)
      if (!printable(x)) ++n;
    cp = 256 + n;
  }
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// `regex` is the Split pattern, or empty for GPT-2's ByteLevel(use_regex=true).
inline nlohmann::ordered_json tiny_tokenizer_json(const std::string& regex, bool nfc) {
  using json = nlohmann::ordered_json;
  json vocab = json::object();
  int next = 0;
  for (int b = 0; b < 256; ++b) vocab[byte_symbol(static_cast<unsigned char>(b))] = next++;
  json merges = json::array();
  const std::vector<std::string> words = {"the", " the", " and", "ing", " of", " to", "tion", " in", "er",
                                          " is", "hello", " world", "中文", " 😀", "  ", "\n\n", "123"};
  for (const std::string& w : words) {
    std::vector<std::string> syms;
    for (unsigned char c : w) syms.push_back(byte_symbol(c));
    // Merge left to right: ((a b) c) d ...
    std::string acc = syms[0];
    for (size_t k = 1; k < syms.size(); ++k) {
      std::string merged = acc + syms[k];
      if (!vocab.contains(merged)) {
        merges.push_back(json::array({acc, syms[k]}));
        vocab[merged] = next++;
      }
      acc = merged;
    }
  }
  json added = json::array();
  const char* specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  for (const char* s : specials)
    added.push_back({{"id", next++}, {"content", s}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  added.push_back({{"id", next++}, {"content", "<think>"}, {"single_word", false}, {"lstrip", false},
                   {"rstrip", false}, {"normalized", false}, {"special", false}});
  json pre;
  if (regex.empty()) {
    pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  } else {
    pre = {{"type", "Sequence"},
           {"pretokenizers",
            json::array({{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}},
                         {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}})}};
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nfc ? json{{"type", "NFC"}} : json(nullptr)},
          {"pre_tokenizer", pre},
          {"post_processor", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
            {"vocab", vocab}, {"merges", merges}}}};
}

inline const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace rpg::test
