#include "rpg/reward/http_scorer.h"

#include <curl/curl.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <string_view>
#include <utility>
#include <vector>

#include "rpg/core/error.h"

namespace rpg::reward {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// A reply this large is a misbehaving service, not a batch of scores; refusing it keeps a
// runaway server from eating the trainer's memory.
constexpr size_t kMaxReplyBytes = size_t{256} << 20;
constexpr size_t kSnippetChars = 200;

// libcurl is loaded when a run first asks for reward_model.url, not linked: linking it maps
// about twenty libraries (OpenSSL, GnuTLS, Kerberos, LDAP, ...) into every rpg process,
// which costs each start and each rank of a launch (`rpg launch` runs under tight
// address-space limits in the hostile-input tests) for a feature most runs never use.
struct CurlApi {
  decltype(&::curl_easy_cleanup) easy_cleanup = nullptr;
  decltype(&::curl_easy_getinfo) easy_getinfo = nullptr;
  decltype(&::curl_easy_init) easy_init = nullptr;
  decltype(&::curl_easy_setopt) easy_setopt = nullptr;
  decltype(&::curl_easy_strerror) easy_strerror = nullptr;
  decltype(&::curl_global_init) global_init = nullptr;
  decltype(&::curl_multi_add_handle) multi_add_handle = nullptr;
  decltype(&::curl_multi_cleanup) multi_cleanup = nullptr;
  decltype(&::curl_multi_info_read) multi_info_read = nullptr;
  decltype(&::curl_multi_init) multi_init = nullptr;
  decltype(&::curl_multi_perform) multi_perform = nullptr;
  decltype(&::curl_multi_poll) multi_poll = nullptr;
  decltype(&::curl_multi_remove_handle) multi_remove_handle = nullptr;
  decltype(&::curl_multi_setopt) multi_setopt = nullptr;
  decltype(&::curl_multi_strerror) multi_strerror = nullptr;
  decltype(&::curl_slist_append) slist_append = nullptr;
  decltype(&::curl_slist_free_all) slist_free_all = nullptr;
};

const CurlApi& curl() {
  static CurlApi api;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* e = dlerror();
      error = str("cannot load libcurl.so.4 (", e ? e : "dlopen failed", "); install Debian's libcurl4");
      return;
    }
    auto load = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn && error.empty()) error = str("libcurl.so.4 has no ", name);
    };
    load(api.easy_cleanup, "curl_easy_cleanup");
    load(api.easy_getinfo, "curl_easy_getinfo");
    load(api.easy_init, "curl_easy_init");
    load(api.easy_setopt, "curl_easy_setopt");
    load(api.easy_strerror, "curl_easy_strerror");
    load(api.global_init, "curl_global_init");
    load(api.multi_add_handle, "curl_multi_add_handle");
    load(api.multi_cleanup, "curl_multi_cleanup");
    load(api.multi_info_read, "curl_multi_info_read");
    load(api.multi_init, "curl_multi_init");
    load(api.multi_perform, "curl_multi_perform");
    load(api.multi_poll, "curl_multi_poll");
    load(api.multi_remove_handle, "curl_multi_remove_handle");
    load(api.multi_setopt, "curl_multi_setopt");
    load(api.multi_strerror, "curl_multi_strerror");
    load(api.slist_append, "curl_slist_append");
    load(api.slist_free_all, "curl_slist_free_all");
    if (!error.empty()) return;
    if (const CURLcode status = api.global_init(CURL_GLOBAL_DEFAULT); status != CURLE_OK)
      error = str("libcurl initialisation failed: ", api.easy_strerror(status));
  });
  if (!error.empty()) throw IoError(str("reward_model.url: ", error));
  return api;
}

// Error messages are one line: a server's body or curl's text is cut at its first line
// break, control bytes are blanked, and it is capped so a 10 MB HTML page stays readable.
std::string one_line(std::string_view text, size_t max_chars = kSnippetChars) {
  text = text.substr(0, text.find_first_of("\r\n"));
  std::string out(text.substr(0, max_chars));
  for (char& c : out)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  if (text.size() > max_chars) out += "...";
  return out;
}

// Python's bool is an int, and verl's reward managers take True / False as 1 / 0: a
// service written in Python that returns a bool means the same as reward_worker.py's.
std::optional<double> as_number(const json& v) {
  if (v.is_number()) return v.get<double>();
  if (v.is_boolean()) return v.get<bool>() ? 1.0 : 0.0;
  return std::nullopt;
}

// The connection errors worth another try: the service restarting, a load balancer dropping
// an idle keep-alive connection, a reset mid-reply. Everything else (bad URL, TLS, a reply
// we refused) would fail the same way again.
bool is_retryable(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_GOT_NOTHING:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_PARTIAL_FILE:
      return true;
    default:
      return false;
  }
}

