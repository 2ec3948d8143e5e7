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
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }

  // False when the pool is busy (the caller runs the job itself).
  bool run(Job& job, int helpers) {
    std::unique_lock<std::mutex> submit(submit_, std::try_to_lock);
    if (!submit.owns_lock()) return false;
    {
      std::unique_lock<std::mutex> lock(m_);
      while (static_cast<int>(threads_.size()) < helpers) {
        const int index = static_cast<int>(threads_.size());
        threads_.emplace_back([this, index] { loop(index); });
      }
      job_ = &job;
      active_ = helpers;
      pending_ = helpers;
      ++generation_;
    }
    wake_.notify_all();
    t_in_worker = true;  // nested parallel_for calls inside our own tasks run inline
    job.work();
    t_in_worker = false;
    std::unique_lock<std::mutex> lock(m_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    return true;
  }

 private:
  void loop(int index) {
    t_in_worker = true;
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= active_) continue;
      Job* job = job_;
      lock.unlock();
      job->work();
      lock.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex submit_, m_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> threads_;
  Job* job_ = nullptr;
  int active_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
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

}  // namespace anchorkv::core
