// Training of a byte-level BPE tokenizer in the Qwen2 style, written as Hugging Face
// tokenizer files, so a model can be built from scratch with nothing downloaded.
//
// The text goes through the same steps encode() applies (special tokens cut out, NFC,
// the Qwen2 split regex), so every merge learned is one the tokenizer can use. The
// vocabulary is the 256 byte tokens (in the order of their byte-level characters, as
// Qwen2's), then one token per merge, then the special tokens, so ids of ordinary text
// never depend on how many special tokens there are.
//
// Determinism: the pair with the highest count merges first; ties go to the pair whose
// (left id, right id) is smallest. Output depends only on the corpus and the options.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace rpg::tok {

// The Qwen2.5-Instruct chat template, verbatim (default system prompt included).
extern const std::string_view kQwen25ChatTemplate;
// Plain ChatML without a default system message: "<|im_start|>{role}\n{content}<|im_end|>\n"
// per message, then "<|im_start|>assistant\n" for the generation prompt. Shorter prompts
// for small demo models.
extern const std::string_view kChatMLChatTemplate;

struct BpeTrainerOptions {
  // Total vocabulary: 256 byte tokens + merges + special tokens. Training stops earlier
  // when no pair reaches min_frequency.
  int64_t vocab_size = 4096;
  int64_t min_frequency = 2;
  std::vector<std::string> special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  // tokenizer_config.json: eos_token / pad_token (must be among special_tokens).
  std::string eos_token = "<|im_end|>";
  std::string pad_token = "<|endoftext|>";
  // "qwen2.5" (kQwen25ChatTemplate) or "chatml" (kChatMLChatTemplate).
  std::string chat_template = "qwen2.5";
  int64_t model_max_length = 32768;
};

struct TrainedBpe {
  std::vector<std::string> tokens;                          // byte strings, index = id (specials last)
  std::vector<std::pair<int32_t, int32_t>> merges;          // in rank order
  int64_t num_special = 0;                                  // the last num_special tokens
};

// Learns merges from `lines` (each an independent text; invalid UTF-8 is replaced as
// encode() does). Throws ValueError for bad options (vocab_size too small for the bytes
// and special tokens, empty or duplicate special tokens, eos / pad not special).
TrainedBpe train_bpe(const std::vector<std::string>& lines, const BpeTrainerOptions& options);

// tokenizer.json in Hugging Face's format (Qwen2 layout: NFC, Split + ByteLevel,
// ByteLevel decoder, BPE model with [left, right] merges) and tokenizer_config.json.
std::string tokenizer_json(const TrainedBpe& bpe, const BpeTrainerOptions& options);
std::string tokenizer_config_json(const TrainedBpe& bpe, const BpeTrainerOptions& options);

// Reads the corpus files (one text per line), trains and writes tokenizer.json +
// tokenizer_config.json into `out_dir` atomically (replacing it). Throws IoError /
// ValueError. Returns the trained vocabulary.
TrainedBpe train_bpe_files(const std::vector<std::filesystem::path>& corpus_files,
                           const std::filesystem::path& out_dir, const BpeTrainerOptions& options);

}  // namespace rpg::tok
