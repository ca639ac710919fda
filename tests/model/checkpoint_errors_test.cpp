// Malformed checkpoints are rpg::FormatError naming the file and the tensor, never a
// crash: each case takes a valid checkpoint and breaks one thing in it.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <malloc.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "model_test_util.h"
#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/model/causal_lm.h"
#include "rpg/model/safetensors.h"
#include "test_util.h"

namespace rpg::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct RawFile {
  json header;
  std::string data;
};

RawFile read_raw(const fs::path& p) {
  std::string bytes = read_file(p);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  return {json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
}

void write_raw(const fs::path& p, const RawFile& f) {
  std::string h = f.header.dump();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  std::ofstream(p, std::ios::binary | std::ios::trunc) << out << h << f.data;
}

class CheckpointErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = dir_ / "m";
    test::random_model("qwen2").save_pretrained(model_);
    file_ = model_ / "model.safetensors";
  }
  // Loads and expects a FormatError whose message names `file` and contains each needle.
  void expect_error(const std::vector<std::string>& needles, const fs::path& file) {
    try {
      CausalLM::from_pretrained(model_);
      ADD_FAILURE() << "loaded a broken checkpoint";
    } catch (const FormatError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(file.string()), std::string::npos) << msg;
      for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
    }
  }
  void edit(const std::function<void(RawFile&)>& f) {
    RawFile r = read_raw(file_);
    f(r);
    write_raw(file_, r);
  }
  rpg::test::TempDir dir_;
  fs::path model_, file_;
};

TEST_F(CheckpointErrors, ValidCheckpointLoads) { EXPECT_NO_THROW(CausalLM::from_pretrained(model_)); }

TEST_F(CheckpointErrors, TruncatedFile) {
  std::string bytes = read_file(file_);
  std::ofstream(file_, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() - 100);
  expect_error({"tensor 'lm_head.weight'", "beyond the data section"}, file_);
  std::ofstream(file_, std::ios::binary | std::ios::trunc) << bytes.substr(0, 5);
  expect_error({"truncated"}, file_);
}

TEST_F(CheckpointErrors, HeaderLengthBeyondTheFile) {
  std::string bytes = read_file(file_);
  uint64_t n = bytes.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  std::ofstream(file_, std::ios::binary | std::ios::trunc) << bytes;
  expect_error({"header length", "beyond"}, file_);
}

TEST_F(CheckpointErrors, HeaderIsNotJson) {
  std::string bytes = read_file(file_);
  bytes[9] = '\x01';
  std::ofstream(file_, std::ios::binary | std::ios::trunc) << bytes;
  expect_error({"not valid JSON"}, file_);
}

TEST_F(CheckpointErrors, OffsetsOutOfRange) {
  edit([](RawFile& r) { r.header["model.norm.weight"]["data_offsets"] = {1ull << 40, (1ull << 40) + 192}; });
  expect_error({"tensor 'model.norm.weight'", "beyond the data section"}, file_);
}

TEST_F(CheckpointErrors, OffsetsReversed) {
  edit([](RawFile& r) { r.header["model.norm.weight"]["data_offsets"] = {192, 0}; });
  expect_error({"tensor 'model.norm.weight'", "reversed"}, file_);
}

TEST_F(CheckpointErrors, OverlappingOffsets) {
  edit([](RawFile& r) {
    r.header["model.norm.weight"]["data_offsets"] = r.header["model.layers.0.input_layernorm.weight"]["data_offsets"];
  });
  expect_error({"overlap", "model.norm.weight", "model.layers.0.input_layernorm.weight"}, file_);
}

TEST_F(CheckpointErrors, SizeDisagreesWithShape) {
  edit([](RawFile& r) { r.header["model.norm.weight"]["shape"] = {49}; });
  expect_error({"tensor 'model.norm.weight'", "need 196"}, file_);
}

TEST_F(CheckpointErrors, UnknownDtype) {
  edit([](RawFile& r) { r.header["model.norm.weight"]["dtype"] = "F33"; });
  expect_error({"tensor 'model.norm.weight'", "unknown dtype"}, file_);
}

TEST_F(CheckpointErrors, NonFloatDtype) {
  edit([](RawFile& r) { r.header["model.norm.weight"]["dtype"] = "I32"; });
  expect_error({"tensor 'model.norm.weight'", "dtype I32"}, file_);
}

TEST_F(CheckpointErrors, MissingTensor) {
  edit([](RawFile& r) { r.header.erase("model.layers.1.mlp.up_proj.weight"); });
  expect_error({"tensor 'model.layers.1.mlp.up_proj.weight'", "missing"}, file_);
}

