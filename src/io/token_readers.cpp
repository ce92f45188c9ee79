#include "cubelm/io/tokens.hpp"

#include "cubelm/core/error.hpp"
#include "token_format.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace cubelm::io {

using namespace detail;

namespace {

void check_vocab(int vocab_size) {
  if (vocab_size < 1)
    throw Error("vocab_size = " + str(vocab_size) + ": must be at least 1");
}

[[noreturn]] void bad_token(const std::string& path, const std::string& where, std::int64_t value,
                            int vocab_size) {
  fail(path, "token " + where + " is " + str(value) +
                 ", outside the vocabulary: every token must be in [0, vocab_size) with "
                 "vocab_size = " +
                 str(vocab_size));
}

std::string escaped(const unsigned char* p, std::size_t n) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] >= 32 && p[i] < 127 && p[i] != '\\' && p[i] != '"')
      s += static_cast<char>(p[i]);
    else
      s += std::string("\\x") + hex[p[i] >> 4] + hex[p[i] & 15];
  }
  return s;
}

} // namespace

namespace {

// True when the bytes read like text (printable ASCII, whitespace or UTF-8 sequences'
// bytes): a text file given where tokens are expected.
bool looks_like_text(const unsigned char* p, std::size_t n) {
  if (n == 0)
    return false;
  for (std::size_t i = 0; i < n; ++i)
    if (p[i] < 0x20 && p[i] != '\n' && p[i] != '\r' && p[i] != '\t')
      return false;
  return true;
}

// The llm.c header's checks: magic, version, size against the token count it declares.
// Returns that count.
std::int64_t llmc_count(InFile& f, const std::string& path) {
  // Magic and version first, even in a short file: a wrong kind of file is
  // the likelier mistake, and its message is the more helpful one.
  unsigned char h[12] = {};
  const std::size_t have = static_cast<std::size_t>(std::min<std::uint64_t>(f.size(), sizeof h));
  f.read(0, h, have);
  const std::int32_t magic = get_i32(h);
  if (have >= 4 && magic != kLlmcMagic) {
    std::string msg = "byte offset 0: magic number " + str(magic) + ", expected " +
                      str(kLlmcMagic) + " for an llm.c token file";
    if (std::equal(h, h + 4, kMegatronMagic))
      msg += "; this looks like a Megatron index: use format \"megatron\"";
    else if (looks_like_text(h, have))
      msg += "; it starts like text (\"" + escaped(h, have) +
             "\"): convert it to tokens with `cubelm data " + path +
             " -o TOKENS.bin`, or read "
             "it as text with data.format = \"text\" (docs/data.md)";
    fail(path, msg);
  }
  const std::int32_t version = get_i32(h + 4);
  if (have >= 8 && version != kLlmcVersion)
    fail(path, "byte offset 4: version " + str(version) +
                   " is not supported: only version 1 (uint16 tokens)");
  if (f.size() < kLlmcHeaderBytes)
    fail(path, "truncated: the file has " + ustr(f.size()) + " bytes, fewer than the " +
                   ustr(kLlmcHeaderBytes) +
                   "-byte llm.c header (256 int32: magic 20240520, version 1, token count)");
  const std::int64_t count = get_i32(h + 8);
  if (count < 0)
    fail(path, "byte offset 8: token count " + str(count) + " must be at least 0");
  const std::uint64_t need = kLlmcHeaderBytes + 2 * static_cast<std::uint64_t>(count);
  if (f.size() < need)
    fail(path, "truncated: the header (byte offset 8) says " + str(count) +
                   " tokens, which need 1024 + 2*" + str(count) + " = " + ustr(need) +
                   " bytes, but the file has " + ustr(f.size()) + " bytes");
  if (f.size() > need)
    fail(path, "the header (byte offset 8) says " + str(count) + " tokens, " + ustr(need) +
                   " bytes in all, but the file has " + ustr(f.size()) +
                   " bytes: an llm.c file ends with its last token");
  return count;
}

} // namespace

