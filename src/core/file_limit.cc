#include "core/file_limit.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <limits>

namespace basalt {

uint64_t raise_open_file_limit() {
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) != 0) return 0;
  if (files.rlim_cur < files.rlim_max) {
    rlimit raised = files;
    raised.rlim_cur = files.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) files = raised;
  }
  return static_cast<uint64_t>(files.rlim_cur);
}

bool reserve_descriptor_table(uint64_t count) {
  if (count == 0) return true;
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) != 0 || count > files.rlim_cur ||
      count > static_cast<uint64_t>(std::numeric_limits<int>::max()))
    return false;
  // The lowest free descriptor at or above count - 1: taking it makes the
  // kernel size the table for it. F_DUPFD never replaces an open descriptor.
  const int high = ::fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, static_cast<int>(count - 1));
  if (high < 0) return false;
  ::close(high);
  return true;
}

}  // namespace basalt
