// c10d is used through its C++ classes. ProcessGroupGloo.hpp includes gloo's headers,
// which the torch wheel does not ship; Debian's libgloo-dev provides them. Only the
// declarations are used: ProcessGroupGloo holds gloo objects through shared_ptr/unique_ptr
// only, so its layout does not depend on the gloo version, every gloo function runs inside
// libtorch_cpu (its own gloo), and this file calls only c10d functions that libtorch
// exports (Options::create_default, createDeviceForHostname/Interface, the constructor,
// the Backend virtuals). libgloo is never linked.
#include "rpg/dist/process_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <ATen/ATen.h>

#include <dlfcn.h>

#include <csignal>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "rpg/core/log.h"

namespace rpg::dist {
namespace {

std::string first_line(const std::string& s) {
  auto nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return c10d::ReduceOp::SUM;
    case ReduceOp::Max: return c10d::ReduceOp::MAX;
    case ReduceOp::Min: return c10d::ReduceOp::MIN;
  }
  throw ValueError("unknown ReduceOp");
}

std::string to_string(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> to_bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.starts_with("127.") || addr == "::1";
}

// The CUDA plugin's NCCL factory (model/cuda/nccl_plugin.cpp).
using NcclFactory = c10d::Backend* (*)(const c10::intrusive_ptr<c10d::Store>*, int, int, std::int64_t, int,
                                       std::string*);

// Loads libtorch's CUDA backend and the plugin if needed; ConfigError naming why NCCL is
// unavailable.
NcclFactory nccl_factory() {
  if (std::string err = device::load_cuda_backend(); !err.empty())
    throw ConfigError(str("dist: trainer.device is cuda, but NCCL is unavailable: libtorch's CUDA backend did not load (",
                          err, ")"));
  auto f = reinterpret_cast<NcclFactory>(dlsym(RTLD_DEFAULT, "rpg_cuda_nccl_group"));
  if (!f)
    throw ConfigError(
        "dist: trainer.device is cuda, but NCCL is unavailable: the CUDA plugin librpg_cuda.so is not loaded or was "
        "built without NCCL (the torch wheel's nvidia/nccl/include/nccl.h, pip nvidia-nccl-cu*; cmake --build build "
        "--target rpg_cuda)");
  return f;
}

}  // namespace

struct ProcessGroup::Impl {
  RankLayout layout;
  GroupOptions options;
  c10::intrusive_ptr<c10d::Store> store;       // collectives' rendezvous, diagnosis
  c10::intrusive_ptr<c10d::Store> hb_store;    // the heartbeat thread's own connection
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
  c10::intrusive_ptr<c10d::Backend> nccl;      // set in a group created for CUDA
  std::atomic<long> entered{0};                // collectives entered by this rank
  std::thread heartbeat;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  bool broken = false;
  std::string broken_message;

  // NCCL for CUDA tensors when the group has it, else Gloo.
  c10d::Backend& backend_for(const at::Tensor& t) {
    if (nccl && t.is_cuda()) return *nccl;
    return *gloo;
  }

  std::string key(const std::string& what, int rank) const { return str("rpg/", what, "/", rank); }

  // Peers are gone: c10d's destructors could block on them, and the process is on its way
  // out. The heartbeat thread is told to stop and left running detached, the c10d objects
  // (and this Impl, which the thread reads) are never destroyed.
  static void abandon(std::unique_ptr<Impl> impl) {
    {
      std::lock_guard lock(impl->mu);
      impl->stop = true;
    }
    impl->cv.notify_all();
    if (impl->heartbeat.joinable()) impl->heartbeat.detach();
    (void)impl->gloo.release();
    (void)impl->nccl.release();
    (void)impl->store.release();
    (void)impl->hb_store.release();
    (void)impl.release();
  }

  std::string store_host() const {
    return str("the rendezvous store at ", layout.master_addr, ":", layout.master_port,
               layout.agent_store ? " (torchrun's agent)" : " (hosted by rank 0)");
  }

