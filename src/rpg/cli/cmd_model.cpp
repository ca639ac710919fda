// `rpg model info` and `rpg tokenize`: argument parsing only; the work is in rpg/model and
// rpg/tokenizer.
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "rpg/cli/commands.h"
#include "rpg/core/args.h"
#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/jsonl.h"
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
  std::string dir, text, jsonl_in, template_kwargs;
  bool special = false, chat = false;
  ArgParser parser(full_name,
                   "Encodes text with a model directory's tokenizer (tokenizer.json) and prints each id with its\n"
                   "piece, then the ids as one list. With --jsonl, encodes many texts in one process: one JSON\n"
                   "line in per text (a JSON string, or an object with \"text\", or with \"messages\" to render\n"
                   "with the chat template), one line {\"ids\": [...], \"num_tokens\": N} out per text, in order.");
  parser.option("--model", &dir, "model or tokenizer directory", "DIR")
      .positional("TEXT", &text, "the text to encode (not with --jsonl)", /*required=*/false)
      .option("--jsonl", &jsonl_in, "read texts from this JSON-lines file ('-': standard input)", "FILE")
      .flag("--add-special-tokens", &special, "add the post-processor's tokens (e.g. Llama 3's BOS)")
      .flag("--chat", &chat, "render TEXT as a user message with the model's chat template first")
      .option("--chat-template-kwargs", &template_kwargs,
              "JSON object of chat-template variables (verl's data.apply_chat_template_kwargs), "
              "e.g. '{\"enable_thinking\": false}'", "JSON");
  if (!parser.parse(args)) return 0;
  if (dir.empty()) throw UsageError(str(full_name, ": --model DIR is required"));
  if (jsonl_in.empty() == text.empty()) throw UsageError(str(full_name, ": give TEXT or --jsonl FILE (one of them)"));
  auto kwargs = tok::ChatTemplateKwargs::parse(template_kwargs, "--chat-template-kwargs");
  tok::Tokenizer tok = tok::Tokenizer::from_dir(dir);
  auto render = [&](const nlohmann::ordered_json& messages) {
    return tok.apply_chat_template(messages, /*add_generation_prompt=*/true, kwargs.json());
  };
  if (!jsonl_in.empty()) {
    std::string input = jsonl_in == "-" ? std::string(std::istreambuf_iterator<char>(std::cin), {})
                                        : read_file(jsonl_in);
    const std::string source = jsonl_in == "-" ? "<stdin>" : jsonl_in;
    std::vector<std::string> texts;
    jsonl::parse(input, source, [&](size_t line, nlohmann::json& j) {
      auto where = [&] { return str(source, ":", line, ": "); };
      if (j.is_string()) {
        texts.push_back(chat ? render(nlohmann::ordered_json::array({{{"role", "user"}, {"content", j}}}))
                             : j.get<std::string>());
      } else if (j.is_object() && j.contains("messages")) {
        texts.push_back(render(nlohmann::ordered_json::parse(j["messages"].dump())));
      } else if (j.is_object() && j.contains("text") && j["text"].is_string()) {
        std::string t = j["text"];
        texts.push_back(chat ? render(nlohmann::ordered_json::array({{{"role", "user"}, {"content", t}}})) : t);
      } else {
        throw FormatError(where() + "expected a JSON string or an object with \"text\" (string) or \"messages\"");
      }
    }, {.allow_torn_last_line = false, .objects_only = false});
    auto all = tok.batch_encode(texts, special);
    std::string out;
    for (const auto& ids : all) out += nlohmann::json{{"ids", ids}, {"num_tokens", ids.size()}}.dump() + "\n";
    std::cout << out << std::flush;
    return 0;
  }
  if (chat) text = render(nlohmann::ordered_json::array({{{"role", "user"}, {"content", text}}}));
  auto ids = tok.encode(text, special);
  std::string list;
  for (tok::TokenId id : ids) {
    std::cout << id << "\t" << tok.id_to_token(id) << "\n";
    list += (list.empty() ? "" : ", ") + std::to_string(id);
  }
  std::cout << "[" << list << "]\n" << ids.size() << " tokens\n";
  return 0;
}

}  // namespace rpg::cli
