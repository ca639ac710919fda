// JSON Lines files (metrics.jsonl, samples.jsonl, responses, SFT pairs, problem records):
// one reader with one rule for a torn last line, and one step-based truncation for resumes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace rpg::jsonl {

struct ReadOptions {
  // A file another process may have been killed while appending to: an unparsable *last*
  // line is a torn write and is skipped. Every other bad line is a FormatError naming
  // "file:line".
  bool allow_torn_last_line = true;
  // Lines must be JSON objects (not arrays, strings or numbers).
  bool objects_only = true;
  // A longer line is a FormatError naming the budget: its parsed form can take ~10x its bytes
  // (a DOM node per value), and the chat template's 64 MiB string budget refuses such a
  // prompt later anyway.
  size_t max_line_bytes = size_t{64} << 20;
};

using LineFn = std::function<void(size_t, nlohmann::json&)>;

// Calls fn(line_number, value) for every non-blank line of `text`, in order (line numbers
// from 1). A bad line throws FormatError "<source>:<line>: not valid JSON" or
// "<source>:<line>: expected a JSON object, got <type>".
void parse(std::string_view text, std::string_view source, const LineFn& fn, const ReadOptions& options = {});

// parse() over a file's contents; IoError when it cannot be read.
void for_each(const std::filesystem::path& path, const LineFn& fn, const ReadOptions& options = {});

// All values of the file, in order.
std::vector<nlohmann::json> read(const std::filesystem::path& path, const ReadOptions& options = {});

// Rewrites `path` atomically keeping the lines whose integer "step" satisfies keep(step);
// lines without an integer step and torn lines are dropped. A missing file is left missing.
void keep_steps(const std::filesystem::path& path, const std::function<bool(int64_t)>& keep);

}  // namespace rpg::jsonl
