// Token files, samplers and the synthetic corpus. Files are written here byte
// by byte (independently of the writers under test) into a temporary folder,
// samplers are compared with their closed forms, and the random streams with
// values from an independent Python implementation of the definitions in
// docs/data.md.

#include "cubelm/core/error.hpp"
#include "cubelm/io/rng.hpp"
#include "cubelm/io/sampler.hpp"
#include "cubelm/io/synthetic.hpp"
#include "cubelm/io/tokens.hpp"

#include "test_helpers.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

using namespace cubelm;
using namespace cubelm::io;
namespace fs = std::filesystem;

using cubelm::testing::TempDir;

namespace {

// Little-endian byte building, kept apart from the code under test.
struct Bytes {
  std::vector<unsigned char> b;
  Bytes& le(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i)
      b.push_back(static_cast<unsigned char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  Bytes& i32(std::int32_t v) { return le(static_cast<std::uint32_t>(v), 4); }
  Bytes& i64(std::int64_t v) { return le(static_cast<std::uint64_t>(v), 8); }
  Bytes& raw(const std::string& s) {
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
};

void write_file(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}
void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}
std::vector<unsigned char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// An llm.c file with the given header fields and uint16 tokens.
Bytes llmc_bytes(std::int32_t magic, std::int32_t version, std::int32_t count,
                 const std::vector<std::uint16_t>& tokens) {
  Bytes b;
  b.i32(magic).i32(version).i32(count);
  for (int i = 3; i < 256; ++i)
    b.i32(0);
  for (auto t : tokens)
    b.le(t, 2);
  return b;
}

// The message of the cubelm::Error that `f` raises: a data file is read by one rank.
std::string error_of(const std::function<void()>& f) {
  return cubelm::testing::error_of(f, false);
}

} // namespace

// ---- llm.c -------------------------------------------------------------------

TEST(Llmc, RoundTripAndExactBytes) {
  TempDir dir;
  const std::string path = dir.path("t.bin");
  const std::vector<std::int32_t> tokens = {0, 1, 255, 256, 50256, 65535, 7};
  write_llmc(path, tokens);
  const auto expected = llmc_bytes(20240520, 1, 7, {0, 1, 255, 256, 50256, 65535, 7}).b;
  EXPECT_EQ(file_bytes(path), expected);
  EXPECT_EQ(read_llmc(path, 65536), tokens);
  const TokenData d = load_tokens("llmc", path, 65536);
  EXPECT_EQ(d.tokens, tokens);
  EXPECT_EQ(d.source, path);
}

TEST(Llmc, EmptyFileRoundTrip) {
  TempDir dir;
  write_llmc(dir.path("e.bin"), {});
  EXPECT_EQ(fs::file_size(dir.path("e.bin")), 1024u);
  EXPECT_TRUE(read_llmc(dir.path("e.bin"), 10).empty());
}

TEST(Llmc, WriterRefusesTokensOutsideUint16) {
  TempDir dir;
  const std::string path = dir.path("w.bin");
  const std::string msg = error_of([&] { write_llmc(path, {1, 2, 65536}); });
  EXPECT_HAS(msg, path);
  EXPECT_HAS(msg, "token 2 is 65536");
  EXPECT_HAS(msg, "[0, 65535]");
  EXPECT_FALSE(fs::exists(path)) << "a refused write leaves no file";
  EXPECT_HAS(error_of([&] { write_llmc(path, {-1}); }), "token 0 is -1");
}

TEST(Llmc, WrongMagic) {
  TempDir dir;
  const std::string path = dir.path("m.bin");
  write_file(path, llmc_bytes(20240521, 1, 1, {3}).b);
  const std::string msg = error_of([&] { read_llmc(path, 256); });
  EXPECT_HAS(msg, path);
  EXPECT_HAS(msg, "byte offset 0");
  EXPECT_HAS(msg, "20240521");
  EXPECT_HAS(msg, "expected 20240520");
}

TEST(Llmc, MegatronIndexGivenAsLlmcGetsAHint) {
  TempDir dir;
  write_megatron(dir.path("c"), {{1, 2}});
  EXPECT_HAS(error_of([&] { read_llmc(dir.path("c.idx"), 256); }), "use format \"megatron\"");
}

TEST(Llmc, UnsupportedVersion) {
  TempDir dir;
  const std::string path = dir.path("v.bin");
  write_file(path, llmc_bytes(20240520, 2, 1, {3}).b);
  const std::string msg = error_of([&] { read_llmc(path, 256); });
  EXPECT_HAS(msg, path);
  EXPECT_HAS(msg, "byte offset 4: version 2");
  EXPECT_HAS(msg, "only version 1");
}

TEST(Llmc, TruncatedFile) {
  TempDir dir;
  const std::string path = dir.path("t.bin");
  write_file(path, llmc_bytes(20240520, 1, 10, {1, 2, 3}).b); // 10 promised, 3 present
  const std::string msg = error_of([&] { read_llmc(path, 256); });
  EXPECT_HAS(msg, path);
  EXPECT_HAS(msg, "truncated");
  EXPECT_HAS(msg, "says 10 tokens");
  EXPECT_HAS(msg, "1044 bytes");          // 1024 + 2*10 needed
  EXPECT_HAS(msg, "file has 1030 bytes"); // 1024 + 2*3 present

  auto shortened = llmc_bytes(20240520, 1, 0, {}).b;
  shortened.resize(100); // a valid start, cut inside the header
  write_file(path, shortened);
  EXPECT_HAS(error_of([&] { read_llmc(path, 256); }), "fewer than the 1024-byte llm.c header");
  write_file(path, std::vector<unsigned char>(2, 0)); // too short even for the magic
  EXPECT_HAS(error_of([&] { read_llmc(path, 256); }), "file has 2 bytes");
}

TEST(Llmc, TrailingBytesRefused) {
  TempDir dir;
  const std::string path = dir.path("x.bin");
  write_file(path, llmc_bytes(20240520, 1, 2, {1, 2, 3}).b);
  EXPECT_HAS(error_of([&] { read_llmc(path, 256); }), "ends with its last token");
}

TEST(Llmc, TokenOutsideVocabulary) {
  TempDir dir;
  const std::string path = dir.path("o.bin");
  write_file(path, llmc_bytes(20240520, 1, 4, {5, 99, 100, 7}).b);
  EXPECT_EQ(read_llmc(path, 101), (std::vector<std::int32_t>{5, 99, 100, 7}));
  const std::string msg = error_of([&] { read_llmc(path, 100); });
  EXPECT_HAS(msg, path);
  EXPECT_HAS(msg, "token 2 (byte offset 1028) is 100"); // 1024 + 2*2
  EXPECT_HAS(msg, "vocab_size = 100");
  EXPECT_HAS(msg, "[0, vocab_size)");
}

TEST(Llmc, MissingFile) {
  TempDir dir;
  const std::string path = dir.path("no_such.bin");
  const std::string msg = error_of([&] { read_llmc(path, 256); });
  EXPECT_HAS(msg, path);
  EXPECT_HAS(msg, "no such file");
  EXPECT_HAS(error_of([&] { read_llmc(dir.path(""), 256); }), "not a regular file");
}

// ---- token ids (a prompt) -----------------------------------------------------

TEST(TokenIds, DecimalIdsOrAnLlmcFile) {
  TempDir dir;
  const std::string text = dir.path("ids.txt"), bin = dir.path("ids.bin");
  write_file(text, std::string(" 5\t99\n\n100  7 \r\n"));
  EXPECT_EQ(read_token_ids(text, 101), (std::vector<std::int32_t>{5, 99, 100, 7}));
  write_file(bin, llmc_bytes(20240520, 1, 4, {5, 99, 100, 7}).b);
  EXPECT_EQ(read_token_ids(bin, 101), (std::vector<std::int32_t>{5, 99, 100, 7}));
  // The llm.c reader's own checks apply to an llm.c file.
  EXPECT_HAS(error_of([&] { read_token_ids(bin, 100); }), "token 2 (byte offset 1028) is 100");
  write_file(text, std::string(""));
  EXPECT_TRUE(read_token_ids(text, 10).empty());
  write_file(text, std::string("\n \n"));
  EXPECT_TRUE(read_token_ids(text, 10).empty());
}

TEST(TokenIds, RefusesWordsAndIdsOutsideTheVocabulary) {
  TempDir dir;
  const std::string path = dir.path("bad.txt");
  write_file(path, std::string("1 2\n300 4"));
  std::string msg = error_of([&] { read_token_ids(path, 256); });
  EXPECT_HAS(msg, path + ": token 2 (byte offset 4) is 300, outside the vocabulary");
  EXPECT_HAS(msg, "vocab_size = 256");
  write_file(path, std::string("1 -2"));
  msg = error_of([&] { read_token_ids(path, 256); });
  EXPECT_HAS(msg, path + ": token 1 (byte offset 2) is \"-2\", not a token id");
  write_file(path, std::string("7 3x 1"));
  EXPECT_HAS(error_of([&] { read_token_ids(path, 256); }), "token 1 (byte offset 2) is \"3x\"");
  write_file(path, std::string("99999999999999999999999"));
  EXPECT_HAS(error_of([&] { read_token_ids(path, 256); }), "not a token id");
  EXPECT_HAS(error_of([&] { read_token_ids(dir.path("none.txt"), 256); }),
             "cannot open the token file: no such file");
}

// ---- Megatron ----------------------------------------------------------------

namespace {

// Parses an index with its own reader, to check what write_megatron wrote.
struct Index {
  std::string magic;
  std::uint64_t version, S, D;
  int dtype;
  std::vector<std::int64_t> lengths, pointers, docs;
};
Index parse_index(const std::vector<unsigned char>& b) {
  auto le = [&](std::size_t at, int n) {
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i)
      v |= std::uint64_t{b.at(at + i)} << (8 * i);
    return v;
  };
  Index x;
  x.magic.assign(b.begin(), b.begin() + 9);
  x.version = le(9, 8);
  x.dtype = static_cast<int>(le(17, 1));
  x.S = le(18, 8);
  x.D = le(26, 8);
  std::size_t at = 34;
  for (std::uint64_t i = 0; i < x.S; ++i, at += 4)
    x.lengths.push_back(static_cast<std::int32_t>(le(at, 4)));
  for (std::uint64_t i = 0; i < x.S; ++i, at += 8)
    x.pointers.push_back(static_cast<std::int64_t>(le(at, 8)));
  for (std::uint64_t i = 0; i < x.D; ++i, at += 8)
    x.docs.push_back(static_cast<std::int64_t>(le(at, 8)));
  EXPECT_EQ(at, b.size()) << "index size";
  return x;
}

// An index for `lengths` sequences laid end to end, with the given header fields.
Bytes index_bytes(const std::string& magic, std::uint64_t version, int dtype,
                  const std::vector<std::int32_t>& lengths,
                  const std::vector<std::int64_t>& pointers) {
  Bytes b;
  b.raw(magic).le(version, 8).le(static_cast<std::uint64_t>(dtype), 1);
  b.le(lengths.size(), 8).le(lengths.size() + 1, 8);
  for (auto l : lengths)
    b.i32(l);
  for (auto p : pointers)
    b.i64(p);
  for (std::size_t d = 0; d <= lengths.size(); ++d)
    b.i64(static_cast<std::int64_t>(d));
  return b;
}

const std::string kMagic("MMIDIDX\0\0", 9);

} // namespace

