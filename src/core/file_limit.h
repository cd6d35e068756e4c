// The process's open-file limit. A server holds one descriptor per
// connection (a gateway two per stream: its client's and its replica's), and
// the soft limit a shell or service manager hands out is often 1,024, far
// below the hard limit the administrator allows.
//
// Contract: raise_open_file_limit() sets the soft RLIMIT_NOFILE to the hard
// one, when it is lower, and returns the soft limit in force afterwards (the
// old one when the raise is refused; 0 when the limit cannot be read). It
// never lowers the limit and never throws.
//
// reserve_descriptor_table(count) grows the kernel's descriptor table of
// this process so that `count` descriptors fit, at start, instead of while
// connections arrive. Linux doubles the table as descriptors are taken, and
// in a process with threads each doubling waits for an RCU grace period
// (expand_fdtable → synchronize_rcu), stalling the thread that accepts or
// connects for milliseconds: measured on a 16-core machine, the first
// seconds of a ramp to 10,000 streams put 10-25 ms on the P99 of the time to
// first byte through the gateway, and on none after. The table never
// shrinks; each slot costs 8 bytes plus two bits. Returns whether the table
// now holds `count` descriptors (false when count is above the soft limit
// or no descriptor could be duplicated); never throws and leaves no
// descriptor open.
#pragma once

#include <cstdint>

namespace basalt {

uint64_t raise_open_file_limit();
bool reserve_descriptor_table(uint64_t count);

}  // namespace basalt