  // Heartbeat value: "<beat>:<collectives entered>".
  void heartbeat_loop() {
    long beat = 0;
    std::unique_lock lock(mu);
    while (!stop) {
      lock.unlock();
      try {
        hb_store->set(key("hb", layout.rank), to_bytes(str(++beat, ":", entered.load())));
      } catch (const std::exception&) {
        return;  // the store is gone; the next collective's diagnosis reports it
      }
      lock.lock();
      cv.wait_for(lock, options.heartbeat, [&] { return stop; });
    }
  }

  // (beat, entered) of every rank; throws when the store is unreachable.
  std::vector<std::pair<long, long>> read_heartbeats() {
    std::vector<std::pair<long, long>> out;
    for (int r = 0; r < layout.world_size; ++r) {
      std::string v = to_string(store->get(key("hb", r)));
      auto colon = v.find(':');
      out.emplace_back(std::stol(v.substr(0, colon)), std::stol(v.substr(colon + 1)));
    }
    return out;
  }

  // A collective failed: find the rank at fault, then throw.
  [[noreturn]] void fail(const std::string& what, const std::string& cause) {
    broken = true;
    long mine = entered.load();
    std::string where = str("rank ", layout.rank, ": ", what, " (collective #", mine, ")");
    std::string message;
    int lost = -1;
    try {
      store->set(key("failed", layout.rank), to_bytes(std::to_string(mine)));
      auto before = read_heartbeats();
      std::this_thread::sleep_for(3 * options.heartbeat);
      auto after = read_heartbeats();
      for (int r = 0; r < layout.world_size && lost < 0; ++r) {
        if (r == layout.rank) continue;
        if (store->check({key("done", r)})) {
          lost = r, message = str("rank ", r, " already left the group");
        } else if (after[r].first == before[r].first) {
          lost = r, message = str("rank ", r, " is lost (its heartbeat stopped: the process died or is stopped)");
        } else if (after[r].second < mine) {
          lost = r, message = str("rank ", r, " did not reach this collective (it is at #", after[r].second,
                                  ": hung or on a different code path)");
        }
      }
    } catch (const std::exception&) {
      if (!(layout.agent_store)) lost = 0;
      message = str(store_host(), " is unreachable", layout.agent_store ? "" : ": rank 0 is lost");
    }
    if (message.empty()) message = "no lost rank found";
    broken_message = str("dist: ", message, "; ", where, " failed: ", first_line(cause));
    throw DistError(broken_message, lost);
  }

