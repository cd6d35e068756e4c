// Error handling for Basalt.
//
// Contract: every input from outside (files, CLI flags, HTTP bodies) is
// validated where it enters, and a violation throws basalt::Error with a
// message that names the thing at fault (file, tensor, field) and the problem.
// Callers at the edge (CLI main, HTTP handlers) catch Error and report it; the
// process never aborts on bad input. BASALT_CHECK is for conditions that bad
// input can cause; BASALT_ASSERT is for internal invariants (also checked in
// release builds: a wrong answer is worse than a loud stop).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace basalt {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace basalt

#define BASALT_CHECK(cond, ...)        \
  do {                                 \
    if (!(cond)) ::basalt::fail(__VA_ARGS__); \
  } while (0)

#define BASALT_ASSERT(cond)                                                                   \
  do {                                                                                        \
    if (!(cond))                                                                              \
      ::basalt::fail("internal error: {} failed at {}:{}", #cond, __FILE__, __LINE__);        \
  } while (0)
