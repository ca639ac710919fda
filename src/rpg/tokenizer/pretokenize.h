// The split step of the byte-level pre-tokenizer. Hugging Face stores it as a regex; we
// recognise the regexes of the families we serve and run a hand-written matcher for each
// that reproduces the regex's leftmost-first, backtracking semantics exactly. Any other
// regex is rejected when the tokenizer is loaded, never approximated.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace rpg::tok {

enum class SplitPattern {
  // Qwen2 / Qwen2.5 / Qwen3: single digits.
  kQwen2,
  // Llama 3 (and tiktoken cl100k): digit runs of up to three.
  kLlama3,
  // GPT-2's ByteLevel(use_regex=true) pattern.
  kGpt2,
};

// The pattern a tokenizer.json regex string denotes, or nullopt when it is not one we know.
std::optional<SplitPattern> split_pattern_from_regex(std::string_view regex);

// Appends the [begin, end) byte ranges of the pieces of valid UTF-8 `text`.
void split_pieces(SplitPattern pattern, std::string_view text,
                  std::vector<std::pair<uint32_t, uint32_t>>& out);

}  // namespace rpg::tok
