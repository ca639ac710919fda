#include "rpg/dist/layout.h"

#include <cerrno>
#include <cstdlib>
#include <vector>

#include "rpg/core/error.h"

namespace rpg::dist {
namespace {

std::optional<std::string> process_getenv(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  if (!v) return std::nullopt;
  return std::string(v);
}

// A base-10 integer that fills the whole string, in [lo, hi].
long parse_int(const std::string& name, const std::string& value, long lo, long hi) {
  if (value.empty()) throw ConfigError(str("environment variable ", name, " is empty (expected an integer)"));
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(value.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || value[0] == ' ' || value[0] == '+')
    throw ConfigError(str("environment variable ", name, "='", value, "' is not an integer"));
  if (v < lo || v > hi)
    throw ConfigError(str("environment variable ", name, "=", value, " is out of range [", lo, ", ", hi, "]"));
  return v;
}

class Env {
 public:
  Env(const EnvLookup& get, std::string launcher, std::string all) : get_(get), launcher_(std::move(launcher)), all_(std::move(all)) {}
  std::optional<std::string> maybe(const std::string& name) const { return get_(name); }
  std::string required(const std::string& name) const {
    auto v = get_(name);
    if (!v)
      throw ConfigError(str(launcher_, " environment is incomplete: ", name, " is not set (a ", launcher_,
                            " launch sets ", all_, ")"));
    return *v;
  }
  int required_int(const std::string& name, long lo, long hi) const {
    return static_cast<int>(parse_int(name, required(name), lo, hi));
  }

