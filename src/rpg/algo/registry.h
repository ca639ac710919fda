// A name -> function table with one signature per registry. Filled by one explicit
// registration function per registry (static self-registration objects would be dropped by
// the linker from the static library), so every entry is visible in one list.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "rpg/core/error.h"

namespace rpg::algo {

template <class Fn>
class Registry {
 public:
  // `kind` names the config key in error messages ("policy_loss", "adv_estimator").
  explicit Registry(std::string kind) : kind_(std::move(kind)) {}

  void add(const std::string& name, Fn fn) {
    if (name.empty()) throw ValueError(str(kind_, ": empty name"));
    if (!entries_.emplace(name, fn).second)
      throw ValueError(str(kind_, " '", name, "' is registered twice"));
  }

  Fn get(std::string_view name) const {
    auto it = entries_.find(std::string(name));
    if (it == entries_.end())
      throw ValueError(str("unknown ", kind_, " '", name, "'; valid: ", joined_names()));
    return it->second;
  }

  bool contains(std::string_view name) const { return entries_.count(std::string(name)) != 0; }

  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [name, fn] : entries_) out.push_back(name);
    return out;
  }

  std::string joined_names() const {
    std::string out;
    for (const auto& [name, fn] : entries_) out += (out.empty() ? "" : ", ") + name;
    return out;
  }

 private:
  std::string kind_;
  std::map<std::string, Fn> entries_;  // sorted: error messages and tests list names stably
};

}  // namespace rpg::algo