std::vector<std::int32_t> read_llmc(const std::string& path, int vocab_size) {
  check_vocab(vocab_size);
  InFile f(path, "llm.c token file");
  const std::int64_t count = llmc_count(f, path);

  std::vector<std::int32_t> tokens(static_cast<std::size_t>(count));
  std::vector<unsigned char> buf;
  for (std::int64_t first = 0; first < count; first += static_cast<std::int64_t>(kChunk)) {
    const std::int64_t n = std::min<std::int64_t>(kChunk, count - first);
    const std::uint64_t offset = kLlmcHeaderBytes + 2 * static_cast<std::uint64_t>(first);
    buf.resize(static_cast<std::size_t>(2 * n));
    f.read(offset, buf.data(), buf.size());
    for (std::int64_t i = 0; i < n; ++i) {
      const auto v = static_cast<std::int32_t>(get_le(&buf[2 * i], 2));
      if (v >= vocab_size)
        bad_token(path, str(first + i) + " (byte offset " + ustr(offset + 2 * i) + ")", v,
                  vocab_size);
      tokens[first + i] = v;
    }
  }
  return tokens;
}

namespace {

// A Megatron index read whole and checked, with the data file's extents: every sequence
// lies inside the .bin. The tokens are not read.
struct MegatronIndex {
  std::string idx_path, bin_path;
  std::vector<unsigned char> ib;
  std::uint64_t sequences = 0, tsize = 0, len_at = 0, ptr_at = 0, total = 0;
};

MegatronIndex megatron_index(const std::string& path) {
  MegatronIndex x;
  const std::string prefix =
      ends_with(path, ".bin") || ends_with(path, ".idx") ? path.substr(0, path.size() - 4) : path;
  x.idx_path = prefix + ".idx";
  x.bin_path = prefix + ".bin";
  const std::string& idx_path = x.idx_path;
  const std::string& bin_path = x.bin_path;
  std::vector<unsigned char>& ib = x.ib;
  // The index is small next to the tokens (20 bytes a sequence): read it whole.
  InFile idx(idx_path, "Megatron index");
  if (idx.size() < kMegatronHeaderBytes)
    fail(idx_path, "the file has " + ustr(idx.size()) + " bytes, fewer than the " +
                       ustr(kMegatronHeaderBytes) + "-byte Megatron index header");
  ib.resize(static_cast<std::size_t>(idx.size()));
  idx.read(0, ib.data(), ib.size());
  if (!std::equal(ib.begin(), ib.begin() + 9, kMegatronMagic))
    fail(idx_path, "byte offset 0: the file starts with \"" + escaped(ib.data(), 9) +
                       "\", not the magic \"MMIDIDX\\x00\\x00\" of a Megatron index");
  const std::uint64_t version = get_le(&ib[9], 8);
  if (version != 1)
    fail(idx_path, "byte offset 9: version " + ustr(version) + " is not supported: only version 1");
  const std::uint8_t dtype = ib[17];
  if (dtype != kDtypeUint16 && dtype != kDtypeInt32)
    fail(idx_path, "byte offset 17: dtype code " + str(dtype) +
                       " is not supported: only 8 (uint16) and 4 (int32)");
  const std::uint64_t tsize = dtype == kDtypeUint16 ? 2 : 4;
  const std::uint64_t S = get_le(&ib[18], 8);
  const std::uint64_t D = get_le(&ib[26], 8);
  // Both counts are bounded by the file size before any product is formed.
  const bool fits =
      S <= idx.size() && D <= idx.size() && kMegatronHeaderBytes + 12 * S + 8 * D <= idx.size();
  if (!fits)
    fail(idx_path, "truncated: the header says " + ustr(S) + " sequences (byte offset 18) and " +
                       ustr(D) + " document indices (byte offset 26), which need 34 + 12*S + 8*D" +
                       " bytes, but the file has " + ustr(idx.size()) + " bytes");
  const std::uint64_t len_at = kMegatronHeaderBytes;
  const std::uint64_t ptr_at = len_at + 4 * S;
  const std::uint64_t doc_at = ptr_at + 8 * S;

  std::int64_t previous = 0;
  for (std::uint64_t d = 0; d < D; ++d) {
    const std::int64_t v = get_i64(&ib[doc_at + 8 * d]);
    if (v < previous || v > static_cast<std::int64_t>(S))
      fail(idx_path, "document index " + ustr(d) + " (byte offset " + ustr(doc_at + 8 * d) +
                         ") is " + str(v) + ": document indices must be nondecreasing and in [0, " +
                         ustr(S) + "]");
    previous = v;
  }

  InFile bin(bin_path, "Megatron data file");
  std::uint64_t total = 0;
  for (std::uint64_t s = 0; s < S; ++s) {
    const std::int64_t len = get_i32(&ib[len_at + 4 * s]);
    const std::int64_t ptr = get_i64(&ib[ptr_at + 8 * s]);
    const std::string which = "sequence " + ustr(s);
    if (len < 0)
      fail(idx_path, which + ": length " + str(len) + " (byte offset " + ustr(len_at + 4 * s) +
                         ") must be at least 0");
    if (ptr < 0 || static_cast<std::uint64_t>(ptr) % tsize != 0)
      fail(idx_path, which + ": pointer " + str(ptr) + " (byte offset " + ustr(ptr_at + 8 * s) +
                         ") must be a byte offset >= 0 and a multiple of the token size " +
                         ustr(tsize));
    const std::uint64_t end = static_cast<std::uint64_t>(ptr) + tsize * len;
    if (static_cast<std::uint64_t>(ptr) > bin.size() || end > bin.size())
      fail(idx_path, which + " (pointer " + str(ptr) + ", " + str(len) + " tokens) ends at byte " +
                         ustr(end) + ", beyond the end of " + bin_path + " (" + ustr(bin.size()) +
                         " bytes)");
    total += static_cast<std::uint64_t>(len);
  }

  x.sequences = S;
  x.tsize = tsize;
  x.len_at = len_at;
  x.ptr_at = ptr_at;
  x.total = total;
  return x;
}

} // namespace