TEST_F(CheckpointErrors, WrongShapeForTheConfig) {
  // Same bytes, different shape: only the config can tell it is wrong.
  edit([](RawFile& r) { r.header["model.norm.weight"]["shape"] = {24, 2}; });
  expect_error({"tensor 'model.norm.weight'", "shape [24, 2]", "expected [48]"}, file_);
}

TEST_F(CheckpointErrors, UnexpectedTensor) {
  edit([](RawFile& r) { r.header["model.layers.9.mlp.up_proj.weight"] = {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {0, 0}}}; });
  expect_error({"unexpected tensor 'model.layers.9.mlp.up_proj.weight'"}, file_);
}

TEST_F(CheckpointErrors, ConfigWithNaNOrUnsupportedValues) {
  std::string good = read_file(model_ / "config.json");
  std::string nan = good;
  nan.replace(nan.find("\"rms_norm_eps\""), 14, "\"rms_norm_eps\": NaN, \"x\"");
  write_file_atomic(model_ / "config.json", nan);
  expect_error({"not valid JSON"}, model_ / "config.json");
  std::string other = good;
  other.replace(other.find("\"qwen2\""), 7, "\"gemma\"");
  write_file_atomic(model_ / "config.json", other);
  expect_error({"model_type: got 'gemma'"}, model_ / "config.json");
}

TEST_F(CheckpointErrors, ConfigDisagreesWithTensorShapes) {
  std::string cfg = read_file(model_ / "config.json");
  cfg.replace(cfg.find("\"intermediate_size\": 80"), 23, "\"intermediate_size\": 81");
  write_file_atomic(model_ / "config.json", cfg);
  expect_error({"tensor 'model.layers.0.mlp.gate_proj.weight'", "shape [80, 48]", "expected [81, 48]"}, file_);
}

TEST_F(CheckpointErrors, ShardedIndexProblems) {
  fs::path sharded = dir_ / "s";
  SaveOptions o;
  o.max_shard_bytes = 30000;
  CausalLM::from_pretrained(model_).save_pretrained(sharded, o);
  model_ = sharded;
  fs::path index = sharded / "model.safetensors.index.json";
  json idx = json::parse(read_file(index));
  std::string first_file = idx["weight_map"]["model.embed_tokens.weight"];
  // A tensor listed in the index but absent from its shard.
  json extra = idx;
  extra["weight_map"]["model.layers.0.mlp.extra.weight"] = first_file;
  write_file_atomic(index, extra.dump());
  expect_error({"tensor 'model.layers.0.mlp.extra.weight'", "listed in the index is missing"}, sharded / first_file);
  // A tensor whose shard is not the one the index names (moved from a shard that keeps
  // other tensors, so that shard is still read).
  std::map<std::string, int> per_file;
  for (auto& [name, f] : idx["weight_map"].items()) per_file[f.get<std::string>()]++;
  std::string moved_name, home;
  for (auto& [name, f] : idx["weight_map"].items())
    if (per_file[f.get<std::string>()] > 1) {
      moved_name = name;
      home = f.get<std::string>();
      break;
    }
  ASSERT_FALSE(moved_name.empty());
  std::string other = home == first_file ? std::string(idx["weight_map"]["lm_head.weight"]) : first_file;
  ASSERT_NE(other, home);
  json moved = idx;
  moved["weight_map"][moved_name] = other;
  write_file_atomic(index, moved.dump());
  expect_error({"tensor '" + moved_name + "'", "not listed for this file"}, sharded / home);
  // A shard file missing entirely: an I/O error naming it.
  write_file_atomic(index, idx.dump());
  fs::remove(sharded / other);
  try {
    CausalLM::from_pretrained(sharded);
    ADD_FAILURE() << "loaded without a shard";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(other), std::string::npos) << e.what();
  }
  // A weight_map entry that escapes the directory.
  json escape = idx;
  escape["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors";
  write_file_atomic(index, escape.dump());
  try {
    CausalLM::from_pretrained(sharded);
    ADD_FAILURE() << "followed a path out of the model directory";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("model.norm.weight"), std::string::npos) << e.what();
  }
}

