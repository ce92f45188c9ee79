#pragma once
/// \file
/// \brief safetensors files (Hugging Face's tensor format), read and written without any
/// library of theirs.
///
/// The format, as published: 8 bytes, the header's length N as a little-endian uint64;
/// N bytes of UTF-8 JSON, an object that maps each tensor's name to
/// `{"dtype": "F32", "shape": [768, 2304], "data_offsets": [begin, end]}` and may hold
/// `"__metadata__"`, an object of strings; then the data, each tensor row-major and
/// little-endian at bytes [begin, end) counted from the end of the header. The writer pads
/// the header with spaces to a multiple of 8 bytes, so that every tensor's data is aligned.
///
/// The reader checks what the reference implementation checks and refuses a file that
/// breaks a rule with a cubelm::Error naming the file, the tensor, the value and the rule:
/// a header length beyond the file or 100 MB, a header that is not a JSON object, an entry
/// without dtype, shape or data_offsets, an unknown dtype, offsets with end < begin or
/// past the end of the file, a byte count other than shape x dtype size, and tensors that
/// overlap, leave gaps between them or do not end where the file ends.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace cubelm::io {

/// \brief One tensor of a safetensors header.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;                ///< "F32", "F16", "BF16", "I64", ...
  std::vector<std::uint64_t> shape; ///< [] for a scalar
  std::uint64_t begin = 0, end = 0; ///< data_offsets: bytes from the end of the header
  /// \brief Elements: the product of the shape (1 for a scalar).
  std::uint64_t elements() const;
};

/// \brief The bytes of one element of `dtype` (F64 8, F32 4, F16 and BF16 2, ...), or 0
/// for a name the format does not define.
int safetensors_dtype_bytes(const std::string& dtype);

/// \brief A safetensors file whose header was read and checked; tensors are read on demand.
class SafetensorsReader {
public:
  /// \brief Opens `path` and checks its header (the rules above).
  explicit SafetensorsReader(const std::string& path);

  const std::string& path() const { return path_; }
  /// \brief Every tensor, in the order of their data in the file.
  const std::vector<SafetensorsEntry>& tensors() const { return tensors_; }
  /// \brief The tensor `name`, or null.
  const SafetensorsEntry* find(const std::string& name) const;
  /// \brief The header's "__metadata__" (empty when it has none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  /// \brief The values of tensor `name` as float32, row-major: F32 as stored, F16 and BF16
  /// widened (exactly). Any other dtype, or a missing tensor, is a cubelm::Error naming
  /// the file and the tensor.
  std::vector<float> read_floats(const std::string& name) const;

private:
  std::string path_;
  std::uint64_t data_start_ = 0; ///< 8 + header length
  std::vector<SafetensorsEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// \brief One float32 tensor to write: its name, shape and `elements()` values.
struct SafetensorsTensor {
  std::string name;
  std::vector<std::uint64_t> shape;
  const float* values = nullptr;
};

/// \brief Writes `tensors` as F32 into the safetensors file `path`, in the order given,
/// with `metadata` as "__metadata__" (omitted when empty). The file is written as
/// "<path>.partial" and renamed when complete. Names must be distinct and not
/// "__metadata__" (cubelm::InternalError otherwise); a file that cannot be written is a
/// cubelm::Error naming it.
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

} // namespace cubelm::io
