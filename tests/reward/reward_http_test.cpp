// The reward service client (reward_model.url) against a local server,
// tests/oracles/reward_http_server.py: batching, keep-alive and bounded concurrency seen
// from the server's side, retries of dropped connections, timeouts of a server that never
// answers, and one-line errors for the replies it must refuse.
#include <arpa/inet.h>
#include <curl/curl.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "rpg/core/error.h"
#include "rpg/reward/http_scorer.h"
#include "reward_server.h"
#include "test_util.h"

namespace rpg::test {
namespace {

using json = nlohmann::json;
using reward::HttpRewardOptions;
using reward::RewardScores;
using reward::ScoreRequest;

// GET /stats: {"posts": [{"batch", "conn", "dropped"}, ...]}.
json stats(const RewardServer& server) {
  CURL* curl = curl_easy_init();
  if (!curl) throw std::runtime_error("curl_easy_init failed");
  std::string body;
  const std::string address = "http://127.0.0.1:" + std::to_string(server.port()) + "/stats";
  curl_easy_setopt(curl, CURLOPT_URL, address.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 10000L);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, +[](char* data, size_t size, size_t count, void* user) {
    static_cast<std::string*>(user)->append(data, size * count);
    return size * count;
  });
  const CURLcode code = curl_easy_perform(curl);
  curl_easy_cleanup(curl);
  if (code != CURLE_OK) throw std::runtime_error(std::string("GET /stats: ") + curl_easy_strerror(code));
  return json::parse(body);
}

// A port nothing listens on: the kernel's pick for a socket that is then closed.
int unused_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    throw std::runtime_error(std::string("bind: ") + std::strerror(errno));
  close(fd);
  return ntohs(addr.sin_port);
}

// Requests with their strings, and what the server scores them.
struct Batch {
  std::vector<std::string> data_source, response, ground_truth, extra_info;
  std::vector<ScoreRequest> requests;

  void add(std::string response_text, std::string gt, std::string extra = "") {
    data_source.push_back("test_source");
    response.push_back(std::move(response_text));
    ground_truth.push_back(std::move(gt));
    extra_info.push_back(std::move(extra));
  }
  // After the last add: the string_views point into vectors that no longer grow.
  std::span<const ScoreRequest> finish() {
    requests.clear();
    for (size_t i = 0; i < response.size(); ++i)
      requests.push_back({data_source[i], response[i], ground_truth[i], extra_info[i]});
    return requests;
  }
};

std::string strip(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\n") - b + 1);
}

// i % 3 == 0: correct with surrounding blanks; others wrong. Even i carry extra_info.index.
Batch numbered(size_t n, size_t first = 0) {
  Batch b;
  for (size_t i = first; i < first + n; ++i) {
    const std::string gt = std::to_string(i);
    b.add(i % 3 == 0 ? "  " + gt + "\n" : "wrong " + gt, gt, i % 2 == 0 ? R"({"index": )" + std::to_string(i) + "}" : "");
  }
  return b;
}

// Checks out.results[i] and the extras against the server's rule, for every i not in `skip`.
void expect_scored(const Batch& b, const RewardScores& out, const std::set<size_t>& skip = {}) {
  ASSERT_EQ(out.results.size(), b.response.size());
  for (size_t i = 0; i < b.response.size(); ++i) {
    if (skip.count(i)) continue;
    const bool right = strip(b.response[i]) == b.ground_truth[i];
    EXPECT_EQ(out.results[i].score, right ? 1.0 : 0.0) << i;
    EXPECT_EQ(out.results[i].acc, right) << i;
    EXPECT_EQ(out.results[i].pred, strip(b.response[i])) << i;
    ASSERT_TRUE(out.extra.count("length"));
    EXPECT_EQ(out.extra.at("length")[i], static_cast<double>(b.response[i].size())) << i;
    if (b.extra_info[i].empty()) {
      if (out.extra.count("index")) {
        EXPECT_TRUE(std::isnan(out.extra.at("index")[i])) << i;
      }
    } else {
      ASSERT_TRUE(out.extra.count("index"));
      EXPECT_EQ(out.extra.at("index")[i], json::parse(b.extra_info[i])["index"].get<double>()) << i;
    }
  }
}

