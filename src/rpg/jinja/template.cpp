// The public face of the chat-template engine: parse = lex + parse + scope analysis;
// render = a Renderer over the globals and the caller's variables.
#include "rpg/jinja/jinja.h"

#include <set>

#include "rpg/core/error.h"
#include "rpg/core/text.h"
#include "rpg/jinja/builtins.h"
#include "rpg/jinja/lexer.h"
#include "rpg/jinja/parser.h"
#include "rpg/jinja/renderer.h"

namespace rpg::jinja {

struct Template::Impl {
  std::string origin;
  Body body;
  std::set<std::string> root_stored;
};

namespace {
void collect_root_stored(const Body& body, std::set<std::string>& out) {
  for (const NodeP& n : body) {
    switch (n->k) {
      case Node::K::kSet:
        if (n->attr.empty()) out.insert(n->targets.begin(), n->targets.end());
        break;
      case Node::K::kSetBlock:
      case Node::K::kMacro: out.insert(n->targets[0]); break;
      default: break;  // if, for, macro and generation bodies are scopes of their own for jinja2
    }
  }
}

// Records on every for / macro node the names its body assigns directly.
void annotate_scopes(const Body& body) {
  for (const NodeP& n : body) {
    if (n->k == Node::K::kFor || n->k == Node::K::kMacro) collect_root_stored(n->body, n->stored);
    for (auto& [cond, b] : n->branches) annotate_scopes(b);
    annotate_scopes(n->body);
    annotate_scopes(n->else_body);
  }
}
}  // namespace

Template Template::parse(std::string_view source, const std::string& origin) {
  auto impl = std::make_shared<Impl>();
  impl->origin = origin;
  std::string clean;
  if (!sanitize_utf8(source, clean)) throw FormatError(origin + ": template is not valid UTF-8");
  impl->body = jinja::parse(lex(source, impl->origin), impl->origin);
  collect_root_stored(impl->body, impl->root_stored);
  annotate_scopes(impl->body);
  return Template(std::move(impl));
}

std::string Template::render(const nlohmann::ordered_json& vars) const {
  Renderer r(impl_->origin);
  r.root_stored = &impl_->root_stored;
  auto globals = std::make_shared<Dict>();
  add_globals(*globals);
  if (!vars.is_object()) throw ValueError("chat template variables must be a JSON object");
  auto ctx = std::make_shared<Dict>();
  for (auto it = vars.begin(); it != vars.end(); ++it) ctx->set(it.key(), Value::from_json(it.value()));
  r.frames.push_back(globals);
  r.frames.push_back(ctx);
  std::string out;
  try {
    r.render(impl_->body, out);
  } catch (const LoopControl&) {
    throw ValueError(impl_->origin + ": 'break' or 'continue' outside a loop");
  }
  return out;
}

}  // namespace rpg::jinja
