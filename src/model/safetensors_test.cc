#include "model/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "testing/error_test_util.h"

namespace basalt {
namespace {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed with its contents.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() / ("basalt_safetensors_test_" + std::to_string(::getpid()) +
                                         "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

std::string le64(uint64_t value) {
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((value >> (8 * i)) & 0xff);
  return out;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good());
}

// A file with the given header JSON and `data_size` bytes of data.
void write_raw(const std::string& path, const std::string& header, size_t data_size) {
  write_bytes(path, le64(header.size()) + header + std::string(data_size, '\x11'));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

using testing::error_of;

class SafetensorsTest : public ::testing::Test {
 protected:
  // Opens a file whose header is `header` over `data_size` bytes and returns
  // the error, which must name the file.
  std::string open_error(const std::string& header, size_t data_size) {
    const std::string path = dir_.file("hostile.safetensors");
    write_raw(path, header, data_size);
    const std::string message = error_of([&] { SafetensorsFile::open(path); });
    EXPECT_CONTAINS(message, path);
    return message;
  }

  TempDir dir_;
};

TEST_F(SafetensorsTest, RoundTripsEveryDtypeWithMetadata) {
  const std::string path = dir_.file("model.safetensors");
  const std::vector<float> f32_values = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -1e-3f};
  Tensor bf16 = Tensor::empty({4}, DType::kBF16);
  Tensor f16 = Tensor::empty({2, 2}, DType::kF16);
  Tensor f8 = Tensor::empty({3}, DType::kF8E4M3);
  Tensor i64 = Tensor::empty({1}, DType::kI64);
  for (int i = 0; i < 4; ++i) bf16.data<uint16_t>()[i] = f32_to_bf16(static_cast<float>(i) - 1.5f);
  for (int i = 0; i < 4; ++i) f16.data<uint16_t>()[i] = f32_to_f16(static_cast<float>(i) * 0.5f);
  for (int i = 0; i < 3; ++i) f8.data<uint8_t>()[i] = f32_to_fp8e4m3(static_cast<float>(i) * 2.0f);
  i64.data<int64_t>()[0] = -(int64_t{1} << 40);
  const std::vector<int32_t> i32_values = {7, -9};
  write_safetensors(path,
                    {{"w.f32", Tensor::from_f32({2, 3}, f32_values)},
                     {"w.bf16", bf16},
                     {"w.f16", f16},
                     {"w.f8", f8},
                     {"w.i32", Tensor::from_i32({2}, i32_values)},
                     {"w.i64", i64},
                     {"empty", Tensor::empty({0, 5}, DType::kF32)},
                     {"scalar", Tensor::from_f32({}, std::vector<float>{42.0f})}},
                    {{"format", "pt"}});

  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.path(), path);
  EXPECT_EQ(file.tensors().size(), 8u);
  EXPECT_EQ(file.metadata().at("format"), "pt");

