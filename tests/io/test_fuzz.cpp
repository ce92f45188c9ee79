// Seeded property tests ("fuzzing" with a fixed random stream): mutated input decks,
// token-file headers and checkpoints are each either accepted or refused with a
// cubelm::Error; nothing else may happen (no other exception, no crash, no abort, no
// hang - ctest's timeout). The number of inputs per target is CUBELM_FUZZ_RUNS
// (default 300); the sanitizer job runs more under AddressSanitizer and UBSan.

#include "cubelm/comm/communicator.hpp"
#include "cubelm/comm/layout.hpp"
#include "cubelm/core/error.hpp"
#include "cubelm/cost/deck.hpp"
#include "cubelm/cost/memory.hpp"
#include "cubelm/io/checkpoint.hpp"
#include "cubelm/io/json.hpp"
#include "cubelm/io/safetensors.hpp"
#include "cubelm/io/tokens.hpp"
#include "cubelm/train/trainer.hpp"

#include "deck_text.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace cubelm;
using cubelm::testing::DeckText;
namespace fs = std::filesystem;

namespace {

int runs() {
  const char* text = std::getenv("CUBELM_FUZZ_RUNS");
  return text ? std::max(1, std::atoi(text)) : 300;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// One random change: flipped bits, overwritten, inserted or deleted bytes, a
// truncation, or (for text) a token replaced by an extreme value.
std::string mutate(std::string s, std::mt19937_64& gen, bool text, std::size_t lo = 0,
                   std::size_t hi = std::string::npos) {
  auto at = [&]() { // a position in [lo, hi) of the string as it is now
    const std::size_t h = std::min(hi, s.size());
    return h > lo ? lo + gen() % (h - lo) : std::min(lo, s.size());
  };
  static const char* const extremes[] = {
      "0",     "-1",         "1e308", "-1e308", "nan", "inf", "2147483648", "99999999999999999999",
      "\"\"",  "[]",         "{}",    "true",   "0.5", "-0",  "1e-320",     "=",
      "[[x]]", "\"\\u0000\""};
  const int kinds = text ? 7 : 5;
  const int n = 1 + static_cast<int>(gen() % 4);
  for (int k = 0; k < n && !s.empty(); ++k)
    switch (gen() % kinds) {
    case 0: // flip bits
      if (const std::size_t i = at(); i < s.size())
        s[i] ^= static_cast<char>(1u << (gen() % 8));
      break;
    case 1: // overwrite a run
      for (std::size_t i = at(), e = std::min(s.size(), i + 1 + gen() % 16); i < e; ++i)
        s[i] = static_cast<char>(gen());
      break;
    case 2: // insert
      s.insert(at(), std::string(1 + gen() % 8, static_cast<char>(gen())));
      break;
    case 3: // delete
      s.erase(at(), 1 + gen() % 16);
      break;
    case 4: // truncate
      s.resize(at());
      break;
    default: { // a value replaced by an extreme one (text)
      const std::size_t eq = s.find('=', at());
      if (eq == std::string::npos)
        break;
      const std::size_t end = s.find('\n', eq);
      s.replace(eq + 1, end == std::string::npos ? std::string::npos : end - eq - 1,
                std::string(" ") + extremes[gen() % (sizeof(extremes) / sizeof(*extremes))]);
    }
    }
  return s;
}

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("cubelm_fuzz_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir / name;
}

} // namespace

// Mutated example and test decks: parsed, and when accepted also planned (layout and
// memory estimate, as `cubelm check` does).
TEST(Fuzz, DecksAreAcceptedOrRefusedWithAnError) {
  std::vector<std::string> seeds;
  for (const char* dir : {CUBELM_SOURCE_DIR "/inputs", CUBELM_SOURCE_DIR "/tests/decks"})
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.path().extension() == ".toml")
        seeds.push_back(read_file(entry.path()));
  ASSERT_GT(seeds.size(), 10u);
  std::mt19937_64 gen(20261123);
  int accepted = 0, refused = 0;
  for (int r = 0; r < runs(); ++r) {
    const std::string text = mutate(seeds[gen() % seeds.size()], gen, true);
    try {
      const Deck deck = cost::parse_deck(text, "fuzz.toml");
      comm::layout_of(deck.parallel).validate();
      (void)cost::estimate_memory(deck);
      ++accepted;
    } catch (const Error&) {
      ++refused;
    } catch (const std::exception& e) {
      FAIL() << "not a cubelm::Error (" << typeid(e).name() << ": " << e.what()
             << ") for the deck:\n"
             << text;
    }
  }
  std::printf("decks: %d accepted, %d refused with an error\n", accepted, refused);
  EXPECT_GT(refused, 0);
}