struct Transfer {
  enum class State { kIdle, kRunning, kBackoff };
  CURL* easy = nullptr;
  char error[CURL_ERROR_SIZE] = {};
  std::string body;
  std::string reply;
  bool reply_too_large = false;
  size_t batch = 0;
  int64_t retries = 0;
  State state = State::kIdle;
  Clock::time_point retry_at;
};

size_t on_reply_bytes(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t n = size * count;
  if (t->reply.size() + n > kMaxReplyBytes) {
    t->reply_too_large = true;
    return 0;  // curl aborts the transfer with CURLE_WRITE_ERROR
  }
  t->reply.append(data, n);
  return n;
}

class HttpScorer final : public RewardScorer {
 public:
  explicit HttpScorer(HttpRewardOptions options) : o_(std::move(options)), where_("reward_model.url " + o_.url + ": ") {
    multi_ = curl().multi_init();
    if (!multi_) throw IoError(where_ + "curl_multi_init failed");
    // One connection per POST in flight, all kept in the multi handle's cache so the next
    // batch (and the next step's score()) finds them open.
    const long connections = static_cast<long>(std::min<int64_t>(o_.max_concurrency, 1 << 16));
    curl().multi_setopt(multi_, CURLMOPT_MAX_HOST_CONNECTIONS, connections);
    curl().multi_setopt(multi_, CURLMOPT_MAX_TOTAL_CONNECTIONS, connections);
    curl().multi_setopt(multi_, CURLMOPT_MAXCONNECTS, connections);
    headers_ = curl().slist_append(headers_, "Content-Type: application/json");
    // Without this, curl asks for "100 Continue" before a large body and waits a second for
    // servers that do not answer it.
    headers_ = curl().slist_append(headers_, "Expect:");
    if (!headers_) {
      curl().multi_cleanup(multi_);
      throw IoError(where_ + "curl_slist_append failed");
    }
  }

  ~HttpScorer() override {
    for (auto& t : transfers_) {
      if (t->state == Transfer::State::kRunning) curl().multi_remove_handle(multi_, t->easy);
      curl().easy_cleanup(t->easy);
    }
    curl().multi_cleanup(multi_);
    curl().slist_free_all(headers_);
  }

  HttpScorer(const HttpScorer&) = delete;
  HttpScorer& operator=(const HttpScorer&) = delete;

  void check_data_source(std::string_view) const override {}

  std::string describe() const override { return "reward service " + o_.url; }

