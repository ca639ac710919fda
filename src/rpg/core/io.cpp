#include "rpg/core/io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "rpg/core/error.h"
#include "rpg/core/test_hook.h"

namespace fs = std::filesystem;

namespace rpg {
namespace {

std::string unique_suffix() {
  static thread_local std::mt19937_64 gen(std::random_device{}() ^ static_cast<uint64_t>(::getpid()));
  return str(".tmp.", ::getpid(), ".", gen() % 1000000007ull);
}

[[noreturn]] void throw_errno(std::string_view what, const fs::path& path) {
  throw IoError(str(what, " ", path.string(), ": ", errno_text(errno)));
}

}  // namespace

std::string errno_text(int err) {
  const char* name = ::strerrorname_np(err);
  return name ? str(std::strerror(err), " (", name, ")") : std::string(std::strerror(err));
}

void write_fd(int fd, std::string_view data, const fs::path& path) {
  if (const int fault = test_hook::write_fault(path.string())) {
    const size_t half = data.size() / 2;
    for (size_t done = 0; done < half;) {
      const ssize_t n = ::write(fd, data.data() + done, half - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    throw IoError(str("cannot write ", path.string(), ": ", errno_text(fault)));
  }
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno("cannot write", path);
    p += n;
    left -= static_cast<size_t>(n);
  }
}

void write_stream(std::FILE* f, std::string_view data, const fs::path& path) {
  if (const int fault = test_hook::write_fault(path.string())) {
    std::fwrite(data.data(), 1, data.size() / 2, f);
    std::fflush(f);
    throw IoError(str("cannot write ", path.string(), ": ", errno_text(fault)));
  }
  if (std::fwrite(data.data(), 1, data.size(), f) != data.size()) throw_errno("cannot write", path);
}

void flush_stream(std::FILE* f, const fs::path& path, bool durable) {
  if (std::fflush(f) != 0) throw_errno("cannot write", path);
  if (durable && ::fsync(::fileno(f)) != 0) throw_errno("cannot fsync", path);
}

void append_file(const fs::path& path, std::string_view data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno("cannot open", path);
  try {
    write_fd(fd, data, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw_errno("cannot write", path);
}

OutputFile::OutputFile(fs::path path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_errno("cannot create", path_);
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void OutputFile::write(std::string_view data) {
  if (pending_.size() + data.size() < kBuffer) {
    pending_.append(data);
    return;
  }
  if (!pending_.empty()) {
    write_fd(fd_, pending_, path_);
    pending_.clear();
  }
  if (data.size() >= kBuffer) write_fd(fd_, data, path_);
  else pending_.append(data);
}

void OutputFile::flush() {
  if (!pending_.empty()) {
    write_fd(fd_, pending_, path_);
    pending_.clear();
  }
}

void OutputFile::close() {
  flush();
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw_errno("cannot write", path_);
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(str("cannot open ", path.string(), ": ", std::strerror(errno)));
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) throw IoError(str("cannot read ", path.string()));
  return out.str();
}

namespace {
std::string mib(std::uint64_t bytes) {
  return bytes % (std::uint64_t{1} << 20) == 0 ? str(bytes >> 20, " MiB") : str(bytes, " bytes");
}
}  // namespace

std::string read_file(const fs::path& path, std::uint64_t max_bytes, std::string_view what) {
  auto over = [&](const std::string& size) {
    return FormatError(str(path.string(), ": ", size, " is over the ", mib(max_bytes), " budget of a ", what,
                           " (read whole into memory)"));
  };
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    const std::uint64_t size = fs::file_size(path, ec);
    if (!ec && size > max_bytes) throw over(str(size, " bytes"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(str("cannot open ", path.string(), ": ", std::strerror(errno)));
  std::string out;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    out.append(buf, static_cast<size_t>(in.gcount()));
    if (out.size() > max_bytes) throw over(str("more than ", max_bytes, " bytes"));
  }
  if (in.bad()) throw IoError(str("cannot read ", path.string()));
  return out;
}

void fsync_path(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno("cannot open for fsync", path);
  int rc = ::fsync(fd);
  int saved = errno;
  ::close(fd);
  errno = saved;
  if (rc != 0) throw_errno("cannot fsync", path);
}

void write_file_atomic(const fs::path& path, std::string_view data) {
  fs::path parent = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) throw IoError(str("cannot create directory ", parent.string(), ": ", ec.message()));
  fs::path tmp = path;
  tmp += unique_suffix();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno("cannot create", tmp);
  try {
    write_fd(fd, data, path);
  } catch (const IoError&) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int saved = errno;
    ::unlink(tmp.c_str());
    errno = saved;
    throw_errno("cannot flush", path);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int saved = errno;
    ::unlink(tmp.c_str());
    errno = saved;
    throw_errno("cannot rename into place", path);
  }
  fsync_path(parent);
}

AtomicDir::AtomicDir(fs::path final_path) : final_(std::move(final_path)) {
  if (final_.filename().empty()) final_ = final_.parent_path();
  tmp_ = final_;
  tmp_ += unique_suffix();
  std::error_code ec;
  fs::create_directories(tmp_, ec);
  if (ec) throw IoError(str("cannot create directory ", tmp_.string(), ": ", ec.message()));
}

AtomicDir::~AtomicDir() {
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }
}

void AtomicDir::commit() {
  // Make the contents durable before the name that publishes them.
  for (const auto& entry : fs::recursive_directory_iterator(tmp_))
    if (entry.is_regular_file() || entry.is_directory()) fsync_path(entry.path());
  fsync_path(tmp_);
  std::error_code ec;
  fs::path old;
  if (fs::exists(final_)) {
    old = final_;
    old += unique_suffix() + ".old";
    fs::rename(final_, old, ec);
    if (ec) throw IoError(str("cannot move aside ", final_.string(), ": ", ec.message()));
  }
  fs::rename(tmp_, final_, ec);
  if (ec) {
    std::error_code ignored;
    if (!old.empty()) fs::rename(old, final_, ignored);  // the previous version stays published
    throw IoError(str("cannot rename ", tmp_.string(), " to ", final_.string(), ": ", ec.message()));
  }
  committed_ = true;
  fsync_path(final_.parent_path().empty() ? fs::path(".") : final_.parent_path());
  if (!old.empty()) fs::remove_all(old, ec);
}

int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t value = 0;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return value * 1024;  // the kernel reports kB
  }
  return -1;
}

