// Small text utilities shared by modules that otherwise have nothing in common.
#pragma once

#include <string>
#include <string_view>

namespace rpg {

// HTML/XML escaping with the entities Jinja2's `escape` filter (markupsafe) emits, so the
// chat-template engine and the HTML report produce the same text for the same input; safe
// both in element text and in quoted attribute values.
std::string html_escape(std::string_view s);

}  // namespace rpg
