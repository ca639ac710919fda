// Encode throughput of rpg's tokenizer next to Hugging Face `tokenizers`, in one run on the
// same corpus and tokenizer (trained by tests/oracles/tokenizer_oracle.py, Qwen2-style
// pre-tokenizer with NFC). Single-threaded: rpg encode() per line vs HF encode_batch with
// one rayon thread (and encode_batch_fast where available); multi-threaded: batch_encode
// vs encode_batch on all cores. Prints MB/s and rpg/HF ratios; no thresholds.
//
//   tokenizer_bench [model_dir corpus.txt]   (default: build both with the oracle)
//   tokenizer_bench --load model_dir         Tokenizer::from_dir alone: wall and CPU time,
//                                            best of 5 (whole-process start-up next to HF
//                                            tokenizers: load_bench.py)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "rpg/tokenizer/tokenizer.h"
#include "test_util.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

template <class F>
double best_of(int rounds, F&& f) {
  f();  // warm-up: fills the piece cache, as HF's BPE cache is warmed on its side
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) {
    auto t = std::chrono::steady_clock::now();
    f();
    best = std::min(best, seconds_since(t));
  }
  return best;
}

double hf_value(const std::string& out, const std::string& key) {
  size_t p = out.find(key + "=");
  return p == std::string::npos ? 0 : std::stod(out.substr(p + key.size() + 1));
}

}  // namespace

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

int load_only(const std::filesystem::path& model) {
  double best_wall = 1e30, best_cpu = 1e30;
  for (int r = 0; r < 5; ++r) {
    auto t = std::chrono::steady_clock::now();
    double c = cpu_seconds();
    rpg::tok::Tokenizer tok = rpg::tok::Tokenizer::from_dir(model);
    best_cpu = std::min(best_cpu, cpu_seconds() - c);
    best_wall = std::min(best_wall, seconds_since(t));
    if (tok.vocab_size() == 0) return 1;
  }
  std::printf("load: Tokenizer::from_dir %.3f s wall, %.3f s CPU (best of 5)\n", best_wall, best_cpu);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--load") == 0) return load_only(argv[2]);
  rpg::test::TempDir tmp;
  std::filesystem::path model, corpus;
  if (argc >= 3) {
    model = argv[1];
    corpus = argv[2];
  } else {
    rpg::test::run_oracle("tokenizer_oracle.py", {"build", tmp.path().string()});
    model = tmp / "qwen2";
    corpus = tmp / "bench.txt";
  }
  std::ifstream in(corpus);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string all = ss.str();
  std::vector<std::string> lines;
  for (size_t i = 0, j; i <= all.size(); i = j + 1) {
    j = all.find('\n', i);
    if (j == std::string::npos) j = all.size();
    lines.push_back(all.substr(i, j - i));
  }
  size_t bytes = 0;
  for (auto& l : lines) bytes += l.size();
  // Load time in this process (no interpreter, no libtorch): the whole from_dir, and the
  // JSON parse of tokenizer.json alone.
  double load = best_of(3, [&] { rpg::tok::Tokenizer t = rpg::tok::Tokenizer::from_dir(model); });
  std::ifstream tj(model / "tokenizer.json");
  std::stringstream tjs;
  tjs << tj.rdbuf();
  const std::string tj_text = tjs.str();
  double parse = best_of(3, [&] { auto j = nlohmann::json::parse(tj_text); });
  std::printf("load: Tokenizer::from_dir %.3f s (of which nlohmann::json::parse of tokenizer.json %.3f s, %.1f MB)\n",
              load, parse, tj_text.size() / 1e6);
  rpg::tok::Tokenizer tok = rpg::tok::Tokenizer::from_dir(model);
  const int rounds = 3;
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());

  std::vector<std::vector<rpg::tok::TokenId>> ids(lines.size());
  double t1 = best_of(rounds, [&] {
    for (size_t i = 0; i < lines.size(); ++i) ids[i] = tok.encode(lines[i]);
  });
  double tn = best_of(rounds, [&] { ids = tok.batch_encode(lines, false, static_cast<int>(cores)); });

  auto hf = [&](unsigned threads) {
    auto r = rpg::test::run_process({rpg::test::python().string(),
                                     (rpg::test::source_dir() / "bench/tokenizer/hf_encode.py").string(),
                                     (model / "tokenizer.json").string(), corpus.string(), std::to_string(threads),
                                     std::to_string(rounds), (tmp / "hf_ids.jsonl").string()});
    if (r.exit_code != 0) throw std::runtime_error("hf_encode.py failed: " + r.err);
    return r.out;
  };
  std::string hf1 = hf(1);
  // Same ids on both sides, or the comparison means nothing.
  std::ifstream hf_ids(tmp / "hf_ids.jsonl");
  size_t line_no = 0, mismatches = 0;
  for (std::string l; std::getline(hf_ids, l); ++line_no)
    if (line_no < ids.size() && nlohmann::json::parse(l).get<std::vector<rpg::tok::TokenId>>() != ids[line_no]) ++mismatches;
  std::string hfn = hf(cores);

  double mb = static_cast<double>(bytes) / 1e6;
  double r1 = mb / t1, rn = mb / tn;
  double h1 = hf_value(hf1, "hf_batch_mb_s"), h1f = hf_value(hf1, "hf_batch_fast_mb_s");
  double hn = hf_value(hfn, "hf_batch_mb_s"), hnf = hf_value(hfn, "hf_batch_fast_mb_s");
  std::printf("corpus: %zu lines, %.2f MB; tokenizer %s; ids identical to HF: %s (%zu mismatches)\n", lines.size(), mb,
              model.string().c_str(), mismatches == 0 ? "yes" : "NO", mismatches);
  std::printf("single thread : rpg %.2f MB/s | HF encode_batch %.2f MB/s, encode_batch_fast %.2f MB/s | ratio %.2f (vs fast %.2f)\n",
              r1, h1, h1f, r1 / h1, h1f > 0 ? r1 / h1f : 0.0);
  std::printf("%2u threads    : rpg %.2f MB/s | HF encode_batch %.2f MB/s, encode_batch_fast %.2f MB/s | ratio %.2f (vs fast %.2f)\n",
              cores, rn, hn, hnf, rn / hn, hnf > 0 ? rn / hnf : 0.0);
  return mismatches == 0 ? 0 : 1;
}
