#include "cubelm/io/tokens.hpp"

#include "token_format.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <system_error>
#include <vector>

namespace cubelm::io {

using namespace detail;

namespace {

void write_llmc_header(OutFile& out, std::int64_t count) {
  out.write(llmc_header(count));
}

} // namespace

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
  // Sizes first (the header holds the count); the files are reopened one at a
  // time below, so that many inputs do not hold many descriptors.
  const std::uint64_t total = input_text_bytes(inputs, output);
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

} // namespace cubelm::io
