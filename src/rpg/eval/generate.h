// `rpg generate`: a model directory + prompts (a Parquet dataset in the paper's schema, or
// plain user messages) -> n responses per prompt, written as JSONL. Prompts are rendered
// with the model's own chat template and tokenized exactly as verl does
// (apply_chat_template(add_generation_prompt=True), then encode without special tokens).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "rpg/rollout/engine.h"
#include "rpg/tokenizer/tokenizer.h"

namespace rpg::eval {

struct GenerateOptions {
  std::filesystem::path model_dir;
  std::filesystem::path adapter;  // a LoRA adapter directory (PEFT's format) applied on top; empty: none
  std::filesystem::path data;        // Parquet in the paper's schema, or empty
  std::vector<std::string> prompts;  // user messages, used when `data` is empty
  std::filesystem::path output;      // .jsonl; empty: JSONL on stdout
  int64_t limit = -1;                // first rows of `data` only (-1: all)
  bool chat_template = true;         // false: prompt text is encoded as is
  tok::ChatTemplateKwargs chat_template_kwargs;  // template variables
  std::string dtype = "auto";        // auto | float32 | bfloat16 | float16
  std::string device = "auto";       // auto | cpu | cuda
  bool progress = true;
  rollout::SamplingParams sampling;  // stop ids: the tokenizer's and generation_config's EOS are added
  rollout::EngineOptions engine;
};

struct GenerateSummary {
  int64_t prompts = 0;
  int64_t responses = 0;
  rollout::GenerateStats stats;
};

// Throws IoError / FormatError / ValueError naming the file or option at fault. The output
// file is written atomically once every response is done.
GenerateSummary run_generate(const GenerateOptions& options);

}  // namespace rpg::eval
