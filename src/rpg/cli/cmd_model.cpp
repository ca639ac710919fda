// `rpg model info` and `rpg tokenize`: argument parsing only; the work is in rpg/model and
// rpg/tokenizer.
#include <iostream>

#include "rpg/cli/commands.h"
#include "rpg/core/args.h"
#include "rpg/core/error.h"
#include "rpg/model/config.h"
#include "rpg/tokenizer/tokenizer.h"

namespace rpg::cli {

int run_model_info(const std::string& full_name, const std::vector<std::string>& args) {
  std::string dir;
  ArgParser parser(full_name,
                   "Prints a Hugging Face model directory's architecture, parameter count, dtype and the\n"
                   "memory its weights (and each token of KV cache) take. Reads config.json only.");
  parser.positional("DIR", &dir, "model directory (config.json)");
  if (!parser.parse(args)) return 0;
  std::cout << model::describe(model::ModelConfig::from_dir(dir)) << "\n";
  return 0;
}

int run_tokenize(const std::string& full_name, const std::vector<std::string>& args) {
  std::string dir, text;
  bool special = false, chat = false;
  ArgParser parser(full_name,
                   "Encodes text with a model directory's tokenizer (tokenizer.json) and prints each id with its\n"
                   "piece, then the ids as one list.");
  parser.option("--model", &dir, "model or tokenizer directory", "DIR")
      .positional("TEXT", &text, "the text to encode")
      .flag("--add-special-tokens", &special, "add the post-processor's tokens (e.g. Llama 3's BOS)")
      .flag("--chat", &chat, "render TEXT as a user message with the model's chat template first");
  if (!parser.parse(args)) return 0;
  if (dir.empty()) throw UsageError(str(full_name, ": --model DIR is required"));
  Tokenizer tok = Tokenizer::from_dir(dir);
  if (chat) text = tok.apply_chat_template({ChatMessage{"user", text}}, /*add_generation_prompt=*/true);
  auto ids = tok.encode(text, special);
  std::string list;
  for (TokenId id : ids) {
    std::cout << id << "\t" << tok.id_to_token(id) << "\n";
    list += (list.empty() ? "" : ", ") + std::to_string(id);
  }
  std::cout << "[" << list << "]\n" << ids.size() << " tokens\n";
  return 0;
}

}  // namespace rpg::cli
