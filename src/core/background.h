// Work off the caller's critical path: a process-wide set of worker threads
// at the lowest CPU priority (nice 19), started once. A streaming cache hands
// a closing segment's compression to them; the decode threads keep the cores
// whenever they want them, and no step pays for creating a thread.
#pragma once

#include <functional>
#include <future>
#include <memory>

namespace anchorkv::core {

// Runs `job` on a background worker; jobs start in submission order. What
// `job` throws is dropped (in_background hands it to the future instead).
void run_in_background(std::function<void()> job);

// `fn`'s result, computed on a background worker; the future rethrows what
// `fn` threw. A job submitted before a fork never finishes in the child.
template <class Fn>
auto in_background(Fn fn) -> std::shared_future<decltype(fn())> {
  auto task = std::make_shared<std::packaged_task<decltype(fn())()>>(std::move(fn));
  auto result = task->get_future().share();
  run_in_background([task] { (*task)(); });
  return result;
}

}  // namespace anchorkv::core