  RewardScores score(std::span<const ScoreRequest> requests) override {
    // One multi handle cannot be driven from two threads at once.
    std::lock_guard lock(mutex_);
    RewardScores out;
    const size_t n = requests.size();
    out.results.resize(n);
    if (n == 0) return out;
    const size_t batch_size = static_cast<size_t>(o_.batch_size);
    const size_t num_batches = (n + batch_size - 1) / batch_size;
    const size_t max_transfers = static_cast<size_t>(std::min<int64_t>(o_.max_concurrency, static_cast<int64_t>(num_batches)));
    while (transfers_.size() < max_transfers) transfers_.push_back(new_transfer());

    // On an error, transfers still in flight are abandoned: removing them closes their
    // connections, so a late reply can never be read as the answer to a later batch.
    struct AbandonOnExit {
      HttpScorer* self;
      ~AbandonOnExit() {
        for (auto& t : self->transfers_) {
          if (t->state == Transfer::State::kRunning) curl().multi_remove_handle(self->multi_, t->easy);
          t->state = Transfer::State::kIdle;
        }
      }
    } abandon{this};

    size_t next_batch = 0, finished = 0;
    while (finished < num_batches) {
      const auto now = Clock::now();
      for (auto& t : transfers_) {
        if (t->state == Transfer::State::kIdle && next_batch < num_batches) {
          t->batch = next_batch++;
          t->retries = 0;
          t->body = batch_body(requests, t->batch);
          curl().easy_setopt(t->easy, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(t->body.size()));
          curl().easy_setopt(t->easy, CURLOPT_POSTFIELDS, t->body.data());
          start(*t);
        } else if (t->state == Transfer::State::kBackoff && now >= t->retry_at) {
          start(*t);
        }
      }

      int running = 0;
      if (CURLMcode mc = curl().multi_perform(multi_, &running); mc != CURLM_OK)
        throw IoError(str(where_, "curl_multi_perform: ", curl().multi_strerror(mc)));
      int queued = 0;
      while (CURLMsg* msg = curl().multi_info_read(multi_, &queued)) {
        if (msg->msg != CURLMSG_DONE) continue;
        Transfer* t = nullptr;
        curl().easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, reinterpret_cast<char**>(&t));
        const CURLcode code = msg->data.result;  // msg dies with the remove below
        curl().multi_remove_handle(multi_, t->easy);
        t->state = Transfer::State::kIdle;
        if (finish(*t, code, requests, out)) {
          ++finished;
        } else {
          t->state = Transfer::State::kBackoff;
          t->retry_at = Clock::now() + backoff(t->retries);
        }
      }
      if (finished == num_batches) break;

      // Wake for curl's sockets, or when the earliest backoff ends; not at all while a
      // finished transfer could already take the next batch.
      int wait_ms = 1000;
      for (auto& t : transfers_)
        if (t->state == Transfer::State::kIdle && next_batch < num_batches) wait_ms = 0;
      for (auto& t : transfers_) {
        if (t->state != Transfer::State::kBackoff) continue;
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(t->retry_at - Clock::now()).count();
        wait_ms = static_cast<int>(std::clamp<int64_t>(left, 0, wait_ms));
      }
      if (wait_ms > 0) {
        if (CURLMcode mc = curl().multi_poll(multi_, nullptr, 0, wait_ms, nullptr); mc != CURLM_OK)
          throw IoError(str(where_, "curl_multi_poll: ", curl().multi_strerror(mc)));
      }
    }
    return out;
  }

 private:
  std::unique_ptr<Transfer> new_transfer() {
    auto t = std::make_unique<Transfer>();
    t->easy = curl().easy_init();
    if (!t->easy) throw IoError(where_ + "curl_easy_init failed");
    CURL* e = t->easy;
    curl().easy_setopt(e, CURLOPT_URL, o_.url.c_str());
    // Signals would reach the trainer's handlers (and do not work off the main thread).
    curl().easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl().easy_setopt(e, CURLOPT_POST, 1L);
    curl().easy_setopt(e, CURLOPT_HTTPHEADER, headers_);
    curl().easy_setopt(e, CURLOPT_WRITEFUNCTION, on_reply_bytes);
    curl().easy_setopt(e, CURLOPT_WRITEDATA, t.get());
    curl().easy_setopt(e, CURLOPT_PRIVATE, t.get());
    curl().easy_setopt(e, CURLOPT_ERRORBUFFER, t->error);
    // The whole POST, connect to last byte; curl closes the connection of a transfer that
    // ends this way, so a reply still on its way can never answer a later batch.
    const double ms = std::ceil(o_.timeout_s * 1000.0);
    curl().easy_setopt(e, CURLOPT_TIMEOUT_MS, static_cast<long>(std::min(ms, static_cast<double>(std::numeric_limits<long>::max()))));
    return t;
  }

  void start(Transfer& t) {
    t.reply.clear();
    t.reply_too_large = false;
    t.error[0] = '\0';
    if (CURLMcode mc = curl().multi_add_handle(multi_, t.easy); mc != CURLM_OK)
      throw IoError(str(where_, "curl_multi_add_handle: ", curl().multi_strerror(mc)));
    t.state = Transfer::State::kRunning;
  }

  std::chrono::milliseconds backoff(int64_t retry) const {
    // retry_backoff_s, doubling per retry, capped so a large max_retries cannot overflow.
    const double s = std::min(o_.retry_backoff_s * std::ldexp(1.0, static_cast<int>(std::min<int64_t>(retry - 1, 30))), 3600.0);
    return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(s * 1000.0)));
  }

  std::string batch_body(std::span<const ScoreRequest> requests, size_t batch) const {
    const size_t begin = batch * static_cast<size_t>(o_.batch_size);
    const size_t end = std::min(requests.size(), begin + static_cast<size_t>(o_.batch_size));
    json items = json::array();
    for (size_t i = begin; i < end; ++i) {
      const ScoreRequest& r = requests[i];
      json extra_info = nullptr;
      if (!r.extra_info.empty()) {
        extra_info = json::parse(r.extra_info, nullptr, false);
        if (extra_info.is_discarded())
          throw FormatError(str(where_, "response ", i, ": extra_info is not valid JSON: ", one_line(r.extra_info)));
      }
      items.push_back({{"data_source", std::string(r.data_source)},
                       {"solution_str", std::string(r.response)},
                       {"ground_truth", std::string(r.ground_truth)},
                       {"extra_info", std::move(extra_info)}});
    }
    // A model's response may be cut mid-character: invalid UTF-8 becomes U+FFFD rather than
    // failing the step.
    return items.dump(-1, ' ', false, json::error_handler_t::replace);
  }

  // Returns false when the transfer should be retried after a backoff.
  bool finish(Transfer& t, CURLcode code, std::span<const ScoreRequest> requests, RewardScores& out) {
    const size_t begin = t.batch * static_cast<size_t>(o_.batch_size);
    const size_t end = std::min(requests.size(), begin + static_cast<size_t>(o_.batch_size));
    if (code == CURLE_OPERATION_TIMEDOUT) {
      for (size_t i = begin; i < end; ++i) out.results[i] = ScoreResult{o_.timeout_score, false, std::nullopt};
      out.timeouts += static_cast<int64_t>(end - begin);
      return true;
    }
    if (code == CURLE_WRITE_ERROR && t.reply_too_large)
      throw FormatError(str(where_, "reply to responses ", begin, "..", end - 1, " exceeds ", kMaxReplyBytes >> 20, " MiB"));
    if (code != CURLE_OK) {
      if (is_retryable(code) && t.retries < o_.max_retries) {
        ++t.retries;
        return false;
      }
      const std::string why = t.error[0] ? one_line(t.error) : curl().easy_strerror(code);
      throw IoError(str(where_, why, is_retryable(code) ? str(" (after ", t.retries, " retries)") : ""));
    }
    long status = 0;
    curl().easy_getinfo(t.easy, CURLINFO_RESPONSE_CODE, &status);
    if (status != 200) {
      const std::string body = one_line(t.reply);
      throw IoError(str(where_, "HTTP ", status, body.empty() ? " (empty body)" : ": " + body));
    }
    parse_reply(t.reply, begin, end, out);
    return true;
  }

  void parse_reply(const std::string& reply, size_t begin, size_t end, RewardScores& out) const {
    const json j = json::parse(reply, nullptr, false);
    if (j.is_discarded()) throw FormatError(str(where_, "reply is not JSON: ", one_line(reply)));
    const size_t count = end - begin;
    if (!j.is_array())
      throw FormatError(str(where_, "reply is a JSON ", j.type_name(), ", expected an array of ", count, " entries"));
    if (j.size() != count) throw FormatError(str(where_, "reply has ", j.size(), " entries for ", count, " responses"));
    for (size_t k = 0; k < count; ++k) {
      const json& e = j[k];
      const size_t i = begin + k;
      ScoreResult r;
      std::optional<double> score = as_number(e);
      const bool is_object = e.is_object();
      if (is_object) {
        if (auto it = e.find("score"); it != e.end()) score = as_number(*it);
      }
      if (!score) throw FormatError(str(where_, "entry ", k, " (response ", i, ") has no numeric 'score'"));
      if (!std::isfinite(*score)) throw FormatError(str(where_, "entry ", k, " (response ", i, ") has a non-finite 'score'"));
      r.score = *score;
      r.acc = r.score > 0;
      if (is_object) {
        // The same reading as reward_worker.py's: "acc" and "pred" of the wrong type are
        // ignored, every other numeric key is an extra metric.
        for (const auto& [key, value] : e.items()) {
          if (key == "score") continue;
          const std::optional<double> v = as_number(value);
          if (key == "acc") {
            if (v) r.acc = *v != 0;
          } else if (key == "pred") {
            if (value.is_string()) r.pred = value.get<std::string>();
          } else if (v && std::isfinite(*v)) {
            auto [slot, added] = out.extra.try_emplace(key);
            if (added) slot->second.assign(out.results.size(), std::numeric_limits<double>::quiet_NaN());
            slot->second[i] = *v;
          }
        }
      }
      out.results[i] = std::move(r);
    }
  }

  HttpRewardOptions o_;
  std::string where_;
  std::mutex mutex_;
  CURLM* multi_ = nullptr;
  curl_slist* headers_ = nullptr;
  std::vector<std::unique_ptr<Transfer>> transfers_;
};

}  // namespace

