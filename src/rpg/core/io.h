// File helpers. Every file rpg writes goes through write_file_atomic (or an AtomicDir),
// so a reader never observes a half-written file: data goes to a temporary name beside
// the target, is fsynced, then renamed over it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace rpg {

// Reads a whole file. Throws IoError naming the path.
std::string read_file(const std::filesystem::path& path);

// The same for a file parsed whole into memory (a JSON DOM takes ~10x its bytes): one over
// `max_bytes` is a FormatError naming the path, its size and the budget ("what" says what the
// file is, e.g. "tokenizer.json"), raised from the file's size before any byte is read, or
// after max_bytes + 1 bytes of a stream without a size (a pipe, /dev/zero).
std::string read_file(const std::filesystem::path& path, std::uint64_t max_bytes, std::string_view what);

// The budgets of the JSON and template files rpg reads whole (issue 34): far above any real
// checkpoint's (Gemma 3's tokenizer.json is ~33 MB, a config.json a few KB).
inline constexpr std::uint64_t kTokenizerJsonBudget = std::uint64_t{512} << 20;
inline constexpr std::uint64_t kTokenizerConfigBudget = std::uint64_t{64} << 20;
inline constexpr std::uint64_t kSmallJsonBudget = std::uint64_t{16} << 20;  // config.json, index, jinja

// Writes `data` to `path` atomically (temp file in the same directory, fsync, rename,
// fsync of the directory). Creates missing parent directories. Throws IoError.
void write_file_atomic(const std::filesystem::path& path, std::string_view data);

// "No space left on device (ENOSPC)": strerror plus the errno's name, for one-line errors.
std::string errno_text(int err);

// The one place rpg's writers hand bytes to the OS: writes all of `data` to the open
// descriptor `fd` of `path` (short writes and EINTR retried). Throws IoError
// "cannot write <path>: <errno_text>". Fault-injection point RPG_TEST_FAIL_WRITE
// (core/test_hook.h): the failing call first writes half of `data`, as a disk that fills
// mid-write does, then fails.
void write_fd(int fd, std::string_view data, const std::filesystem::path& path);
// The same for a stdio stream (the bytes go to its buffer; flush_stream reports late
// errors).
void write_stream(std::FILE* f, std::string_view data, const std::filesystem::path& path);
void flush_stream(std::FILE* f, const std::filesystem::path& path, bool durable = false);

// Appends `data` to `path` (created when missing; its directory must exist) in one write_fd
// call, so the fault hook sees it. For JSON Lines logs (samples.jsonl): a write that fails
// or is killed half way leaves a torn last line, which jsonl's readers and keep_steps drop.
// Throws IoError "cannot open|write <path>: <errno_text>".
void append_file(const std::filesystem::path& path, std::string_view data);

// A file created (or truncated) for writing through write_fd. Small pieces (a safetensors
// header, small tensors) are gathered into writes of >= 4 MiB; larger ones are written
// directly. close() writes the rest and reports errors; the destructor closes silently.
// Used inside an AtomicDir for large files.
class OutputFile {
 public:
  explicit OutputFile(std::filesystem::path path);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  void write(std::string_view data);
  // Hands what is gathered to the OS now (a kill test's "half written" point).
  void flush();
  void close();

 private:
  static constexpr size_t kBuffer = size_t{4} << 20;
  std::filesystem::path path_;
  int fd_ = -1;
  std::string pending_;
};

// MemAvailable of /proc/meminfo in bytes (what can be allocated without swapping), or -1
// where it cannot be read.
int64_t available_memory_bytes();

// "3.2 GiB": a byte count for messages.
std::string format_bytes(double bytes);

// One input of a command, for check_output_apart: what the user called it (a flag or a
// key) and its path.
struct NamedPath {
  std::string name;
  std::filesystem::path path;
};

// A command writing `output` (named `output_name`) must not destroy what it reads: refuses
// (ValueError naming both) an output that is, contains or lies inside one of `inputs`.
// Paths are compared after resolving symbolic links and `..` (std::filesystem::weakly_
// canonical), so `dir/../dir/model` and a link to it count as the same place. Inputs that
// are empty paths are skipped.
void check_output_apart(const NamedPath& output, const std::vector<NamedPath>& inputs);

// fsyncs a file or directory. Throws IoError.
void fsync_path(const std::filesystem::path& path);

// A directory built under a temporary name and published by one rename.
//   AtomicDir dir(final_path);  write into dir.path();  dir.commit();
// Without commit() the temporary directory is removed by the destructor. An existing
// directory at the final path is replaced (moved aside, then removed) on commit.
class AtomicDir {
 public:
  explicit AtomicDir(std::filesystem::path final_path);
  ~AtomicDir();
  AtomicDir(const AtomicDir&) = delete;
  AtomicDir& operator=(const AtomicDir&) = delete;

  const std::filesystem::path& path() const { return tmp_; }
  void commit();

 private:
  std::filesystem::path final_;
  std::filesystem::path tmp_;
  bool committed_ = false;
};

}  // namespace rpg
