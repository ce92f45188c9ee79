#pragma once
// On-disk constants and byte-level file access shared by the token readers
// (token_readers.cpp) and writers (token_writers.cpp, bpe_files.cpp). The formats:
// docs/data.md.

#include "cubelm/core/error.hpp"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace cubelm::io::detail {

namespace fs = std::filesystem;

inline constexpr std::int32_t kLlmcMagic = 20240520;
inline constexpr std::int32_t kLlmcVersion = 1;
inline constexpr std::uint64_t kLlmcHeaderBytes = 256 * 4;
inline constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr std::uint64_t kMegatronHeaderBytes = 9 + 8 + 1 + 8 + 8;
inline constexpr std::uint8_t kDtypeInt32 = 4;
inline constexpr std::uint8_t kDtypeUint16 = 8;
// Files are read and written in pieces of this many tokens, so that a corpus
// never sits in memory twice (once as bytes, once as int32).
inline constexpr std::size_t kChunk = std::size_t{1} << 20;

[[noreturn]] inline void fail(const std::string& path, const std::string& message) {
  throw Error(path + ": " + message);
}

inline std::string str(std::int64_t v) {
  return std::to_string(v);
}
inline std::string ustr(std::uint64_t v) {
  return std::to_string(v);
}

// The formats are little-endian on disk whatever the host is, so bytes are
// assembled explicitly rather than copied into integers.
inline std::uint64_t get_le(const unsigned char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}
inline std::int32_t get_i32(const unsigned char* p) {
  return static_cast<std::int32_t>(static_cast<std::uint32_t>(get_le(p, 4)));
}
inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
inline std::int64_t get_i64(const unsigned char* p) {
  return static_cast<std::int64_t>(get_le(p, 8));
}

inline void put_le(std::vector<unsigned char>& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}

/// The 1024-byte header of an llm.c token file of `count` uint16 tokens.
inline std::vector<unsigned char> llmc_header(std::int64_t count) {
  std::vector<unsigned char> header;
  put_le(header, static_cast<std::uint32_t>(kLlmcMagic), 4);
  put_le(header, static_cast<std::uint32_t>(kLlmcVersion), 4);
  put_le(header, static_cast<std::uint32_t>(count), 4);
  header.resize(kLlmcHeaderBytes, 0);
  return header;
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

/// The bytes of the text files `inputs` together, checked before `output` is written:
/// there is at least one, each can be opened, and none is the output (opening the
/// output truncates it).
inline std::uint64_t input_text_bytes(const std::vector<std::string>& inputs,
                                      const std::string& output) {
  if (inputs.empty())
    fail(output, "no input text files to convert");
  std::uint64_t total = 0;
  for (const auto& path : inputs) {
    total += InFile(path, "text file").size();
    std::error_code ec;
    if (fs::exists(output, ec) && fs::equivalent(path, output, ec))
      fail(output,
           "the output is also an input file (" + path + "); it would be overwritten while read");
  }
  return total;
}

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
  /// Writes `bytes` over those at `offset` (a header known only at the end), then
  /// continues at the end of the file.
  void rewrite(std::uint64_t offset, const std::vector<unsigned char>& bytes) {
    out_.seekp(static_cast<std::streamoff>(offset));
    write(bytes);
    out_.seekp(0, std::ios::end);
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

} // namespace cubelm::io::detail