std::unique_ptr<RewardScorer> make_http_scorer(const HttpRewardOptions& options) {
  const std::string& url = options.url;
  if (!(url.starts_with("http://") || url.starts_with("https://")) || url.find_first_of(" \t\r\n") != std::string::npos)
    throw ValueError(str("reward_model.url: '", one_line(url), "' is not an http:// or https:// URL"));
  if (options.batch_size < 1) throw ValueError(str("reward_model.request_batch_size: must be >= 1, got ", options.batch_size));
  if (options.max_concurrency < 1)
    throw ValueError(str("reward_model.num_workers: must be >= 1 requests in flight, got ", options.max_concurrency));
  if (!(options.timeout_s > 0) || !std::isfinite(options.timeout_s))
    throw ValueError(str("reward_model.timeout_s: must be a finite number > 0, got ", options.timeout_s));
  if (!std::isfinite(options.timeout_score))
    throw ValueError(str("reward_model.timeout_score: must be finite, got ", options.timeout_score));
  if (options.max_retries < 0) throw ValueError(str("reward service max_retries: must be >= 0, got ", options.max_retries));
  if (!(options.retry_backoff_s >= 0) || !std::isfinite(options.retry_backoff_s))
    throw ValueError(str("reward service retry_backoff_s: must be a finite number >= 0, got ", options.retry_backoff_s));
  return std::make_unique<HttpScorer>(options);
}

}  // namespace rpg::reward
