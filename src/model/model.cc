#include "model/model.h"

#include "core/error.h"
#include "model/checkpoint.h"
#include "model/deepseek_v3.h"
#include "model/dense.h"

namespace basalt {

std::unique_ptr<Model> load_model(const std::string& dir, Backend& backend,
                                  const LoadProgress& progress) {
  const ModelConfig config = ModelConfig::load(dir);
  Checkpoint checkpoint = Checkpoint::open(dir);
  switch (config.architecture) {
    case Architecture::kLlama:
    case Architecture::kMistral:
    case Architecture::kQwen2:
    case Architecture::kQwen3:
      if (progress) checkpoint.prefetch(progress);
      return load_dense_model(config, checkpoint, backend);
    case Architecture::kDeepseekV2:
    case Architecture::kDeepseekV3:
      // No prefetch: only the pages of the tensors a forward pass touches
      // become resident (the MTP layer and idle experts cost nothing).
      return load_deepseek_model(config, checkpoint, backend);
  }
  fail("{}: unsupported architecture", dir);
}

}  // namespace basalt
