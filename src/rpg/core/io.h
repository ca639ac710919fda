// File helpers. Every file rpg writes goes through write_file_atomic (or an AtomicDir),
// so a reader never observes a half-written file: data goes to a temporary name beside
// the target, is fsynced, then renamed over it.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace rpg {

// Reads a whole file. Throws IoError naming the path.
std::string read_file(const std::filesystem::path& path);

// Writes `data` to `path` atomically (temp file in the same directory, fsync, rename,
// fsync of the directory). Creates missing parent directories. Throws IoError.
void write_file_atomic(const std::filesystem::path& path, std::string_view data);

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
