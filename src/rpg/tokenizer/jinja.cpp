#include "rpg/tokenizer/jinja.h"

#include "rpg/core/error.h"

namespace rpg::jinja {
struct Template::Impl {};
Template Template::parse(std::string_view, const std::string& origin) {
  throw FormatError(origin + ": chat templates are not supported yet");
}
std::string Template::render(const nlohmann::ordered_json&) const { throw ValueError("chat templates are not supported yet"); }
}  // namespace rpg::jinja