TEST_F(CheckpointErrors, SaveErrorsKeepTheOldDirectoryAndSavesReplaceItWhole) {
  CausalLM m = CausalLM::from_pretrained(model_);
  std::string before = read_file(file_);
  // Sharded output whose extra-file copy fails: an error, and the old model untouched.
  SaveOptions o;
  o.max_shard_bytes = 30000;
  o.copy_files_from = dir_ / "does-not-exist";
  EXPECT_THROW(m.save_pretrained(model_, o), IoError);
  EXPECT_EQ(read_file(file_), before);
  EXPECT_FALSE(fs::exists(model_ / "model.safetensors.index.json"));
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir_.path())) entries += e.path().filename() != "m";
  EXPECT_EQ(entries, 0) << "no temporary directory left behind";
  // A successful save replaces it as a whole (the single file becomes shards).
  o.copy_files_from.clear();
  m.save_pretrained(model_, o);
  EXPECT_FALSE(fs::exists(file_));
  EXPECT_TRUE(fs::exists(model_ / "model.safetensors.index.json"));
  EXPECT_NO_THROW(CausalLM::from_pretrained(model_));
}

TEST(Safetensors, SerializedHeaderRoundTripsAndIsAligned) {
  namespace st = safetensors;
  std::vector<st::TensorInfo> ts = {{"a", st::DType::kBF16, {3, 5}, 0, 30}, {"b", st::DType::kF32, {}, 30, 34}};
  std::string h = st::serialize_header(ts, {{"format", "pt"}});
  EXPECT_EQ(h.size() % 8, 0u);
  std::string file = h + std::string(34, '\0');
  auto parsed = st::parse(reinterpret_cast<const uint8_t*>(file.data()), file.size(), "mem");
  ASSERT_EQ(parsed.tensors.size(), 2u);
  EXPECT_EQ(parsed.tensors[0].shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(parsed.tensors[1].numel(), 1);
  EXPECT_EQ(parsed.metadata.at("format"), "pt");
  EXPECT_EQ(parsed.data_start, h.size());
}

}  // namespace
}  // namespace rpg::model

namespace rpg::model {
namespace {

double status_mb(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key + ":", 0) == 0) return std::stod(line.substr(key.size() + 1)) / 1024.0;
  return -1;
}

// Loading holds the weights once: the peak resident memory during from_pretrained is the
// parameters plus about one tensor's mapped pages, not parameters + the whole mapped file.
// The peak is VmHWM (anonymous and file pages) above VmRSS before. That the measurement sees
// the parameters is checked on anonymous memory alone (RssAnon after - before): the kernel
// may reclaim this process's clean file pages (libtorch's code) while another test of a
// parallel ctest needs memory, and a peak that fell by them once read 50 MB for 87 MB of
// parameters. The heap's free pages are handed back first (malloc_trim), so that the load's
// tensors cannot reuse pages already resident and go uncounted.
TEST(CheckpointMemory, LoadingNeverHoldsTwoCopies) {
  rpg::test::TempDir dir;
  int64_t largest = 0, total = 0;
  {
    at::manual_seed(0);
    CausalLM m(ModelConfig::from_json(test::tiny_config_json("qwen2", R"("vocab_size": 40000, "hidden_size": 256,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512, "num_hidden_layers": 4)"),
                                      "big"),
               at::kFloat);
    for (auto& p : m.parameters()) {
      largest = std::max<int64_t>(largest, p.nbytes());
      total += p.nbytes();
    }
    m.save_pretrained(dir / "m");
  }
  const double mb = 1024.0 * 1024.0;
  ASSERT_GT(total / mb, 80.0);
  std::ofstream reset("/proc/self/clear_refs");
  ASSERT_TRUE(reset.good()) << "cannot reset the peak-RSS counter";
  malloc_trim(0);
  const double anon_before = status_mb("RssAnon");
  double before = status_mb("VmRSS");
  reset << "5" << std::flush;
  ASSERT_TRUE(reset.good());
  CausalLM m = CausalLM::from_pretrained(dir / "m");
  double peak = status_mb("VmHWM") - before;
  const double anon = status_mb("RssAnon") - anon_before;
  std::printf("[ measure  ] load peak %.1f MB (anonymous memory after: +%.1f MB) for %.1f MB of parameters "
              "(largest tensor %.1f MB)\n",
              peak, anon, total / mb, largest / mb);
  // Two copies would be ~2x the parameters. One copy, plus the 16 MB slice being copied,
  // plus slack for the allocator and libraries, is the bound (below params + largest tensor).
  EXPECT_LE(peak, total / mb + 16.0 + 12.0);
  EXPECT_LT(total / mb + 16.0 + 12.0, (total + largest) / mb);
  ASSERT_GE(anon_before, 0.0) << "no RssAnon in /proc/self/status";
  EXPECT_GE(anon, total / mb * 0.9) << "the measurement must see the parameters themselves";
}

}  // namespace
}  // namespace rpg::model
