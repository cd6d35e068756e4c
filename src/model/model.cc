#include "model/model.h"

#include "core/error.h"
#include "model/checkpoint.h"
#include "model/dense.h"

namespace basalt {

std::unique_ptr<Model> load_model(const std::string& dir, Backend& backend,
                                  const LoadProgress& progress) {
  const ModelConfig config = ModelConfig::load(dir);
  Checkpoint checkpoint = Checkpoint::open(dir);
  if (progress) checkpoint.prefetch(progress);
  switch (config.architecture) {
    case Architecture::kLlama:
    case Architecture::kMistral:
    case Architecture::kQwen2:
    case Architecture::kQwen3:
      return load_dense_model(config, checkpoint, backend);
  }
  fail("{}: unsupported architecture", dir);
}

}  // namespace basalt
