#include "sim/step_table.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace basalt::sim {
namespace {

const char* kTable = R"({
  "name": "t", "source": "a test",
  "decode_ms": [[1, 10], [5, 20], [10, 30]],
  "prefill_tokens_per_s": 1000, "prefill_fixed_ms": 2,
  "max_running": 8, "step_token_budget": 256, "kv_capacity_tokens": 4096
})";

TEST(StepTable, InterpolatesDecodeAndAddsPrefill) {
  const StepTable t = parse_step_table(kTable, "t.json");
  EXPECT_EQ(t.name, "t");
  EXPECT_EQ(t.max_running, 8);
  EXPECT_EQ(t.gpus_per_replica, 1);
  EXPECT_DOUBLE_EQ(t.step_ms({0, 0, 0, 0}), 0);
  EXPECT_DOUBLE_EQ(t.step_ms({1, 0, 0, 0}), 10);
  EXPECT_DOUBLE_EQ(t.step_ms({3, 0, 0, 0}), 15);   // between (1, 10) and (5, 20)
  EXPECT_DOUBLE_EQ(t.step_ms({10, 0, 0, 0}), 30);
  EXPECT_DOUBLE_EQ(t.step_ms({20, 0, 0, 0}), 50);  // the last segment's slope, 2 ms per sequence
  EXPECT_DOUBLE_EQ(t.step_ms({0, 0, 100, 0}), 102);  // 2 ms fixed + 100 tokens at 1,000/s
  EXPECT_DOUBLE_EQ(t.step_ms({5, 0, 100, 0}), 122);
}

TEST(StepTable, ContextAddsAttention) {
  std::string text = kTable;
  text.replace(text.find("\"max_running\""), 0, "\"decode_context_tokens\": 100, \"decode_ms_per_1k_context\": 4, ");
  const StepTable t = parse_step_table(text, "t.json");
  EXPECT_DOUBLE_EQ(t.step_ms({5, 500, 0, 0}), 20);         // measured context: the table's time
  EXPECT_DOUBLE_EQ(t.step_ms({5, 1500, 0, 0}), 24);        // 1,000 keys more: 4 ms
  EXPECT_DOUBLE_EQ(t.step_ms({5, 0, 0, 0}), 18);           // 500 fewer: 2 ms less
  EXPECT_DOUBLE_EQ(t.step_ms({1, 0, 0, 0}), 10);           // never below the first point
}

TEST(StepTable, PrefillAttentionGrowsWithTheContext) {
  std::string text = kTable;
  text.replace(text.find("\"max_running\""), 0, "\"prefill_ms_per_1m_pairs\": 10, ");
  const StepTable t = parse_step_table(text, "t.json");
  EXPECT_DOUBLE_EQ(StepTable::chunk_pairs(0, 3), 6);     // 1 + 2 + 3
  EXPECT_DOUBLE_EQ(StepTable::chunk_pairs(10, 2), 23);   // 11 + 12
  // 100 tokens: 2 + 100 ms, plus 5,050 pairs at 10 ms per million.
  EXPECT_DOUBLE_EQ(t.step_ms({0, 0, 100, StepTable::chunk_pairs(0, 100)}), 102 + 0.0505);
}

TEST(StepTable, OnePointScalesWithTheBatch) {
  const StepTable t = parse_step_table(
      R"({"name": "one", "source": "s", "decode_ms": [[4, 8]], "prefill_tokens_per_s": 100, "max_running": 1,
          "step_token_budget": 1, "kv_capacity_tokens": 1, "gpus_per_replica": 8})",
      "one.json");
  EXPECT_DOUBLE_EQ(t.step_ms({2, 0, 0, 0}), 8);
  EXPECT_DOUBLE_EQ(t.step_ms({8, 0, 0, 0}), 16);
  EXPECT_EQ(t.gpus_per_replica, 8);
}

void expect_error(const std::string& text, const std::string& part) {
  try {
    parse_step_table(text, "bad.json");
    ADD_FAILURE() << "accepted: " << text;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
  }
}

std::string with(const std::string& from, const std::string& to) {
  std::string text = kTable;
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

TEST(StepTable, RefusesBadTables) {
  expect_error("[1]", "not a JSON object");
  expect_error("{", "not JSON");
  expect_error(with("\"name\": \"t\"", "\"name\": \"t\", \"colour\": 1"), "unknown key \"colour\"");
  expect_error(with("\"name\": \"t\", ", ""), "no \"name\"");
  expect_error(with("[[1, 10], [5, 20], [10, 30]]", "[]"), "decode_ms");
  expect_error(with("[5, 20]", "[1, 20]"), "batches must increase");
  expect_error(with("[5, 20]", "[5, -1]"), "ms must be > 0");
  expect_error(with("[1, 10]", "[0, 10]"), "batch must be >= 1");
  expect_error(with("[5, 20]", "[5]"), "decode_ms[1] must be [batch, ms]");
  expect_error(with("\"prefill_tokens_per_s\": 1000", "\"prefill_tokens_per_s\": 0"), "prefill_tokens_per_s");
  expect_error(with("\"prefill_fixed_ms\": 2", "\"prefill_fixed_ms\": -2"), "prefill_fixed_ms");
  expect_error(with("\"max_running\": 8", "\"max_running\": 1.5"), "max_running");
  expect_error(with("\"kv_capacity_tokens\": 4096", "\"kv_capacity_tokens\": 0"), "kv_capacity_tokens");
}

TEST(StepTable, TheCommittedTablesParse) {
  for (const char* name : {"h200-llama8b.json", "cpu-basalt-mini.json"}) {
    const StepTable t = load_step_table(std::string(BASALT_SOURCE_DIR) + "/bench/sim/" + name);
    EXPECT_FALSE(t.source.empty()) << name;
    EXPECT_GT(t.step_ms({1, 0, 0, 0}), 0) << name;
  }
}

}  // namespace
}  // namespace basalt::sim
