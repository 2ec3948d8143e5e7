#include "core/background.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace anchorkv::core {
namespace {

TEST(Background, EveryJobsResultArrives) {
  std::vector<std::shared_future<int>> results;
  for (int i = 0; i < 200; ++i) results.push_back(in_background([i] { return i * i; }));
  for (int i = 0; i < 200; ++i) EXPECT_EQ(results[static_cast<size_t>(i)].get(), i * i);
}

TEST(Background, RunsOffTheCallingThread) {
  const auto caller = std::this_thread::get_id();
  EXPECT_NE(in_background([] { return std::this_thread::get_id(); }).get(), caller);
}

TEST(Background, AJobsExceptionReachesItsFutureAndTheWorkersGoOn) {
  auto failed = in_background([]() -> int { throw std::runtime_error("job failed"); });
  EXPECT_THROW(failed.get(), std::runtime_error);
  EXPECT_EQ(in_background([] { return 7; }).get(), 7);
}

// A forked child has no workers of its parent's: it must start its own.
TEST(Background, AForkedChildRunsItsOwnJobs) {
  EXPECT_EQ(in_background([] { return 1; }).get(), 1);  // the parent's workers exist
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(in_background([] { return 42; }).get() == 42 ? 0 : 1);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace anchorkv::core