HttpRewardOptions options_for(const RewardServer& server) {
  HttpRewardOptions o;
  o.url = server.url();
  o.batch_size = 16;
  o.max_concurrency = 4;
  o.timeout_s = 30;
  o.max_retries = 3;
  o.retry_backoff_s = 0.05;
  return o;
}

std::string error_of(reward::RewardScorer& scorer, std::span<const ScoreRequest> requests) {
  try {
    scorer.score(requests);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(RewardHttp, BatchesInOrderOverKeptAliveConnections) {
  RewardServer server;
  auto scorer = reward::make_http_scorer(options_for(server));
  EXPECT_EQ(scorer->describe(), "reward service " + server.url());
  EXPECT_NO_THROW(scorer->check_data_source("anything/at_all"));

  Batch b = numbered(500);
  const RewardScores out = scorer->score(b.finish());
  EXPECT_EQ(out.timeouts, 0);
  expect_scored(b, out);
  EXPECT_EQ(out.extra.size(), 2u);  // length and index; "pred" is not an extra

  const json posts = stats(server)["posts"];
  ASSERT_EQ(posts.size(), (500u + 15) / 16);
  std::map<int, int> per_connection;
  int total = 0;
  for (const auto& p : posts) {
    EXPECT_LE(p["batch"].get<int>(), 16);
    EXPECT_GE(p["batch"].get<int>(), 1);
    EXPECT_FALSE(p["dropped"].get<bool>());
    total += p["batch"].get<int>();
    ++per_connection[p["conn"].get<int>()];
  }
  EXPECT_EQ(total, 500);
  EXPECT_LE(per_connection.size(), 4u);
  int most = 0;
  for (const auto& [conn, count] : per_connection) most = std::max(most, count);
  EXPECT_GT(most, 1) << "no connection served two POSTs: keep-alive is not working";

  // The next call (the next training step) reuses the same connections.
  Batch b2 = numbered(100, 1000);
  const RewardScores out2 = scorer->score(b2.finish());
  expect_scored(b2, out2);
  const json posts2 = stats(server)["posts"];
  ASSERT_EQ(posts2.size(), posts.size() + (100 + 15) / 16);
  std::set<int> connections;
  for (const auto& p : posts2) connections.insert(p["conn"].get<int>());
  EXPECT_LE(connections.size(), 4u);

  const RewardScores none = scorer->score({});
  EXPECT_TRUE(none.results.empty());
  EXPECT_EQ(stats(server)["posts"].size(), posts2.size());
}

// The trainer scores from one thread, but `rpg eval` may share a scorer between threads:
// calls are serialised, and scorers made on several threads at once initialise libcurl once.
TEST(RewardHttp, ScorersAreSafeToShareBetweenThreads) {
  RewardServer server;
  auto shared = reward::make_http_scorer(options_for(server));
  std::vector<Batch> batches;
  for (size_t t = 0; t < 4; ++t) batches.push_back(numbered(100, t * 1000));
  std::vector<RewardScores> shared_out(4), own_out(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const auto requests = batches[t].finish();
      shared_out[t] = shared->score(requests);
      own_out[t] = reward::make_http_scorer(options_for(server))->score(requests);
    });
  }
  for (auto& t : threads) t.join();
  for (size_t t = 0; t < 4; ++t) {
    expect_scored(batches[t], shared_out[t]);
    expect_scored(batches[t], own_out[t]);
  }
}

