#include "core/parallel.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace anchorkv::core {

int resolve_threads(int threads) {
  if (threads > 0) return threads;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

namespace {

// One parallel_for call: workers pull task indices from `next`.
struct Job {
  const std::function<void(int64_t)>* task = nullptr;
  int64_t n_tasks = 0;
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr error;

  void work() {
    for (;;) {
      if (failed.load(std::memory_order_relaxed)) return;
      const int64_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= n_tasks) return;
      try {
        (*task)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        failed.store(true);
      }
    }
  }
};

thread_local bool t_in_worker = false;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}
// Spin this many rounds (tens of microseconds) before sleeping on a futex:
// decode issues jobs back to back, and waking a sleeping thread costs more
// than most of them.
constexpr int kSpin = 1 << 13;

// Persistent workers (decode calls parallel_for several times per token and
// layer: starting threads each time cost more than the work, and thread-local
// workspaces died with them). One job runs at a time; a call that finds the
// pool busy, or comes from inside a task, runs its tasks on the calling thread
// (the same results: a task's output never depends on which thread runs it).
class Pool {
 public:
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_.store(true);
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }

  // False when the pool is busy (the caller runs the job itself).
  bool run(Job& job, int helpers) {
    helpers = std::min(helpers, 0xFFFF);
    std::unique_lock<std::mutex> submit(submit_, std::try_to_lock);
    if (!submit.owns_lock()) return false;
    while (static_cast<int>(threads_.size()) < helpers) {
      const int index = static_cast<int>(threads_.size());
      threads_.emplace_back([this, index] { loop(index); });
    }
    job_.store(&job, std::memory_order_relaxed);
    pending_.store(helpers, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(m_);  // a worker about to sleep sees the new state
      generation_ += 1;
      state_.store((generation_ << 16) | static_cast<uint64_t>(helpers), std::memory_order_release);
    }
    if (sleepers_.load() > 0) wake_.notify_all();
    t_in_worker = true;  // nested parallel_for calls inside our own tasks run inline
    job.work();
    t_in_worker = false;
    for (int i = 0; i < kSpin && pending_.load(std::memory_order_acquire) != 0; ++i) cpu_relax();
    if (pending_.load(std::memory_order_acquire) != 0) {
      std::unique_lock<std::mutex> lock(m_);
      done_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
    }
    job_.store(nullptr, std::memory_order_relaxed);
    return true;
  }

 private:
  void loop(int index) {
    t_in_worker = true;
    uint64_t seen = 0;
    for (;;) {
      // state_ = generation << 16 | helpers, one atomic word: a worker learns
      // both together. Only workers with index < helpers touch job_, and the
      // caller cannot start the next job before they finish, so job_ stays
      // valid for them; the others never read it.
      uint64_t st = state_.load(std::memory_order_acquire);
      for (int i = 0; i < kSpin && (st >> 16) == seen && !stop_.load(std::memory_order_relaxed); ++i) {
        cpu_relax();
        st = state_.load(std::memory_order_acquire);
      }
      if ((st >> 16) == seen) {
        std::unique_lock<std::mutex> lock(m_);
        sleepers_.fetch_add(1);
        wake_.wait(lock,
                   [&] { return stop_.load() || (state_.load(std::memory_order_acquire) >> 16) != seen; });
        sleepers_.fetch_sub(1);
        st = state_.load(std::memory_order_acquire);
      }
      if (stop_.load()) return;
      seen = st >> 16;
      if (index >= static_cast<int>(st & 0xFFFF)) continue;
      job_.load(std::memory_order_relaxed)->work();
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(m_);
        done_.notify_one();
      }
    }
  }

  std::mutex submit_, m_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> threads_;
  std::atomic<Job*> job_{nullptr};
  std::atomic<int> pending_{0}, sleepers_{0};
  uint64_t generation_ = 0;  // written by the submitting thread only
  std::atomic<uint64_t> state_{0};
  std::atomic<bool> stop_{false};
};

// The pool is created on first use and never destroyed (workers may be
// blocked at exit); a forked child starts a fresh one, since it has no workers.
std::atomic<Pool*> g_pool{nullptr};
std::once_flag g_atfork_once;

Pool& pool() {
  std::call_once(g_atfork_once, [] { pthread_atfork(nullptr, nullptr, [] { g_pool.store(nullptr); }); });
  Pool* p = g_pool.load(std::memory_order_acquire);
  if (p) return *p;
  static std::mutex create;
  std::lock_guard<std::mutex> lock(create);
  p = g_pool.load(std::memory_order_acquire);
  if (!p) {
    p = new Pool();  // NOLINT: intentionally leaked, see above
    g_pool.store(p, std::memory_order_release);
  }
  return *p;
}

}  // namespace

void parallel_for(int64_t n_tasks, int threads, const std::function<void(int64_t)>& task) {
  if (n_tasks <= 0) return;
  const int64_t workers = std::min<int64_t>(resolve_threads(threads), n_tasks);
  Job job;
  job.task = &task;
  job.n_tasks = n_tasks;
  if (workers <= 1 || t_in_worker || !pool().run(job, static_cast<int>(workers - 1))) job.work();
  if (job.error) std::rethrow_exception(job.error);
}

void parallel_for_grouped(int64_t n_tasks, int threads, const std::function<int64_t(int64_t)>& cost,
                          const std::function<void(int64_t)>& task) {
  constexpr int64_t kRunsPerThread = 4;
  const int64_t runs = std::min<int64_t>(n_tasks, kRunsPerThread * resolve_threads(threads));
  if (runs <= 1 || runs == n_tasks) return parallel_for(n_tasks, threads, task);
  std::vector<int64_t> until(static_cast<size_t>(n_tasks));  // cost of tasks [0, i]
  int64_t total = 0;
  for (int64_t i = 0; i < n_tasks; ++i) until[static_cast<size_t>(i)] = total += std::max<int64_t>(1, cost(i));
  std::vector<int64_t> first(static_cast<size_t>(runs + 1), n_tasks);  // run j: tasks [first[j], first[j + 1])
  first[0] = 0;
  for (int64_t j = 1; j < runs; ++j)
    first[static_cast<size_t>(j)] =
        std::lower_bound(until.begin(), until.end(), total * j / runs) - until.begin();
  parallel_for(runs, threads, [&](int64_t j) {
    for (int64_t i = first[static_cast<size_t>(j)]; i < first[static_cast<size_t>(j + 1)]; ++i) task(i);
  });
}

}  // namespace anchorkv::core
