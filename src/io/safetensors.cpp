#include "cubelm/io/safetensors.hpp"

#include "cubelm/core/error.hpp"
#include "cubelm/io/checkpoint.hpp"
#include "cubelm/io/json.hpp"
#include "token_format.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <system_error>

namespace cubelm::io {

namespace fs = std::filesystem;

namespace {

// The reference implementation's limit: a larger header is refused before it is read.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

[[noreturn]] void refuse(const std::string& path, const std::string& message) {
  throw Error(path + ": " + message + " (safetensors format)");
}

// The format is little-endian whatever the host is: bytes are assembled explicitly.
using detail::get_le;

float float_of_bits(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// IEEE binary16 to binary32, exactly (every half is a float).
float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) { // zero or subnormal: mantissa x 2^-24
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) // infinity or NaN (the payload kept)
    return float_of_bits(sign | 0x7f800000u | (mantissa << 13));
  return float_of_bits(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// Checks one header entry and returns it; `name` is its key.
SafetensorsEntry entry_of(const std::string& path, const std::string& name, const Json& v,
                          std::uint64_t data_bytes) {
  const std::string what = "tensor \"" + name + "\"";
  if (!v.is_object())
    refuse(path, what + " is " + v.describe() +
                     " in the header: each tensor must be an object with dtype, shape and "
                     "data_offsets");
  SafetensorsEntry e;
  e.name = name;
  const Json* dtype = v.find("dtype");
  const Json* shape = v.find("shape");
  const Json* offsets = v.find("data_offsets");
  for (const auto& [key, field] : {std::pair<const char*, const Json*>{"dtype", dtype},
                                   {"shape", shape},
                                   {"data_offsets", offsets}})
    if (field == nullptr)
      refuse(path, what + " has no \"" + key + "\" in the header");
  if (!dtype->is_string())
    refuse(path, what + ": dtype = " + dtype->describe() + ": must be a string");
  e.dtype = dtype->text();
  if (safetensors_dtype_bytes(e.dtype) == 0)
    refuse(path, what + ": dtype = \"" + e.dtype +
                     "\" is not a safetensors dtype (BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, "
                     "F16, BF16, I32, U32, F32, F64, I64, U64)");
  if (!shape->is_array())
    refuse(path, what + ": shape = " + shape->describe() + ": must be an array of sizes");
  for (const Json& d : shape->elements()) {
    const auto size = d.unsigned_integer();
    if (!size)
      refuse(path, what + ": shape holds " + d.describe() + ": every size must be an integer >= 0");
    e.shape.push_back(*size);
  }
  if (!offsets->is_array() || offsets->elements().size() != 2)
    refuse(path, what + ": data_offsets = " + offsets->describe() +
                     ": must be an array [begin, end] of two byte offsets");
  const auto begin = offsets->elements()[0].unsigned_integer();
  const auto end = offsets->elements()[1].unsigned_integer();
  if (!begin || !end)
    refuse(path, what + ": data_offsets = [" + offsets->elements()[0].describe() + ", " +
                     offsets->elements()[1].describe() + "]: must be integers >= 0");
  e.begin = *begin;
  e.end = *end;
  if (e.end < e.begin)
    refuse(path, what + ": data_offsets = [" + std::to_string(e.begin) + ", " +
                     std::to_string(e.end) + "]: end must not be below begin");
  if (e.end > data_bytes)
    refuse(path, what + ": data_offsets = [" + std::to_string(e.begin) + ", " +
                     std::to_string(e.end) + "] reach past the end of the file, which holds " +
                     std::to_string(data_bytes) + " bytes of data after the header");
  // shape x dtype size, without overflow (a lying shape may be huge)
  const std::uint64_t unit = static_cast<std::uint64_t>(safetensors_dtype_bytes(e.dtype));
  std::uint64_t bytes = unit;
  bool overflow = false;
  for (const std::uint64_t d : e.shape) {
    if (d != 0 && bytes > UINT64_MAX / d)
      overflow = true;
    bytes = overflow ? 0 : bytes * d;
  }
  if (overflow || bytes != e.end - e.begin)
    refuse(path, what + ": shape " + shape_text(e.shape) + " of " + e.dtype + " needs " +
                     (overflow ? std::string("more than 2^64") : std::to_string(bytes)) +
                     " bytes, but data_offsets = [" + std::to_string(e.begin) + ", " +
                     std::to_string(e.end) + "] hold " + std::to_string(e.end - e.begin));
  return e;
}

} // namespace

std::uint64_t SafetensorsEntry::elements() const {
  std::uint64_t n = 1;
  for (const std::uint64_t d : shape)
    n *= d;
  return n;
}

int safetensors_dtype_bytes(const std::string& dtype) {
  static const std::pair<const char*, int> sizes[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  for (const auto& [name, bytes] : sizes)
    if (dtype == name)
      return bytes;
  return 0;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw Error(path + ": no such file" +
                (fs::exists(path, ec) ? std::string(" (it is not a regular file)") : ""));
  const std::uint64_t size = fs::file_size(path, ec);
  std::ifstream in(path, std::ios::binary);
  if (ec || !in)
    throw Error(path + ": cannot open the file for reading");
  if (size < 8)
    refuse(path, "the file has " + std::to_string(size) +
                     " bytes: too short for the 8-byte header length that starts the format");
  unsigned char head[8];
  in.read(reinterpret_cast<char*>(head), 8);
  const std::uint64_t n = get_le(head, 8);
  if (n > kMaxHeaderBytes)
    refuse(path, "header length " + std::to_string(n) + " (the first 8 bytes, little-endian) is " +
                     "above the format's limit of 100000000 bytes");
  if (n > size - 8)
    refuse(path, "header length " + std::to_string(n) + " (the first 8 bytes, little-endian) " +
                     "reaches past the end of the file of " + std::to_string(size) + " bytes");
  std::string text(static_cast<std::size_t>(n), '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  if (!in)
    throw Error(path + ": cannot read the header's " + std::to_string(n) + " bytes");
  data_start_ = 8 + n;
  const std::uint64_t data_bytes = size - data_start_;
  const Json header = parse_json(text, path + " (header)");
  if (!header.is_object())
    refuse(path, "the header is " + header.describe() + ": it must be a JSON object");
  for (const auto& [name, value] : header.members()) {
    if (name == "__metadata__") {
      if (!value.is_object())
        refuse(path, "__metadata__ is " + value.describe() + ": it must be an object of strings");
      for (const auto& [key, text_value] : value.members()) {
        if (!text_value.is_string())
          refuse(path, "__metadata__ \"" + key + "\" = " + text_value.describe() +
                           ": every metadata value must be a string");
        metadata_[key] = text_value.text();
      }
      continue;
    }
    tensors_.push_back(entry_of(path, name, value, data_bytes));
  }
  // The data is the tensors' bytes one after another, nothing else.
  std::stable_sort(tensors_.begin(), tensors_.end(),
                   [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
                     return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
                   });
  std::uint64_t at = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& e : tensors_) {
    if (e.begin < at)
      refuse(path, "tensors \"" + previous->name + "\" (bytes [" + std::to_string(previous->begin) +
                       ", " + std::to_string(previous->end) + ")) and \"" + e.name + "\" ([" +
                       std::to_string(e.begin) + ", " + std::to_string(e.end) +
                       ")) overlap: each byte of the data belongs to one tensor");
    if (e.begin > at)
      refuse(path, "bytes [" + std::to_string(at) + ", " + std::to_string(e.begin) +
                       ") of the data belong to no tensor (before \"" + e.name +
                       "\"): the tensors' data must follow one another without gaps");
    at = e.end;
    previous = &e;
  }
  if (at != data_bytes)
    refuse(path, "the tensors' data ends at byte " + std::to_string(at) + " but the file holds " +
                     std::to_string(data_bytes) +
                     " bytes of data after the header: the data must end where the file ends");
}

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  for (const SafetensorsEntry& e : tensors_)
    if (e.name == name)
      return &e;
  return nullptr;
}

std::vector<float> SafetensorsReader::read_floats(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  if (e == nullptr)
    throw Error(path_ + ": has no tensor \"" + name + "\"");
  const int unit = safetensors_dtype_bytes(e->dtype);
  if (e->dtype != "F32" && e->dtype != "F16" && e->dtype != "BF16")
    throw Error(path_ + ": tensor \"" + name + "\" is " + e->dtype +
                ": cubelm reads F32, F16 and BF16 tensors (as float32)");
  std::ifstream in(path_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(data_start_ + e->begin));
  const std::size_t count = static_cast<std::size_t>(e->elements());
  std::vector<float> out(count);
  // In pieces, so that a large tensor's bytes are never held twice whole.
  constexpr std::size_t kPiece = std::size_t{1} << 20;
  std::vector<unsigned char> bytes(std::min(count, kPiece) * static_cast<std::size_t>(unit));
  for (std::size_t done = 0; done < count;) {
    const std::size_t n = std::min(kPiece, count - done);
    in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(n * unit));
    if (!in)
      throw Error(path_ + ": cannot read the data of tensor \"" + name + "\" (the file was " +
                  "cut short while it was read?)");
    for (std::size_t i = 0; i < n; ++i) {
      const unsigned char* p = bytes.data() + i * unit;
      float& v = out[done + i];
      if (unit == 4)
        v = float_of_bits(static_cast<std::uint32_t>(get_le(p, 4)));
      else if (e->dtype == "F16")
        v = half_to_float(static_cast<std::uint16_t>(get_le(p, 2)));
      else // BF16: the upper half of a float32
        v = float_of_bits(static_cast<std::uint32_t>(get_le(p, 2)) << 16);
    }
    done += n;
  }
  return out;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      header += (first ? "" : ",") + json_quote(key) + ":" + json_quote(value);
      first = false;
    }
    header += "}";
  }
  std::set<std::string> names;
  std::uint64_t at = 0;
  for (const SafetensorsTensor& t : tensors) {
    CUBELM_ASSERT(t.name != "__metadata__" && names.insert(t.name).second,
                  "safetensors: tensor name \"" + t.name + "\" twice or reserved");
    std::uint64_t n = 1;
    for (const std::uint64_t d : t.shape)
      n *= d;
    header += (header.size() > 1 ? "," : "") + json_quote(t.name) + ":{\"dtype\":\"F32\"," +
              "\"shape\":" + shape_text(t.shape) + ",\"data_offsets\":[" + std::to_string(at) +
              "," + std::to_string(at + 4 * n) + "]}";
    at += 4 * n;
  }
  header += "}";
  // Spaces to a multiple of 8 bytes: the data, after the 8-byte length, starts aligned.
  header.append((8 - header.size() % 8) % 8, ' ');

  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out)
      throw Error(path + ": cannot create the file (" + partial + ")");
    unsigned char length[8];
    for (int i = 0; i < 8; ++i)
      length[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(header.size()) >> (8 * i));
    out.write(reinterpret_cast<const char*>(length), 8);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    std::vector<unsigned char> bytes;
    for (const SafetensorsTensor& t : tensors) {
      std::uint64_t n = 1;
      for (const std::uint64_t d : t.shape)
        n *= d;
      bytes.resize(static_cast<std::size_t>(4 * n));
      for (std::uint64_t i = 0; i < n; ++i) {
        std::uint32_t bits;
        std::memcpy(&bits, t.values + i, 4);
        for (int b = 0; b < 4; ++b)
          bytes[4 * i + b] = static_cast<unsigned char>(bits >> (8 * b));
      }
      out.write(reinterpret_cast<const char*>(bytes.data()),
                static_cast<std::streamsize>(bytes.size()));
    }
    out.flush();
    if (!out)
      throw Error(path + ": cannot write the file (disk full?)");
  }
  std::error_code ec;
  fs::rename(partial, path, ec);
  if (ec)
    throw Error(path + ": cannot rename " + partial + " to it: " + ec.message());
}

} // namespace cubelm::io