  // Starts a collective without waiting (reduce_async).
  template <class F>
  c10::intrusive_ptr<c10d::Work> start(const std::string& what, F&& begin) {
    if (broken) throw DistError(str("dist: the process group is broken after an earlier failure: ", broken_message), -1);
    entered.fetch_add(1);
    try {
      return begin();
    } catch (const std::exception& e) {
      fail(what, e.what());
    }
  }
  template <class F>
  void run(const std::string& what, F&& start) {
    if (broken) throw DistError(str("dist: the process group is broken after an earlier failure: ", broken_message), -1);
    entered.fetch_add(1);
    try {
      c10::intrusive_ptr<c10d::Work> work = start();
      work->wait();
    } catch (const std::exception& e) {
      fail(what, e.what());
    }
  }
};

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<ProcessGroup> ProcessGroup::init(const RankLayout& layout, const GroupOptions& options) {
  // c10d logs every socket failure as a warning with a backtrace on stderr; our failures
  // are one DistError line. TORCH_CPP_LOG_LEVEL, when set, is respected.
  if (!std::getenv("TORCH_CPP_LOG_LEVEL")) FLAGS_caffe2_log_level = 2;  // errors only
  // A write to a dead peer's socket must be an error (EPIPE) that names the peer, not a
  // silent SIGPIPE death of this rank too. (Python, and so torch.distributed, ignores it.)
  std::signal(SIGPIPE, SIG_IGN);
  // Before anything connects: a CUDA group without NCCL is a configuration error.
  NcclFactory make_nccl = options.device == device::Kind::kCuda ? nccl_factory() : nullptr;
  auto impl = std::make_unique<Impl>();
  impl->layout = layout;
  impl->options = options;
  const std::string endpoint = str(layout.master_addr, ":", layout.master_port);
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(layout.master_port);
    so.isServer = layout.rank == 0 && !layout.agent_store;
    so.numWorkers = layout.agent_store ? std::nullopt : std::optional<std::size_t>(layout.world_size);
    so.waitWorkers = false;  // arrivals are counted below, naming the missing ranks
    so.timeout = options.timeout;
    c10::intrusive_ptr<c10d::Store> tcp = c10::make_intrusive<c10d::TCPStore>(layout.master_addr, so);
    impl->hb_store = tcp->clone();
    if (layout.agent_store) {
      std::string prefix = str("/worker/attempt_", layout.restart_count);
      impl->store = c10::make_intrusive<c10d::PrefixStore>(prefix, tcp);
      impl->hb_store = c10::make_intrusive<c10d::PrefixStore>(prefix, impl->hb_store);
    } else {
      impl->store = tcp;
    }
  } catch (const std::exception& e) {
    throw DistError(str("dist: rank ", layout.rank, " cannot ", layout.rank == 0 && !layout.agent_store ? "host" : "reach",
                        " the rendezvous store at ", endpoint, ": ", first_line(e.what())),
                    layout.rank == 0 ? -1 : 0);
  }
  // Arrival: heartbeat key first, so a diagnosis can read every rank's.
  std::vector<std::string> all;
  for (int r = 0; r < layout.world_size; ++r) all.push_back(impl->key("hb", r));
  try {
    impl->store->set(impl->key("hb", layout.rank), to_bytes("0:0"));
    impl->store->wait(all, options.timeout);
  } catch (const std::exception& e) {
    std::string missing;
    try {
      for (int r = 0; r < layout.world_size; ++r)
        if (!impl->store->check({impl->key("hb", r)})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    } catch (const std::exception&) {
      throw DistError(str("dist: ", impl->store_host(), " went away while rank ", layout.rank, " was joining: ",
                          first_line(e.what())),
                      layout.agent_store ? -1 : 0);
    }
    throw DistError(str("dist: rank(s) ", missing, " did not join the group at ", endpoint, " within ",
                        options.timeout.count() / 1000.0, " s"),
                    missing.empty() ? -1 : std::stoi(missing.substr(0, missing.find(','))));
  }
  if (make_nccl) {
    // ProcessGroupNCCL connects lazily (on the first collective on a device), through its
    // own prefix of the same store.
    c10::intrusive_ptr<c10d::Store> nccl_store = c10::make_intrusive<c10d::PrefixStore>("rpg/nccl", impl->store);
    std::string err;
    c10d::Backend* b = make_nccl(&nccl_store, layout.rank, layout.world_size, options.timeout.count(),
                                 layout.local_rank, &err);
    if (!b) throw DistError(str("dist: rank ", layout.rank, " cannot create its NCCL process group: ", err), -1);
    impl->nccl = c10::intrusive_ptr<c10d::Backend>::reclaim(b);
  }
  impl->heartbeat = std::thread([p = impl.get()] { p->heartbeat_loop(); });
  try {
    auto opts = c10d::ProcessGroupGloo::Options::create(options.timeout);
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
      std::string names = ifname;
      for (size_t pos = 0; pos <= names.size();) {
        size_t comma = names.find(',', pos);
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(names.substr(pos, comma - pos)));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    } else if (is_loopback(layout.master_addr)) {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(layout.master_addr));
    } else {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    auto gloo_store = c10::make_intrusive<c10d::PrefixStore>("rpg/gloo", impl->store);
    impl->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(gloo_store, layout.rank, layout.world_size, opts);
  } catch (const std::exception& e) {
    try {
      impl->fail("connecting Gloo", e.what());
    } catch (...) {
      Impl::abandon(std::move(impl));  // the heartbeat thread is running: destroying it would terminate
      throw;
    }
  }
  log_debug("dist: joined as ", describe(layout), impl->nccl ? " (NCCL for CUDA tensors)" : "");
  return std::unique_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
}

ProcessGroup::~ProcessGroup() {
  if (!impl_) return;
  if (impl_->broken) {
    Impl::abandon(std::move(impl_));
    return;
  }
  try {
    impl_->store->set(impl_->key("done", impl_->layout.rank), to_bytes("1"));
  } catch (const std::exception&) {
  }
  {
    std::lock_guard lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->heartbeat.joinable()) impl_->heartbeat.join();
}

