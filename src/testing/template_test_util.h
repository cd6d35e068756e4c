// Test helper: the fixed clock the chat-template fixtures were rendered at
// (tools/fixtures/make_chat_template_fixtures.py formats 2025-03-14 09:26:53
// for strftime_now), so C++ renders of date-printing templates match.
#pragma once

#include <ctime>

#include "template/jinja.h"

namespace basalt::testing {

inline RenderOptions fixture_clock() {
  RenderOptions options;
  std::tm tm{};
  tm.tm_year = 2025 - 1900;
  tm.tm_mon = 2;
  tm.tm_mday = 14;
  tm.tm_hour = 9;
  tm.tm_min = 26;
  tm.tm_sec = 53;
  tm.tm_wday = 5;
  tm.tm_yday = 72;
  options.now = tm;
  return options;
}

}  // namespace basalt::testing
