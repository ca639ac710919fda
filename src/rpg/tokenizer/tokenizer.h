// Byte-level BPE tokenizer loaded from a Hugging Face model directory (tokenizer.json +
// tokenizer_config.json), as used by Qwen2 / Qwen2.5 / Qwen3 and Llama 3. Ids, decoded text
// and rendered chat prompts are identical to Hugging Face `tokenizers` / `transformers`.
//
// Pipeline of encode(), in Hugging Face's order: invalid UTF-8 -> U+FFFD (as Python's
// bytes.decode(errors="replace")); added tokens that match the raw text are cut out; the
// remaining text is normalized (NFC for Qwen), added tokens that match normalized text are
// cut out; the rest is split by the pre-tokenizer regex and each piece's bytes run through
// BPE merges (cached per piece).
//
// Thread safety: a Tokenizer is immutable after loading apart from its internal piece
// cache, which is synchronised; encode/decode may be called from many threads at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace rpg::tok {

using TokenId = int32_t;

struct ChatMessage {
  std::string role;
  std::string content;
};

class Tokenizer {
 public:
  // Reads dir/tokenizer.json and, when present, dir/tokenizer_config.json (special tokens
  // and chat_template; a chat_template.jinja file beside it is used when the config has
  // none). Throws IoError / FormatError naming the file and the reason.
  static Tokenizer from_dir(const std::filesystem::path& dir);
  // From in-memory file contents; `origin` names them in error messages.
  static Tokenizer from_json(std::string_view tokenizer_json, const std::string& origin,
                             std::string_view tokenizer_config_json = {},
                             const std::string& config_origin = "tokenizer_config.json");

  // Token ids of `text` (any bytes; invalid UTF-8 is replaced first). With
  // add_special_tokens the post-processor's tokens are added (Llama 3: <|begin_of_text|>),
  // as Hugging Face does by default; chat prompts already carry them, so the default here
  // is off, matching how verl encodes rendered prompts.
  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens = false) const;

  // encode() of every text on `threads` threads (0 = hardware concurrency).
  std::vector<std::vector<TokenId>> batch_encode(const std::vector<std::string>& texts,
                                                 bool add_special_tokens = false,
                                                 int threads = 0) const;

  // Text of `ids`. Byte sequences that are not valid UTF-8 become U+FFFD, as in Hugging
  // Face. Throws ValueError for an id outside the vocabulary.
  std::string decode(std::span<const TokenId> ids, bool skip_special_tokens = false) const;

  // Incremental decode for generation: push ids one at a time; each call returns the text
  // that became final. Bytes of an incomplete UTF-8 character are held back until the
  // character completes, so the output never contains broken UTF-8 and the concatenation
  // of all outputs plus finish() equals decode(all ids).
  class StreamDecoder {
   public:
    std::string push(TokenId id);
    std::string finish();

   private:
    friend class Tokenizer;
    StreamDecoder(const Tokenizer* tok, bool skip_special) : tok_(tok), skip_special_(skip_special) {}
    const Tokenizer* tok_;
    bool skip_special_;
    std::string pending_;        // plain byte-level decoder: bytes not yet emitted
    std::vector<TokenId> run_;   // other decoder chains: the current run of model tokens,
    std::string emitted_text_;   // the part of its text already emitted
    size_t emitted_ = 0;
  };
  StreamDecoder stream_decoder(bool skip_special_tokens = false) const {
    return StreamDecoder(this, skip_special_tokens);
  }

  // Renders the model's chat_template (Jinja) the way transformers' apply_chat_template
  // does: `messages` is a list of {"role", "content", ...} objects; `extra` holds further
  // template variables (tools, enable_thinking, date_string, ...). bos_token, eos_token,
  // pad_token and unk_token come from tokenizer_config.json. Throws FormatError when the
  // model has no chat template, ValueError when the template raises.
  std::string apply_chat_template(const nlohmann::ordered_json& messages, bool add_generation_prompt) const;
  std::string apply_chat_template(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                  const nlohmann::ordered_json& extra) const;
  std::string apply_chat_template(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  bool has_chat_template() const;

  // Vocabulary size including added tokens (max id + 1).
  size_t vocab_size() const;
  // The token's string as written in tokenizer.json (byte-level form for BPE tokens).
  std::string id_to_token(TokenId id) const;
  std::optional<TokenId> token_to_id(std::string_view token) const;
  bool is_special(TokenId id) const;

  // From tokenizer_config.json; nullopt when unset or not in the vocabulary.
  std::optional<TokenId> bos_id() const;
  std::optional<TokenId> eos_id() const;
  std::optional<TokenId> pad_id() const;
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  const std::string& pad_token() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

// verl's `data.apply_chat_template_kwargs` (rpg's `--chat-template-kwargs`): a JSON object
// that verl passes as `tokenizer.apply_chat_template(messages, ..., **kwargs)`, so each key
// becomes a template variable (overriding bos_token and the other special tokens; "tools"
// and "documents" reach the template under those names), e.g. {"enable_thinking": false}.
// A value type (copies share the immutable object) so that headers holding one need only
// nlohmann/json_fwd.hpp.
class ChatTemplateKwargs {
 public:
  ChatTemplateKwargs();  // {}
  // Parses `text` (empty = {}) and checks it as from_json does.
  static ChatTemplateKwargs parse(std::string_view text, const std::string& what);
  // Throws ValueError naming `what` for a non-object (null = {}), or for a key that
  // transformers takes as one of apply_chat_template's own parameters
  // (add_generation_prompt, tokenize, chat_template, continue_final_message, ...) or that
  // collides with the conversation: those would not reach the template as variables (verl
  // would fail or change the call).
  static ChatTemplateKwargs from_json(const nlohmann::ordered_json& value, const std::string& what);
  const nlohmann::ordered_json& json() const { return *value_; }

 private:
  std::shared_ptr<const nlohmann::ordered_json> value_;
};

}  // namespace rpg::tok
