// The startup timeline: phases come back in start order whatever order
// they were marked in, a phase marked twice keeps its later time, a new
// timeline forgets the old one's marks, each mark logs a `startup` line, and
// a name that is not a phase is refused.
#include "core/startup.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/log.h"

namespace basalt {
namespace {

class LogToFile {
 public:
  LogToFile() : file_(std::tmpfile()) { set_log_sink(file_); }
  ~LogToFile() {
    set_log_sink(stderr);
    std::fclose(file_);
  }
  std::string text() const {
    std::fflush(file_);
    std::rewind(file_);
    std::string out;
    char buffer[4096];
    size_t n = 0;
    while ((n = std::fread(buffer, 1, sizeof buffer, file_)) > 0) out.append(buffer, n);
    return out;
  }

 private:
  std::FILE* file_;
};

TEST(Startup, ProcessClockRunsForward) {
  const double before = seconds_since_process_start();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double after = seconds_since_process_start();
  EXPECT_GT(before, 0);
  EXPECT_GE(after - before, 0.019);
}

TEST(Startup, ANewTimelineForgetsTheOldOnesMarks) {
  LogToFile log;
  start_startup_timeline();
  mark_startup_phase("mmap");
  start_startup_timeline();
  EXPECT_TRUE(startup_phases().empty());
  EXPECT_NE(log.text().find("startup phase=mmap since_start_s="), std::string::npos) << log.text();
}

TEST(Startup, PhasesComeBackInStartOrderWithTheirLatestTime) {
  LogToFile log;
  start_startup_timeline();
  mark_startup_phase("upload");
  mark_startup_phase("listening");
  mark_startup_phase("mmap");
  const double first_upload = startup_phases()[2].since_start_s;
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  mark_startup_phase("upload");  // a second rank finishing later
  const std::vector<StartupPhase> phases = startup_phases();
  ASSERT_EQ(phases.size(), 3u);
  EXPECT_EQ(phases[0].name, "listening");
  EXPECT_EQ(phases[1].name, "mmap");
  EXPECT_EQ(phases[2].name, "upload");
  EXPECT_GT(phases[2].since_start_s, first_upload);
  EXPECT_LE(phases[0].since_start_s, phases[1].since_start_s);
  const std::string text = log.text();
  size_t lines = 0;
  for (size_t at = text.find("startup phase="); at != std::string::npos; at = text.find("startup phase=", at + 1))
    ++lines;
  EXPECT_EQ(lines, 4u) << text;
}

TEST(Startup, UnknownPhaseIsRefused) {
  EXPECT_THROW(mark_startup_phase("loading"), Error);
  EXPECT_TRUE(is_startup_phase("kv_cache"));
  EXPECT_FALSE(is_startup_phase("Ready"));
}

}  // namespace
}  // namespace basalt
