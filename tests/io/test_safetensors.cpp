// The JSON reader and safetensors files. Files are built here byte by byte from the
// published format (8-byte little-endian header length, JSON header, data), independently
// of the writer under test; values are closed forms of their index, and F16/BF16 bit
// patterns are checked against their values as IEEE 754 defines them.

#include "cubelm/core/error.hpp"
#include "cubelm/io/json.hpp"
#include "cubelm/io/safetensors.hpp"

#include "test_helpers.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

using namespace cubelm;
using namespace cubelm::io;
using cubelm::testing::error_of;
namespace fs = std::filesystem;

namespace {

std::string temp_file(const std::string& stem) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return (fs::temp_directory_path() /
          ("cubelm_st_" + std::to_string(::getpid()) + "_" + info->name() + "_" + stem))
      .string();
}

std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file: the length as 8 little-endian bytes, the header as given, the data.
std::string file_bytes(const std::string& header, const std::string& data,
                       std::uint64_t length = std::numeric_limits<std::uint64_t>::max()) {
  if (length == std::numeric_limits<std::uint64_t>::max())
    length = header.size();
  std::string out;
  for (int i = 0; i < 8; ++i)
    out += static_cast<char>((length >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string le32(std::uint32_t v) {
  std::string s;
  for (int i = 0; i < 4; ++i)
    s += static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}
std::string le16(std::uint16_t v) {
  return std::string{static_cast<char>(v & 0xff), static_cast<char>(v >> 8)};
}
std::string f32(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return le32(bits);
}

// The message the reader gives for a file of these bytes.
std::string reader_error(const std::string& bytes) {
  const std::string path = temp_file("bad.safetensors");
  write_bytes(path, bytes);
  const std::string message = error_of([&] { SafetensorsReader r(path); }, false);
  EXPECT_HAS(message, path);
  fs::remove(path);
  return message;
}

} // namespace

TEST(Json, ReadsNestedValuesAndExactIntegers) {
  const Json v = parse_json(R"( {"a": [1, 2.5, -3e2, true, false, null],
    "big": 18446744073709551615, "s": "q\"\\\/\n\u00e9\ud83d\ude00", "o": {}} )",
                            "doc");
  ASSERT_TRUE(v.is_object());
  ASSERT_EQ(v.members().size(), 4u);
  const Json& a = *v.find("a");
  ASSERT_EQ(a.elements().size(), 6u);
  EXPECT_EQ(a.elements()[0].unsigned_integer(), std::optional<std::uint64_t>(1));
  EXPECT_DOUBLE_EQ(a.elements()[1].number(), 2.5);
  EXPECT_FALSE(a.elements()[1].unsigned_integer());
  EXPECT_DOUBLE_EQ(a.elements()[2].number(), -300.0);
  EXPECT_FALSE(a.elements()[2].unsigned_integer());
  EXPECT_TRUE(a.elements()[3].is_boolean() && a.elements()[3].boolean());
  EXPECT_TRUE(a.elements()[4].is_boolean() && !a.elements()[4].boolean());
  EXPECT_TRUE(a.elements()[5].is_null());
  EXPECT_EQ(v.find("big")->unsigned_integer(),
            std::optional<std::uint64_t>(18446744073709551615ull));
  EXPECT_EQ(v.find("s")->text(), "q\"\\/\n\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_TRUE(v.find("o")->is_object());
  EXPECT_EQ(v.find("missing"), nullptr);
  EXPECT_FALSE(parse_json("18446744073709551616", "x").unsigned_integer()); // 2^64
  EXPECT_EQ(json_quote("a\"b\\c\n\x01"), "\"a\\\"b\\\\c\\n\\u0001\"");
  EXPECT_EQ(parse_json(json_quote("a\"b\\c\n\x01"), "x").text(), "a\"b\\c\n\x01");
}

TEST(Json, RefusesBrokenDocumentsWithLineAndColumn) {
  const auto message = [](const std::string& text) {
    return error_of([&] { parse_json(text, "cfg.json"); }, false);
  };
  std::string m = message("{\n  \"a\": 1,\n  \"a\": 2\n}");
  EXPECT_HAS(m, "cfg.json: line 3, column 3: the key \"a\" appears twice");
  m = message("{\"a\": 1} x");
  EXPECT_HAS(m, "line 1, column 10: unexpected 'x' after the end of the document");
  EXPECT_HAS(message("{\"a\": \"open"), "the string is not closed");
  EXPECT_HAS(message("[1, 2"), "',' or ']' expected in an array, found end of the text");
  EXPECT_HAS(message("{\"a\" 1}"), "':' expected after the member name \"a\"");
  EXPECT_HAS(message("[01]"), "',' or ']' expected");
  EXPECT_HAS(message("[1.]"), "a digit expected after the decimal point");
  EXPECT_HAS(message("[tru]"), "a value expected, found 't'");
  EXPECT_HAS(message("\"\\x\""), "unknown escape '\\x'");
  EXPECT_HAS(message("\"\\ud800\""), "high surrogate");
  EXPECT_HAS(message(""), "a value expected, found the end of the text");
  // Deep nesting is an error, not a stack overflow.
  EXPECT_HAS(message(std::string(100000, '[')), "nested deeper than 64 levels");
}

TEST(Safetensors, WriterFollowsTheFormat) {
  const std::string path = temp_file("w.safetensors");
  std::vector<float> a(2 * 3), b(5);
  for (std::size_t i = 0; i < a.size(); ++i)
    a[i] = 0.5f * static_cast<float>(i) - 1.0f;
  for (std::size_t i = 0; i < b.size(); ++i)
    b[i] = 100.0f + static_cast<float>(i);
  write_safetensors(path, {{"x.weight", {2, 3}, a.data()}, {"y", {5}, b.data()}},
                    {{"format", "pt"}});
  EXPECT_FALSE(fs::exists(path + ".partial"));
  const std::vector<unsigned char> bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | bytes[static_cast<std::size_t>(i)];
  EXPECT_EQ((8 + n) % 8, 0u) << "the data must start 8-byte aligned";
  ASSERT_EQ(bytes.size(), 8 + n + 4 * (6 + 5));
  const std::string header(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(n));
  const Json h = parse_json(header, "header");
  EXPECT_EQ(h.find("__metadata__")->find("format")->text(), "pt");
  const Json& x = *h.find("x.weight");
  EXPECT_EQ(x.find("dtype")->text(), "F32");
  EXPECT_EQ(x.find("shape")->elements()[0].unsigned_integer(), std::optional<std::uint64_t>(2));
  EXPECT_EQ(x.find("shape")->elements()[1].unsigned_integer(), std::optional<std::uint64_t>(3));
  const auto& offsets = h.find("y")->find("data_offsets")->elements();
  ASSERT_EQ(offsets.size(), 2u);
  EXPECT_EQ(offsets[0].unsigned_integer(), std::optional<std::uint64_t>(24));
  EXPECT_EQ(offsets[1].unsigned_integer(), std::optional<std::uint64_t>(44));
  // y[2] = 102 as little-endian float32 bits, at data offset 24 + 8.
  const std::string expected = f32(102.0f);
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(static_cast<char>(bytes[8 + n + 32 + static_cast<std::size_t>(i)]),
              expected[static_cast<std::size_t>(i)]);

  const SafetensorsReader r(path);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  ASSERT_EQ(r.tensors().size(), 2u);
  EXPECT_EQ(r.find("x.weight")->shape, (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(r.read_floats("x.weight"), a);
  EXPECT_EQ(r.read_floats("y"), b);
  fs::remove(path);
}

TEST(Safetensors, ReadsF16AndBF16Exactly) {
  // F16: 1.5 (0x3e00), -0 (0x8000), 65504 (0x7bff), the smallest subnormal 2^-24 (0x0001),
  // infinity (0x7c00). BF16: 1.0 (0x3f80), -2.5 (0xc020). A scalar F32 last, and the data
  // in another order than the header lists it.
  const std::string data = le16(0x3f80) + le16(0xc020) + le16(0x3e00) + le16(0x8000) +
                           le16(0x7bff) + le16(0x0001) + le16(0x7c00) + f32(-7.25f);
  std::string header = R"({"h":{"dtype":"F16","shape":[5],"data_offsets":[4,14]},)"
                       R"("b":{"dtype":"BF16","shape":[1,2],"data_offsets":[0,4]},)"
                       R"("s":{"dtype":"F32","shape":[],"data_offsets":[14,18]}})";
  const std::string path = temp_file("h.safetensors");
  write_bytes(path, file_bytes(header, data));
  const SafetensorsReader r(path);
  EXPECT_EQ(r.read_floats("b"), (std::vector<float>{1.0f, -2.5f}));
  const std::vector<float> h = r.read_floats("h");
  ASSERT_EQ(h.size(), 5u);
  EXPECT_EQ(h[0], 1.5f);
  EXPECT_TRUE(h[1] == 0.0f && std::signbit(h[1]));
  EXPECT_EQ(h[2], 65504.0f);
  EXPECT_EQ(h[3], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(h[4]) && h[4] > 0);
  EXPECT_EQ(r.read_floats("s"), (std::vector<float>{-7.25f}));
  EXPECT_EQ(r.tensors().front().name, "b") << "tensors are listed in the order of their data";
  EXPECT_HAS(error_of([&] { r.read_floats("nope"); }, false), "has no tensor \"nope\"");
  fs::remove(path);
}

TEST(Safetensors, RefusesHeadersThatLie) {
  const std::string ok = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string data(8, '\0');
  // Too short, a length past the file or beyond the limit, no JSON object.
  EXPECT_HAS(reader_error("abc"), "too short for the 8-byte header length");
  EXPECT_HAS(reader_error(file_bytes("{" + ok + "}", data, 1000)),
             "header length 1000 (the first 8 bytes, little-endian) reaches past the end");
  EXPECT_HAS(reader_error(file_bytes("{}", "", 200000000)), "above the format's limit");
  EXPECT_HAS(reader_error(file_bytes("{\"t\": [", data)), "(header): line 1, column 8");
  EXPECT_HAS(reader_error(file_bytes("[1]", "")), "the header is an array: it must be a JSON");
  // Entries.
  EXPECT_HAS(reader_error(file_bytes(R"({"t":{"shape":[2],"data_offsets":[0,8]}})", data)),
             "tensor \"t\" has no \"dtype\"");
  EXPECT_HAS(
      reader_error(file_bytes(R"({"t":{"dtype":"F128","shape":[2],"data_offsets":[0,8]}})", data)),
      "tensor \"t\": dtype = \"F128\" is not a safetensors dtype");
  EXPECT_HAS(
      reader_error(file_bytes(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data)),
      "shape holds -2: every size must be an integer >= 0");
  EXPECT_HAS(
      reader_error(file_bytes(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", data)),
      "data_offsets = [8, 0]: end must not be below begin");
  EXPECT_HAS(
      reader_error(file_bytes(R"({"t":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data)),
      "data_offsets = [0, 16] reach past the end of the file, which holds 8 bytes");
  EXPECT_HAS(
      reader_error(file_bytes(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data)),
      "shape [3] of F32 needs 12 bytes, but data_offsets = [0, 8] hold 8");
  EXPECT_HAS(
      reader_error(file_bytes(
          R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", data)),
      "needs more than 2^64 bytes");
  EXPECT_HAS(reader_error(file_bytes(R"({"__metadata__":{"a":1},)" + ok + "}", data)),
             "__metadata__ \"a\" = 1: every metadata value must be a string");
  // The data: overlaps, gaps, bytes after the last tensor.
  EXPECT_HAS(reader_error(file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                     R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                     data)),
             "tensors \"a\" (bytes [0, 8)) and \"b\" ([4, 8)) overlap");
  EXPECT_HAS(
      reader_error(file_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data)),
      "bytes [0, 4) of the data belong to no tensor");
  EXPECT_HAS(reader_error(file_bytes("{" + ok + "}", data + "xx")),
             "the tensors' data ends at byte 8 but the file holds 10 bytes");
  // A dtype the format has but cubelm does not read as floats.
  const std::string path = temp_file("i64.safetensors");
  write_bytes(path, file_bytes(R"({"t":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", data));
  const SafetensorsReader r(path);
  EXPECT_HAS(error_of([&] { r.read_floats("t"); }, false),
             "tensor \"t\" is I64: cubelm reads F32, F16 and BF16 tensors");
  fs::remove(path);
  EXPECT_HAS(error_of([] { SafetensorsReader r("/no/such/model.safetensors"); }, false),
             "/no/such/model.safetensors: no such file");
}
