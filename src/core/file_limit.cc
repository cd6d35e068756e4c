#include "core/file_limit.h"

#include <sys/resource.h>

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

}  // namespace basalt
