#include "rpg/core/args.h"

#include <charconv>
#include <cmath>
#include <iostream>

#include "rpg/core/config.h"
#include "rpg/core/error.h"

namespace rpg {

ArgParser::ArgParser(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

ArgParser& ArgParser::flag(std::string name, bool* out, std::string help) {
  options_.push_back({std::move(name), std::move(help), "", false, [out](const std::string&) { *out = true; }});
  return *this;
}

ArgParser& ArgParser::option(std::string name, std::string* out, std::string help, std::string metavar) {
  options_.push_back({std::move(name), std::move(help), std::move(metavar), true,
                      [out](const std::string& v) { *out = v; }});
  return *this;
}

ArgParser& ArgParser::option(std::string name, int64_t* out, std::string help, std::string metavar) {
  std::string flag_name = name;
  options_.push_back({std::move(name), std::move(help), std::move(metavar), true, [this, out, flag_name](const std::string& v) {
                        auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), *out);
                        if (ec != std::errc() || end != v.data() + v.size() || v.empty())
                          usage_error(str(flag_name, ": expected an integer, got '", v, "'"));
                      }});
  return *this;
}

ArgParser& ArgParser::option(std::string name, double* out, std::string help, std::string metavar) {
  std::string flag_name = name;
  options_.push_back({std::move(name), std::move(help), std::move(metavar), true, [this, out, flag_name](const std::string& v) {
                        auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), *out);
                        if (ec != std::errc() || end != v.data() + v.size() || v.empty() || !std::isfinite(*out))
                          usage_error(str(flag_name, ": expected a number, got '", v, "'"));
                      }});
  return *this;
}

ArgParser& ArgParser::option_list(std::string name, std::vector<std::string>* out, std::string help,
                                  std::string metavar) {
  options_.push_back({std::move(name), std::move(help), std::move(metavar), true,
                      [out](const std::string& v) { out->push_back(v); }});
  return *this;
}

ArgParser& ArgParser::positional(std::string name, std::string* out, std::string help, bool required) {
  positionals_.push_back({std::move(name), std::move(help), required, out});
  return *this;
}

ArgParser& ArgParser::rest(std::string name, std::vector<std::string>* out, std::string help) {
  rest_name_ = std::move(name);
  rest_help_ = std::move(help);
  rest_ = out;
  return *this;
}

ArgParser& ArgParser::epilog(std::string text) {
  epilog_ = std::move(text);
  return *this;
}

ArgParser::Option* ArgParser::find_option(const std::string& name) {
  for (auto& o : options_)
    if (o.name == name) return &o;
  return nullptr;
}

void ArgParser::usage_error(const std::string& message) const {
  throw UsageError(str(command_, ": ", message, " (see '", command_, " --help')"));
}

bool ArgParser::parse(const std::vector<std::string>& args) {
  size_t next_positional = 0;
  bool only_positionals = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (!only_positionals && (a == "--help" || a == "-h")) {
      std::cout << help();
      return false;
    }
    if (!only_positionals && a == "--") {
      only_positionals = true;
      continue;
    }
    if (!only_positionals && a.size() > 1 && a[0] == '-' && !(a[1] >= '0' && a[1] <= '9') && a[1] != '.') {
      std::string name = a, value;
      bool has_inline = false;
      if (auto eq = a.find('='); eq != std::string::npos) {
        name = a.substr(0, eq);
        value = a.substr(eq + 1);
        has_inline = true;
      }
      Option* o = find_option(name);
      if (!o) {
        std::vector<std::string> names;
        for (const auto& opt : options_) names.push_back(opt.name);
        names.push_back("--help");
        std::string hint = nearest(name, names);
        usage_error(str("unknown option '", name, "'", hint.empty() ? "" : str("; did you mean '", hint, "'?")));
      }
      if (!o->takes_value) {
        if (has_inline) usage_error(str(name, " takes no value"));
        o->set("");
        continue;
      }
      if (!has_inline) {
        if (i + 1 >= args.size()) usage_error(str(name, " needs a value (", o->metavar, ")"));
        value = args[++i];
      }
      o->set(value);
      continue;
    }
    if (next_positional < positionals_.size()) {
      *positionals_[next_positional++].out = a;
    } else if (rest_) {
      rest_->push_back(a);
    } else {
      usage_error(str("unexpected argument '", a, "'"));
    }
  }
  for (size_t k = next_positional; k < positionals_.size(); ++k)
    if (positionals_[k].required) usage_error(str("missing argument ", positionals_[k].name));
  return true;
}

std::string ArgParser::help() const {
  std::string usage = str("usage: ", command_);
  if (!options_.empty()) usage += " [options]";
  for (const auto& p : positionals_) usage += p.required ? str(" ", p.name) : str(" [", p.name, "]");
  if (rest_) usage += str(" [", rest_name_, "...]");
  std::string out = str(usage, "\n\n", summary_, "\n");
  auto row = [](const std::string& left, const std::string& right) {
    std::string l = "  " + left;
    if (l.size() < 28) l.resize(28, ' ');
    else l += "\n" + std::string(28, ' ');
    return l + right + "\n";
  };
  if (!positionals_.empty() || rest_) {
    out += "\narguments:\n";
    for (const auto& p : positionals_) out += row(p.name, p.help);
    if (rest_) out += row(rest_name_ + "...", rest_help_);
  }
  out += "\noptions:\n";
  for (const auto& o : options_) out += row(o.takes_value ? o.name + " " + o.metavar : o.name, o.help);
  out += row("-h, --help", "show this help and exit");
  if (!epilog_.empty()) out += "\n" + epilog_ + "\n";
  return out;
}

}  // namespace rpg
