// Run metrics: one JSON object per step in metrics.jsonl and TensorBoard scalar events
// (events.out.tfevents.*), both under the run directory. TensorBoard files are written in
// the TFRecord format (length, masked CRC-32C, serialized tensorflow.Event) without
// TensorFlow or protobuf: the few Event/Summary fields used are encoded here.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace rpg {

// CRC-32C (Castagnoli), and the "masked" form TFRecord stores.
uint32_t crc32c(std::string_view data, uint32_t crc = 0);
uint32_t masked_crc32c(std::string_view data);

class TensorBoardWriter {
 public:
  // Creates `dir` and a new event file in it. Throws IoError.
  explicit TensorBoardWriter(const std::filesystem::path& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void add_scalar(std::string_view tag, double value, int64_t step);
  // Flushes to the OS (and fsyncs when `durable`).
  void flush(bool durable = false);
  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(const std::string& event);
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  std::string pending_;  // records since the last flush: one write per flush
};

// Appends one line per step to `<dir>/metrics.jsonl` and the same scalars to TensorBoard.
// Resuming at step s first drops every line with step >= s, so a crash between a log
// write and a checkpoint never leaves duplicate or orphaned steps. Thread-safe: lines from
// several threads never interleave (tests/core/threads_test.cpp).
class MetricsLogger {
 public:
  MetricsLogger(const std::filesystem::path& dir, bool tensorboard, int64_t resume_step = 0);
  void log(int64_t step, const std::map<std::string, double>& metrics);
  void flush(bool durable = false);

 private:
  void flush_locked(bool durable);
  std::filesystem::path jsonl_;
  std::FILE* file_ = nullptr;
  std::mutex mu_;
  std::unique_ptr<TensorBoardWriter> tb_;

 public:
  ~MetricsLogger();
  MetricsLogger(const MetricsLogger&) = delete;
  MetricsLogger& operator=(const MetricsLogger&) = delete;
};

}  // namespace rpg
