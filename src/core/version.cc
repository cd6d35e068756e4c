#include "core/version.h"

namespace basalt {
const char kBasaltVersion[] = BASALT_VERSION;
}
