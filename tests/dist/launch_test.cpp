// `rpg launch`: torchrun's environment for each rank, output prefixed by rank, a failing
// rank stops the others and is named; a 2-"node" launch on loopback equals a 1-node one.
#include <gtest/gtest.h>

#include <future>

#include "rpg/core/error.h"
#include "rpg/dist/launch.h"
#include "test_util.h"

namespace rpg::dist {
namespace {

using test::run_process;

bool contains(const std::string& haystack, const std::string& needle) { return haystack.find(needle) != std::string::npos; }

// Lines of `text` that start with `prefix`, prefix removed, in order.
std::string lines_of(const std::string& text, const std::string& prefix) {
  std::string out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string line = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    if (line.starts_with(prefix)) out += line.substr(prefix.size()) + "\n";
    if (nl == std::string::npos) break;
    pos = nl + 1;
  }
  return out;
}

std::vector<std::string> launch_argv(std::vector<std::string> args) {
  std::vector<std::string> argv = {test::rpg_binary().string(), "launch"};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

TEST(Launch, EnvironmentAndPrefixes) {
  auto r = run_process(launch_argv({"--nproc", "3", "--exec", "--", "/bin/sh", "-c",
                                    "echo env $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $NODE_RANK "
                                    "$OMP_NUM_THREADS; echo to-stderr >&2; printf no-newline"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int k = 0; k < 3; ++k) {
    std::string p = str("[rank ", k, "] ");
    EXPECT_EQ(lines_of(r.out, p), str("env ", k, " 3 ", k, " 3 127.0.0.1 0 1\nno-newline\n")) << r.out;
    EXPECT_EQ(lines_of(r.err, p), "to-stderr\n") << r.err;
  }
}

TEST(Launch, FailingRankStopsTheOthersAndIsNamed) {
  // Rank 1 exits 3 at once; ranks 0 and 2 would sleep for 10 minutes.
  auto r = run_process(launch_argv({"--nproc", "3", "--exec", "--", "/bin/sh", "-c",
                                    "if [ $RANK = 1 ]; then exit 3; fi; exec sleep 600"}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err, "rpg: error: launch: rank 1 exited with code 3 (of 3 ranks; the others were stopped)"))
      << r.err;
}

TEST(Launch, KilledRankIsNamed) {
  auto r = run_process(launch_argv({"--nproc", "2", "--exec", "--", "/bin/sh", "-c",
                                    "if [ $RANK = 0 ]; then kill -9 $$; fi; exec sleep 600"}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err, "rpg: error: launch: rank 0 was killed by signal 9 (SIGKILL)")) << r.err;
}

TEST(Launch, RpgCommandByDefault) {
  auto r = run_process(launch_argv({"--nproc", "2", "--", "version"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "[rank 0] rpg ")) << r.out;
  EXPECT_TRUE(contains(r.out, "[rank 1] rpg ")) << r.out;
  auto bad = run_process(launch_argv({"--nproc", "2"}));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_TRUE(contains(bad.err, "give the command to run after --")) << bad.err;
}

TEST(Launch, ProcessGroupUnderLaunch) {
  auto r = run_process(launch_argv({"--nproc", "2", "--exec", "--", RPG_DIST_WORKER, "collectives"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(lines_of(r.out, "[rank 1] "), "reduce_scatter 6 9\n")) << r.out;
  EXPECT_TRUE(contains(lines_of(r.out, "[rank 0] "), "reduce_scatter 0 3\n")) << r.out;
}

TEST(Launch, KilledRankInAProcessGroup) {
  auto r = run_process(launch_argv({"--nproc", "2", "--exec", "--", RPG_DIST_WORKER, "kill", "1"}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.err, "rpg: error: launch: rank 1 was killed by signal 9 (SIGKILL)")) << r.err;
}

// Two "nodes" of one rank each on loopback: the same results as one node of two ranks.
TEST(Launch, TwoNodesEqualOneNode) {
  auto one = run_process(launch_argv({"--nproc", "2", "--exec", "--", RPG_DIST_WORKER, "collectives"}));
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const std::string port = std::to_string(free_port());
  std::vector<std::future<test::ProcessResult>> nodes;
  for (int n = 0; n < 2; ++n)
    nodes.push_back(std::async(std::launch::async, [&, n] {
      return run_process(launch_argv({"--nproc", "1", "--nnodes", "2", "--node-rank", std::to_string(n),
                                      "--master-port", port, "--exec", "--", RPG_DIST_WORKER, "collectives"}));
    }));
  for (int n = 0; n < 2; ++n) {
    auto r = nodes[n].get();
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::string p = str("[rank ", n, "] ");
    EXPECT_EQ(lines_of(r.out, p), lines_of(one.out, p));
    EXPECT_FALSE(lines_of(r.out, p).empty());
  }
}

}  // namespace
}  // namespace rpg::dist

namespace rpg::dist {
namespace {

// PyTorch's own launcher (torchrun from the venv; its agent hosts the store) runs the
// same ranks: the results equal `rpg launch`'s.
TEST(Launch, TorchrunEqualsRpgLaunch) {
  auto ours = run_process(launch_argv({"--nproc", "2", "--exec", "--", RPG_DIST_WORKER, "collectives"}));
  ASSERT_EQ(ours.exit_code, 0) << ours.err;
  auto theirs = run_process({test::python().string(), "-m", "torch.distributed.run", "--nproc-per-node", "2",
                             "--master-port", std::to_string(free_port()), "--tee", "3", "--no-python", RPG_DIST_WORKER,
                             "collectives"});
  ASSERT_EQ(theirs.exit_code, 0) << theirs.err;
  for (int k = 0; k < 2; ++k) {
    // torchrun --tee prefixes lines with "[default<k>]:".
    std::string mine = lines_of(ours.out, str("[rank ", k, "] "));
    EXPECT_FALSE(mine.empty());
    EXPECT_EQ(lines_of(theirs.out, str("[default", k, "]:")), mine) << theirs.out;
  }
}

}  // namespace
}  // namespace rpg::dist

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <set>

namespace rpg::dist {
namespace {

// free_port's ports stay out of the kernel's ephemeral range (read here from /proc, not
// through launch.cpp), where any process's connect() can take a port between the pick
// and the store's bind; and a store can listen on every one of them.
TEST(Launch, FreePortIsOutsideTheEphemeralRangeAndListens) {
  int lo = 0, hi = 0;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> lo >> hi;
  ASSERT_GT(lo, 0) << "cannot read /proc/sys/net/ipv4/ip_local_port_range";
  ASSERT_TRUE(lo > 10000 || hi < 65535) << "this machine's ephemeral range leaves no room: " << lo << " " << hi;
  std::set<int> seen;
  for (int i = 0; i < 64; ++i) {
    const int port = free_port();
    EXPECT_TRUE(port < lo || port > hi) << port << " is in the ephemeral range [" << lo << ", " << hi << "]";
    EXPECT_GE(port, 1024);
    seen.insert(port);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << "port " << port;
    EXPECT_EQ(listen(fd, 1), 0) << "port " << port;
    close(fd);
  }
  // A random start: callers in parallel do not all probe the same first port.
  EXPECT_GT(seen.size(), 32u);
}

}  // namespace
}  // namespace rpg::dist