TEST(RewardHttp, OddTextSurvivesTheRoundTrip) {
  RewardServer server;
  auto scorer = reward::make_http_scorer(options_for(server));
  Batch b;
  b.add("cut mid-character \xE2\x82", "x");
  b.add("\xFF\xFE", "x");
  b.add(std::string("nul\0byte", 8), "x");
  b.add("quotes \" \\ and \u00e9\u4e2d\U0001F600", "quotes \" \\ and \u00e9\u4e2d\U0001F600", R"({"index": 7, "nested": {"a": [1, 2]}})");
  const RewardScores out = scorer->score(b.finish());
  ASSERT_EQ(out.results.size(), 4u);
  EXPECT_EQ(out.results[0].score, 0.0);
  EXPECT_EQ(out.results[1].score, 0.0);
  EXPECT_EQ(out.results[2].score, 0.0);
  EXPECT_EQ(out.extra.at("length")[2], 8.0);
  EXPECT_EQ(out.results[3].score, 1.0);
  EXPECT_EQ(out.results[3].pred, b.response[3]);
  EXPECT_EQ(out.extra.at("length")[3], 18.0);  // Python's len: code points
  EXPECT_EQ(out.extra.at("index")[3], 7.0);
  EXPECT_TRUE(std::isnan(out.extra.at("index")[0]));

  Batch bad;
  bad.add("a", "a", "{not json");
  const std::string error = error_of(*scorer, bad.finish());
  EXPECT_NE(error.find("extra_info"), std::string::npos) << error;
}

TEST(RewardHttp, DroppedConnectionsAreRetried) {
  RewardServer server({"--drop-first", "3"});
  HttpRewardOptions o = options_for(server);
  o.batch_size = 8;
  o.max_concurrency = 2;
  Batch b = numbered(40);
  const RewardScores out = reward::make_http_scorer(o)->score(b.finish());
  EXPECT_EQ(out.timeouts, 0);
  expect_scored(b, out);
  int dropped = 0, answered = 0;
  const json seen = stats(server);
  for (const auto& p : seen["posts"]) (p["dropped"].get<bool>() ? dropped : answered) += 1;
  EXPECT_EQ(dropped, 3);
  EXPECT_EQ(answered, 5);
}

TEST(RewardHttp, ConnectionsDroppedBeyondTheRetriesAreAnIoError) {
  RewardServer server({"--drop-first", "1000"});
  HttpRewardOptions o = options_for(server);
  o.max_retries = 2;
  o.max_concurrency = 1;
  Batch b = numbered(1);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    reward::make_http_scorer(o)->score(b.finish());
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    const std::string what = e.what();
    EXPECT_TRUE(what.starts_with("reward_model.url " + server.url() + ": ")) << what;
    EXPECT_TRUE(what.ends_with("(after 2 retries)")) << what;
  }
  EXPECT_GE(seconds_since(t0), 0.05 + 0.1);  // the backoff doubles
  EXPECT_EQ(stats(server)["posts"].size(), 3u);  // the first try and two retries
}

TEST(RewardHttp, UnansweredBatchesTimeOutAndTheRestIsScored) {
  RewardServer server({"--hang-on", "HANG"});
  HttpRewardOptions o = options_for(server);
  o.batch_size = 8;
  o.max_concurrency = 4;
  o.timeout_s = 1.0;
  o.timeout_score = -1.0;
  auto scorer = reward::make_http_scorer(o);

  Batch b = numbered(64);
  b.response[10] = "HANG";  // batch 1: responses 8..15
  b.response[50] = "HANG";  // batch 6: responses 48..55
  std::set<size_t> hung;
  for (size_t i = 8; i < 16; ++i) hung.insert(i);
  for (size_t i = 48; i < 56; ++i) hung.insert(i);

  const auto t0 = std::chrono::steady_clock::now();
  const RewardScores out = scorer->score(b.finish());
  const double elapsed = seconds_since(t0);
  EXPECT_LT(elapsed, o.timeout_s + 10) << "hang guard";
  EXPECT_EQ(out.timeouts, 16);
  for (size_t i : hung) {
    EXPECT_EQ(out.results[i].score, -1.0) << i;
    EXPECT_FALSE(out.results[i].acc) << i;
    EXPECT_FALSE(out.results[i].pred.has_value()) << i;
    EXPECT_TRUE(std::isnan(out.extra.at("length")[i])) << i;
  }
  expect_scored(b, out, hung);

  // The abandoned connections (their server threads still asleep) must not be reused.
  Batch again = numbered(64, 100);
  const auto t1 = std::chrono::steady_clock::now();
  const RewardScores out2 = scorer->score(again.finish());
  EXPECT_LT(seconds_since(t1), o.timeout_s + 10) << "hang guard";
  EXPECT_EQ(out2.timeouts, 0);
  expect_scored(again, out2);
}