// Token files with damaged headers (and bodies, and lengths): llm.c .bin, Megatron .idx.
TEST(Fuzz, TokenFilesAreReadOrRefusedWithAnError) {
  std::vector<std::int32_t> tokens(3000);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::int32_t>((i * 7) % 200);
  const fs::path llmc = scratch("seed.bin");
  io::write_llmc(llmc.string(), tokens);
  const std::string llmc_bytes = read_file(llmc);
  const fs::path prefix = scratch("seed_mg");
  io::write_megatron(prefix.string(),
                     {std::vector<std::int32_t>(tokens.begin(), tokens.begin() + 900),
                      std::vector<std::int32_t>(tokens.begin() + 900, tokens.end()),
                      {5}});
  const std::string idx_bytes = read_file(prefix.string() + ".idx");
  const std::string bin_bytes = read_file(prefix.string() + ".bin");
  std::mt19937_64 gen(7);
  int read = 0, refused = 0;
  for (int r = 0; r < runs(); ++r) {
    const bool megatron = gen() % 2 == 1;
    const bool header = gen() % 4 != 0; // mostly the header; sometimes anywhere
    std::string where;
    try {
      if (!megatron) {
        write_file(llmc, mutate(llmc_bytes, gen, false, 0, header ? 1024 : std::string::npos));
        where = "llm.c";
        io::read_llmc(llmc.string(), 256);
      } else {
        write_file(prefix.string() + ".idx",
                   mutate(idx_bytes, gen, false, 0, header ? 64 : std::string::npos));
        write_file(prefix.string() + ".bin",
                   gen() % 8 == 0 ? mutate(bin_bytes, gen, false) : bin_bytes);
        where = "Megatron";
        io::read_megatron(prefix.string(), 256);
      }
      ++read;
    } catch (const Error&) {
      ++refused;
    } catch (const std::exception& e) {
      FAIL() << where << " input " << r << ": not a cubelm::Error (" << typeid(e).name() << ": "
             << e.what() << ")";
    }
  }
  std::printf("token files: %d read, %d refused with an error\n", read, refused);
  EXPECT_GT(refused, runs() / 2);
  fs::remove_all(llmc.parent_path());
}

// safetensors files with damaged headers (and data, and lengths), as `cubelm convert
// --from hf` reads them: each is read whole or refused with an Error naming the file.
TEST(Fuzz, SafetensorsFilesAreReadOrRefusedWithAnError) {
  std::vector<float> a(12), b(7);
  for (std::size_t i = 0; i < a.size(); ++i)
    a[i] = 0.25f * static_cast<float>(i);
  for (std::size_t i = 0; i < b.size(); ++i)
    b[i] = -1.0f - static_cast<float>(i);
  const fs::path path = scratch("seed.safetensors");
  io::write_safetensors(
      path.string(), {{"h.0.attn.c_attn.weight", {3, 4}, a.data()}, {"ln_f.bias", {7}, b.data()}},
      {{"format", "pt"}});
  const std::string bytes = read_file(path);
  std::size_t header = 0; // 8 + the header's length (little-endian)
  for (int i = 7; i >= 0; --i)
    header = (header << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  header += 8;
  std::mt19937_64 gen(5);
  int read = 0, refused = 0;
  for (int r = 0; r < runs(); ++r) {
    const bool in_header = gen() % 4 != 0; // mostly the header; sometimes anywhere
    write_file(path, mutate(bytes, gen, false, 0, in_header ? header : std::string::npos));
    try {
      const io::SafetensorsReader reader(path.string());
      for (const io::SafetensorsEntry& e : reader.tensors())
        if (e.dtype == "F32" || e.dtype == "F16" || e.dtype == "BF16")
          EXPECT_EQ(reader.read_floats(e.name).size(), e.elements());
      ++read;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
      ++refused;
    } catch (const std::exception& e) {
      FAIL() << "safetensors input " << r << ": not a cubelm::Error (" << typeid(e).name() << ": "
             << e.what() << ")";
    }
  }
  std::printf("safetensors files: %d read, %d refused with an error\n", read, refused);
  EXPECT_GT(refused, runs() / 2);
  fs::remove_all(path.parent_path());
}

// A real checkpoint of the tiny model with bytes flipped or overwritten (data and
// metadata) or cut short: `cubelm verify`'s check and a resume either succeed or
// refuse it with an Error naming the file; a resume never loads damaged values
// silently when verification found damage.
TEST(Fuzz, DamagedCheckpointsAreVerifiedOrRefused) {
  const Deck deck = DeckText().set("train.steps", 2).set("train.global_batch", 4).deck("fuzz.toml");
  train::Trainer trainer(deck);
  trainer.step();
  const fs::path good = scratch("step_00000001.h5");
  trainer.save(good.string());
  const std::string bytes = read_file(good);
  const fs::path bad = scratch("damaged.h5");
  const comm::Communicator comm = comm::Communicator::world();
  std::mt19937_64 gen(11);
  int sound = 0, refused = 0, loaded = 0;
  const int n = std::max(1, runs() / 3); // each run opens HDF5 twice: fewer of them
  for (int r = 0; r < n; ++r) {
    write_file(bad, mutate(bytes, gen, false));
    bool verified = false;
    try {
      const io::Verification v = io::verify_checkpoint(bad.string(), comm);
      verified = v.problem.empty();
      if (!verified)
        EXPECT_NE(v.problem.find(bad.string()), std::string::npos) << v.problem;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(bad.string()), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      FAIL() << "verify, input " << r << ": not a cubelm::Error (" << e.what() << ")";
    }
    verified ? ++sound : ++refused;
    try {
      train::Trainer other(deck);
      other.resume(bad.string());
      ++loaded;
    } catch (const Error&) {
    } catch (const std::exception& e) {
      FAIL() << "resume, input " << r << ": not a cubelm::Error (" << e.what() << ")";
    }
  }
  std::printf("checkpoints: %d verified, %d refused; %d loaded by resume\n", sound, refused,
              loaded);
  EXPECT_GT(refused, 0);
  fs::remove_all(good.parent_path());
}