  const Tensor f32_back = file.tensor("w.f32");
  EXPECT_EQ(f32_back.dtype(), DType::kF32);
  EXPECT_EQ(f32_back.shape(), (Shape{2, 3}));
  EXPECT_EQ(std::memcmp(f32_back.raw(), f32_values.data(), 24), 0);
  for (const auto& [name, original] : std::vector<std::pair<std::string, Tensor>>{
           {"w.bf16", bf16}, {"w.f16", f16}, {"w.f8", f8}, {"w.i64", i64}}) {
    const Tensor back = file.tensor(name);
    EXPECT_EQ(back.dtype(), original.dtype()) << name;
    EXPECT_EQ(back.shape(), original.shape()) << name;
    EXPECT_EQ(std::memcmp(back.raw(), original.raw(), original.nbytes()), 0) << name;
  }
  EXPECT_EQ(file.tensor("w.i32").data<int32_t>()[1], -9);
  EXPECT_EQ(file.tensor("empty").shape(), (Shape{0, 5}));
  EXPECT_EQ(file.tensor("empty").numel(), 0);
  EXPECT_EQ(file.tensor("scalar").shape(), Shape{});
  EXPECT_EQ(file.tensor("scalar").data<float>()[0], 42.0f);
}

TEST_F(SafetensorsTest, TensorsAreZeroCopyAlignedViewsThatOutliveTheFile) {
  const std::string path = dir_.file("model.safetensors");
  write_safetensors(path, {{"a", Tensor::from_f32({3}, std::vector<float>{1, 2, 3})},
                           {"b", Tensor::empty({5}, DType::kBF16)},
                           {"c", Tensor::empty({3}, DType::kF8E4M3)},
                           {"d", Tensor::empty({2}, DType::kI64)}});
  Tensor a;
  {
    const SafetensorsFile file = SafetensorsFile::open(path);
    for (const auto& [name, entry] : file.tensors()) {
      const Tensor tensor = file.tensor(name);
      EXPECT_EQ(tensor.raw(), file.data().data() + entry.begin) << name << " was copied";
      EXPECT_EQ(reinterpret_cast<uintptr_t>(tensor.raw()) % dtype_size(entry.dtype), 0u) << name;
    }
    a = file.tensor("a");
  }
  EXPECT_EQ(a.data<float>()[2], 3.0f);  // the mapping outlives the file object
}

TEST_F(SafetensorsTest, WriterUsesTheReferenceLayout) {
  const std::string path = dir_.file("model.safetensors");
  write_safetensors(path, {{"small", Tensor::empty({3}, DType::kBF16)},
                           {"big", Tensor::empty({2}, DType::kF32)},
                           {"bytes", Tensor::empty({5}, DType::kF8E4M3)}});
  const std::string bytes = read_bytes(path);
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  EXPECT_EQ(header_size % 8, 0u);
  const SafetensorsFile file = SafetensorsFile::open(path);
  // Back to back, largest elements first, covering the whole data section.
  EXPECT_EQ(file.find("big")->begin, 0u);
  EXPECT_EQ(file.find("small")->begin, 8u);
  EXPECT_EQ(file.find("bytes")->begin, 14u);
  EXPECT_EQ(file.find("bytes")->end, file.data().size());
  EXPECT_FALSE(fs::exists(path + ".partial"));
}

TEST_F(SafetensorsTest, WriterRejectsDuplicateAndReservedNames) {
  const std::string path = dir_.file("out.safetensors");
  const Tensor t = Tensor::empty({1}, DType::kF32);
  std::string message = error_of([&] { write_safetensors(path, {{"x", t}, {"x", t}}); });
  EXPECT_CONTAINS(message, "'x'");
  EXPECT_CONTAINS(message, "twice");
  message = error_of([&] { write_safetensors(path, {{"__metadata__", t}}); });
  EXPECT_CONTAINS(message, "reserved");
  message = error_of([&] { write_safetensors(path, {{std::string("bad\xff", 4), t}}); });
  EXPECT_CONTAINS(message, "UTF-8");
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(SafetensorsTest, MisalignedTensorComesBackAsAnAlignedCopy) {
  // Pads the header so the data section starts at an odd file offset, which
  // no f32 can be aligned to whatever the mapping's address.
  std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  while ((8 + header.size()) % 4 != 1) header += ' ';
  const float values[2] = {3.5f, -4.25f};
  std::string data(8, '\0');
  std::memcpy(data.data(), values, 8);
  const std::string path = dir_.file("odd.safetensors");
  write_bytes(path, le64(header.size()) + header + data);

  const SafetensorsFile file = SafetensorsFile::open(path);
  const Tensor x = file.tensor("x");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x.raw()) % 4, 0u);
  EXPECT_NE(x.raw(), static_cast<const void*>(file.data().data()));
  EXPECT_EQ(x.data<float>()[0], 3.5f);
  EXPECT_EQ(x.data<float>()[1], -4.25f);
}

