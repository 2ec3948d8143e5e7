#include "core/background.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#ifdef __linux__
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace anchorkv::core {

namespace {

// The worker yields to everything else (nice 19: it takes what the cores
// leave; SCHED_IDLE starved it until a commit had to wait, measured worse).
void lower_this_threads_priority() {
#ifdef __linux__
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
#endif
}

class Workers {
 public:
  Workers() {
    const unsigned hw = std::thread::hardware_concurrency();
    const unsigned n = std::clamp(hw, 1u, 4u);  // jobs arrive per layer, a few at a time
    for (unsigned i = 0; i < n; ++i) threads_.emplace_back([this] { loop(); });
  }
  void push(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    lower_this_threads_priority();
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !queue_.empty(); });
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        job();  // in_background's packaged task hands what it throws to its future
      } catch (...) {
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;
};

// Created on first use and never destroyed (a job may still run at exit);
// a forked child starts its own, since it has no workers.
std::atomic<Workers*> g_workers{nullptr};
std::once_flag g_atfork_once;

Workers& workers() {
  std::call_once(g_atfork_once, [] { pthread_atfork(nullptr, nullptr, [] { g_workers.store(nullptr); }); });
  Workers* w = g_workers.load(std::memory_order_acquire);
  if (w) return *w;
  static std::mutex create;
  std::lock_guard<std::mutex> lock(create);
  w = g_workers.load(std::memory_order_acquire);
  if (!w) {
    w = new Workers();  // NOLINT: intentionally leaked, see above
    g_workers.store(w, std::memory_order_release);
  }
  return *w;
}

}  // namespace

void run_in_background(std::function<void()> job) { workers().push(std::move(job)); }

}  // namespace anchorkv::core
