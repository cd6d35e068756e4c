// The Basalt version: the top-level CMakeLists.txt's project() version,
// compiled into version.cc alone (so a version bump rebuilds one file).
#pragma once

namespace basalt {
extern const char kBasaltVersion[];
}