std::vector<std::int32_t> read_megatron(const std::string& path, int vocab_size) {
  check_vocab(vocab_size);
  const MegatronIndex x = megatron_index(path);
  const std::vector<unsigned char>& ib = x.ib;
  const std::uint64_t S = x.sequences, tsize = x.tsize, len_at = x.len_at, ptr_at = x.ptr_at,
                      total = x.total;
  const std::string& bin_path = x.bin_path;
  InFile bin(bin_path, "Megatron data file");
  std::vector<std::int32_t> tokens;
  tokens.reserve(static_cast<std::size_t>(total));
  std::vector<unsigned char> buf;
  for (std::uint64_t s = 0; s < S; ++s) {
    const std::int64_t len = get_i32(&ib[len_at + 4 * s]);
    const std::uint64_t ptr = static_cast<std::uint64_t>(get_i64(&ib[ptr_at + 8 * s]));
    buf.resize(static_cast<std::size_t>(tsize * len));
    if (len > 0)
      bin.read(ptr, buf.data(), buf.size());
    for (std::int64_t j = 0; j < len; ++j) {
      const std::int64_t v = tsize == 2 ? static_cast<std::int64_t>(get_le(&buf[2 * j], 2))
                                        : static_cast<std::int64_t>(get_i32(&buf[4 * j]));
      if (v < 0 || v >= vocab_size)
        bad_token(bin_path,
                  str(j) + " of sequence " + ustr(s) + " (byte offset " + ustr(ptr + tsize * j) +
                      ")",
                  v, vocab_size);
      tokens.push_back(static_cast<std::int32_t>(v));
    }
  }
  return tokens;
}

std::vector<std::int32_t> read_text(const std::string& path, int vocab_size) {
  check_vocab(vocab_size);
  InFile f(path, "text file");
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(f.size()));
  std::vector<unsigned char> buf;
  for (std::uint64_t first = 0; first < f.size(); first += kChunk) {
    buf.resize(static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, f.size() - first)));
    f.read(first, buf.data(), buf.size());
    for (std::size_t i = 0; i < buf.size(); ++i) {
      if (buf[i] >= vocab_size)
        bad_token(path, ustr(first + i) + " (byte offset " + ustr(first + i) + ")", buf[i],
                  vocab_size);
      tokens[first + i] = buf[i];
    }
  }
  return tokens;
}

std::vector<std::int32_t> read_token_ids(const std::string& path, int vocab_size) {
  check_vocab(vocab_size);
  InFile f(path, "token file");
  unsigned char h[4] = {};
  if (f.size() >= 4) {
    f.read(0, h, 4);
    if (get_i32(h) == kLlmcMagic)
      return read_llmc(path, vocab_size);
  }
  // Decimal ids separated by whitespace.
  std::vector<unsigned char> bytes(static_cast<std::size_t>(f.size()));
  if (!bytes.empty())
    f.read(0, bytes.data(), bytes.size());
  std::vector<std::int32_t> tokens;
  const auto space = [](unsigned char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
  };
  std::size_t i = 0;
  while (i < bytes.size()) {
    if (space(bytes[i])) {
      ++i;
      continue;
    }
    const std::size_t start = i;
    while (i < bytes.size() && !space(bytes[i]))
      ++i;
    const std::string word(bytes.begin() + static_cast<std::ptrdiff_t>(start),
                           bytes.begin() + static_cast<std::ptrdiff_t>(i));
    const std::string where =
        str(static_cast<std::int64_t>(tokens.size())) + " (byte offset " + ustr(start) + ")";
    const bool digits = word.size() <= 18 && std::all_of(word.begin(), word.end(), [](char c) {
                          return c >= '0' && c <= '9';
                        });
    if (!digits)
      fail(path, "token " + where + " is \"" +
                     escaped(&bytes[start], std::min<std::size_t>(word.size(), 40)) +
                     "\", not a token id: the file is either an llm.c token file or token ids "
                     "written as decimal numbers separated by whitespace");
    const std::int64_t v = std::stoll(word);
    if (v >= vocab_size)
      bad_token(path, where, v, vocab_size);
    tokens.push_back(static_cast<std::int32_t>(v));
  }
  return tokens;
}

