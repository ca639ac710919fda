#include "rpg/train/resume_check.h"

#include <algorithm>
#include <map>

#include "rpg/core/config.h"
#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/log.h"

namespace fs = std::filesystem;

namespace rpg::train {
namespace {

constexpr const char* kConfigFile = "config.yaml";
constexpr const char* kAbsent = "(absent)";

// A node in YAML flow syntax, for one-line reports.
std::string flow(const ConfigNode& n) {
  switch (n.kind) {
    case ConfigNode::Kind::Null: return "null";
    case ConfigNode::Kind::Scalar: return n.quoted ? "\"" + n.scalar + "\"" : n.scalar;
    case ConfigNode::Kind::List: {
      std::string out = "[";
      for (size_t i = 0; i < n.list.size(); ++i) out += (i ? ", " : "") + flow(n.list[i]);
      return out + "]";
    }
    case ConfigNode::Kind::Map: {
      std::string out = "{";
      for (size_t i = 0; i < n.map.size(); ++i) out += (i ? ", " : "") + n.map[i].key + ": " + flow(n.map[i].value);
      return out + "}";
    }
  }
  return "";
}

// Dotted key -> value for every leaf; an empty map is a leaf ("{}").
void flatten(const ConfigNode& n, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (n.kind == ConfigNode::Kind::Map && !n.map.empty()) {
    for (const auto& e : n.map) flatten(e.value, config_detail::join_key(prefix, e.key), out);
    return;
  }
  out[prefix] = flow(n);
}

}  // namespace

std::vector<ConfigChange> config_changes(std::string_view before_yaml, std::string_view after_yaml) {
  std::map<std::string, std::string> before, after;
  flatten(parse_yaml(before_yaml, "<checkpoint config>"), "", before);
  flatten(parse_yaml(after_yaml, "<current config>"), "", after);
  std::vector<ConfigChange> out;
  for (const auto& [key, value] : before) {
    auto it = after.find(key);
    const std::string now = it == after.end() ? kAbsent : it->second;
    if (now != value) out.push_back({key, value, now});
  }
  for (const auto& [key, value] : after)
    if (!before.count(key)) out.push_back({key, kAbsent, value});
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.key < b.key; });
  return out;
}

std::string format_change(const ConfigChange& c) {
  return str("resume: config changed: ", c.key, " ", c.before, " -> ", c.after);
}

void save_checkpoint_config(const fs::path& checkpoint_dir, const TrainConfig& cfg) {
  write_file_atomic(checkpoint_dir / kConfigFile, config_to_yaml(cfg));
}

std::vector<ConfigChange> report_config_changes(const fs::path& checkpoint_dir, const TrainConfig& cfg) {
  const fs::path file = checkpoint_dir / kConfigFile;
  if (!fs::exists(file)) {
    log_info(str("resume: ", checkpoint_dir.string(), " has no ", kConfigFile,
                 " (written by an older rpg): config changes are not reported"));
    return {};
  }
  std::vector<ConfigChange> changes;
  try {
    changes = config_changes(read_file(file), config_to_yaml(cfg));
  } catch (const Error& e) {
    // The saved config only serves this report; resuming does not depend on it.
    log_warn(str("resume: cannot compare with the checkpoint's config: ", e.what()));
    return {};
  }
  std::erase_if(changes, [](const ConfigChange& c) {
    return c.key == "trainer.resume_mode" || c.key == "trainer.resume_path";
  });
  for (const auto& c : changes) log_info(format_change(c));
  return changes;
}

}  // namespace rpg::train
