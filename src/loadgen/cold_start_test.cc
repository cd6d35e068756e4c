// The cold-start bench's parts without a server: the startup samples read
// back from /metrics text (and refused when malformed), the page-cache
// helpers on a real file, and the report's medians, floor and table.
#include "loadgen/cold_start.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"

namespace basalt::loadgen {
namespace {

namespace fs = std::filesystem;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ColdStart, StartupPhasesFromMetricsKeepTheServersOrder) {
  const std::string text =
      "# HELP basalt_requests_running Requests.\n"
      "# TYPE basalt_requests_running gauge\n"
      "basalt_requests_running{model_name=\"m\"} 3\n"
      "basalt_engine_startup_seconds_extra{phase=\"x\"} 9\n"
      "# TYPE basalt_engine_startup_seconds gauge\n"
      "basalt_engine_startup_seconds{model_name=\"a \\\"quoted\\\" {name}\",phase=\"listening\"} 0.03\n"
      "basalt_engine_startup_seconds{phase=\"mmap\",model_name=\"m\"} 0.5\n"
      "basalt_engine_startup_seconds{model_name=\"m\",phase=\"ready\"} 1.25e0 1700000000\n";
  const std::vector<StartupPhase> phases = startup_phases_from_metrics(text);
  ASSERT_EQ(phases.size(), 3u);
  EXPECT_EQ(phases[0].name, "listening");
  EXPECT_DOUBLE_EQ(phases[0].since_start_s, 0.03);
  EXPECT_EQ(phases[1].name, "mmap");
  EXPECT_EQ(phases[2].name, "ready");
  EXPECT_DOUBLE_EQ(phases[2].since_start_s, 1.25);
  EXPECT_TRUE(startup_phases_from_metrics("basalt_requests_running 3\n").empty());
  EXPECT_TRUE(startup_phases_from_metrics("").empty());
}

TEST(ColdStart, MalformedStartupSamplesAreRefused) {
  EXPECT_NE(error_of([] { startup_phases_from_metrics("basalt_engine_startup_seconds 1\n"); })
                .find("without a phase"),
            std::string::npos);
  EXPECT_NE(error_of([] { startup_phases_from_metrics("basalt_engine_startup_seconds{model_name=\"m\"} 1\n"); })
                .find("without a phase"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              startup_phases_from_metrics(
                  "basalt_engine_startup_seconds{phase=\"mmap\"} 1\nbasalt_engine_startup_seconds{phase=\"mmap\"} 2\n");
            }).find("given twice"),
            std::string::npos);
  for (const char* bad : {"-1", "NaN", "+Inf", "1s", ""}) {
    const std::string line = std::string("basalt_engine_startup_seconds{phase=\"ready\"} ") + bad + "\n";
    EXPECT_NE(error_of([&] { startup_phases_from_metrics(line); }).find("no valid seconds"), std::string::npos)
        << bad;
  }
  EXPECT_NE(error_of([] { startup_phases_from_metrics("basalt_engine_startup_seconds{phase=\"ready 1\n"); })
                .find("unterminated"),
            std::string::npos);
}

