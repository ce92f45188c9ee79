#pragma once
// Damage done to files on purpose, the way storage and crashed jobs do, for the
// checkpoint tests (damage_file.cpp and train/test_train.cpp).

#include <fstream>
#include <string>
#include <vector>

namespace cubelm::test {

/// Inverts `n` bytes of `file` from byte `at` on.
inline void invert_bytes(const std::string& file, std::streamoff at, int n) {
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  std::vector<char> bytes(static_cast<std::size_t>(n));
  io.seekg(at);
  io.read(bytes.data(), n);
  for (char& b : bytes)
    b = static_cast<char>(~b);
  io.seekp(at);
  io.write(bytes.data(), n);
}

} // namespace cubelm::test