TEST_F(SafetensorsTest, AcceptsValidEdgeCases) {
  // Empty header, null metadata, trailing padding, gaps, zero-size tensors
  // sharing an offset with a real one.
  EXPECT_TRUE(SafetensorsFile::parse_header("{}", 0, "f").tensors.empty());
  EXPECT_TRUE(SafetensorsFile::parse_header(R"({"__metadata__": null})", 0, "f").metadata.empty());
  const SafetensorsHeader header = SafetensorsFile::parse_header(
      R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
          "z": {"shape": [0, 3], "data_offsets": [4, 4], "dtype": "BF16"},
          "": {"dtype": "I64", "shape": [], "data_offsets": [16, 24]}}     )",
      32, "f");
  ASSERT_EQ(header.tensors.size(), 3u);
  EXPECT_EQ(header.tensors.at("a").begin, 4u);
  EXPECT_EQ(header.tensors.at("z").shape, (Shape{0, 3}));
  EXPECT_EQ(header.tensors.at("").dtype, DType::kI64);
}

TEST_F(SafetensorsTest, RejectsFilesTooShortForALengthField) {
  const std::string path = dir_.file("tiny.safetensors");
  write_bytes(path, "abc");
  const std::string message = error_of([&] { SafetensorsFile::open(path); });
  EXPECT_CONTAINS(message, path);
  EXPECT_CONTAINS(message, "too short");
}

TEST_F(SafetensorsTest, RejectsHeaderLongerThanTheFile) {
  const std::string path = dir_.file("short.safetensors");
  write_bytes(path, le64(1000) + "{}");
  const std::string message = error_of([&] { SafetensorsFile::open(path); });
  EXPECT_CONTAINS(message, path);
  EXPECT_CONTAINS(message, "header length 1000 exceeds");
}

TEST_F(SafetensorsTest, RejectsHugeAndZeroHeaderLengths) {
  const std::string path = dir_.file("len.safetensors");
  write_bytes(path, le64(uint64_t{1} << 62) + "{}");
  std::string message = error_of([&] { SafetensorsFile::open(path); });
  EXPECT_CONTAINS(message, path);
  EXPECT_CONTAINS(message, "exceeds the limit");
  write_bytes(path, le64(0) + "{}");
  message = error_of([&] { SafetensorsFile::open(path); });
  EXPECT_CONTAINS(message, path);
  EXPECT_CONTAINS(message, "header length is 0");
}

TEST_F(SafetensorsTest, RejectsTruncatedData) {
  const std::string path = dir_.file("model.safetensors");
  write_safetensors(path, {{"layer.weight", Tensor::empty({64}, DType::kF32)}});
  const std::string whole = read_bytes(path);
  write_bytes(path, whole.substr(0, whole.size() - 10));
  const std::string message = error_of([&] { SafetensorsFile::open(path); });
  EXPECT_CONTAINS(message, path);
  EXPECT_CONTAINS(message, "tensor 'layer.weight'");
  EXPECT_CONTAINS(message, "truncated");
}

TEST_F(SafetensorsTest, RejectsHeadersThatAreNotJsonObjects) {
  EXPECT_CONTAINS(open_error("not json at all", 0), "not valid JSON");
  EXPECT_CONTAINS(open_error(R"({"a": )", 0), "not valid JSON");
  EXPECT_CONTAINS(open_error("{} trailing", 0), "not valid JSON");
  EXPECT_CONTAINS(open_error("[1, 2]", 0), "must be a JSON object");
  EXPECT_CONTAINS(open_error(R"("text")", 0), "must be a JSON object");
  EXPECT_CONTAINS(open_error(std::string("{\"a\0\": 1}", 10), 0), "not valid JSON");
  EXPECT_CONTAINS(open_error("{\"\xc3\x28\": 1}", 0), "not valid JSON");
}

