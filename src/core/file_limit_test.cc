// raise_open_file_limit: the soft limit ends at the hard one, from below,
// and a second call changes nothing.
#include "core/file_limit.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace basalt {
namespace {

TEST(FileLimit, SoftLimitRisesToTheHardOne) {
  rlimit before{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &before), 0);
  // Start below the hard limit, as a shell's default soft limit does.
  if (before.rlim_max > 64) {
    rlimit lowered = before;
    lowered.rlim_cur = 64;
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &lowered), 0);
  }
  const uint64_t now = raise_open_file_limit();
  rlimit after{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &after), 0);
  EXPECT_EQ(after.rlim_cur, after.rlim_max);
  EXPECT_EQ(after.rlim_max, before.rlim_max);
  EXPECT_EQ(now, static_cast<uint64_t>(after.rlim_cur));
  EXPECT_EQ(raise_open_file_limit(), now);
}

// The kernel's table size, FDSize in /proc/self/status.
uint64_t descriptor_table_size() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("FDSize:", 0) == 0) return std::stoull(line.substr(7));
  return 0;
}

TEST(FileLimit, ReservingGrowsTheDescriptorTableOnce) {
  raise_open_file_limit();
  rlimit files{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &files), 0);
  if (files.rlim_cur < 5000) GTEST_SKIP() << "the hard open-file limit is " << files.rlim_max;
  const uint64_t before = descriptor_table_size();
  ASSERT_GT(before, 0u);
  ASSERT_LT(before, 5000u) << "a fresh test process starts with a small table";
  EXPECT_TRUE(reserve_descriptor_table(5000));
  EXPECT_GE(descriptor_table_size(), 5000u);
  // Nothing stays open: the next descriptor is a low one again.
  const int fd = ::dup(STDERR_FILENO);
  EXPECT_LT(fd, 64);
  ::close(fd);
  // Beyond the soft limit: refused, and nothing changes.
  EXPECT_FALSE(reserve_descriptor_table(static_cast<uint64_t>(files.rlim_cur) + 1));
  EXPECT_TRUE(reserve_descriptor_table(0));
}

}  // namespace
}  // namespace basalt
