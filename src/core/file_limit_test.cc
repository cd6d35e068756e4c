// raise_open_file_limit: the soft limit ends at the hard one, from below,
// and a second call changes nothing.
#include "core/file_limit.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

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

}  // namespace
}  // namespace basalt
