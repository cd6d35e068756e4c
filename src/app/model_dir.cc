#include "app/model_dir.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

#include "core/error.h"

namespace basalt {

std::string model_dir_or_bundled(const std::string& flag_value) {
  if (!flag_value.empty()) return flag_value;
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
  if (const char* env = std::getenv("BASALT_MODEL"); env != nullptr && *env != '\0') {
    candidates.emplace_back(env);
  }
  std::error_code error;
  const fs::path exe = fs::read_symlink("/proc/self/exe", error);
  if (!error) {
    const fs::path bin = exe.parent_path();
    candidates.push_back(bin / ".." / ".." / "models" / "basalt-mini");
    candidates.push_back(bin / ".." / "share" / "basalt" / "models" / "basalt-mini");
  }
  candidates.push_back(fs::path(BASALT_SOURCE_DIR) / "models" / "basalt-mini");
  std::string looked;
  for (const fs::path& dir : candidates) {
    if (fs::is_regular_file(dir / "config.json", error)) return fs::weakly_canonical(dir).string();
    looked += (looked.empty() ? "" : ", ") + dir.lexically_normal().string();
  }
  fail("no --model given and the bundled model was not found (looked in {})", looked);
}

}  // namespace basalt
