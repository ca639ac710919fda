// A small Jinja2 interpreter for chat templates. It covers what current Qwen2.5, Qwen3 and
// Llama 3 templates use and renders them byte-identically to transformers'
// apply_chat_template (a jinja2 sandbox with trim_blocks, lstrip_blocks and loopcontrols,
// plus raise_exception, strftime_now and a tojson without HTML escaping). Anything
// outside that subset is rejected at parse time with its line and column, never rendered
// approximately.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace rpg::jinja {

class Template {
 public:
  // Throws FormatError "<origin>:<line>:<col>: <reason>" for syntax errors and unsupported
  // constructs.
  static Template parse(std::string_view source, const std::string& origin);

  // `vars` is a JSON object of template variables. Throws ValueError for errors raised
  // while rendering (raise_exception, attribute of an undefined value, type errors).
  std::string render(const nlohmann::ordered_json& vars) const;

  struct Impl;

 private:
  explicit Template(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace rpg::jinja
