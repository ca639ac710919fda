#include "rpg/core/metrics.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/jsonl.h"

namespace rpg {
namespace {

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli
      t[i] = c;
    }
    return t;
  }();
  return table;
}

// Protocol-buffer wire format, just what Event/Summary need.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, int field, int wire_type) { put_varint(out, static_cast<uint64_t>(field << 3 | wire_type)); }
void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}
template <class T>
void put_fixed(std::string& out, int field, T value) {
  put_key(out, field, sizeof(T) == 8 ? 1 : 5);
  char buf[sizeof(T)];
  std::memcpy(buf, &value, sizeof(T));  // little-endian host, as the wire format
  out.append(buf, sizeof(T));
}

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string event_header(int64_t step) {
  std::string e;
  put_fixed(e, 1, wall_time());  // Event.wall_time
  put_key(e, 2, 0);              // Event.step
  put_varint(e, static_cast<uint64_t>(step));
  return e;
}

}  // namespace

uint32_t crc32c(std::string_view data, uint32_t crc) {
  crc = ~crc;
  for (unsigned char c : data) crc = crc_table()[(crc ^ c) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(std::string_view data) {
  uint32_t crc = crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw IoError(str("cannot create directory ", dir.string(), ": ", ec.message()));
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  // TensorBoard orders event files by name; the pid keeps two writers in one second apart.
  path_ = dir / str("events.out.tfevents.", static_cast<int64_t>(wall_time()), ".", host, ".", getpid());
  file_ = std::fopen(path_.c_str(), "ab");
  if (!file_) throw IoError(str("cannot create ", path_.string(), ": ", std::strerror(errno)));
  std::string e = event_header(0);
  put_bytes(e, 3, "brain.Event:2");  // Event.file_version
  write_record(e);
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ && !pending_.empty()) {
    try {
      write_stream(file_, pending_, path_);  // best effort: a destructor does not throw
    } catch (const std::exception&) {
    }
  }
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::add_scalar(std::string_view tag, double value, int64_t step) {
  std::string v;
  put_bytes(v, 1, tag);                              // Summary.Value.tag
  put_fixed(v, 2, static_cast<float>(value));        // Summary.Value.simple_value
  std::string summary;
  put_bytes(summary, 1, v);                          // Summary.value
  std::string e = event_header(step);
  put_bytes(e, 5, summary);                          // Event.summary
  write_record(e);
}

void TensorBoardWriter::write_record(const std::string& event) {
  std::string rec;
  uint64_t len = event.size();
  std::string len_bytes(reinterpret_cast<const char*>(&len), 8);
  uint32_t len_crc = masked_crc32c(len_bytes), data_crc = masked_crc32c(event);
  rec += len_bytes;
  rec.append(reinterpret_cast<const char*>(&len_crc), 4);
  rec += event;
  rec.append(reinterpret_cast<const char*>(&data_crc), 4);
  pending_ += rec;
}

void TensorBoardWriter::flush(bool durable) {
  if (!pending_.empty()) {
    std::string records;
    records.swap(pending_);
    write_stream(file_, records, path_);
  }
  flush_stream(file_, path_, durable);
}

MetricsLogger::MetricsLogger(const std::filesystem::path& dir, bool tensorboard, int64_t resume_step)
    : jsonl_(dir / "metrics.jsonl") {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw IoError(str("cannot create directory ", dir.string(), ": ", ec.message()));
  if (std::filesystem::exists(jsonl_)) {
    // Keep only the steps before the resume point; a torn last line is dropped too.
    jsonl::keep_steps(jsonl_, [&](int64_t step) { return step < resume_step; });
  }
  file_ = std::fopen(jsonl_.c_str(), "ab");
  if (!file_) throw IoError(str("cannot open ", jsonl_.string(), ": ", std::strerror(errno)));
  if (tensorboard) tb_ = std::make_unique<TensorBoardWriter>(dir / "tensorboard");
}

MetricsLogger::~MetricsLogger() {
  if (file_) std::fclose(file_);
}

void MetricsLogger::log(int64_t step, const std::map<std::string, double>& metrics) {
  nlohmann::ordered_json j;
  j["step"] = step;
  for (const auto& [k, v] : metrics) {
    if (std::isfinite(v)) j[k] = v;
    else j[k] = nullptr;  // JSON has no NaN/Inf
  }
  std::string line = j.dump() + "\n";
  std::lock_guard lock(mu_);
  if (tb_)
    for (const auto& [k, v] : metrics) tb_->add_scalar(k, v, step);
  write_stream(file_, line, jsonl_);
  flush_locked(false);
}

void MetricsLogger::flush(bool durable) {
  std::lock_guard lock(mu_);
  flush_locked(durable);
}

void MetricsLogger::flush_locked(bool durable) {
  flush_stream(file_, jsonl_, durable);
  if (tb_) tb_->flush(durable);
}

}  // namespace rpg