 private:
  const EnvLookup& get_;
  std::string launcher_, all_;
};

constexpr long kMaxRanks = 1 << 20;

void check_common(RankLayout& l, const std::string& rank_var, const std::string& world_var) {
  if (l.rank >= l.world_size)
    throw ConfigError(str("environment variable ", rank_var, "=", l.rank, " is not below ", world_var, "=", l.world_size));
  if (l.master_addr.empty()) throw ConfigError("environment variable MASTER_ADDR is empty");
}

RankLayout from_torchrun(const EnvLookup& get) {
  Env env(get, "torchrun", "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT");
  RankLayout l;
  l.source = "torchrun";
  l.world_size = env.required_int("WORLD_SIZE", 1, kMaxRanks);
  l.rank = env.required_int("RANK", 0, kMaxRanks);
  l.local_world_size = env.required_int("LOCAL_WORLD_SIZE", 1, kMaxRanks);
  l.local_rank = env.required_int("LOCAL_RANK", 0, kMaxRanks);
  l.master_addr = env.required("MASTER_ADDR");
  l.master_port = env.required_int("MASTER_PORT", 1, 65535);
  check_common(l, "RANK", "WORLD_SIZE");
  if (l.local_rank >= l.local_world_size)
    throw ConfigError(str("environment variable LOCAL_RANK=", l.local_rank, " is not below LOCAL_WORLD_SIZE=", l.local_world_size));
  if (l.world_size % l.local_world_size != 0)
    throw ConfigError(str("environment variable WORLD_SIZE=", l.world_size, " is not a multiple of LOCAL_WORLD_SIZE=",
                          l.local_world_size, " (every node runs the same number of ranks)"));
  l.nnodes = l.world_size / l.local_world_size;
  std::string node_var = get("NODE_RANK") ? "NODE_RANK" : get("GROUP_RANK") ? "GROUP_RANK" : "";
  l.node_rank = node_var.empty() ? l.rank / l.local_world_size : env.required_int(node_var, 0, kMaxRanks);
  if (l.node_rank >= l.nnodes)
    throw ConfigError(str("environment variable ", node_var, "=", l.node_rank, " is not below the number of nodes ",
                          l.nnodes, " (WORLD_SIZE / LOCAL_WORLD_SIZE)"));
  l.agent_store = get("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  if (auto restarts = get("TORCHELASTIC_RESTART_COUNT"))
    l.restart_count = static_cast<int>(parse_int("TORCHELASTIC_RESTART_COUNT", *restarts, 0, kMaxRanks));
  if (l.rank != l.node_rank * l.local_world_size + l.local_rank)
    throw ConfigError(str("environment variable RANK=", l.rank, " does not match ", node_var.empty() ? "node" : node_var, " ",
                          l.node_rank, " x LOCAL_WORLD_SIZE ", l.local_world_size, " + LOCAL_RANK ", l.local_rank));
  return l;
}

RankLayout from_slurm(const EnvLookup& get) {
  Env env(get, "SLURM",
          "SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_NNODES, SLURM_TASKS_PER_NODE and "
          "SLURM_NODELIST");
  RankLayout l;
  l.source = "slurm";
  l.world_size = env.required_int("SLURM_NTASKS", 1, kMaxRanks);
  l.rank = env.required_int("SLURM_PROCID", 0, kMaxRanks);
  l.local_rank = env.required_int("SLURM_LOCALID", 0, kMaxRanks);
  l.node_rank = env.required_int("SLURM_NODEID", 0, kMaxRanks);
  std::string nnodes_var = get("SLURM_NNODES") ? "SLURM_NNODES" : get("SLURM_JOB_NUM_NODES") ? "SLURM_JOB_NUM_NODES" : "SLURM_NNODES";
  l.nnodes = env.required_int(nnodes_var, 1, kMaxRanks);
  if (l.node_rank >= l.nnodes)
    throw ConfigError(str("environment variable SLURM_NODEID=", l.node_rank, " is not below ", nnodes_var, "=", l.nnodes));
  std::string tasks_var = get("SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
  try {
    l.local_world_size = slurm_tasks_on_node(env.required(tasks_var), l.node_rank);
  } catch (const ConfigError& e) {
    throw ConfigError(str("environment variable ", tasks_var, ": ", e.what()));
  }
  if (l.local_rank >= l.local_world_size)
    throw ConfigError(str("environment variable SLURM_LOCALID=", l.local_rank, " is not below the ", l.local_world_size,
                          " tasks of node ", l.node_rank, " (", tasks_var, ")"));
  if (auto addr = get("MASTER_ADDR")) {
    l.master_addr = *addr;
  } else {
    std::string list_var = get("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST"
                           : get("SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST"
                                                      : "SLURM_NODELIST";
    l.master_addr = first_slurm_host(env.required(list_var), list_var);
  }
  l.master_port = get("MASTER_PORT") ? static_cast<int>(parse_int("MASTER_PORT", *get("MASTER_PORT"), 1, 65535)) : 29500;
  check_common(l, "SLURM_PROCID", "SLURM_NTASKS");
  return l;
}

}  // namespace

RankLayout layout_from_env(const EnvLookup& get) {
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"})
    if (get(v)) return from_torchrun(get);
  if (get("SLURM_PROCID")) return from_slurm(get);
  return RankLayout{};
}

RankLayout layout_from_env() { return layout_from_env(process_getenv); }

std::string first_slurm_host(const std::string& nodelist, const std::string& what) {
  // The first top-level item: commas inside brackets separate ranges, not hosts.
  std::string item;
  int depth = 0;
  for (char c : nodelist) {
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) break;
    if (c == ',' && depth == 0) break;
    item += c;
  }
  if (depth != 0) throw ConfigError(str("environment variable ", what, "='", nodelist, "' has unbalanced brackets"));
  if (item.empty()) throw ConfigError(str("environment variable ", what, "='", nodelist, "' names no host"));
  // Each bracket group contributes its first value: "[01-04,07]" -> "01" (padding kept).
  std::string host;
  for (size_t i = 0; i < item.size(); ++i) {
    if (item[i] != '[') {
      host += item[i];
      continue;
    }
    size_t close = item.find(']', i);
    std::string group = item.substr(i + 1, close - i - 1);
    std::string first = group.substr(0, group.find_first_of(",-"));
    if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos)
      throw ConfigError(str("environment variable ", what, "='", nodelist, "' has a malformed range [", group, "]"));
    host += first;
    i = close;
  }
  return host;
}

int slurm_tasks_on_node(const std::string& spec, int node) {
  // Comma-separated "N" or "N(xR)" entries.
  int seen = 0;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string entry = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    long count = 0, repeat = 1;
    size_t paren = entry.find("(x");
    try {
      count = parse_int("tasks", entry.substr(0, paren), 1, kMaxRanks);
      if (paren != std::string::npos) {
        if (entry.back() != ')') throw ConfigError("");
        repeat = parse_int("repeat", entry.substr(paren + 2, entry.size() - paren - 3), 1, kMaxRanks);
      }
    } catch (const ConfigError&) {
      throw ConfigError(str("'", spec, "' is not a task count list like 2(x3),1"));
    }
    if (node < seen + repeat) return static_cast<int>(count);
    seen += static_cast<int>(repeat);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  throw ConfigError(str("'", spec, "' lists ", seen, " nodes, not node ", node));
}

std::string describe(const RankLayout& l) {
  return str("rank ", l.rank, "/", l.world_size, " (local ", l.local_rank, "/", l.local_world_size, ", node ", l.node_rank,
             "/", l.nnodes, ") via ", l.source, ", store ", l.master_addr, ":", l.master_port);
}

}  // namespace rpg::dist