std::string format_bytes(double bytes) {
  std::ostringstream out;
  out.precision(bytes >= 10.0 * (1 << 30) ? 0 : 1);
  out << std::fixed;
  if (bytes >= double(1 << 30)) out << bytes / double(1 << 30) << " GiB";
  else out << bytes / double(1 << 20) << " MiB";
  return out.str();
}

namespace {
bool is_within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin(), o = outer.begin();
  for (; o != outer.end(); ++o, ++i) {
    if (o->empty()) continue;  // a trailing separator
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}
}  // namespace

void check_output_apart(const NamedPath& output, const std::vector<NamedPath>& inputs) {
  if (output.path.empty()) return;
  std::error_code ec;
  const fs::path out = fs::weakly_canonical(fs::absolute(output.path), ec);
  if (ec) return;  // unresolvable: the write itself reports it
  for (const auto& in : inputs) {
    if (in.path.empty()) continue;
    const fs::path src = fs::weakly_canonical(fs::absolute(in.path), ec);
    if (ec) continue;
    const char* how = out == src                ? "is the same path as"
                      : is_within(out, src)     ? "lies inside"
                      : is_within(src, out)     ? "contains"
                                                : nullptr;
    if (how)
      throw ValueError(str(output.name, " ", output.path.string(), " ", how, " ", in.name, " ", in.path.string(),
                           ": writing it would destroy the input; choose another output"));
  }
}

}  // namespace rpg
