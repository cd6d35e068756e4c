// Test helpers for code that reports bad input as basalt::Error.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace basalt::testing {

// The message of the basalt::Error that `action` throws ("" after recording a
// failure when it throws none).
template <typename Action>
std::string error_of(Action&& action) {
  try {
    action();
  } catch (const Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a basalt::Error";
  return "";
}

}  // namespace basalt::testing

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)
