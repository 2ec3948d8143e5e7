// Deterministic parallel loop: task i always computes the same thing whichever
// thread runs it, so results never depend on the thread count. Workers pull
// task indices from an atomic counter; the first exception thrown by a task is
// rethrown on the calling thread after all workers stop.
#pragma once

#include <cstdint>
#include <functional>

namespace anchorkv::core {

// threads <= 0 means all hardware threads.
int resolve_threads(int threads);

void parallel_for(int64_t n_tasks, int threads, const std::function<void(int64_t)>& task);

// parallel_for over consecutive runs of tasks of about equal total `cost(i)`
// (a few runs per thread): many cheap tasks (a long session's small
// segments) cost one pull of the shared counter per run instead of one each,
// and neighbouring tasks' outputs stay on one thread. Each task still
// computes the same thing whichever thread runs it.
void parallel_for_grouped(int64_t n_tasks, int threads, const std::function<int64_t(int64_t)>& cost,
                          const std::function<void(int64_t)>& task);

}  // namespace anchorkv::core