TEST_F(SafetensorsTest, RejectsMissingFields) {
  std::string message = open_error(R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", 4);
  EXPECT_CONTAINS(message, "tensor 'w': missing field 'dtype'");
  message = open_error(R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", 4);
  EXPECT_CONTAINS(message, "tensor 'w': missing field 'shape'");
  message = open_error(R"({"w": {"dtype": "F32", "shape": [1]}})", 4);
  EXPECT_CONTAINS(message, "tensor 'w': missing field 'data_offsets'");
}

TEST_F(SafetensorsTest, RejectsWrongFieldTypes) {
  EXPECT_CONTAINS(
      open_error(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": ["0", "4"]}})", 4),
      "tensor 'w': 'data_offsets' must contain integers, got a string");
  EXPECT_CONTAINS(
      open_error(R"({"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 4]}})", 4),
      "tensor 'w': 'shape' must contain integers, got 2.5");
  EXPECT_CONTAINS(
      open_error(R"({"w": {"dtype": "F32", "shape": [-1, 2], "data_offsets": [0, 4]}})", 4),
      "tensor 'w': 'shape' contains the negative value -1");
  EXPECT_CONTAINS(open_error(R"({"w": {"dtype": 5, "shape": [1], "data_offsets": [0, 4]}})", 4),
                  "tensor 'w': 'dtype' must be a string");
  EXPECT_CONTAINS(open_error(R"({"w": {"dtype": "F32", "shape": 1, "data_offsets": [0, 4]}})", 4),
                  "tensor 'w': 'shape' must be an array of integers");
  EXPECT_CONTAINS(
      open_error(R"({"w": {"dtype": "F32", "shape": [[1]], "data_offsets": [0, 4]}})", 4),
      "tensor 'w': 'shape' must contain integers, got an array");
  EXPECT_CONTAINS(open_error(R"({"w": [1, 2]})", 4), "tensor 'w': entry must be an object");
  EXPECT_CONTAINS(
      open_error(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 1}})", 4),
      "tensor 'w': unknown field 'x'");
  EXPECT_CONTAINS(
      open_error(R"({"w": {"dtype": "F32", "dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
                 4),
      "tensor 'w': field 'dtype' appears twice");
  EXPECT_CONTAINS(
      open_error(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}})", 8),
      "tensor 'w': 'data_offsets' must have exactly 2 elements");
  EXPECT_CONTAINS(open_error(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4]}})", 8),
                  "tensor 'w': 'data_offsets' must have exactly 2 elements");
  EXPECT_CONTAINS(open_error(R"({"__metadata__": {"k": 1}})", 0), "__metadata__ value for 'k'");
  EXPECT_CONTAINS(open_error(R"({"__metadata__": [1]})", 0), "__metadata__ must be an object");
}

TEST_F(SafetensorsTest, RejectsUnknownDtypes) {
  for (const char* dtype : {"F64", "Q4", "bf16", ""}) {
    const std::string message = open_error(
        fmt::format(R"({{"model.w": {{"dtype": "{}", "shape": [1], "data_offsets": [0, 8]}}}})",
                    dtype),
        8);
    EXPECT_CONTAINS(message, "tensor 'model.w': unsupported dtype '" + std::string(dtype) + "'");
  }
}

TEST_F(SafetensorsTest, RejectsBadOffsets) {
  EXPECT_CONTAINS(
      open_error(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})", 12),
      "tensor 'w': data_offsets [8, 16] extend past the end of the data section (12 bytes)");
  EXPECT_CONTAINS(
      open_error(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 12),
      "tensor 'w': data_offsets [8, 4] begin after they end");
  EXPECT_CONTAINS(
      open_error(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 12),
      "tensor 'w': data_offsets [0, 8] hold 8 bytes but F32 [3] needs 12");
  EXPECT_CONTAINS(
      open_error(
          R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 18446744073709551615]}})", 4),
      "extend past the end");
  const std::string message = open_error(
      R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
          "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
      12);
  EXPECT_CONTAINS(message, "tensor 'b': data_offsets [4, 12] overlap tensor 'a' at [0, 8]");
}

