// `rpg sft`: supervised fine-tuning on (prompt, response) pairs, the loss on response
// tokens only (verl's SFT trainer: prompt rendered with the chat template and the
// generation prompt, response followed by EOS, token-mean cross-entropy over the
// mini-batch). The RL trainer's optimizer, LR schedule, clipping and metrics are reused so
// an SFT warm start and the RL run that follows behave alike.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace rpg::model {
class CausalLM;
}

namespace rpg::rollout {
struct Policy;
}

namespace rpg::train {

struct SftOptions {
  double lr = 1e-4;  // peak LR
  int64_t epochs = 1;
  int64_t batch_size = 8;        // pairs per optimizer step
  int64_t micro_batch_size = 8;  // pairs per forward/backward; never changes the update
  // Prompt + response tokens (EOS included); longer pairs are dropped and counted.
  int64_t max_length = 1024;
  int64_t seed = 0;
  double weight_decay = 0.0;
  double warmup_ratio = 0.05;
  std::string lr_scheduler = "cosine";  // cosine | constant
  double min_lr_ratio = 0.0;
  double grad_clip = 1.0;
  std::string optimizer = "adamw";  // adamw | schedule_free_adamw
  // Total optimizer steps; unset = epochs * ceil(pairs / batch_size). When larger than
  // that, the data is repeated (a new shuffle per epoch).
  std::optional<int64_t> steps;
  std::string device = "auto";
  std::string dtype = "float32";  // parameters while training (the optimizer keeps fp32 masters)
  bool gradient_checkpointing = false;
  bool progress = true;
  // Early stop (a warm start that must reach a competence, not a step count): every
  // `eval_every` optimizer steps from `min_steps` on, `stop_when(policy, step)` is asked with
  // the weights as they would be saved; true ends training there. Unset: all steps run.
  int64_t eval_every = 0;
  int64_t min_steps = 0;
  std::function<bool(const rollout::Policy&, int64_t step)> stop_when;
};

// One JSONL record.
struct SftPair {
  std::string prompt;    // user message, rendered with the model's chat template
  std::string response;  // assistant text
};

// One pair as token ids: the rendered prompt, and the response with EOS appended.
struct SftExample {
  std::vector<int64_t> prompt_ids;
  std::vector<int64_t> response_ids;
};

// Reads `{"prompt": str, "response": str, ...}` per line (blank lines skipped; other keys
// ignored). Throws IoError when unreadable, FormatError "<file>:<line>: ..." for bad lines,
// and FormatError when the file holds no pair.
std::vector<SftPair> read_sft_jsonl(const std::filesystem::path& file);

// Throws ValueError when the tokenizer has no EOS (nothing to teach the model to stop with).
std::vector<SftExample> encode_sft_pairs(const rollout::Policy& policy, const std::vector<SftPair>& pairs);

struct SftBatchResult {
  double loss = 0.0;   // token-mean cross-entropy over every response token of the batch
  int64_t tokens = 0;  // response tokens (the normaliser)
};

// Forward + backward of the batch's SFT loss in micro-batches of `micro_batch_size`
// pairs, accumulating into the parameters' .grad(); each micro-batch is divided by the
// whole batch's token count, so the accumulated gradient is that of the batch mean.
SftBatchResult sft_backward(const model::CausalLM& model, const std::vector<const SftExample*>& batch,
                            int64_t pad_token_id, int64_t micro_batch_size);

struct SftResult {
  int64_t steps = 0;    // optimizer steps run (fewer than planned when stop_when said so)
  bool stopped_early = false;
  int64_t pairs = 0;    // pairs trained on
  int64_t dropped = 0;  // pairs longer than max_length
  double first_loss = 0.0, last_loss = 0.0;
  std::filesystem::path model_dir;  // OUT_DIR/model
};

// Fine-tunes the model in `model_dir` on `data_file`; writes metrics.jsonl + TensorBoard
// events to `out_dir` and the final model (tokenizer files copied) to out_dir/model,
// atomically. ConfigError for bad options, FormatError / IoError naming the file at fault.
SftResult run_sft(const std::filesystem::path& model_dir, const std::filesystem::path& data_file,
                  const std::filesystem::path& out_dir, const SftOptions& options = {});

}  // namespace rpg::train
