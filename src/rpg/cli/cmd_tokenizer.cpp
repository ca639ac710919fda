// `rpg tokenizer train`: argument parsing only; the work is in rpg/tokenizer/bpe_trainer.
// Torch-free: built into the `rpg` front binary (see main.cpp).
#include <iostream>

#include "rpg/cli/commands.h"
#include "rpg/core/args.h"
#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/tokenizer/bpe_trainer.h"

namespace rpg::cli {

int run_tokenizer_train(const std::string& full_name, const std::vector<std::string>& args) {
  std::vector<std::string> corpus;
  std::string output;
  tok::BpeTrainerOptions options;
  ArgParser parser(full_name,
                   "Trains a byte-level BPE tokenizer in the Qwen2 style (NFC, Qwen2 split regex, special tokens\n"
                   "<|endoftext|> <|im_start|> <|im_end|> last) on text files, one text per line, and writes\n"
                   "tokenizer.json + tokenizer_config.json (eos <|im_end|>, pad <|endoftext|>, chat template).");
  parser.option_list("--corpus", &corpus, "a text file (may be given several times)", "FILE")
      .option("--vocab-size", &options.vocab_size, "total vocabulary including the 256 bytes and 3 specials (default 4096)")
      .option("--min-frequency", &options.min_frequency, "stop when the best pair occurs fewer times (default 2)")
      .option("--chat-template", &options.chat_template, "qwen2.5 (the Qwen2.5-Instruct template, default) or chatml", "NAME")
      .option("--output", &output, "the tokenizer directory to write (replaced atomically)", "DIR")
      .epilog("example: rpg tokenizer train --corpus data/sft.txt --vocab-size 4096 --output runs/tok");
  if (!parser.parse(args)) return 0;
  if (corpus.empty()) throw UsageError(str(full_name, ": --corpus FILE is required"));
  if (output.empty()) throw UsageError(str(full_name, ": --output DIR is required"));
  std::vector<NamedPath> inputs;
  for (const auto& c : corpus) inputs.push_back({"--corpus", c});
  check_output_apart({"--output", output}, inputs);
  std::vector<std::filesystem::path> files(corpus.begin(), corpus.end());
  auto bpe = tok::train_bpe_files(files, output, options);
  std::cout << "tokenizer: " << bpe.tokens.size() << " tokens (" << bpe.merges.size() << " merges) -> " << output << "\n";
  return 0;
}

}  // namespace rpg::cli