TEST(Megatron, RoundTripUint16) {
  TempDir dir;
  const std::vector<std::vector<std::int32_t>> docs = {{1, 2, 3}, {}, {65535, 0}, {9}};
  write_megatron(dir.path("c"), docs);
  const Index x = parse_index(file_bytes(dir.path("c.idx")));
  EXPECT_EQ(x.magic, kMagic);
  EXPECT_EQ(x.version, 1u);
  EXPECT_EQ(x.dtype, 8);
  EXPECT_EQ(x.S, 4u);
  EXPECT_EQ(x.D, 5u);
  EXPECT_EQ(x.lengths, (std::vector<std::int64_t>{3, 0, 2, 1}));
  EXPECT_EQ(x.pointers, (std::vector<std::int64_t>{0, 6, 6, 10}));
  EXPECT_EQ(x.docs, (std::vector<std::int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(fs::file_size(dir.path("c.bin")), 12u);

  const std::vector<std::int32_t> all = {1, 2, 3, 65535, 0, 9};
  // The prefix and either file name give the same corpus.
  EXPECT_EQ(read_megatron(dir.path("c"), 65536), all);
  EXPECT_EQ(read_megatron(dir.path("c.bin"), 65536), all);
  EXPECT_EQ(read_megatron(dir.path("c.idx"), 65536), all);
  EXPECT_EQ(load_tokens("megatron", dir.path("c.bin"), 65536).source, dir.path("c") + ".{bin,idx}");
}

TEST(Megatron, RoundTripInt32) {
  TempDir dir;
  const std::vector<std::vector<std::int32_t>> docs = {{70000, 1}, {2}, {100000, 3, 4}};
  write_megatron(dir.path("w"), docs);
  const Index x = parse_index(file_bytes(dir.path("w.idx")));
  EXPECT_EQ(x.dtype, 4);
  EXPECT_EQ(x.pointers, (std::vector<std::int64_t>{0, 8, 12}));
  EXPECT_EQ(fs::file_size(dir.path("w.bin")), 24u);
  EXPECT_EQ(read_megatron(dir.path("w"), 100001),
            (std::vector<std::int32_t>{70000, 1, 2, 100000, 3, 4}));
  const std::string msg = error_of([&] { read_megatron(dir.path("w"), 100000); });
  EXPECT_HAS(msg, dir.path("w.bin"));
  EXPECT_HAS(msg, "token 0 of sequence 2 (byte offset 12) is 100000");
  EXPECT_HAS(msg, "vocab_size = 100000");
}

TEST(Megatron, ReadsHandWrittenFilesWithGapsAndOrder) {
  // Sequences need not be contiguous nor in file order: the index decides.
  TempDir dir;
  Bytes bin;
  for (std::uint16_t t : {10, 11, 12, 99, 20, 21})
    bin.le(t, 2);
  write_file(dir.path("h.bin"), bin.b);
  write_file(dir.path("h.idx"), index_bytes(kMagic, 1, 8, {2, 3}, {8, 0}).b);
  EXPECT_EQ(read_megatron(dir.path("h"), 100), (std::vector<std::int32_t>{20, 21, 10, 11, 12}));
}

TEST(Megatron, WrongMagic) {
  TempDir dir;
  write_file(dir.path("m.bin"), Bytes().le(1, 2).b);
  write_file(dir.path("m.idx"), index_bytes(std::string("MMIDIDY\0\0", 9), 1, 8, {1}, {0}).b);
  const std::string msg = error_of([&] { read_megatron(dir.path("m"), 256); });
  EXPECT_HAS(msg, dir.path("m.idx"));
  EXPECT_HAS(msg, "byte offset 0");
  EXPECT_HAS(msg, "MMIDIDY\\x00\\x00");
  EXPECT_HAS(msg, "magic");
}

TEST(Megatron, UnsupportedVersion) {
  TempDir dir;
  write_file(dir.path("v.bin"), Bytes().le(1, 2).b);
  write_file(dir.path("v.idx"), index_bytes(kMagic, 2, 8, {1}, {0}).b);
  EXPECT_HAS(error_of([&] { read_megatron(dir.path("v"), 256); }), "byte offset 9: version 2");
}

TEST(Megatron, BadDtypeCode) {
  TempDir dir;
  write_file(dir.path("d.bin"), Bytes().le(1, 8).b);
  write_file(dir.path("d.idx"), index_bytes(kMagic, 1, 5, {1}, {0}).b);
  const std::string msg = error_of([&] { read_megatron(dir.path("d"), 256); });
  EXPECT_HAS(msg, dir.path("d.idx"));
  EXPECT_HAS(msg, "byte offset 17: dtype code 5");
  EXPECT_HAS(msg, "only 8 (uint16) and 4 (int32)");
}

TEST(Megatron, PointerBeyondBinSize) {
  TempDir dir;
  write_file(dir.path("p.bin"), Bytes().le(1, 2).le(2, 2).le(3, 2).b); // 6 bytes
  write_file(dir.path("p.idx"), index_bytes(kMagic, 1, 8, {2, 2}, {0, 4}).b);
  const std::string msg = error_of([&] { read_megatron(dir.path("p"), 256); });
  EXPECT_HAS(msg, dir.path("p.idx"));
  EXPECT_HAS(msg, "sequence 1 (pointer 4, 2 tokens) ends at byte 8");
  EXPECT_HAS(msg, "beyond the end of " + dir.path("p.bin") + " (6 bytes)");

  write_file(dir.path("p.idx"), index_bytes(kMagic, 1, 8, {1}, {3}).b);
  EXPECT_HAS(error_of([&] { read_megatron(dir.path("p"), 256); }), "multiple of the token size 2");
}

TEST(Megatron, TruncatedIndexAndMissingBin) {
  TempDir dir;
  auto b = index_bytes(kMagic, 1, 8, {1, 1}, {0, 2}).b;
  b.resize(b.size() - 8);
  write_file(dir.path("t.idx"), b);
  const std::string msg = error_of([&] { read_megatron(dir.path("t"), 256); });
  EXPECT_HAS(msg, "truncated");
  EXPECT_HAS(msg, "2 sequences");
  write_file(dir.path("t.idx"), index_bytes(kMagic, 1, 8, {1}, {0}).b);
  const std::string missing = error_of([&] { read_megatron(dir.path("t"), 256); });
  EXPECT_HAS(missing, dir.path("t.bin"));
  EXPECT_HAS(missing, "no such file");
}

TEST(Megatron, BadDocumentIndex) {
  TempDir dir;
  write_file(dir.path("i.bin"), Bytes().le(1, 2).b);
  Bytes b;
  b.raw(kMagic).le(1, 8).le(8, 1).le(1, 8).le(2, 8).i32(1).i64(0).i64(0).i64(5);
  write_file(dir.path("i.idx"), b.b);
  EXPECT_HAS(error_of([&] { read_megatron(dir.path("i"), 256); }), "document index 1");
}

// ---- Text --------------------------------------------------------------------

TEST(Text, BytesAreTokens) {
  TempDir dir;
  const std::string path = dir.path("t.txt");
  write_file(path, std::string("h\xc3\xa9!\n", 5)); // "hé!\n" in UTF-8
  EXPECT_EQ(read_text(path), (std::vector<std::int32_t>{104, 0xc3, 0xa9, 33, 10}));
  EXPECT_EQ(load_tokens("text", path, 256).tokens.size(), 5u);

  const std::string msg = error_of([&] { read_text(path, 128); });
  EXPECT_HAS(msg, path);
  EXPECT_HAS(msg, "token 1 (byte offset 1) is 195");
  EXPECT_HAS(msg, "vocab_size = 128");
}

TEST(Text, ConvertedToLlmc) {
  TempDir dir;
  write_file(dir.path("a.txt"), "ab");
  write_file(dir.path("b.txt"), std::string("\xff", 1));
  EXPECT_EQ(text_to_llmc({dir.path("a.txt"), dir.path("b.txt")}, dir.path("o.bin")), 3);
  EXPECT_EQ(file_bytes(dir.path("o.bin")), llmc_bytes(20240520, 1, 3, {97, 98, 255}).b);
  EXPECT_HAS(error_of([&] { text_to_llmc({dir.path("a.txt")}, dir.path("a.txt")); }),
             "also an input");
  EXPECT_HAS(error_of([&] { text_to_llmc({dir.path("nope.txt")}, dir.path("o.bin")); }),
             "no such file");
}

TEST(Text, UnknownFormat) {
  const std::string msg = error_of([] { load_tokens("parquet", "x", 256); });
  EXPECT_HAS(msg, "\"parquet\"");
  EXPECT_HAS(msg, "\"llmc\", \"megatron\" or \"text\"");
}

// ---- Samplers ----------------------------------------------------------------

namespace {
std::vector<std::int32_t> pattern(std::int64_t n) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    t[i] = static_cast<std::int32_t>((i * 37 + 11) % 1009); // distinct for n <= 1009
  return t;
}
} // namespace

TEST(SequentialSampler, StartsFollowTheClosedForm) {
  const std::int64_t N = 100;
  const int B = 4, T = 8;
  SequentialSampler s(N, B, T);
  const std::int64_t m = N - T - 1; // 91
  for (std::int64_t t = 0; t < 30; ++t)
    for (int k = 0; k < B; ++k)
      EXPECT_EQ(s.start(t, k), ((t * B + k) * T) % m) << "t=" << t << " k=" << k;
  // Hand-worked values, including wrap-arounds: (12·8) mod 91 = 5, (15·8) mod 91 = 29.
  EXPECT_EQ(s.start(0, 0), 0);
  EXPECT_EQ(s.start(2, 3), 88);
  EXPECT_EQ(s.start(3, 0), 5);
  EXPECT_EQ(s.start(3, 3), 29);
  EXPECT_EQ(s.name(), "sequential");
}

TEST(SequentialSampler, BatchIsShiftedSlicesAndRowsMatch) {
  const std::int64_t N = 60;
  const int B = 5, T = 7;
  const auto tokens = pattern(N);
  SequentialSampler s(N, B, T);
  for (std::int64_t step : {0, 1, 4, 11}) {
    Batch full;
    s.fill(tokens, step, full);
    ASSERT_EQ(full.B, B);
    ASSERT_EQ(full.T, T);
    ASSERT_EQ(full.inputs.size(), static_cast<std::size_t>(B * T));
    for (int k = 0; k < B; ++k) {
      const std::int64_t st = ((step * B + k) * T) % (N - T - 1);
      for (int j = 0; j < T; ++j) {
        EXPECT_EQ(full.inputs[k * T + j], tokens[st + j]);
        EXPECT_EQ(full.targets[k * T + j], tokens[st + j + 1]);
      }
    }
    // Any split of the rows reads the same sequences as the full batch.
    for (int first = 0; first < B; ++first)
      for (int count = 0; first + count <= B; ++count) {
        Batch part;
        s.fill_rows(tokens, step, first, count, part);
        EXPECT_EQ(part.B, count);
        EXPECT_EQ(part.first, first);
        EXPECT_EQ(part.inputs,
                  std::vector<std::int32_t>(full.inputs.begin() + first * T,
                                            full.inputs.begin() + (first + count) * T));
        EXPECT_EQ(part.targets,
                  std::vector<std::int32_t>(full.targets.begin() + first * T,
                                            full.targets.begin() + (first + count) * T));
      }
  }
}

TEST(Sampler, RefusesTooFewTokens) {
  const std::string msg = error_of([] { SequentialSampler(9, 2, 8); });
  EXPECT_HAS(msg, "9 tokens");
  EXPECT_HAS(msg, "T = 8");
  EXPECT_HAS(msg, "T + 2 = 10");
  EXPECT_NO_THROW(SequentialSampler(10, 2, 8));
  EXPECT_HAS(error_of([] { ShuffleSampler(5, 1, 4, 1); }), "5 tokens");
  EXPECT_HAS(error_of([] { make_sampler("random", 100, 2, 4, 1); }), "\"random\"");
  EXPECT_EQ(make_sampler("shuffle", 100, 2, 4, 1)->name(), "shuffle");
}

TEST(ShuffleSampler, MatchesIndependentReference) {
  // N = 43, T = 4: W = 42 / 4 = 10 windows. perm_0 and perm_1 for seed 42
  // from the Python reference implementation.
  const std::vector<std::int64_t> perm0 = {7, 3, 8, 9, 5, 6, 4, 1, 0, 2};
  const std::vector<std::int64_t> perm1 = {2, 4, 5, 0, 8, 1, 3, 6, 7, 9};
  ShuffleSampler s(43, 3, 4, 42);
  ASSERT_EQ(s.windows(), 10);
  EXPECT_EQ(s.permutation(0), perm0);
  EXPECT_EQ(s.permutation(1), perm1);
  for (std::int64_t t = 0; t < 6; ++t)
    for (int k = 0; k < 3; ++k) {
      const std::int64_t i = t * 3 + k;
      const auto& perm = i < 10 ? perm0 : perm1;
      EXPECT_EQ(s.start(t, k), perm[i % 10] * 4) << "t=" << t << " k=" << k;
    }
}

TEST(ShuffleSampler, SeededEpochsVisitEveryWindowOnce) {
  const std::int64_t N = 1000;
  const int B = 8, T = 10;
  const std::int64_t W = (N - 1) / T; // 99
  ShuffleSampler a(N, B, T, 7), again(N, B, T, 7), other(N, B, T, 8);
  ASSERT_EQ(a.windows(), W);
  int differ = 0;
  std::map<std::int64_t, std::vector<int>> seen; // epoch -> visits per window
  for (std::int64_t t = 0; t < 3 * W / B; ++t)
    for (int k = 0; k < B; ++k) {
      const std::int64_t s = a.start(t, k);
      EXPECT_EQ(s, again.start(t, k));
      differ += s != other.start(t, k);
      EXPECT_EQ(s % T, 0);
      EXPECT_GE(s, 0);
      EXPECT_LE(s + T + 1, N);
      auto& v = seen[(t * B + k) / W];
      v.resize(W);
      ++v[s / T];
    }
  EXPECT_GT(differ, 100) << "another seed gives another order";
  for (std::int64_t e = 0; e < 2; ++e) // epochs 0 and 1 are complete
    for (std::int64_t w = 0; w < W; ++w)
      EXPECT_EQ(seen[e][w], 1) << "epoch " << e << " window " << w;
  EXPECT_NE(a.permutation(0), a.permutation(1));

  // The batch reads the windows the starts name.
  const auto tokens = pattern(N);
  Batch b;
  a.fill_rows(tokens, 5, 2, 3, b);
  for (int r = 0; r < 3; ++r)
    for (int j = 0; j < T; ++j) {
      EXPECT_EQ(b.inputs[r * T + j], tokens[a.start(5, 2 + r) + j]);
      EXPECT_EQ(b.targets[r * T + j], tokens[a.start(5, 2 + r) + j + 1]);
    }
}

// ---- Random numbers ----------------------------------------------------------

TEST(Rng, MatchesPublishedAndReferenceValues) {
  // xoshiro256** from state {1, 2, 3, 4}, as published with the algorithm.
  Rng x(1, 2, 3, 4);
  EXPECT_EQ(x.next(), 11520u);
  EXPECT_EQ(x.next(), 0u);
  EXPECT_EQ(x.next(), 1509978240u);
  EXPECT_EQ(x.next(), 1215971899390074240u);
  // First splitmix64 output from state 0, as published.
  EXPECT_EQ(splitmix64_mix(0x9E3779B97F4A7C15ULL), 0xE220A8397B1DCDAFULL);
  // Seeding and streams, from the Python reference implementation.
  Rng a(42);
  EXPECT_EQ(a.next(), 0x15780b2e0c2ec716ULL);
  EXPECT_EQ(a.next(), 0x6104d9866d113a7eULL);
  Rng b(42, 7);
  EXPECT_EQ(b.next(), 0x11a904479c05b3daULL);
  Rng c(5);
  std::vector<std::uint64_t> draws;
  for (int i = 0; i < 10; ++i)
    draws.push_back(c.below(10));
  EXPECT_EQ(draws, (std::vector<std::uint64_t>{5, 6, 2, 3, 3, 5, 5, 6, 3, 4}));
}

// ---- Synthetic corpus --------------------------------------------------------

TEST(Synthetic, MatchesIndependentReference) {
  const auto succ = synthetic_successors(16, 3, 7);
  EXPECT_EQ(std::vector<std::int32_t>(succ.begin(), succ.begin() + 12),
            (std::vector<std::int32_t>{6, 12, 10, 2, 3, 15, 9, 4, 8, 10, 9, 7}));
  EXPECT_EQ(make_synthetic_corpus(16, 20, 3, 7),
            (std::vector<std::int32_t>{4, 4,  4,  11, 15, 2, 4,  0, 10, 14,
                                       7, 12, 14, 10, 14, 0, 10, 4, 0,  10}));
}

TEST(Synthetic, DeterministicWithinVocabAndBranching) {
  const int V = 50, b = 3;
  const auto x = make_synthetic_corpus(V, 20000, b, 11);
  EXPECT_EQ(x, make_synthetic_corpus(V, 20000, b, 11));
  EXPECT_NE(x, make_synthetic_corpus(V, 20000, b, 12));
  const auto succ = synthetic_successors(V, b, 11);
  std::vector<std::set<std::int32_t>> next(V);
  for (std::size_t i = 0; i < x.size(); ++i) {
    ASSERT_GE(x[i], 0);
    ASSERT_LT(x[i], V);
    if (i > 0)
      next[x[i - 1]].insert(x[i]);
  }
  for (int a = 0; a < V; ++a) {
    EXPECT_LE(next[a].size(), static_cast<std::size_t>(b)) << "token " << a;
    const std::set<std::int32_t> row(succ.begin() + a * b, succ.begin() + (a + 1) * b);
    EXPECT_EQ(row.size(), static_cast<std::size_t>(b)) << "successors of " << a << " distinct";
    for (auto s : next[a])
      EXPECT_TRUE(row.count(s)) << a << " -> " << s << " is not in the table";
  }
}

TEST(Synthetic, EmpiricalConditionalEntropyIsLnBranching) {
  const int V = 64, b = 4;
  const auto x = make_synthetic_corpus(V, 200000, b, 2024);
  std::vector<double> pair(V * V, 0.0), prev(V, 0.0);
  for (std::size_t i = 1; i < x.size(); ++i) {
    pair[x[i - 1] * V + x[i]] += 1;
    prev[x[i - 1]] += 1;
  }
  double h = 0; // H(next | previous) from counts, in nats
  const double n = static_cast<double>(x.size() - 1);
  for (int a = 0; a < V; ++a)
    for (int c = 0; c < V; ++c)
      if (pair[a * V + c] > 0)
        h -= pair[a * V + c] / n * std::log(pair[a * V + c] / prev[a]);
  EXPECT_NEAR(h, std::log(4.0), 0.02);
  EXPECT_DOUBLE_EQ(synthetic_entropy_floor(b), std::log(4.0));
  EXPECT_DOUBLE_EQ(synthetic_entropy_floor(1), 0.0);
}

TEST(Synthetic, RefusesBadBranching) {
  EXPECT_HAS(error_of([] { make_synthetic_corpus(8, 10, 0, 1); }), "branching = 0");
  const std::string msg = error_of([] { make_synthetic_corpus(8, 10, 9, 1); });
  EXPECT_HAS(msg, "branching = 9");
  EXPECT_HAS(msg, "[1, vocab = 8]");
  EXPECT_EQ(make_synthetic_corpus(8, 5, 8, 1).size(), 5u); // branching = vocab is allowed
}
