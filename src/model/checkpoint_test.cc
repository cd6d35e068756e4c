#include "model/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "testing/error_test_util.h"

namespace basalt {
namespace {

namespace fs = std::filesystem;

// A fresh model directory under the system temp dir, removed with its contents.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = (fs::temp_directory_path() / ("basalt_checkpoint_test_" + std::to_string(::getpid()) +
                                          "_" + std::to_string(counter++)))
                .string();
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  ASSERT_TRUE(out.good());
}

std::string index_json(const std::map<std::string, std::string>& weight_map) {
  return nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump();
}

using testing::error_of;

Tensor f32(Shape shape, float first) {
  Tensor t = Tensor::empty(std::move(shape), DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = first + static_cast<float>(i);
  return t;
}

class CheckpointTest : public ::testing::Test {
 protected:
  // Two shards and their index, as Hugging Face writes them.
  void write_sharded() {
    write_safetensors(dir_.file("model-00001-of-00002.safetensors"),
                      {{"embed.weight", f32({4, 2}, 0)}, {"layers.0.w", f32({2, 2}, 100)}});
    write_safetensors(dir_.file("model-00002-of-00002.safetensors"),
                      {{"layers.1.w", f32({2, 2}, 200)}, {"norm.weight", f32({2}, 300)}});
    write_text(dir_.file("model.safetensors.index.json"),
               index_json({{"embed.weight", "model-00001-of-00002.safetensors"},
                           {"layers.0.w", "model-00001-of-00002.safetensors"},
                           {"layers.1.w", "model-00002-of-00002.safetensors"},
                           {"norm.weight", "model-00002-of-00002.safetensors"}}));
  }

  std::string open_error() {
    return error_of([&] { Checkpoint::open(dir_.path()); });
  }

  TempDir dir_;
};

TEST_F(CheckpointTest, OpensASingleFile) {
  write_safetensors(dir_.file("model.safetensors"),
                    {{"a.weight", f32({3, 2}, 1)}, {"b.bias", f32({3}, 10)}});
  const Checkpoint checkpoint = Checkpoint::open(dir_.path());
  EXPECT_EQ(checkpoint.dir(), dir_.path());
  EXPECT_EQ(checkpoint.names(), (std::vector<std::string>{"a.weight", "b.bias"}));
  EXPECT_EQ(checkpoint.files(), std::vector<std::string>{dir_.file("model.safetensors")});
  EXPECT_TRUE(checkpoint.has("a.weight"));
  EXPECT_FALSE(checkpoint.has("c"));
  EXPECT_EQ(checkpoint.total_bytes(), 36u);

  const CheckpointTensorInfo info = checkpoint.info("a.weight");
  EXPECT_EQ(info.dtype, DType::kF32);
  EXPECT_EQ(info.shape, (Shape{3, 2}));
  EXPECT_EQ(info.file, dir_.file("model.safetensors"));
  EXPECT_EQ(info.nbytes, 24u);

  EXPECT_EQ(checkpoint.get("a.weight").data<float>()[5], 6.0f);
  EXPECT_EQ(checkpoint.get("b.bias", {3}).data<float>()[0], 10.0f);
  ASSERT_TRUE(checkpoint.find("b.bias").has_value());
  EXPECT_FALSE(checkpoint.find("lm_head.weight").has_value());
  checkpoint.require("a.weight");
}

TEST_F(CheckpointTest, OpensShardsThroughTheIndex) {
  write_sharded();
  // A stray consolidated copy must not matter when an index exists.
  write_safetensors(dir_.file("consolidated.safetensors"), {{"embed.weight", f32({4, 2}, 0)}});
  const Checkpoint checkpoint = Checkpoint::open(dir_.path());
  EXPECT_EQ(checkpoint.names().size(), 4u);
  EXPECT_EQ(checkpoint.files().size(), 2u);
  EXPECT_EQ(checkpoint.info("norm.weight").file, dir_.file("model-00002-of-00002.safetensors"));
  EXPECT_EQ(checkpoint.get("layers.1.w").data<float>()[3], 203.0f);
  EXPECT_EQ(checkpoint.get("embed.weight", {4, 2}).data<float>()[7], 7.0f);
  EXPECT_EQ(checkpoint.total_bytes(), (8u + 4u + 4u + 2u) * 4u);
}

TEST_F(CheckpointTest, TensorsOutliveTheCheckpoint) {
  write_sharded();
  Tensor norm;
  {
    const Checkpoint checkpoint = Checkpoint::open(dir_.path());
    norm = checkpoint.get("norm.weight");
  }
  EXPECT_EQ(norm.data<float>()[1], 301.0f);
}

TEST_F(CheckpointTest, MergesFilesWithoutAnIndex) {
  write_safetensors(dir_.file("part-a.safetensors"), {{"x", f32({1}, 1)}});
  write_safetensors(dir_.file("part-b.safetensors"), {{"y", f32({1}, 2)}});
  write_text(dir_.file("config.json"), "{}");
  const Checkpoint checkpoint = Checkpoint::open(dir_.path());
  EXPECT_EQ(checkpoint.names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(checkpoint.get("y").data<float>()[0], 2.0f);
}

TEST_F(CheckpointTest, RejectsDuplicateNamesAcrossShards) {
  write_safetensors(dir_.file("part-a.safetensors"), {{"x", f32({1}, 1)}});
  write_safetensors(dir_.file("part-b.safetensors"), {{"x", f32({1}, 2)}});
  const std::string message = open_error();
  EXPECT_CONTAINS(message, dir_.file("part-b.safetensors") + ": tensor 'x': also in " +
                               dir_.file("part-a.safetensors"));
}

TEST_F(CheckpointTest, RejectsDuplicateNamesAcrossIndexedShards) {
  write_sharded();
  write_safetensors(dir_.file("model-00002-of-00002.safetensors"),
                    {{"layers.1.w", f32({2, 2}, 200)},
                     {"norm.weight", f32({2}, 300)},
                     {"embed.weight", f32({4, 2}, 0)}});
  const std::string message = open_error();
  EXPECT_CONTAINS(message, "tensor 'embed.weight': also in");
}

TEST_F(CheckpointTest, RejectsAnIndexPointingToAMissingShard) {
  write_sharded();
  fs::remove(dir_.file("model-00002-of-00002.safetensors"));
  const std::string message = open_error();
  EXPECT_CONTAINS(message, dir_.file("model.safetensors.index.json"));
  EXPECT_CONTAINS(message, "tensor 'layers.1.w'");
  EXPECT_CONTAINS(message, "model-00002-of-00002.safetensors does not exist");
}

TEST_F(CheckpointTest, RejectsShardNamesThatLeaveTheDirectory) {
  write_sharded();
  for (const std::string shard : {"../model-00001-of-00002.safetensors", "sub/x.safetensors",
                                  "/etc/passwd", "..", "", "a\\b.safetensors"}) {
    write_text(
        dir_.file("model.safetensors.index.json"),
        index_json({{"embed.weight", "model-00001-of-00002.safetensors"}, {"evil.weight", shard}}));
    const std::string message = open_error();
    EXPECT_CONTAINS(message, dir_.file("model.safetensors.index.json"));
    EXPECT_CONTAINS(message,
                    "tensor 'evil.weight': shard '" + shard + "' is not a plain file name");
  }
}

TEST_F(CheckpointTest, RejectsMalformedIndexes) {
  write_sharded();
  const std::string index = dir_.file("model.safetensors.index.json");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"weight_map": {"a": )", "not valid JSON"},
      {"[]", "must be a JSON object"},
      {R"({"metadata": {}})", "missing \"weight_map\""},
      {R"({"weight_map": []})", "\"weight_map\" must be an object"},
      {R"({"weight_map": {}})", "lists no tensors"},
      {R"({"weight_map": {"embed.weight": 3}})",
       "tensor 'embed.weight': shard must be a file name"},
  };
  for (const auto& [text, problem] : cases) {
    write_text(index, text);
    const std::string message = open_error();
    EXPECT_CONTAINS(message, index);
    EXPECT_CONTAINS(message, problem);
  }
}

TEST_F(CheckpointTest, RejectsDeeplyNestedIndexWithoutOverflowingTheStack) {
  write_sharded();
  const std::string index = dir_.file("model.safetensors.index.json");
  write_text(index, std::string(200'000, '[') + std::string(200'000, ']'));
  EXPECT_CONTAINS(open_error(), index + ": must be a JSON object");
}

TEST_F(CheckpointTest, RejectsAnIndexThatDisagreesWithTheShards) {
  write_sharded();
  write_text(dir_.file("model.safetensors.index.json"),
             index_json({{"embed.weight", "model-00001-of-00002.safetensors"},
                         {"lm_head.weight", "model-00001-of-00002.safetensors"},
                         {"norm.weight", "model-00002-of-00002.safetensors"}}));
  std::string message = open_error();
  EXPECT_CONTAINS(message, dir_.file("model-00001-of-00002.safetensors") +
                               ": tensor 'lm_head.weight': listed in model.safetensors.index.json "
                               "but missing from the shard");

  write_text(dir_.file("model.safetensors.index.json"),
             index_json({{"embed.weight", "model-00001-of-00002.safetensors"},
                         {"norm.weight", "model-00001-of-00002.safetensors"},
                         {"layers.1.w", "model-00002-of-00002.safetensors"}}));
  message = open_error();
  EXPECT_CONTAINS(message, "tensor 'norm.weight'");
  EXPECT_CONTAINS(message, "places it in " + dir_.file("model-00001-of-00002.safetensors"));
}

TEST_F(CheckpointTest, ReportsCorruptShardsByFile) {
  write_sharded();
  const std::string shard = dir_.file("model-00002-of-00002.safetensors");
  fs::resize_file(shard, fs::file_size(shard) - 4);
  const std::string message = open_error();
  EXPECT_CONTAINS(message, shard + ": tensor '");
  EXPECT_CONTAINS(message, "truncated");
}

TEST_F(CheckpointTest, ShapeMismatchNamesFileTensorAndBothShapes) {
  write_sharded();
  const Checkpoint checkpoint = Checkpoint::open(dir_.path());
  const std::string message = error_of([&] { checkpoint.get("embed.weight", {2, 4}); });
  EXPECT_EQ(message,
            dir_.file("model-00001-of-00002.safetensors") +
                ": tensor 'embed.weight': shape [4, 2] does not match the config's [2, 4]");
}

TEST_F(CheckpointTest, MissingTensorsNameTheDirectory) {
  write_sharded();
  const Checkpoint checkpoint = Checkpoint::open(dir_.path());
  const std::string expected = dir_.path() + ": tensor 'lm_head.weight' not found in checkpoint";
  EXPECT_EQ(error_of([&] { checkpoint.require("lm_head.weight"); }), expected);
  EXPECT_EQ(error_of([&] { checkpoint.get("lm_head.weight"); }), expected);
  EXPECT_EQ(error_of([&] { checkpoint.get("lm_head.weight", {1}); }), expected);
  EXPECT_EQ(error_of([&] { checkpoint.info("lm_head.weight"); }), expected);
}

TEST_F(CheckpointTest, RejectsDirectoriesWithoutCheckpoints) {
  EXPECT_CONTAINS(open_error(), "no model.safetensors.index.json, model.safetensors or");
  write_safetensors(dir_.file("model.safetensors"), {});
  EXPECT_CONTAINS(open_error(), "holds no tensors");
  const std::string missing = dir_.file("absent");
  EXPECT_EQ(error_of([&] { Checkpoint::open(missing); }), missing + ": does not exist");
  EXPECT_EQ(error_of([&] { Checkpoint::open(dir_.file("model.safetensors")); }),
            dir_.file("model.safetensors") + ": not a directory");
}

TEST_F(CheckpointTest, PrefetchReportsMonotonicProgressEndingAtTheTotal) {
  write_sharded();
  const Checkpoint checkpoint = Checkpoint::open(dir_.path());
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  checkpoint.prefetch([&](uint64_t done, uint64_t total) { calls.emplace_back(done, total); });
  ASSERT_GE(calls.size(), 2u);
  EXPECT_EQ(calls.front(), std::make_pair(uint64_t{0}, checkpoint.total_bytes()));
  EXPECT_EQ(calls.back(), std::make_pair(checkpoint.total_bytes(), checkpoint.total_bytes()));
  for (size_t i = 1; i < calls.size(); ++i) EXPECT_GE(calls[i].first, calls[i - 1].first);
  checkpoint.prefetch();  // no callback is fine too
}

TEST_F(CheckpointTest, PrefetchWalksChunksOfALargeFile) {
  // 80 MB crosses the 64 MB chunk size; the odd sizes put the second tensor
  // at an offset that is not page-aligned, and adjacent tensors are read as
  // one range.
  write_safetensors(dir_.file("model.safetensors"),
                    {{"big", Tensor::zeros({20'000'003}, DType::kF32)},
                     {"small", Tensor::zeros({3}, DType::kBF16)}});
  const Checkpoint checkpoint = Checkpoint::open(dir_.path());
  std::vector<uint64_t> done_values;
  checkpoint.prefetch([&](uint64_t done, uint64_t) { done_values.push_back(done); });
  EXPECT_EQ(done_values, (std::vector<uint64_t>{0, 64ull << 20, 80'000'018}));
}

// Reads back what a ProgressPrinter wrote to a temporary file.
class ProgressPrinterTest : public ::testing::Test {
 protected:
  ProgressPrinterTest() : out_(std::tmpfile()) {}
  ~ProgressPrinterTest() override { std::fclose(out_); }
  std::string written() {
    std::fflush(out_);
    std::rewind(out_);
    std::string text;
    for (int c; (c = std::fgetc(out_)) != EOF;) text += static_cast<char>(c);
    return text;
  }
  std::FILE* out_;
};

TEST_F(ProgressPrinterTest, DrawsThrottledLinesAndEndsWithANewline) {
  ProgressPrinter printer(out_, /*out_is_terminal=*/true);
  const uint64_t total = 2'000'000'000;
  printer(0, total);
  printer(total / 4, total);  // within 100 ms of the last draw: skipped
  std::this_thread::sleep_for(ProgressPrinter::kInterval + std::chrono::milliseconds(20));
  printer(total / 2, total);
  printer(total, total);
  printer(total, total);  // a repeated final call adds nothing
  EXPECT_EQ(written(),
            "\rloading weights: 0% (0.0/2.0 GB)"
            "\rloading weights: 50% (1.0/2.0 GB)"
            "\rloading weights: 100% (2.0/2.0 GB)\n");
}

TEST_F(ProgressPrinterTest, StaysSilentForSmallLoadsAndNonTerminals) {
  ProgressPrinter small(out_, /*out_is_terminal=*/true);
  small(0, ProgressPrinter::kMinTotalBytes - 1);
  small(ProgressPrinter::kMinTotalBytes - 1, ProgressPrinter::kMinTotalBytes - 1);
  ProgressPrinter piped(out_, /*out_is_terminal=*/false);
  piped(0, 10'000'000'000);
  piped(10'000'000'000, 10'000'000'000);
  EXPECT_EQ(written(), "");
}

}  // namespace
}  // namespace basalt
