// SPDX-License-Identifier: Apache-2.0
// The project's one JSON writer (tools/json_writer.h) in each layout its
// users print: qemu-img's (tests/cli_test.cc holds its key-order tests),
// the one-line forms, bench's results document, and the tests' parser
// reading back what it writes.
#include "tools/json_writer.h"

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/util/json_lite.h"
#include "tools/bench/bench_output.h"

// The bench results are not part of any library target: compile them in.
#include "tools/bench/bench_output.cc"  // NOLINT(build/include)

namespace qcow2::tool {
namespace {

Json Sample() {
  Json o = Json::Object();
  o.Set("u", Json::Uint(18446744073709551615ull))
      .Set("i", Json::Int(-5))
      .Set("d", Json::Double(2.0))
      .Set("nan", Json::Double(std::nan("")))
      .Set("s", Json::String("caf\xc3\xa9\n"))
      .Set("a", Json::Array().Append(Json::Bool(true)).Append(Json::Null()))
      .Set("e", Json::Array());
  return o;
}

TEST(JsonWriterTest, OneLineForms) {
  EXPECT_EQ(ToJson(Sample(), JsonFormat::Compact()),
            "{\"u\": 18446744073709551615, \"i\": -5, \"d\": 2.0, "
            "\"nan\": null, \"s\": \"caf\\u00E9\\n\", \"a\": [true, null], "
            "\"e\": []}");
  EXPECT_EQ(ToJson(Sample(), JsonFormat::Tight()),
            "{\"u\":18446744073709551615,\"i\":-5,\"d\":2.0,\"nan\":null,"
            "\"s\":\"caf\\u00E9\\n\",\"a\":[true,null],\"e\":[]}");
}

TEST(JsonWriterTest, DoublesRoundTripOrShort) {
  JsonFormat short_form;
  short_form.doubles = JsonFormat::Doubles::kShort;
  const Json a = Json::Array()
                     .Append(Json::Double(0.1))
                     .Append(Json::Double(1e20))
                     .Append(Json::Double(1000))
                     .Append(Json::Double(-3.25e-9));
  EXPECT_EQ(ToJson(a, JsonFormat::Tight()),
            "[0.10000000000000001,1e+20,1000.0,-3.2500000000000002e-09]");
  EXPECT_EQ(ToJson(a, short_form), "[0.1, 1e+20, 1000, -3.25e-09]");
}

TEST(JsonWriterTest, ExpandsOnlyToTheGivenDepth) {
  JsonFormat f;
  f.expand_objects = 1;
  f.expand_arrays = 2;
  f.indent = 2;
  Json doc = Json::Object();
  doc.Set("o", Json::Object().Set("k", Json::Uint(1)))
      .Set("rows", Json::Array()
                       .Append(Json::Object().Set("x", Json::Uint(1)))
                       .Append(Json::Array().Append(Json::Uint(2))))
      .Set("none", Json::Array());
  EXPECT_EQ(ToJson(doc, f),
            "{\n"
            "  \"o\": {\"k\": 1},\n"
            "  \"rows\": [\n"
            "    {\"x\": 1},\n"
            "    [2]\n"
            "  ],\n"
            "  \"none\": []\n"
            "}");
  // QEMU's printer breaks the line even in an empty container.
  EXPECT_EQ(
      ToJson(Json::Object().Set("e", Json::Array()), JsonFormat::QemuPretty()),
      "{\n    \"e\": [\n    ]\n}");
}

TEST(JsonWriterTest, TestParserReadsBackWhatItWrites) {
  auto v = testing::json::Parse(ToJson(Sample(), JsonFormat::QemuPretty()));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*v)["u"].as_uint64(), 18446744073709551615ull);
  EXPECT_EQ((*v)["i"].as_int64(), -5);
  EXPECT_EQ((*v)["d"].type(), testing::json::Value::Type::kDouble);
  EXPECT_TRUE((*v)["nan"].is_null());
  EXPECT_EQ((*v)["s"].as_string(), "caf\xc3\xa9\n");
  // The parser's values print through the same writer, so its tight text
  // comes back unchanged.
  const std::string tight = ToJson(Sample(), JsonFormat::Tight());
  auto t = testing::json::Parse(tight);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->ToString(), tight);
  EXPECT_EQ(testing::json::Quote("\x01\xff"), "\"\\u0001\\uFFFD\"");
}

}  // namespace

namespace bench {
namespace {

// The results document as `qcowtool bench --output=json` has printed it
// since before the writers were one (bench/*.py and the docs read it).
TEST(JsonWriterTest, BenchReportLayoutIsUnchanged) {
  Report r;
  r.workload = "over\"lay caf\xc3\xa9";
  r.params.Set("bs", Value::UintList(std::vector<uint64_t>{4096, 65536}))
      .Set("engine", Value::Str("io_uring"))
      .Set("direct", Value::Bool(true))
      .Set("time", Value::Num(1.5))
      .Set("weights", Value::NumList({0.25, 2.0, 1e7, 0.000123456789}))
      .Set("none", Value());
  Record a;
  a.Set("depth", Value::Uint(0))
      .Set("iops", Value::Num(123456.789))
      .Set("mbps", Value::Num(2.0))
      .Set("ratio", Value::Ratio(std::nullopt))
      .Set("nan", Value::Num(std::numeric_limits<double>::quiet_NaN()))
      .Set("big", Value::Uint(18446744073709551615ull))
      .Set("neg", Value::Num(-3.25e-9))
      .Set("l2", Value::Bool(false))
      .Set("empty", Value::UintList(std::vector<int>{}));
  r.rows = {
      a, Record().Set("depth", Value::Uint(1)).Set("ratio", Value::Ratio(0.5))};
  r.extra.emplace_back("recommendation",
                       Record()
                           .Set("cluster_size", Value::Uint(65536))
                           .Set("why", Value::Str("tab\there\n")));
  EXPECT_EQ(
      ReportJson(r),
      "{\n"
      "  \"workload\": \"over\\\"lay caf\\u00E9\",\n"
      "  \"params\": {\"bs\": [4096, 65536], \"engine\": \"io_uring\", "
      "\"direct\": true, \"time\": 1.5, \"weights\": [0.25, 2, 1e+07, "
      "0.000123457], \"none\": null},\n"
      "  \"rows\": [\n"
      "    {\"depth\": 0, \"iops\": 123457, \"mbps\": 2, \"ratio\": null, "
      "\"nan\": null, \"big\": 18446744073709551615, \"neg\": -3.25e-09, "
      "\"l2\": false, \"empty\": []},\n"
      "    {\"depth\": 1, \"ratio\": 0.5}\n"
      "  ],\n"
      "  \"recommendation\": {\"cluster_size\": 65536, \"why\": "
      "\"tab\\there\\n\"}\n"
      "}\n");
  Report empty;
  empty.workload = "x";
  empty.extra.emplace_back("ex", Record());
  EXPECT_EQ(ReportJson(empty),
            "{\n  \"workload\": \"x\",\n  \"params\": {},\n  \"rows\": [],\n"
            "  \"ex\": {}\n}\n");
  EXPECT_EQ(a.Find("iops")->ToJson(), "123457");
  EXPECT_EQ(FormatCell(*a.Find("empty"), 0), "[]");
}

}  // namespace
}  // namespace bench
}  // namespace qcow2::tool
