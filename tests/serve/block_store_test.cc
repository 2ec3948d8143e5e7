// The store replicas share, against a real redis-server started here (on a
// free loopback port, no persistence). Also run under ThreadSanitizer.
#include "serve/block_store.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "anchorkv/status.h"
#include "runtime/prefix_chain.h"

extern char** environ;

namespace anchorkv::serve {
namespace {

using runtime::BlockInfo;
using runtime::HeldBlock;
using namespace std::chrono_literals;

bool have_redis_server() { return std::system("command -v redis-server >/dev/null 2>&1") == 0; }

#define NEED_REDIS()                                                                            \
  do {                                                                                          \
    if (!have_redis_server()) {                                                                 \
      if (std::getenv("CI")) FAIL() << "redis-server is missing (scripts/deps.sh installs it)"; \
      GTEST_SKIP() << "redis-server is not installed";                                          \
    }                                                                                           \
  } while (0)

int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

// A redis-server of its own for one test; stopped with the object.
class RedisServer {
 public:
  explicit RedisServer(int port, std::vector<std::string> extra = {}) : port_(port) {
    std::vector<std::string> args = {"redis-server", "--port", std::to_string(port), "--bind", "127.0.0.1",
                                     "--save",       "",       "--appendonly",       "no",     "--logfile",
                                     "/dev/null"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawnp(&pid_, "redis-server", nullptr, nullptr, argv.data(), environ) != 0) pid_ = -1;
    for (int i = 0; i < 200 && !answers(); ++i) std::this_thread::sleep_for(20ms);
  }
  ~RedisServer() { stop(); }
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  bool answers() const {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = ::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(s);
    return ok;
  }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  // A direct connection, to damage and inspect what the store holds.
  RedisConnection connect() const { return RedisConnection(parse_redis_url(url()), 2000ms); }

 private:
  int port_;
  pid_t pid_ = -1;
};

constexpr uint64_t kRoot = 0x1234;

// Test block bytes: key, parent, first, then the tokens (the store never
// parses blocks; `verify` here does, as block_info does for real files).
std::shared_ptr<const std::vector<uint8_t>> bytes_of(const BlockInfo& b) {
  std::vector<uint8_t> out(24 + 4 * b.tokens.size());
  std::memcpy(&out[0], &b.key, 8);
  std::memcpy(&out[8], &b.parent, 8);
  std::memcpy(&out[16], &b.first, 8);
  std::memcpy(&out[24], b.tokens.data(), 4 * b.tokens.size());
  return std::make_shared<const std::vector<uint8_t>>(std::move(out));
}

BlockStore::Verify verify_bytes() {
  return [](const uint8_t* d, size_t n) -> std::optional<BlockInfo> {
    if (n < 28 || (n - 24) % 4 != 0) return std::nullopt;
    BlockInfo b;
    std::memcpy(&b.key, d, 8);
    std::memcpy(&b.parent, d + 8, 8);
    std::memcpy(&b.first, d + 16, 8);
    b.tokens.resize((n - 24) / 4);
    std::memcpy(b.tokens.data(), d + 24, n - 24);
    if (runtime::chain_key(b.parent, b.tokens.data(), b.tokens.size()) != b.key) return std::nullopt;
    return b;
  };
}

std::vector<int32_t> prompt_of(int n, int32_t salt = 0) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) p[static_cast<size_t>(i)] = (i * 7 + salt) % 1000;
  return p;
}

// The chain of `prompt` cut at `lengths`, from kRoot.
std::vector<HeldBlock> chain_of(const std::vector<int32_t>& prompt, const std::vector<int>& lengths) {
  std::vector<HeldBlock> out;
  uint64_t parent = kRoot;
  int64_t pos = 0;
  for (int l : lengths) {
    BlockInfo b{0, parent, pos, std::vector<int32_t>(prompt.begin() + pos, prompt.begin() + pos + l)};
    b.key = runtime::chain_key(parent, b.tokens.data(), b.tokens.size());
    out.push_back({b, bytes_of(b)});
    parent = b.key;
    pos += l;
  }
  return out;
}

