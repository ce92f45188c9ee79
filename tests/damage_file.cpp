// Damages a file the way storage and crashed jobs do, for the checkpoint tests:
//   damage_file FILE flip       inverts 64 bytes in the middle of the file
//   damage_file FILE truncate   cuts the file to half its size
#include "damage.hpp"

#include <cstdio>
#include <cstring>
#include <filesystem>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: damage_file FILE flip|truncate\n");
    return 2;
  }
  const std::filesystem::path file = argv[1];
  std::error_code ec;
  const auto size = std::filesystem::file_size(file, ec);
  if (ec || size < 128) {
    std::fprintf(stderr, "damage_file: %s: missing or shorter than 128 bytes\n", argv[1]);
    return 1;
  }
  if (std::strcmp(argv[2], "truncate") == 0) {
    std::filesystem::resize_file(file, size / 2);
  } else if (std::strcmp(argv[2], "flip") == 0) {
    cubelm::test::invert_bytes(file.string(), static_cast<std::streamoff>(size / 2 - 32), 64);
  } else {
    std::fprintf(stderr, "damage_file: unknown damage '%s'\n", argv[2]);
    return 2;
  }
  std::printf("damaged %s (%s)\n", argv[1], argv[2]);
  return 0;
}