int ProcessGroup::rank() const { return impl_->layout.rank; }
int ProcessGroup::size() const { return impl_->layout.world_size; }
const RankLayout& ProcessGroup::layout() const { return impl_->layout; }
long ProcessGroup::collectives() const { return impl_->entered.load(); }
bool ProcessGroup::has_nccl() const { return static_cast<bool>(impl_->nccl); }

void ProcessGroup::all_reduce(at::Tensor& tensor, ReduceOp op) {
  std::vector<at::Tensor> ts{tensor};
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  impl_->run("all_reduce", [&] { return impl_->backend_for(tensor).allreduce(ts, o); });
}

void ProcessGroup::broadcast(at::Tensor& tensor, int root) {
  if (root < 0 || root >= size()) throw ValueError(str("dist: broadcast root ", root, " is not a rank of ", size()));
  std::vector<at::Tensor> ts{tensor};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  impl_->run("broadcast", [&] { return impl_->backend_for(tensor).broadcast(ts, o); });
}

at::Tensor ProcessGroup::all_gather(const at::Tensor& tensor) {
  at::Tensor input = tensor.contiguous();
  std::vector<int64_t> shape = input.sizes().vec();
  if (shape.empty()) shape.push_back(1), input = input.reshape({1});
  shape[0] *= size();
  at::Tensor output = at::empty(shape, input.options());
  impl_->run("all_gather", [&] { return impl_->backend_for(input)._allgather_base(output, input); });
  return output;
}

at::Tensor ProcessGroup::reduce_scatter(const at::Tensor& input, ReduceOp op) {
  if (input.dim() == 0 || input.size(0) % size() != 0)
    throw ValueError(str("dist: reduce_scatter needs dim 0 divisible by the world size ", size(), ", got shape ",
                         input.sizes()));
  at::Tensor in = input.contiguous();
  std::vector<int64_t> shape = in.sizes().vec();
  shape[0] /= size();
  at::Tensor output = at::empty(shape, in.options());
  c10d::ReduceScatterOptions o;
  o.reduceOp = to_c10d(op);
  impl_->run("reduce_scatter", [&] { return impl_->backend_for(in)._reduce_scatter_base(output, in, o); });
  return output;
}

struct Pending::State {
  ProcessGroup::Impl* impl = nullptr;
  std::string what;
  c10::intrusive_ptr<c10d::Work> work;
  std::vector<at::Tensor> tensors;  // kept alive until wait()
};

Pending::Pending() = default;
Pending::~Pending() = default;
Pending::Pending(Pending&&) noexcept = default;
Pending& Pending::operator=(Pending&&) noexcept = default;

void Pending::wait() {
  if (!state_) return;
  std::unique_ptr<State> s = std::move(state_);
  if (s->impl->broken)
    throw DistError(str("dist: the process group is broken after an earlier failure: ", s->impl->broken_message), -1);
  try {
    s->work->wait();
  } catch (const std::exception& e) {
    s->impl->fail(s->what, e.what());
  }
}

Pending ProcessGroup::reduce_async(const at::Tensor& tensor, int root, ReduceOp op) {
  if (root < 0 || root >= size()) throw ValueError(str("dist: reduce root ", root, " is not a rank of ", size()));
  if (!tensor.is_contiguous()) throw ValueError("dist: reduce_async needs a contiguous tensor");
  auto s = std::make_unique<Pending::State>();
  s->impl = impl_.get();
  s->what = "reduce";
  s->tensors = {tensor};
  c10d::ReduceOptions o;
  o.rootRank = root;
  o.reduceOp = to_c10d(op);
  s->work = impl_->start("reduce", [&] { return impl_->backend_for(tensor).reduce(s->tensors, o); });
  Pending p;
  p.state_ = std::move(s);
  return p;
}

void ProcessGroup::barrier() {
  impl_->run("barrier", [&] { return impl_->gloo->barrier(); });
}

}  // namespace rpg::dist