TEST(ColdStart, ReadsFilesAndReportsTheirCache) {
  const fs::path dir = fs::temp_directory_path() / ("basalt_cold_start_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string a = (dir / "a.bin").string(), b = (dir / "b.bin").string(), empty = (dir / "e.bin").string();
  std::ofstream(a) << std::string(3 << 20, 'a');
  std::ofstream(b) << std::string(12345, 'b');
  std::ofstream(empty) << "";
  const ReadMeasurement warm = read_files({a, b, empty}, false);
  EXPECT_EQ(warm.bytes, (3u << 20) + 12345u);
  EXPECT_GT(warm.seconds, 0);
  EXPECT_GT(cached_fraction(a), 0);  // just read
  const ReadMeasurement cold = read_files({a, b}, true);
  EXPECT_EQ(cold.bytes, warm.bytes);
  drop_file_cache(a);
  const double left = cached_fraction(a);  // tmpfs keeps every page; a disk's file loses them
  EXPECT_GE(left, 0);
  EXPECT_LE(left, 1);
  EXPECT_EQ(cached_fraction(empty), 0);
  const std::string missing = (dir / "missing.bin").string();
  EXPECT_NE(error_of([&] { read_files({missing}, false); }).find(missing + ": cannot open it"), std::string::npos);
  EXPECT_NE(error_of([&] { drop_file_cache(missing); }).find(missing), std::string::npos);
  fs::remove_all(dir);
}

TEST(ColdStart, ReportMediansPhasesAndComparesWithTheFloor) {
  ColdStartReport r;
  r.command = "basalt bench --cold-start --model models/m -- --device cuda";
  r.model_dir = "models/m";
  r.serve_args = {"--device", "cuda"};
  r.device = "cuda";
  r.weight_bytes = 1'000'000'000;
  r.weight_files = 2;
  r.disk_read_bytes_per_s = 2e9;        // 0.5 s
  r.page_cache_read_bytes_per_s = 1e10;  // 0.1 s
  r.host_to_device_bytes_per_s = 4e9;    // 0.25 s
  EXPECT_DOUBLE_EQ(r.floor_s(true), 0.5);    // the disk, slower than the upload
  EXPECT_DOUBLE_EQ(r.floor_s(false), 0.25);  // the upload, slower than the page cache
  ColdStartCache cold{"cold", {}};
  cold.runs.push_back({{{"listening", 0.1}, {"mmap", 0.2}, {"upload", 1.2}, {"ready", 1.5}}, 1.6, 0.05, 0.0});
  cold.runs.push_back({{{"listening", 0.1}, {"mmap", 0.3}, {"upload", 1.3}, {"ready", 1.4}}, 1.5, 0.07, 0.1});
  cold.runs.push_back({{{"listening", 0.2}, {"mmap", 0.4}, {"read", 0.9}, {"upload", 1.9}, {"ready", 2.0}}, 2.1,
                       0.06, 0.0});
  r.caches.push_back(cold);
  ColdStartCache warm{"warm", {}};
  warm.runs.push_back({{{"listening", 0.1}, {"ready", 0.7}}, 0.75, 0.01, 1.0});
  r.caches.push_back(warm);

  const nlohmann::json j = r.to_json();
  ASSERT_EQ(j["caches"].size(), 2u);
  const nlohmann::json& m = j["caches"][0]["median"];
  ASSERT_EQ(m["phases"].size(), 5u);
  EXPECT_EQ(m["phases"][0]["phase"], "listening");
  EXPECT_EQ(m["phases"][2]["phase"], "upload");
  EXPECT_EQ(m["phases"][4]["phase"], "read");  // seen in the third run only: last
  EXPECT_EQ(m["phases"][4]["runs"], 1);
  EXPECT_DOUBLE_EQ(m["phases"][1]["since_start_s"].get<double>(), 0.3);
  EXPECT_DOUBLE_EQ(m["phases"][1]["took_s"].get<double>(), 0.2);
  // upload took 1.0, 1.0 and (after read) 1.0.
  EXPECT_NEAR(m["phases"][2]["took_s"].get<double>(), 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(m["ready_s"].get<double>(), 1.6);  // the client's
  EXPECT_DOUBLE_EQ(m["ready_seen_s"].get<double>(), 1.6);
  EXPECT_DOUBLE_EQ(m["first_request_s"].get<double>(), 0.06);
  EXPECT_DOUBLE_EQ(m["ready_over_floor"].get<double>(), 1.6 / 0.5);
  EXPECT_DOUBLE_EQ(j["caches"][1]["median"]["ready_over_floor"].get<double>(), 0.75 / 0.25);
  EXPECT_EQ(j["caches"][0]["runs"].size(), 3u);
  EXPECT_EQ(j["rates"]["host_to_device_bytes_per_s"], 4e9);
  EXPECT_EQ(j["weights"]["bytes"], 1'000'000'000);

  const std::string table = r.table();
  for (const char* text : {"cold end", "warm end", "listening", "upload", "ready (client)/floor", "3.2x", "0.750",
                           "host to device 4.00 GB/s", "serve --device cuda", "\nbasalt bench --cold-start --model"})
    EXPECT_NE(table.find(text), std::string::npos) << text << "\n" << table;
}

TEST(ColdStart, NoFloorWithoutMeasuredRates) {
  ColdStartReport r;
  r.caches.push_back({"warm", {{{{"ready", 0.4}}, 0.5, 0.01, 1.0}}});
  EXPECT_EQ(r.floor_s(false), 0);
  EXPECT_TRUE(r.to_json()["caches"][0]["median"]["ready_over_floor"].is_null());
  EXPECT_NE(r.table().find("ready (client)/floor"), std::string::npos);
  EXPECT_NE(r.table().find("no weight files (random weights): no disk floor"), std::string::npos) << r.table();
}

}  // namespace
}  // namespace basalt::loadgen