StoreOptions options(const std::string& url) {
  StoreOptions o;
  o.url = url;
  o.retry = 50ms;
  o.timeout = 1000ms;
  return o;
}

std::vector<uint64_t> keys(const std::vector<HeldBlock>& blocks) {
  std::vector<uint64_t> k;
  for (const HeldBlock& b : blocks) k.push_back(b.info.key);
  return k;
}

std::string block_key(uint64_t key) {
  char s[80];
  std::snprintf(s, sizeof s, "anchorkv:1:%016llx:block:%016llx", static_cast<unsigned long long>(kRoot),
                static_cast<unsigned long long>(key));
  return s;
}

bool wait_for(const std::function<bool()>& f) {
  for (int i = 0; i < 500; ++i) {
    if (f()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

TEST(ChainKeys, EqualChainKeyAtEveryLength) {
  const std::vector<int32_t> p = prompt_of(300);
  const std::vector<size_t> lengths = {1, 2, 64, 65, 299, 300, 7};  // the last out of order
  const std::vector<uint64_t> keys = runtime::chain_keys(kRoot, p.data(), lengths);
  ASSERT_EQ(keys.size(), lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i)
    EXPECT_EQ(keys[i], runtime::chain_key(kRoot, p.data(), lengths[i]));
}

TEST(ChainKeys, ThetasThatDifferAnywhereHaveRootsOfTheirOwn) {
  EXPECT_EQ(runtime::theta_string(0.05), "0.05");
  EXPECT_EQ(runtime::theta_string(0.1), "0.1");
  EXPECT_NE(runtime::theta_string(0.0500001), runtime::theta_string(0.05));
  EXPECT_NE(runtime::chain_root({"model", "anchorkv", 0.0500001}), runtime::chain_root({"model", "anchorkv", 0.05}));
  EXPECT_NE(runtime::chain_root({"model", "anchorkv", std::nextafter(0.05, 1.0)}),
            runtime::chain_root({"model", "anchorkv", 0.05}));
}

TEST(RedisUrl, ParsesEveryFormAndRefusesOthers) {
  RedisAddress a = parse_redis_url("redis://alice:s%40cret@cache.internal:6380/3");
  EXPECT_EQ(a.host, "cache.internal");
  EXPECT_EQ(a.port, 6380);
  EXPECT_EQ(a.db, 3);
  EXPECT_EQ(a.user, "alice");
  EXPECT_EQ(a.password, "s@cret");
  EXPECT_EQ(a.redacted(), "redis://alice:***@cache.internal:6380/3");
  a = parse_redis_url("redis://:pw@[::1]:7000");
  EXPECT_EQ(a.host, "::1");
  EXPECT_EQ(a.port, 7000);
  EXPECT_EQ(a.password, "pw");
  EXPECT_EQ(a.redacted().find("pw"), std::string::npos);
  a = parse_redis_url("redis://localhost");
  EXPECT_EQ(a.port, 6379);
  EXPECT_EQ(a.db, 0);
  a = parse_redis_url("unix:///run/redis/redis.sock?db=2");
  EXPECT_TRUE(a.unix_socket);
  EXPECT_EQ(a.path, "/run/redis/redis.sock");
  EXPECT_EQ(a.db, 2);
  for (const char* bad :
       {"http://host:6379", "rediss://host:6379", "host:6379", "redis://", "redis://h:0", "redis://h:99999",
        "redis://h:12x", "redis://h/db", "unix://relative.sock", "unix:///s?x=1", "redis://u:%4@h",
        "redis://[::1", "redis://a@b@h:1", "redis://h\\x:1"}) {
    try {
      parse_redis_url(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << bad;
      EXPECT_NE(std::string(e.what()).find("--kv-store"), std::string::npos) << e.what();
    }
  }
}

TEST(BlockStore, AChainIsFoundFromAnyOfItsBlocksAndOnlyWhereThePromptMatches) {
  NEED_REDIS();
  RedisServer redis(free_port());
  BlockStore store(options(redis.url()), kRoot, verify_bytes());
  ASSERT_TRUE(store.up());
  const std::vector<int32_t> p = prompt_of(300);
  const std::vector<HeldBlock> chain = chain_of(p, {100, 120, 80});
  store.put(chain);
  store.flush();
  EXPECT_EQ(store.metrics().blocks_written, 3);

  EXPECT_EQ(keys(store.extend(p, p.size(), kRoot, 0)), keys(chain));
  const std::vector<HeldBlock> rest = store.extend(p, p.size(), chain[0].info.key, 100);
  EXPECT_EQ(keys(rest), std::vector<uint64_t>({chain[1].info.key, chain[2].info.key}));
  EXPECT_EQ(*rest[0].file, *chain[1].file);
  EXPECT_EQ(keys(store.extend(p, 299, kRoot, 0)).size(), 2u) << "the last block ends past max_tokens";
  std::vector<int32_t> other = p;
  other[150] += 1;  // differs inside the second block
  EXPECT_EQ(keys(store.extend(other, other.size(), kRoot, 0)), std::vector<uint64_t>({chain[0].info.key}));
  EXPECT_TRUE(store.extend(prompt_of(300, 1), 300, kRoot, 0).empty());
  // A second chain from the same first block: the longest that matches is taken.
  std::vector<int32_t> longer = p;
  longer.resize(400, 5);
  const std::vector<HeldBlock> fork = chain_of(longer, {100, 300});
  store.put(fork);
  store.flush();
  EXPECT_EQ(keys(store.extend(longer, longer.size(), kRoot, 0)), keys(fork));
  const StoreMetrics m = store.metrics();
  EXPECT_EQ(m.blocks_written, 4) << "the shared first block is written once";
  EXPECT_EQ(m.hits, 5);
  EXPECT_EQ(m.misses, 1);
  EXPECT_EQ(m.errors, 0);
}

TEST(BlockStore, DamagedForeignTruncatedOrEvictedValuesEndTheChainThere) {
  NEED_REDIS();
  RedisServer redis(free_port());
  BlockStore store(options(redis.url()), kRoot, verify_bytes());
  const std::vector<int32_t> p = prompt_of(300);
  const std::vector<HeldBlock> chain = chain_of(p, {100, 100, 100});
  RedisConnection direct = redis.connect();
  const std::vector<int32_t> q = prompt_of(100, 3);
  const std::vector<HeldBlock> foreign = chain_of(q, {100});  // a real block, not the one asked for
  const std::string wrong_value(reinterpret_cast<const char*>(foreign[0].file->data()),
                                foreign[0].file->size());
  const std::string good(reinterpret_cast<const char*>(chain[1].file->data()), chain[1].file->size());
  int64_t bad = 0;
  for (const std::string& damage : {std::string("garbage"), good.substr(0, good.size() - 5), wrong_value,
                                    good.substr(0, 24) + std::string(good.size() - 24, '\x01')}) {
    store.put(chain);
    store.flush();
    direct.pipeline({{"SET", block_key(chain[1].info.key), damage}});
    EXPECT_EQ(keys(store.extend(p, p.size(), kRoot, 0)), std::vector<uint64_t>({chain[0].info.key}));
    EXPECT_EQ(store.metrics().bad_entries, ++bad);
    EXPECT_EQ(direct.pipeline({{"EXISTS", block_key(chain[1].info.key)}})[0].integer, 0) << "deleted";
    EXPECT_EQ(keys(store.extend(p, p.size(), kRoot, 0)).size(), 1u);
  }
  store.put(chain);
  store.flush();
  ASSERT_EQ(keys(store.extend(p, p.size(), kRoot, 0)).size(), 3u);
  direct.pipeline({{"DEL", block_key(chain[1].info.key)}});  // evicted by the store
  EXPECT_EQ(keys(store.extend(p, p.size(), kRoot, 0)), std::vector<uint64_t>({chain[0].info.key}));
  // Blocks a replica restored from its own pool come back when the store lost them.
  store.put({chain[0], chain[1]}, /*known_present=*/true);
  store.flush();
  EXPECT_EQ(keys(store.extend(p, p.size(), kRoot, 0)).size(), 3u);
}

TEST(BlockStore, ADownStoreIsAMissAndIsUsedAgainWhenItComesBack) {
  NEED_REDIS();
  const int port = free_port();
  BlockStore store(options("redis://127.0.0.1:" + std::to_string(port)), kRoot, verify_bytes());
  EXPECT_FALSE(store.up());
  const std::vector<int32_t> p = prompt_of(200);
  const std::vector<HeldBlock> chain = chain_of(p, {100, 100});
  EXPECT_TRUE(store.extend(p, p.size(), kRoot, 0).empty());
  store.put(chain);
  EXPECT_EQ(store.metrics().dropped_writes, 2);
  {
    RedisServer redis(port);
    ASSERT_TRUE(wait_for([&] { return store.up(); })) << "reconnects in the background";
    store.put(chain);
    store.flush();
    EXPECT_EQ(keys(store.extend(p, p.size(), kRoot, 0)), keys(chain));
  }  // killed
  EXPECT_TRUE(store.extend(p, p.size(), kRoot, 0).empty());
  EXPECT_FALSE(store.up());
  EXPECT_GE(store.metrics().errors, 1);
  RedisServer again(port);  // empty: it kept nothing
  ASSERT_TRUE(wait_for([&] { return store.up(); }));
  EXPECT_TRUE(store.extend(p, p.size(), kRoot, 0).empty());
  store.put(chain);
  store.flush();
  EXPECT_EQ(keys(store.extend(p, p.size(), kRoot, 0)), keys(chain));
}

// A server that accepts connections and never answers: down after the
// timeout, and every call returns at once from then on.
TEST(BlockStore, AStoreThatNeverAnswersIsDownAfterTheTimeout) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(s, 16), 0);  // the kernel completes connections; nothing reads them
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  StoreOptions o = options("redis://127.0.0.1:" + std::to_string(ntohs(a.sin_port)));
  o.timeout = 100ms;
  testing::internal::CaptureStderr();
  BlockStore store(o, kRoot, verify_bytes());
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(store.up());
  EXPECT_NE(said.find("no reply within the timeout"), std::string::npos) << said;
  const std::vector<int32_t> p = prompt_of(100);
  EXPECT_TRUE(store.extend(p, p.size(), kRoot, 0).empty());
  store.put(chain_of(p, {100}));
  EXPECT_EQ(store.metrics().dropped_writes, 1);
  ::close(s);
}

// A store of the test's own on loopback: reads each command and answers what
// `reply(command)` says, a byte at a time every `byte_gap` when that is set.
class ScriptedStore {
 public:
  using Reply = std::function<std::string(const std::vector<std::string>&)>;
  ScriptedStore(Reply reply, std::chrono::milliseconds byte_gap = 0ms) : reply_(std::move(reply)), gap_(byte_gap) {
    listen_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(listen_, 16);
    socklen_t len = sizeof a;
    ::getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~ScriptedStore() {
    stop_ = true;
    ::shutdown(listen_, SHUT_RDWR);
    ::close(listen_);
    thread_.join();
  }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  std::vector<std::string> commands_seen() {
    std::lock_guard lock(mu_);
    return seen_;
  }

 private:
  void serve() {
    while (!stop_) {
      const int c = ::accept(listen_, nullptr, nullptr);
      if (c < 0) return;
      std::string in;
      char buf[4096];
      while (!stop_) {
        std::vector<std::string> cmd;
        size_t used = parse(in, cmd);
        if (used == 0) {
          pollfd p{c, POLLIN, 0};
          if (::poll(&p, 1, 50) <= 0) continue;
          const ssize_t n = ::recv(c, buf, sizeof buf, 0);
          if (n <= 0) break;
          in.append(buf, static_cast<size_t>(n));
          continue;
        }
        in.erase(0, used);
        {
          std::lock_guard lock(mu_);
          seen_.push_back(cmd[0]);
        }
        const std::string out = reply_(cmd);
        if (gap_.count() == 0) {
          (void)::send(c, out.data(), out.size(), MSG_NOSIGNAL);
          continue;
        }
        for (size_t i = 0; i < out.size() && !stop_; ++i) {
          if (::send(c, &out[i], 1, MSG_NOSIGNAL) != 1) break;
          std::this_thread::sleep_for(gap_);
        }
      }
      ::close(c);
    }
  }
  // One command (an array of bulk strings) from the front of `in`; 0 bytes when incomplete.
  static size_t parse(const std::string& in, std::vector<std::string>& cmd) {
    size_t pos = 0;
    auto line = [&](std::string& out) {
      const size_t end = in.find("\r\n", pos);
      if (end == std::string::npos) return false;
      out = in.substr(pos, end - pos);
      pos = end + 2;
      return true;
    };
    std::string l;
    if (!line(l) || l.empty() || l[0] != '*') return 0;
    const int n = std::stoi(l.substr(1));
    for (int i = 0; i < n; ++i) {
      if (!line(l)) return 0;
      const size_t len = std::stoul(l.substr(1));
      if (in.size() < pos + len + 2) return 0;
      cmd.push_back(in.substr(pos, len));
      pos += len + 2;
    }
    return pos;
  }
  Reply reply_;
  std::chrono::milliseconds gap_;
  int listen_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::string> seen_;
};

std::string pong_or(const std::vector<std::string>& cmd, const std::string& otherwise) {
  return cmd[0] == "PING" ? "+PONG\r\n" : otherwise;
}

TEST(BlockStore, AStoreThatTricklesItsRepliesCostsOneTimeoutAndIsMarkedDown) {
  // Answers one byte per 100 ms.
  ScriptedStore trickle([&](const std::vector<std::string>& cmd) { return pong_or(cmd, "*1\r\n$3\r\n100\r\n"); },
                        100ms);
  StoreOptions o = options(trickle.url());
  o.timeout = 300ms;  // the PING's 7 bytes take 0.7 s: the greeting alone is past it
  const auto t0 = std::chrono::steady_clock::now();
  BlockStore store(o, kRoot, verify_bytes());
  const std::vector<int32_t> p = prompt_of(100);
  EXPECT_TRUE(store.extend(p, p.size(), kRoot, 0).empty());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 3.0) << "each round trip ends at the timeout, not per byte";
  EXPECT_FALSE(store.up());
}

TEST(BlockStore, RepliesLargerThanAnyBlockAreRefusedUnreadCountedAndDeleted) {
  const std::vector<int32_t> p = prompt_of(200);
  for (const std::string& oversized : {std::string("$500000000\r\n"), std::string("*2147483648\r\n")}) {
    // The lookup walks to the first block, whose value (or whose set of next lengths) is oversized.
    const bool value = oversized[0] == '$';
    ScriptedStore store_server([&](const std::vector<std::string>& cmd) -> std::string {
      if (cmd[0] == "PING") return "+PONG\r\n";
      if (cmd[0] == "DEL") return ":1\r\n";
      if (cmd[0] == "SMEMBERS")  // after the root: one block of 100; after it, the oversized set
        return cmd[1] == "anchorkv:1:0000000000001234:next:0000000000001234" ? "*1\r\n$3\r\n100\r\n"
               : value                                                      ? "*0\r\n"
                                                                            : oversized;
      if (cmd[0] == "EXISTS") return ":1\r\n";
      if (cmd[0] == "GET") return value ? oversized : "$-1\r\n";
      return "-ERR unknown\r\n";
    });
    StoreOptions o = options(store_server.url());
    o.max_value = 1 << 20;
    BlockStore store(o, kRoot, verify_bytes());
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(store.extend(p, p.size(), kRoot, 0).empty()) << oversized;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
    const StoreMetrics m = store.metrics();
    EXPECT_EQ(m.bad_entries, 1) << oversized;
    EXPECT_EQ(m.errors, 0) << "a bad value is not a down store";
    EXPECT_TRUE(store.up());
    const std::vector<std::string> seen = store_server.commands_seen();
    EXPECT_NE(std::find(seen.begin(), seen.end(), "DEL"), seen.end()) << "the value is deleted";
  }
}

TEST(BlockStore, ARealValueLargerThanAnyBlockIsABadEntry) {
  NEED_REDIS();
  RedisServer redis(free_port());
  StoreOptions o = options(redis.url());
  o.max_value = 64 << 10;
  BlockStore store(o, kRoot, verify_bytes());
  const std::vector<int32_t> p = prompt_of(100);
  const std::vector<HeldBlock> chain = chain_of(p, {100});
  store.put(chain);
  store.flush();
  ASSERT_EQ(keys(store.extend(p, p.size(), kRoot, 0)), keys(chain));
  RedisConnection direct = redis.connect();
  direct.pipeline({{"SET", block_key(chain[0].info.key), std::string(1 << 20, 'x')}});
  EXPECT_TRUE(store.extend(p, p.size(), kRoot, 0).empty());
  EXPECT_EQ(store.metrics().bad_entries, 1);
  EXPECT_EQ(direct.pipeline({{"EXISTS", block_key(chain[0].info.key)}})[0].integer, 0) << "deleted";
  EXPECT_TRUE(store.up());
}

TEST(BlockStore, PasswordsAndAclUsers) {
  NEED_REDIS();
  const int port = free_port();
  RedisServer redis(port,
                    {"--requirepass", "top secret", "--user", "alice", "on", ">al1ce", "~*", "&*", "+@all"});
  const std::string base = "127.0.0.1:" + std::to_string(port);
  const std::vector<int32_t> p = prompt_of(100);
  for (const std::string& url : {"redis://:top%20secret@" + base, "redis://alice:al1ce@" + base + "/2"}) {
    BlockStore store(options(url), kRoot, verify_bytes());
    ASSERT_TRUE(store.up()) << url;
    store.put(chain_of(p, {100}));
    store.flush();
    EXPECT_EQ(store.extend(p, p.size(), kRoot, 0).size(), 1u);
  }
  for (const std::string& url : {"redis://" + base, "redis://alice:wr0ng@" + base}) {
    testing::internal::CaptureStderr();
    BlockStore store(options(url), kRoot, verify_bytes());
    const std::string said = testing::internal::GetCapturedStderr();
    EXPECT_FALSE(store.up()) << url;
    EXPECT_NE(said.find("is down"), std::string::npos) << said;
    EXPECT_EQ(said.find("wr0ng"), std::string::npos) << "the password is never printed: " << said;
    EXPECT_TRUE(store.extend(p, p.size(), kRoot, 0).empty());
  }
  StoreOptions o = options("redis://alice@" + base);
  o.password = "al1ce";  // as from the environment
  BlockStore store(o, kRoot, verify_bytes());
  EXPECT_TRUE(store.up());
}

TEST(BlockStore, ReplicasWritingAndReadingTheSameBlocksAtOnce) {
  NEED_REDIS();
  RedisServer redis(free_port());
  BlockStore a(options(redis.url()), kRoot, verify_bytes()), b(options(redis.url()), kRoot, verify_bytes());
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      BlockStore& s = t % 2 ? a : b;
      for (int i = 0; i < 20; ++i) {
        const std::vector<int32_t> p = prompt_of(120, i % 5);
        const std::vector<HeldBlock> chain = chain_of(p, {60, 60});
        s.put(chain);
        const std::vector<HeldBlock> got = s.extend(p, p.size(), kRoot, 0);
        if (!got.empty() && got[0].info.key != chain[0].info.key) ++wrong;
      }
    });
  for (auto& t : threads) t.join();
  a.flush();
  b.flush();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(a.metrics().errors + b.metrics().errors, 0);
  EXPECT_EQ(a.metrics().blocks_written + b.metrics().blocks_written, 10)
      << "each block written once (SET NX)";
  for (int i = 0; i < 5; ++i) EXPECT_EQ(a.extend(prompt_of(120, i), 120, kRoot, 0).size(), 2u);
}

}  // namespace
}  // namespace anchorkv::serve