TEST_F(SafetensorsTest, RejectsShapesWhoseSizeOverflows) {
  EXPECT_CONTAINS(
      open_error(
          R"({"w": {"dtype": "F32", "shape": [1099511627776, 1099511627776], "data_offsets": [0, 4]}})",
          4),
      "tensor 'w': shape [1099511627776, 1099511627776] has too many elements");
  EXPECT_CONTAINS(
      open_error(
          R"({"w": {"dtype": "I64", "shape": [2305843009213693952], "data_offsets": [0, 8]}})", 8),
      "tensor 'w': shape [2305843009213693952] is too large in bytes");
  EXPECT_CONTAINS(
      open_error(
          R"({"w": {"dtype": "I64", "shape": [18446744073709551615], "data_offsets": [0, 8]}})", 8),
      "tensor 'w': 'shape' dimension 18446744073709551615 is too large");
  EXPECT_CONTAINS(
      open_error(R"({"w": {"dtype": "I64", "shape": [1e30], "data_offsets": [0, 8]}})", 8),
      "tensor 'w': 'shape' must contain integers");
  std::string many_dims = "[1";
  for (int i = 0; i < 40; ++i) many_dims += ",1";
  many_dims += "]";
  EXPECT_CONTAINS(
      open_error(
          R"({"w": {"dtype": "F32", "shape": )" + many_dims + R"(, "data_offsets": [0, 4]}})", 4),
      "tensor 'w': 'shape' has more than 32 dimensions");
}

TEST_F(SafetensorsTest, RejectsDuplicateNamesInOneHeader) {
  EXPECT_CONTAINS(open_error(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                  "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                             8),
                  "tensor 'w': listed twice");
}

TEST_F(SafetensorsTest, QuotesHostileNamesSafely) {
  const std::string message = open_error(
      "{\"evil\\u001b[2Jname\": {\"dtype\": \"F64\", \"shape\": [1], \"data_offsets\": [0, 8]}}",
      8);
  EXPECT_CONTAINS(message, "tensor 'evil\\x1b[2Jname'");
  EXPECT_EQ(message.find('\x1b'), std::string::npos);
  const std::string long_name(5000, 'n');
  const std::string long_message = open_error(
      "{\"" + long_name + R"(": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", 8);
  EXPECT_LT(long_message.size(), 600u);
  EXPECT_CONTAINS(long_message, "...");
}

TEST_F(SafetensorsTest, MissingTensorAndMissingFileNameTheFile) {
  const std::string path = dir_.file("model.safetensors");
  write_safetensors(path, {{"a", Tensor::empty({1}, DType::kF32)}});
  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.find("b"), nullptr);
  std::string message = error_of([&] { file.tensor("b"); });
  EXPECT_CONTAINS(message, path + ": tensor 'b' not found");
  message = error_of([&] { SafetensorsFile::open(dir_.file("absent.safetensors")); });
  EXPECT_CONTAINS(message, "absent.safetensors: cannot open");
  message = error_of([&] { SafetensorsFile::open(fs::temp_directory_path().string()); });
  EXPECT_CONTAINS(message, "not a regular file");
}

TEST_F(SafetensorsTest, ParseImageAgreesWithOpen) {
  const std::string path = dir_.file("model.safetensors");
  write_safetensors(path, {{"a", Tensor::from_f32({2}, std::vector<float>{1, 2})}});
  const std::string bytes = read_bytes(path);
  const SafetensorsView view = SafetensorsFile::parse_image(
      {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, "image");
  ASSERT_EQ(view.header.tensors.size(), 1u);
  EXPECT_EQ(view.data.size(), 8u);
  EXPECT_EQ(view.data.data(), reinterpret_cast<const uint8_t*>(bytes.data()) + bytes.size() - 8);
  const std::string message = error_of([&] {
    SafetensorsFile::parse_image({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size() - 1},
                                 "image");
  });
  EXPECT_CONTAINS(message, "image: tensor 'a'");
}

}  // namespace
}  // namespace basalt
