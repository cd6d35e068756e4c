// `basalt quantize`: writes a quantized copy of a checkpoint: block FP8
// (DeepSeek-V2/V3, DeepSeek-V3's format) or int8 / int4 codes with f16 group
// scales (any architecture, CPU backend; core/int_weights.h). Quantization
// is explicit: the copy says what it is in config.json, and `basalt eval
// --compare-model` measures what it costs against the original.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
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
  std::string group_size = "32";
  bool force = false;
  bool json = false;
};

std::string megabytes(uint64_t bytes) {
  return fmt::format("{:.2f} MB", static_cast<double>(bytes) / 1e6);
}

void run_quantize(const QuantizeFlags& f) {
  QuantizeOptions options;
  if (f.format == "fp8-block") {
    options.format = QuantFormat::kFp8Block;
  } else if (f.format == "int8") {
    options.format = QuantFormat::kInt8;
  } else if (f.format == "int4") {
    options.format = QuantFormat::kInt4;
  } else {
    fail("--format '{}' is not supported (fp8-block, int8 or int4)", f.format);
  }
  if (f.group_size == "channel") {
    options.group_size = -1;
  } else {
    size_t used = 0;
    long long g = 0;
    try {
      g = std::stoll(f.group_size, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    BASALT_CHECK(used == f.group_size.size() && g >= 32 && g % 32 == 0 && g <= (1 << 20),
                 "--group-size '{}' must be a multiple of 32 or 'channel' (one scale per row)", f.group_size);
    options.group_size = g;
  }
  BASALT_CHECK(std::filesystem::is_directory(f.model), "--model: '{}' is not a directory", f.model);
  ProgressPrinter progress(stderr, ::isatty(2) != 0, "quantizing");
  options.force = f.force;
  const QuantizeReport r = quantize_checkpoint(f.model, f.out, options, std::ref(progress));
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
  const std::string scales = options.group_size < 0 ? "one f16 scale per row"
                                                    : fmt::format("f16 scales per {} columns", options.group_size);
  const std::string what = options.format == QuantFormat::kFp8Block ? "float8_e4m3fn with 128x128 block scales"
                           : options.format == QuantFormat::kInt8   ? "int8 with " + scales
                                                                    : "int4 with " + scales;
  std::printf("quantized %lld tensors to %s; copied %lld unchanged\n", static_cast<long long>(r.tensors_quantized),
              what.c_str(), static_cast<long long>(r.tensors_copied));
  std::printf("tensor data: %s -> %s (%.1f%%) in %zu file%s under %s\n",
              megabytes(r.bytes_before).c_str(), megabytes(r.bytes_after).c_str(), 100.0 * ratio,
              r.files.size(), r.files.size() == 1 ? "" : "s", f.out.c_str());
}

}  // namespace

void add_quantize_command(CLI::App& app) {
  auto flags = std::make_shared<QuantizeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "quantize", "Write a quantized copy of a checkpoint (block FP8 for DeepSeek; int8 or int4 for the CPU)");
  cmd->add_option("--model", flags->model, "Hugging Face model directory (bf16, f16 or f32)")->required();
  cmd->add_option("--out", flags->out, "Output directory (new or empty)")->required();
  cmd->add_option("--format", flags->format,
                  "fp8-block (DeepSeek-V2/V3): float8_e4m3fn weights with a float32 weight_scale_inv per 128x128 "
                  "block; int8 / int4 (any model, CPU backend): integer codes with f16 scales per group");
  cmd->add_option("--group-size", flags->group_size,
                  "int8 / int4: input columns per scale, a multiple of 32, or 'channel' for one per row (default 32)");
  cmd->add_flag("--force", flags->force, "Write into a non-empty output directory, replacing its weights");
  cmd->add_flag("--json", flags->json, "Print the summary as one JSON object");
  cmd->callback([flags] { run_quantize(*flags); });
}

}  // namespace basalt
