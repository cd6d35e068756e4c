// The process's open-file limit. A server holds one descriptor per
// connection (a gateway two per stream: its client's and its replica's), and
// the soft limit a shell or service manager hands out is often 1,024, far
// below the hard limit the administrator allows.
//
// Contract: raise_open_file_limit() sets the soft RLIMIT_NOFILE to the hard
// one, when it is lower, and returns the soft limit in force afterwards (the
// old one when the raise is refused; 0 when the limit cannot be read). It
// never lowers the limit and never throws.
#pragma once

#include <cstdint>

namespace basalt {

uint64_t raise_open_file_limit();

}  // namespace basalt
