// `basalt quantize`: writes a block-FP8 copy of a DeepSeek checkpoint.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "core/error.h"
#include "model/checkpoint.h"
#include "model/quantize.h"

namespace basalt {
namespace {

struct QuantizeFlags {
  std::string model;
  std::string out;
  std::string format = "fp8-block";
  bool force = false;
  bool json = false;
};

std::string megabytes(uint64_t bytes) {
  return fmt::format("{:.2f} MB", static_cast<double>(bytes) / 1e6);
}

void run_quantize(const QuantizeFlags& f) {
  BASALT_CHECK(f.format == "fp8-block", "--format '{}' is not supported (fp8-block only)", f.format);
  BASALT_CHECK(std::filesystem::is_directory(f.model), "--model: '{}' is not a directory", f.model);
  ProgressPrinter progress(stderr, ::isatty(2) != 0, "quantizing");
  QuantizeOptions options;
  options.force = f.force;
  const QuantizeReport r = quantize_checkpoint_fp8(f.model, f.out, options, std::ref(progress));
  const double ratio = r.bytes_before > 0
                           ? static_cast<double>(r.bytes_after) / static_cast<double>(r.bytes_before)
                           : 0.0;
  if (f.json) {
    const nlohmann::json out = {{"tensors_quantized", r.tensors_quantized},
                                {"tensors_copied", r.tensors_copied},
                                {"bytes_before", r.bytes_before},
                                {"bytes_after", r.bytes_after},
                                {"files", r.files.size()}};
    std::printf("%s\n", out.dump().c_str());
    return;
  }
  std::printf("quantized %lld tensors to float8_e4m3fn with 128x128 block scales; copied %lld unchanged\n",
              static_cast<long long>(r.tensors_quantized), static_cast<long long>(r.tensors_copied));
  std::printf("tensor data: %s -> %s (%.1f%%) in %zu file%s under %s\n",
              megabytes(r.bytes_before).c_str(), megabytes(r.bytes_after).c_str(), 100.0 * ratio,
              r.files.size(), r.files.size() == 1 ? "" : "s", f.out.c_str());
}

}  // namespace

void add_quantize_command(CLI::App& app) {
  auto flags = std::make_shared<QuantizeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "quantize", "Write a block-FP8 copy of a DeepSeek-V2/V3 checkpoint (DeepSeek-V3's format)");
  cmd->add_option("--model", flags->model, "Hugging Face model directory (bf16, f16 or f32)")->required();
  cmd->add_option("--out", flags->out, "Output directory (new or empty)")->required();
  cmd->add_option("--format", flags->format,
                  "fp8-block: float8_e4m3fn weights with a float32 weight_scale_inv per 128x128 block");
  cmd->add_flag("--force", flags->force, "Write into a non-empty output directory, replacing its weights");
  cmd->add_flag("--json", flags->json, "Print the summary as one JSON object");
  cmd->callback([flags] { run_quantize(*flags); });
}

}  // namespace basalt