TEST(RewardHttp, RefusedConnectionIsAnIoErrorAfterTheRetries) {
  HttpRewardOptions o;
  o.url = "http://127.0.0.1:" + std::to_string(unused_port()) + "/score";
  o.max_retries = 2;
  o.retry_backoff_s = 0.05;
  o.timeout_s = 5;
  auto scorer = reward::make_http_scorer(o);
  Batch b = numbered(20);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    scorer->score(b.finish());
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("reward_model.url " + o.url), std::string::npos) << what;
    EXPECT_NE(what.find("after 2 retries"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  EXPECT_LT(seconds_since(t0), 10.0);
  // The scorer stays usable after an error (the trainer may retry the step).
  EXPECT_THROW(scorer->score(b.finish()), IoError);
}

TEST(RewardHttp, HttpErrorStatusIsAOneLineIoError) {
  RewardServer server({"--status", "500"});
  auto scorer = reward::make_http_scorer(options_for(server));
  Batch b = numbered(40);
  try {
    scorer->score(b.finish());
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what, "reward_model.url " + server.url() + ": HTTP 500: scorer crashed: ZeroDivisionError");
  }
}

TEST(RewardHttp, WrongReplyLengthIsAOneLineFormatError) {
  RewardServer server({"--bad-length"});
  HttpRewardOptions o = options_for(server);
  o.batch_size = 8;
  o.max_concurrency = 1;
  auto scorer = reward::make_http_scorer(o);
  Batch b = numbered(8);
  try {
    scorer->score(b.finish());
    ADD_FAILURE() << "no error";
  } catch (const FormatError& e) {
    EXPECT_EQ(std::string(e.what()), "reward_model.url " + server.url() + ": reply has 7 entries for 8 responses");
  }
}

// Each server answers every POST with the same body; a batch of one response.
struct ReplyCase {
  std::string reply = {};
  std::string error = {};  // empty: accepted
  double score = 0;
  bool acc = false;
  std::optional<std::string> pred = {};
  std::map<std::string, double> extra = {};
};

