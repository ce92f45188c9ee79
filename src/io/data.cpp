#include "cubelm/io/data.hpp"

#include "cubelm/core/error.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <system_error>
#include <utility>

namespace cubelm::io {

namespace {

namespace fs = std::filesystem;

constexpr std::int32_t kLlmcMagic = 20240520;
constexpr std::int32_t kLlmcVersion = 1;
constexpr std::uint64_t kLlmcHeaderBytes = 256 * 4;
constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr std::uint64_t kMegatronHeaderBytes = 9 + 8 + 1 + 8 + 8;
constexpr std::uint8_t kDtypeInt32 = 4;
constexpr std::uint8_t kDtypeUint16 = 8;
// Files are read and written in pieces of this many tokens, so that a corpus
// never sits in memory twice (once as bytes, once as int32).
constexpr std::size_t kChunk = std::size_t{1} << 20;

[[noreturn]] void fail(const std::string& path, const std::string& message) {
  throw Error(path + ": " + message);
}

std::string str(std::int64_t v) {
  return std::to_string(v);
}
std::string ustr(std::uint64_t v) {
  return std::to_string(v);
}

// The formats are little-endian on disk whatever the host is, so bytes are
// assembled explicitly rather than copied into integers.
std::uint64_t get_le(const unsigned char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}
std::int32_t get_i32(const unsigned char* p) {
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(get_le(p, 4)));
}
std::int64_t get_i64(const unsigned char* p) {
  return static_cast<std::int64_t>(get_le(p, 8));
}

void put_le(std::vector<unsigned char>& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

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

/// A file opened for reading, with its size and reads at given offsets.
class InFile {
public:
  InFile(std::string path, const std::string& kind) : path_(std::move(path)) {
    std::error_code ec;
    const fs::file_status st = fs::status(path_, ec);
    if (st.type() == fs::file_type::not_found)
      fail(path_, "cannot open the " + kind + ": no such file");
    if (ec)
      fail(path_, "cannot open the " + kind + ": " + ec.message());
    if (!fs::is_regular_file(st))
      fail(path_, "cannot read the " + kind + ": not a regular file");
    size_ = fs::file_size(path_, ec);
    if (ec)
      fail(path_, "cannot read the size of the " + kind + ": " + ec.message());
    in_.open(path_, std::ios::binary);
    if (!in_)
      fail(path_, "cannot open the " + kind + " (is it readable?)");
  }
  const std::string& path() const { return path_; }
  std::uint64_t size() const { return size_; }
  void read(std::uint64_t offset, void* dst, std::size_t bytes) {
    in_.clear();
    in_.seekg(static_cast<std::streamoff>(offset));
    in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(bytes));
    if (!in_ || in_.gcount() != static_cast<std::streamsize>(bytes))
      fail(path_, "could not read " + ustr(bytes) + " bytes at byte offset " + ustr(offset));
  }

private:
  std::string path_;
  std::uint64_t size_ = 0;
  std::ifstream in_;
};

/// A file opened for writing; close() reports a failed write (e.g. disk full).
class OutFile {
public:
  explicit OutFile(std::string path) : path_(std::move(path)) {
    out_.open(path_, std::ios::binary | std::ios::trunc);
    if (!out_)
      fail(path_, "cannot create the file (does the directory exist and is it writable?)");
  }
  void write(const std::vector<unsigned char>& bytes) {
    out_.write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
  }
  void close() {
    out_.close();
    if (!out_)
      fail(path_, "writing the file failed (is the disk full?)");
  }

private:
  std::string path_;
  std::ofstream out_;
};

void write_llmc_header(OutFile& out, std::int64_t count) {
  std::vector<unsigned char> header;
  put_le(header, static_cast<std::uint32_t>(kLlmcMagic), 4);
  put_le(header, static_cast<std::uint32_t>(kLlmcVersion), 4);
  put_le(header, static_cast<std::uint32_t>(count), 4);
  header.resize(kLlmcHeaderBytes, 0);
  out.write(header);
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

// ---- Reading ---------------------------------------------------------------

std::vector<std::int32_t> read_llmc(const std::string& path, int vocab_size) {
  check_vocab(vocab_size);
  InFile f(path, "llm.c token file");
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

std::vector<std::int32_t> read_megatron(const std::string& path, int vocab_size) {
  check_vocab(vocab_size);
  const std::string prefix =
      ends_with(path, ".bin") || ends_with(path, ".idx") ? path.substr(0, path.size() - 4) : path;
  const std::string idx_path = prefix + ".idx";
  const std::string bin_path = prefix + ".bin";

  // The index is small next to the tokens (20 bytes a sequence): read it whole.
  InFile idx(idx_path, "Megatron index");
  if (idx.size() < kMegatronHeaderBytes)
    fail(idx_path, "the file has " + ustr(idx.size()) + " bytes, fewer than the " +
                       ustr(kMegatronHeaderBytes) + "-byte Megatron index header");
  std::vector<unsigned char> ib(static_cast<std::size_t>(idx.size()));
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

// ---- Writing ---------------------------------------------------------------

void write_llmc(const std::string& path, const std::vector<std::int32_t>& tokens) {
  // Check everything before the file is created, so a refused write leaves none.
  if (tokens.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    fail(path,
         ustr(tokens.size()) + " tokens: an llm.c header counts at most 2^31 - 1 tokens (int32)");
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] > 65535)
      fail(path, "token " + ustr(i) + " is " + str(tokens[i]) +
                     ": an llm.c file stores uint16 tokens, in [0, 65535]");
  OutFile out(path);
  write_llmc_header(out, static_cast<std::int64_t>(tokens.size()));
  std::vector<unsigned char> buf;
  for (std::size_t first = 0; first < tokens.size(); first += kChunk) {
    buf.clear();
    const std::size_t last = std::min(tokens.size(), first + kChunk);
    for (std::size_t i = first; i < last; ++i)
      put_le(buf, static_cast<std::uint32_t>(tokens[i]), 2);
    out.write(buf);
  }
  out.close();
}

void write_megatron(const std::string& prefix,
                    const std::vector<std::vector<std::int32_t>>& documents) {
  const std::string bin_path = prefix + ".bin";
  std::int32_t max_token = 0;
  for (std::size_t d = 0; d < documents.size(); ++d) {
    if (documents[d].size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
      fail(bin_path, "document " + ustr(d) + " has " + ustr(documents[d].size()) +
                         " tokens: a Megatron sequence length is an int32");
    for (std::size_t i = 0; i < documents[d].size(); ++i) {
      const std::int32_t v = documents[d][i];
      if (v < 0)
        fail(bin_path, "token " + ustr(i) + " of document " + ustr(d) + " is " + str(v) +
                           ": tokens must be at least 0");
      max_token = std::max(max_token, v);
    }
  }
  const bool narrow = max_token <= 65535;
  const int tsize = narrow ? 2 : 4;

  OutFile bin(bin_path);
  std::vector<unsigned char> buf;
  for (const auto& doc : documents) {
    buf.clear();
    for (std::int32_t v : doc)
      put_le(buf, static_cast<std::uint32_t>(v), tsize);
    bin.write(buf);
  }
  bin.close();

  const std::uint64_t S = documents.size();
  std::vector<unsigned char> idx(kMegatronMagic, kMegatronMagic + 9);
  put_le(idx, 1, 8);
  put_le(idx, narrow ? kDtypeUint16 : kDtypeInt32, 1);
  put_le(idx, S, 8);
  put_le(idx, S + 1, 8);
  for (const auto& doc : documents)
    put_le(idx, doc.size(), 4);
  std::uint64_t pointer = 0;
  for (const auto& doc : documents) {
    put_le(idx, pointer, 8);
    pointer += tsize * doc.size();
  }
  for (std::uint64_t d = 0; d <= S; ++d)
    put_le(idx, d, 8);
  OutFile out(prefix + ".idx");
  out.write(idx);
  out.close();
}

std::int64_t text_to_llmc(const std::vector<std::string>& inputs, const std::string& output) {
  if (inputs.empty())
    fail(output, "no input text files to convert");
  // Sizes first (the header holds the count); the files are reopened one at a
  // time below, so that many inputs do not hold many descriptors.
  std::uint64_t total = 0;
  for (const auto& path : inputs) {
    total += InFile(path, "text file").size();
    std::error_code ec;
    // Opening the output truncates it: it must not be one of the inputs.
    if (fs::exists(output, ec) && fs::equivalent(path, output, ec))
      fail(output,
           "the output is also an input file (" + path + "); it would be overwritten while read");
  }
  if (total > static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max()))
    fail(output, "the inputs hold " + ustr(total) +
                     " bytes: an llm.c header counts at most 2^31 - 1 tokens (int32)");
  OutFile out(output);
  write_llmc_header(out, static_cast<std::int64_t>(total));
  std::vector<unsigned char> in, buf;
  std::uint64_t written = 0;
  for (const auto& path : inputs) {
    InFile f(path, "text file");
    for (std::uint64_t first = 0; first < f.size(); first += kChunk) {
      in.resize(static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, f.size() - first)));
      f.read(first, in.data(), in.size());
      buf.clear();
      for (unsigned char c : in)
        put_le(buf, c, 2);
      out.write(buf);
    }
    written += f.size();
  }
  out.close();
  if (written != total) {
    std::error_code ec;
    fs::remove(output, ec); // its header would be wrong
    fail(output, "the input files changed size while being converted");
  }
  return static_cast<std::int64_t>(total);
}

// ---- Random numbers --------------------------------------------------------

namespace {
constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
std::uint64_t rotl(std::uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}
} // namespace

std::uint64_t splitmix64_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

Rng::Rng(std::uint64_t seed, std::uint64_t stream) {
  std::uint64_t x = seed ^ splitmix64_mix(stream);
  for (auto& s : s_) {
    x += kGolden;
    s = splitmix64_mix(x);
  }
}

Rng::Rng(std::uint64_t s0, std::uint64_t s1, std::uint64_t s2, std::uint64_t s3)
    : s_{s0, s1, s2, s3} {}

std::uint64_t Rng::next() {
  const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const std::uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

std::uint64_t Rng::below(std::uint64_t n) {
  CUBELM_ASSERT(n >= 1, "Rng::below needs n >= 1");
  // 2^64 mod n: rejecting draws under it leaves a multiple of n equally likely values.
  const std::uint64_t threshold = (0 - n) % n;
  for (;;) {
    const std::uint64_t r = next();
    if (r >= threshold)
      return r % n;
  }
}

// ---- Samplers --------------------------------------------------------------

Sampler::Sampler(std::int64_t n, int batch, int context) : n_(n), batch_(batch), context_(context) {
  if (batch < 1)
    throw Error("sampler: global batch B = " + str(batch) + " must be at least 1");
  if (context < 1)
    throw Error("sampler: context T = " + str(context) + " must be at least 1");
  if (n < static_cast<std::int64_t>(context) + 2)
    throw Error("sampler: the corpus has " + str(n) + " tokens, too few for context T = " +
                str(context) + ": it needs at least T + 2 = " + str(context + 2) +
                " (T inputs, the shifted targets and N - T - 1 >= 1 start positions)");
  CUBELM_ASSERT(n <= std::numeric_limits<std::int64_t>::max() / context,
                "token count times context overflows int64");
}

void Sampler::fill(const std::vector<std::int32_t>& tokens, std::int64_t step, Batch& out) const {
  fill_rows(tokens, step, 0, batch_, out);
}

void Sampler::fill_rows(const std::vector<std::int32_t>& tokens, std::int64_t step, int first,
                        int count, Batch& out) const {
  CUBELM_ASSERT(static_cast<std::int64_t>(tokens.size()) == n_,
                "the sampler was built for " + str(n_) + " tokens, got " + ustr(tokens.size()));
  CUBELM_ASSERT(step >= 0, "step must be >= 0");
  CUBELM_ASSERT(first >= 0 && count >= 0 && first + count <= batch_,
                "rows [" + str(first) + ", " + str(first + count) + ") outside the batch of " +
                    str(batch_));
  const std::size_t T = static_cast<std::size_t>(context_);
  out.B = count;
  out.T = context_;
  out.first = first;
  out.inputs.resize(static_cast<std::size_t>(count) * T);
  out.targets.resize(static_cast<std::size_t>(count) * T);
  for (int r = 0; r < count; ++r) {
    const std::int64_t s = start(step, first + r);
    CUBELM_ASSERT(s >= 0 && s + context_ + 1 <= n_, "sequence start out of range");
    const auto* src = tokens.data() + s;
    std::copy(src, src + T, out.inputs.begin() + r * T);
    std::copy(src + 1, src + T + 1, out.targets.begin() + r * T);
  }
}

SequentialSampler::SequentialSampler(std::int64_t n, int batch, int context)
    : Sampler(n, batch, context) {}

std::int64_t SequentialSampler::start(std::int64_t step, std::int64_t k) const {
  CUBELM_ASSERT(step >= 0 && k >= 0 && k < batch(), "sequence index outside the batch");
  const std::int64_t m = token_count() - context() - 1;
  const std::int64_t i = step * batch() + k;
  // ((i mod m)·T) mod m equals (i·T) mod m and cannot overflow (m·T < 2^63).
  return ((i % m) * context()) % m;
}

ShuffleSampler::ShuffleSampler(std::int64_t n, int batch, int context, std::uint64_t seed)
    : Sampler(n, batch, context), seed_(seed), windows_((n - 1) / context) {}

std::vector<std::int64_t> ShuffleSampler::permutation(std::int64_t epoch) const {
  return cached_permutation(epoch);
}

const std::vector<std::int64_t>& ShuffleSampler::cached_permutation(std::int64_t epoch) const {
  CUBELM_ASSERT(epoch >= 0, "epoch must be >= 0");
  if (epoch != cached_epoch_) {
    perm_.resize(static_cast<std::size_t>(windows_));
    for (std::int64_t w = 0; w < windows_; ++w)
      perm_[w] = w;
    Rng rng(seed_, static_cast<std::uint64_t>(epoch));
    for (std::int64_t j = windows_ - 1; j >= 1; --j)
      std::swap(perm_[j], perm_[rng.below(static_cast<std::uint64_t>(j + 1))]);
    cached_epoch_ = epoch;
  }
  return perm_;
}

std::int64_t ShuffleSampler::start(std::int64_t step, std::int64_t k) const {
  CUBELM_ASSERT(step >= 0 && k >= 0 && k < batch(), "sequence index outside the batch");
  const std::int64_t i = step * batch() + k;
  return cached_permutation(i / windows_)[i % windows_] * context();
}

std::unique_ptr<Sampler> make_sampler(const std::string& kind, std::int64_t n, int batch,
                                      int context, std::uint64_t seed) {
  if (kind == "sequential")
    return std::make_unique<SequentialSampler>(n, batch, context);
  if (kind == "shuffle")
    return std::make_unique<ShuffleSampler>(n, batch, context, seed);
  throw Error("sampler \"" + kind + "\" is not known: use \"sequential\" or \"shuffle\"");
}

// ---- Synthetic corpus ------------------------------------------------------

namespace {

void check_synthetic(int vocab, int branching) {
  if (vocab < 1)
    throw Error("synthetic corpus: vocab = " + str(vocab) + " must be at least 1");
  if (branching < 1 || branching > vocab)
    throw Error("synthetic corpus: branching = " + str(branching) +
                " must be in [1, vocab = " + str(vocab) + "]");
}

// Step 1 of the generator (header): the successor table, drawn from `rng`.
std::vector<std::int32_t> successors(int vocab, int branching, Rng& rng) {
  std::vector<std::int32_t> p(static_cast<std::size_t>(vocab));
  for (int a = 0; a < vocab; ++a)
    p[a] = a;
  std::vector<std::int32_t> succ(static_cast<std::size_t>(vocab) * branching);
  for (int a = 0; a < vocab; ++a)
    for (int i = 0; i < branching; ++i) {
      std::swap(p[i], p[i + rng.below(static_cast<std::uint64_t>(vocab - i))]);
      succ[static_cast<std::size_t>(a) * branching + i] = p[i];
    }
  return succ;
}

} // namespace

std::vector<std::int32_t> synthetic_successors(int vocab, int branching, std::uint64_t seed) {
  check_synthetic(vocab, branching);
  Rng rng(seed, kSyntheticStream);
  return successors(vocab, branching, rng);
}

std::vector<std::int32_t> make_synthetic_corpus(int vocab, std::int64_t count, int branching,
                                                std::uint64_t seed) {
  check_synthetic(vocab, branching);
  if (count < 0)
    throw Error("synthetic corpus: count = " + str(count) + " must be at least 0");
  Rng rng(seed, kSyntheticStream);
  const std::vector<std::int32_t> succ = successors(vocab, branching, rng);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(count));
  if (count == 0)
    return tokens;
  tokens[0] = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(vocab)));
  for (std::int64_t i = 1; i < count; ++i)
    tokens[i] = succ[static_cast<std::size_t>(tokens[i - 1]) * branching +
                     rng.below(static_cast<std::uint64_t>(branching))];
  return tokens;
}

double synthetic_entropy_floor(int branching) {
  if (branching < 1)
    throw Error("synthetic corpus: branching = " + str(branching) + " must be at least 1");
  return std::log(static_cast<double>(branching));
}

} // namespace cubelm::io
