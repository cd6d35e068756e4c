// Which model directory a command uses when --model is not given.
//
// Basalt ships a small trained model (models/basalt-mini) so the first
// command a newcomer types does something real. model_dir_or_bundled returns
// the flag's value when given; otherwise the first of these that holds a
// config.json: $BASALT_MODEL, the repository's models/basalt-mini next to the
// build tree the binary runs from (bin/ -> ../../models), an installed
// share/basalt/models/basalt-mini, and the source tree the binary was built
// from. Throws basalt::Error listing where it looked when none exists.
#pragma once

#include <string>

namespace basalt {

std::string model_dir_or_bundled(const std::string& flag_value);

}  // namespace basalt
