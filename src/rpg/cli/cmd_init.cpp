// `rpg model init` and `rpg model merge`: argument parsing only; the work is in rpg/model.
#include <iostream>
#include <optional>

#include "rpg/cli/commands.h"
#include "rpg/core/args.h"
#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/model/causal_lm.h"
#include "rpg/model/config.h"
#include "rpg/model/lora.h"
#include "rpg/model/init.h"
#include "rpg/tokenizer/tokenizer.h"

namespace rpg::cli {

int run_model_init(const std::string& full_name, const std::vector<std::string>& args) {
  std::string tokenizer_dir, output;
  model::InitOptions o;
  int64_t seed = 0;
  bool untied = false;
  ArgParser parser(full_name,
                   "Writes a Hugging Face model directory holding a freshly initialised Qwen2 model (float32,\n"
                   "seeded), sized to a tokenizer's vocabulary, with the tokenizer files and a\n"
                   "generation_config.json (stop at <|im_end|> or <|endoftext|>) beside the weights.");
  parser.option("--tokenizer", &tokenizer_dir, "tokenizer directory (e.g. from `rpg tokenizer train`)", "DIR")
      .option("--output", &output, "the model directory to write (replaced atomically)", "DIR")
      .option("--hidden", &o.hidden_size, "hidden size (default 128)")
      .option("--layers", &o.num_hidden_layers, "decoder layers (default 4)")
      .option("--heads", &o.num_attention_heads, "attention heads (default 4)")
      .option("--kv-heads", &o.num_key_value_heads, "key/value heads (default 2)")
      .option("--intermediate", &o.intermediate_size, "MLP width (default 512)")
      .option("--max-positions", &o.max_position_embeddings, "max_position_embeddings (default 1024)")
      .option("--seed", &seed, "initialisation seed (default 0)", "S")
      .flag("--untie-embeddings", &untied, "a separate lm_head instead of sharing the embedding matrix")
      .epilog("example: rpg model init --tokenizer runs/tok --output runs/model-init --seed 1");
  if (!parser.parse(args)) return 0;
  if (tokenizer_dir.empty()) throw UsageError(str(full_name, ": --tokenizer DIR is required"));
  if (output.empty()) throw UsageError(str(full_name, ": --output DIR is required"));
  if (seed < 0) throw UsageError(str(full_name, ": --seed: got ", seed, ", expected >= 0"));
  check_output_apart({"--output", output}, {{"--tokenizer", tokenizer_dir}});
  o.seed = static_cast<uint64_t>(seed);
  o.tie_word_embeddings = !untied;
  tok::Tokenizer tok = tok::Tokenizer::from_dir(tokenizer_dir);
  auto eos = tok.eos_id();
  auto pad = tok.pad_id();
  if (!eos) throw ValueError(str(tokenizer_dir, ": the tokenizer has no eos token"));
  model::VocabInfo vocab{static_cast<int64_t>(tok.vocab_size()), *eos, pad ? *pad : *eos};
  model::init_model_dir(o, vocab, tokenizer_dir, output);
  std::cout << model::describe(model::ModelConfig::from_dir(output)) << "\n" << "written to " << output << "\n";
  return 0;
}

int run_model_merge(const std::string& full_name, const std::vector<std::string>& args) {
  std::string base, adapter, output;
  ArgParser parser(full_name,
                   "Folds a LoRA adapter directory (PEFT's adapter_config.json + adapter_model.safetensors, as\n"
                   "`rpg train` checkpoints and PEFT write them) into its base model, as PEFT's\n"
                   "merge_and_unload() does (in fp32), and writes a plain Hugging Face model directory in the\n"
                   "base checkpoint's dtype, with the base's tokenizer and other files beside it.");
  parser.positional("BASE", &base, "base model directory")
      .positional("ADAPTER", &adapter, "LoRA adapter directory")
      .positional("OUT", &output, "the merged model directory to write (replaced atomically)")
      .epilog("example: rpg model merge models/qwen2.5-0.5b runs/lora/global_step_50/actor runs/merged");
  if (!parser.parse(args)) return 0;
  check_output_apart({"OUT", output}, {{"BASE", base}, {"ADAPTER", adapter}});
  // Merged in fp32 (PEFT merges in the weights' dtype: the same for fp32 bases), written back
  // in the checkpoint's own dtype.
  at::ScalarType dtype;
  std::optional<model::CausalLM> m;
  {
    model::CausalLM stored = model::CausalLM::from_pretrained(base);
    dtype = stored.dtype();
    if (dtype == at::kFloat) {
      m.emplace(std::move(stored));
    } else {
      m.emplace(stored.config(), at::kFloat);
      m->copy_parameters_from(stored);
    }
  }
  model::load_lora_adapter(*m, adapter);
  const auto lora = *m->lora();
  m->merge_lora();
  model::SaveOptions so;
  so.dtype = dtype;
  so.copy_files_from = base;
  m->save_pretrained(output, so);
  std::cout << "merged rank-" << lora.rank << " LoRA (" << lora.target_modules.size() << " modules per layer, scale "
            << lora.scale() << ") into " << output << "\n";
  return 0;
}

}  // namespace rpg::cli
