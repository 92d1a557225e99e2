// run_process: input and outputs byte-exact, exit statuses, signals (an abort), timeouts (also of
// a child that closed its outputs), a child that never reads its input, a missing program, and
// many concurrent children (no pipe leaks into a sibling).
#include "runtime/subprocess.hpp"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace flashjit {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string pattern_bytes(size_t size) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>((i * 131 + i / 7) & 0xff);
  return bytes;
}

TEST(RunProcess, PassesInputAndOutputByteExact) {
  // Larger than any pipe buffer, so writing stdin and reading stdout must interleave.
  const std::string input = pattern_bytes(3 << 20);
  Result<ProcessResult> result = run_process({"/bin/cat"}, input, 30);
  ASSERT_TRUE(result.ok()) << result.error().describe();
  EXPECT_TRUE(result->exited_ok()) << result->how_it_ended(30);
  EXPECT_EQ(result->out.size(), input.size());
  EXPECT_TRUE(result->out == input);
  EXPECT_EQ(result->err, "");
}

TEST(RunProcess, ReportsExitStatusAndStderr) {
  Result<ProcessResult> result =
      run_process({"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}, "", 30);
  ASSERT_TRUE(result.ok()) << result.error().describe();
  EXPECT_EQ(result->exit_code, 3);
  EXPECT_EQ(result->signal, 0);
  EXPECT_FALSE(result->exited_ok());
  EXPECT_EQ(result->out, "out\n");
  EXPECT_EQ(result->err, "err\n");
  EXPECT_EQ(result->how_it_ended(30), "exit status 3");
}

TEST(RunProcess, AnAbortIsASignalNotACrashOfTheCaller) {
  Result<ProcessResult> result =
      run_process({"/bin/sh", "-c", "echo last words >&2; kill -ABRT $$"}, "", 30);
  ASSERT_TRUE(result.ok()) << result.error().describe();
  EXPECT_EQ(result->signal, SIGABRT);
  EXPECT_EQ(result->exit_code, -1);
  EXPECT_EQ(result->err, "last words\n");
  EXPECT_EQ(result->how_it_ended(30), "killed by signal 6 (SIGABRT)");
}

TEST(RunProcess, KillsAChildPastTheTimeout) {
  const auto start = std::chrono::steady_clock::now();
  Result<ProcessResult> result = run_process({"/bin/sh", "-c", "sleep 20"}, "", 0.3);
  ASSERT_TRUE(result.ok()) << result.error().describe();
  EXPECT_TRUE(result->timed_out);
  EXPECT_LT(seconds_since(start), 5.0);
  EXPECT_NE(result->how_it_ended(0.3).find("timed out"), std::string::npos);
}

TEST(RunProcess, TimeoutHoldsForAChildThatClosedItsOutputs) {
  const auto start = std::chrono::steady_clock::now();
  Result<ProcessResult> result = run_process({"/bin/sh", "-c", "exec >&- 2>&-; sleep 20"}, "", 0.3);
  ASSERT_TRUE(result.ok()) << result.error().describe();
  EXPECT_TRUE(result->timed_out);
  EXPECT_LT(seconds_since(start), 5.0);
}

TEST(RunProcess, AChildThatIgnoresItsInputDoesNotKillTheCaller) {
  // The child exits without reading: writing the rest must give EPIPE, not SIGPIPE.
  Result<ProcessResult> result = run_process({"/bin/true"}, pattern_bytes(8 << 20), 30);
  ASSERT_TRUE(result.ok()) << result.error().describe();
  EXPECT_TRUE(result->exited_ok()) << result->how_it_ended(30);
}

TEST(RunProcess, AMissingProgramIsAnIoError) {
  Result<ProcessResult> result = run_process({"/no/such/program"}, "", 30);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().code, ErrorCode::IoError);
  EXPECT_NE(result.error().message.find("/no/such/program"), std::string::npos);
  EXPECT_FALSE(run_process({}, "", 30).ok());
}

TEST(RunProcess, ConcurrentChildrenDoNotHoldEachOthersPipes) {
  // If a pipe end leaked into a sibling, the fast children would see EOF only when the slow one
  // (2 s) exits.
  std::thread slow([] { (void)run_process({"/bin/sh", "-c", "sleep 2"}, "", 30); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  std::vector<std::string> outputs(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([t, &outputs] {
      Result<ProcessResult> result = run_process({"/bin/cat"}, "child " + std::to_string(t), 30);
      if (result.ok()) outputs[t] = result->out;
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_LT(seconds_since(start), 1.5);
  for (int t = 0; t < 8; ++t) EXPECT_EQ(outputs[t], "child " + std::to_string(t));
  slow.join();
}

}  // namespace
}  // namespace flashjit