std::int64_t token_count(const std::string& format, const std::string& path) {
  if (format == "llmc") {
    InFile f(path, "llm.c token file");
    return llmc_count(f, path);
  }
  if (format == "megatron")
    return static_cast<std::int64_t>(megatron_index(path).total);
  if (format == "text")
    return static_cast<std::int64_t>(InFile(path, "text file").size());
  throw Error(path + ": data format \"" + format +
              "\" is not known: use \"llmc\", \"megatron\" or \"text\"");
}

TokenData load_tokens(const std::string& format, const std::string& path, int vocab_size) {
  TokenData data;
  if (format == "llmc") {
    data.source = path;
    data.tokens = read_llmc(path, vocab_size);
  } else if (format == "megatron") {
    const std::string prefix =
        ends_with(path, ".bin") || ends_with(path, ".idx") ? path.substr(0, path.size() - 4) : path;
    data.source = prefix + ".{bin,idx}";
    data.tokens = read_megatron(path, vocab_size);
  } else if (format == "text") {
    data.source = path;
    data.tokens = read_text(path, vocab_size);
  } else {
    throw Error(path + ": data format \"" + format +
                "\" is not known: use \"llmc\", \"megatron\" or \"text\"");
  }
  return data;
}

namespace {
std::string fraction_text(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", x);
  return buf;
}
} // namespace

TokenSplit split_tokens(const Deck& deck, std::int64_t corpus, std::int64_t val_file) {
  const DataConfig& d = deck.data;
  TokenSplit split;
  split.train = corpus;
  if (!d.validates())
    return split;
  const std::string source = d.format == "synthetic" ? "the synthetic corpus" : d.path;
  const std::int64_t context = deck.model.seq_len;
  if (d.val_fraction > 0) {
    split.validation = static_cast<std::int64_t>(static_cast<double>(corpus) * d.val_fraction);
    split.train = corpus - split.validation;
    if (split.train < context + 2)
      throw Error(deck.source + ": data.val_fraction = " + fraction_text(d.val_fraction) +
                      " leaves " + std::to_string(split.train) + " of the " +
                      std::to_string(corpus) + " tokens of " + source +
                      " for training, fewer than model.seq_len + 2 = " +
                      std::to_string(context + 2) + ": lower data.val_fraction",
                  true);
  } else {
    split.validation = val_file;
  }
  // The sequential sampler's sequence k of batch b starts at (b B + k) T: b batches of B
  // sequences read tokens [0, b B T + 1) and repeat none when b B T <= N - 2.
  const std::int64_t per_batch = static_cast<std::int64_t>(deck.train.global_batch) * context;
  const std::int64_t whole = split.validation >= 2 ? (split.validation - 2) / per_batch : 0;
  if (whole < 1) {
    const std::string what = d.val_fraction > 0
                                 ? "data.val_fraction = " + fraction_text(d.val_fraction) +
                                       " holds out " + std::to_string(split.validation) +
                                       " of the " + std::to_string(corpus) + " tokens of " + source
                                 : "data.val_path = " + d.val_path + " holds " +
                                       std::to_string(split.validation) + " tokens";
    throw Error(deck.source + ": " + what + ", fewer than one validation batch needs (" +
                    "train.global_batch " + std::to_string(deck.train.global_batch) +
                    " x model.seq_len " + std::to_string(context) +
                    " + 2 = " + std::to_string(per_batch + 2) +
                    "): " + (d.val_fraction > 0 ? "raise data.val_fraction" : "give more tokens") +
                    " or lower train.global_batch",
                true);
  }
  split.batches = static_cast<int>(std::min<std::int64_t>(whole, deck.eval.batches));
  return split;
}

} // namespace cubelm::io
