// StopChecker: stop strings split across pieces in every way.
#include "runtime/stop_checker.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "core/error.h"

namespace basalt {
namespace {

struct Outcome {
  std::string text;
  std::optional<std::string> stop;
  bool operator==(const Outcome&) const = default;
};

// Feeds `pieces` and flushes if nothing matched. Checks on the way that
// nothing is emitted after a match.
// The first `unchecked` pieces are fed with check = false.
Outcome run(const std::vector<std::string>& stops, const std::vector<std::string>& pieces,
            bool include = false, size_t unchecked = 0) {
  StopChecker checker(stops, include);
  Outcome out;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const std::string& piece = pieces[i];
    StopChecker::Result r = checker.feed(piece, i >= unchecked);
    if (out.stop) {
      EXPECT_EQ(r.text, "") << "text emitted after the stop";
      EXPECT_FALSE(r.stop.has_value());
      continue;
    }
    out.text += r.text;
    out.stop = r.stop;
  }
  if (!out.stop) out.text += checker.flush();
  return out;
}

// What streaming must produce: the text up to the first stop, where "first"
// is the earliest end and, at equal ends, the longest stop. Only stops ending
// past the first min_end bytes count.
Outcome expected(const std::vector<std::string>& stops, const std::string& text, bool include,
                 size_t min_end = 0) {
  for (size_t end = min_end + 1; end <= text.size(); ++end) {
    const std::string* best = nullptr;
    for (const std::string& s : stops)
      if (s.size() <= end && text.compare(end - s.size(), s.size(), s) == 0 &&
          (best == nullptr || s.size() > best->size()))
        best = &s;
    if (best != nullptr) return {text.substr(0, include ? end : end - best->size()), *best};
  }
  return {text, std::nullopt};
}

// Every way to cut `text` into pieces (2^(n-1) of them), plus empty pieces.
std::vector<std::vector<std::string>> all_splits(const std::string& text) {
  std::vector<std::vector<std::string>> out;
  const size_t cuts = text.size() - 1;
  for (uint32_t mask = 0; mask < (1u << cuts); ++mask) {
    std::vector<std::string> pieces(1);
    for (size_t i = 0; i < text.size(); ++i) {
      pieces.back().push_back(text[i]);
      if (i < cuts && (mask >> i & 1)) pieces.emplace_back();
    }
    out.push_back(pieces);
  }
  out.push_back({"", text, ""});
  return out;
}

TEST(StopChecker, NoStopsEmitsEverythingAtOnce) {
  StopChecker checker({});
  EXPECT_EQ(checker.feed("hello").text, "hello");
  EXPECT_EQ(checker.flush(), "");
}

TEST(StopChecker, HoldsBackOnlyWhatCouldStartAStop) {
  StopChecker checker({"STOP"});
  StopChecker::Result r = checker.feed("abc ST");
  EXPECT_EQ(r.text, "abc ");
  EXPECT_FALSE(r.stop);
  r = checker.feed("X S");  // "STX" cannot be a stop: released, "S" held
  EXPECT_EQ(r.text, "STX ");
  r = checker.feed("TO");
  EXPECT_EQ(r.text, "");
  r = checker.feed("P and more");
  EXPECT_EQ(r.text, "");
  ASSERT_TRUE(r.stop);
  EXPECT_EQ(*r.stop, "STOP");
  EXPECT_TRUE(checker.stopped());
  EXPECT_EQ(checker.feed("later").text, "");
  EXPECT_EQ(checker.flush(), "");
}

TEST(StopChecker, FlushReleasesAnUnfinishedPrefix) {
  StopChecker checker({"</end>"});
  EXPECT_EQ(checker.feed("x </e").text, "x ");
  EXPECT_EQ(checker.flush(), "</e");
}

TEST(StopChecker, IncludeStopKeepsTheString) {
  EXPECT_EQ(run({"ab"}, {"xa", "by"}, true), (Outcome{"xab", "ab"}));
  EXPECT_EQ(run({"ab"}, {"xa", "by"}, false), (Outcome{"x", "ab"}));
}

TEST(StopChecker, OverlappingStopsInEverySplit) {
  const std::vector<std::string> stops = {"ab", "abc", "bca"};
  for (const std::string text : {"xxabcay", "xbcay", "abc", "zzbcbca", "aabbcca", "cab"}) {
    for (bool include : {false, true}) {
      const Outcome want = expected(stops, text, include);
      for (const auto& pieces : all_splits(text))
        EXPECT_EQ(run(stops, pieces, include), want) << text;
    }
  }
  // Hand-checked: "ab" completes before "abc" could.
  EXPECT_EQ(expected(stops, "xxabcay", false), (Outcome{"xx", "ab"}));
  EXPECT_EQ(expected(stops, "xbcay", false), (Outcome{"x", "bca"}));
  // At the same end the longer stop wins.
  EXPECT_EQ(run({"c", "abc"}, {"xa", "bc"}), (Outcome{"x", "abc"}));
}

TEST(StopChecker, Unicode) {
  const std::vector<std::string> stops = {"世界", "é!"};
  const std::string text = "é, 世界 é!";
  const Outcome want = {"é, ", "世界"};
  for (const auto& pieces : all_splits(text)) {
    const Outcome got = run(stops, pieces);
    EXPECT_EQ(got, want);
  }
  // Whole-character pieces: what is emitted is always valid UTF-8 text.
  StopChecker checker({"世界"});
  EXPECT_EQ(checker.feed("a世").text, "a");
  EXPECT_EQ(checker.feed("间").text, "世间");
}

TEST(StopChecker, UncheckedTextDoesNotMatch) {
  // Stops completing inside text fed with check = false (before min_tokens)
  // do not count; one that starts there and ends in checked text does.
  StopChecker a({"ab"});
  EXPECT_EQ(a.feed("xab", false).text, "xab");
  const StopChecker::Result later = a.feed("yab");
  EXPECT_EQ(later.text, "y");
  EXPECT_EQ(later.stop, "ab");
  StopChecker b({"abc"});
  EXPECT_EQ(b.feed("xab", false).text, "x");
  const StopChecker::Result r = b.feed("cd");
  ASSERT_TRUE(r.stop);
  EXPECT_EQ(r.text, "");
  StopChecker c({"ab"});
  EXPECT_EQ(c.feed("xa", false).text, "x");
  EXPECT_EQ(c.feed("b", false).text, "ab");
  EXPECT_FALSE(c.stopped());
}

TEST(StopChecker, RandomizedAgainstTheDefinition) {
  std::mt19937 rng(1234);
  auto random_string = [&](size_t min_len, size_t max_len, const std::string& alphabet) {
    std::string s(std::uniform_int_distribution<size_t>(min_len, max_len)(rng), ' ');
    for (char& c : s) c = alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
    return s;
  };
  for (int trial = 0; trial < 6000; ++trial) {
    const std::string alphabet = trial % 2 ? "ab" : "abcd";
    const std::string text = random_string(0, 40, alphabet);
    std::vector<std::string> stops;
    const int n = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int i = 0; i < n; ++i) stops.push_back(random_string(1, 5, alphabet));
    const bool include = trial % 3 == 0;
    std::vector<std::string> pieces;
    for (size_t at = 0; at < text.size();) {
      const size_t len = std::uniform_int_distribution<size_t>(0, 6)(rng);
      pieces.push_back(text.substr(at, len));
      at += len;
    }
    // Half the trials feed a first stretch of pieces unchecked (min_tokens).
    const size_t unchecked =
        (trial / 2) % 2 ? 0 : std::uniform_int_distribution<size_t>(0, pieces.size())(rng);
    size_t min_end = 0;
    for (size_t i = 0; i < unchecked; ++i) min_end += pieces[i].size();
    const Outcome want = expected(stops, text, include, min_end);
    const Outcome got = run(stops, pieces, include, unchecked);
    ASSERT_EQ(got, want) << "text '" << text << "' trial " << trial << " unchecked " << min_end;
  }
}

TEST(StopChecker, RejectsEmptyStop) {
  EXPECT_THROW(StopChecker({"a", ""}), Error);
}

}  // namespace
}  // namespace basalt