TEST(RewardHttp, ReplyEntries) {
  const std::vector<ReplyCase> cases = {
      {.reply = "[2.5]", .score = 2.5, .acc = true},
      {.reply = "[-1]", .score = -1, .acc = false},
      {.reply = "[true]", .score = 1, .acc = true},  // Python's bool is an int
      {.reply = R"([{"score": 0.5, "acc": false}])", .score = 0.5, .acc = false},
      {.reply = R"([{"score": -1, "acc": 1}])", .score = -1, .acc = true},
      // "acc" and "pred" of the wrong type are ignored, as reward_worker.py does
      {.reply = R"([{"score": 0, "acc": "yes", "pred": 42}])", .score = 0, .acc = false},
      {.reply = R"([{"score": 1, "pred": "x", "n": 3, "flag": true, "note": "text", "list": [1]}])",
       .score = 1,
       .acc = true,
       .pred = "x",
       .extra = {{"n", 3}, {"flag", 1}}},
      {.reply = "not json at all\nsecond line", .error = "reply is not JSON: not json at all"},
      {.reply = R"({"score": 1})", .error = "reply is a JSON object, expected an array of 1 entries"},
      {.reply = "[]", .error = "reply has 0 entries for 1 responses"},
      {.reply = R"([{"acc": true}])", .error = "entry 0 (response 0) has no numeric 'score'"},
      {.reply = R"([{"score": "1"}])", .error = "entry 0 (response 0) has no numeric 'score'"},
      {.reply = R"(["1"])", .error = "entry 0 (response 0) has no numeric 'score'"},
      {.reply = "[null]", .error = "entry 0 (response 0) has no numeric 'score'"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.reply);
    RewardServer server({"--reply", c.reply});
    HttpRewardOptions o = options_for(server);
    o.batch_size = 1;
    auto scorer = reward::make_http_scorer(o);
    Batch b;
    b.add("a", "a");
    if (!c.error.empty()) {
      const std::string error = error_of(*scorer, b.finish());
      EXPECT_EQ(error, "reward_model.url " + server.url() + ": " + c.error);
      continue;
    }
    const RewardScores out = scorer->score(b.finish());
    ASSERT_EQ(out.results.size(), 1u);
    EXPECT_EQ(out.results[0].score, c.score);
    EXPECT_EQ(out.results[0].acc, c.acc);
    EXPECT_EQ(out.results[0].pred, c.pred);
    std::map<std::string, double> extra;
    for (const auto& [k, v] : out.extra) extra[k] = v.at(0);
    EXPECT_EQ(extra, c.extra);
  }
}

TEST(RewardHttp, NonFiniteScoreIsRefused) {
  // JSON has no NaN or Infinity, but Python's json.dumps writes them, and an overflowing
  // literal parses as infinity.
  for (const std::string reply : {"[1e999]", "[NaN]", R"([{"score": Infinity}])"}) {
    SCOPED_TRACE(reply);
    RewardServer server({"--reply", reply});
    HttpRewardOptions o = options_for(server);
    o.batch_size = 1;
    Batch b;
    b.add("a", "a");
    try {
      reward::make_http_scorer(o)->score(b.finish());
      ADD_FAILURE() << "no error";
    } catch (const FormatError& e) {
      const std::string what = e.what();
      EXPECT_TRUE(what.starts_with("reward_model.url " + server.url() + ": ")) << what;
    }
  }
}

TEST(RewardHttp, InvalidOptionsAreValueErrors) {
  const auto invalid = [](auto edit) {
    HttpRewardOptions o;
    o.url = "http://127.0.0.1:1/score";
    edit(o);
    EXPECT_THROW(reward::make_http_scorer(o), ValueError);
  };
  invalid([](HttpRewardOptions& o) { o.url = ""; });
  invalid([](HttpRewardOptions& o) { o.url = "ftp://host/score"; });
  invalid([](HttpRewardOptions& o) { o.url = "127.0.0.1:8000/score"; });
  invalid([](HttpRewardOptions& o) { o.url = "http://host/a b"; });
  invalid([](HttpRewardOptions& o) { o.batch_size = 0; });
  invalid([](HttpRewardOptions& o) { o.max_concurrency = 0; });
  invalid([](HttpRewardOptions& o) { o.timeout_s = 0; });
  invalid([](HttpRewardOptions& o) { o.timeout_s = -1; });
  invalid([](HttpRewardOptions& o) { o.timeout_s = std::nan(""); });
  invalid([](HttpRewardOptions& o) { o.max_retries = -1; });
  invalid([](HttpRewardOptions& o) { o.retry_backoff_s = -0.1; });
  try {
    HttpRewardOptions o;
    o.url = "localhost:8000";
    reward::make_http_scorer(o);
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("reward_model.url"), std::string::npos) << e.what();
  }
  HttpRewardOptions ok;
  ok.url = "https://example.invalid/score";
  ok.max_retries = 0;
  ok.retry_backoff_s = 0;
  EXPECT_NO_THROW(reward::make_http_scorer(ok));
}

}  // namespace
}  // namespace rpg::test
