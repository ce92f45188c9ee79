// train.precision: bfloat16 rounding bit by bit against an independent nearest-value
// search, the bf16 gemm against double products of rounded inputs, and training in
// bf16 (bf16 storage) against fp32 in every tensor-parallel mode (the mode of the job's
// world size).

#include "cubelm/core/error.hpp"
#include "cubelm/cost/deck.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/kernels/precision.hpp"
#include "cubelm/train/trainer.hpp"

#include "deck_text.hpp"
#include "layouts.hpp"
#include "test_helpers.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace cubelm;
using cubelm::testing::DeckText;
using cubelm::testing::world_size;

namespace {

// The bfloat16 nearest to x by search: the two candidates around x (x with its low 16
// bits cleared, and the next bfloat16 away from zero), the nearer one in double, a tie
// to the one with an even last bit. Finite x only.
std::uint32_t nearest_bf16(std::uint32_t u) {
  const std::uint32_t down = u & 0xffff0000u, up = down + 0x10000u;
  float x, lo, hi;
  std::memcpy(&x, &u, 4);
  std::memcpy(&lo, &down, 4);
  std::memcpy(&hi, &up, 4); // may be infinity: then compare with the overflow threshold
  const double dlo = std::fabs(static_cast<double>(x) - lo);
  double dhi;
  if (std::isinf(hi)) // the midpoint to "2^128" decides: 0x7f7f8000 rounds up (to even)
    dhi = std::fabs(std::ldexp(1.0, 128) * (std::signbit(x) ? -1 : 1) - static_cast<double>(x));
  else
    dhi = std::fabs(static_cast<double>(hi) - x);
  if (dlo < dhi)
    return down;
  if (dhi < dlo)
    return up;
  return ((down >> 16) & 1u) == 0 ? down : up;
}

std::uint32_t rounded_bits(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return static_cast<std::uint32_t>(kernels::bf16_bits(x)) << 16;
}

} // namespace

TEST(Bf16, RoundingIsNearestEvenBitForBit) {
  std::vector<std::uint32_t> cases = {0x00000000u,
                                      0x80000000u,
                                      0x3f800000u,
                                      0x3f808000u /* tie, to even: down */,
                                      0x3f818000u /* tie, to even: up */,
                                      0x3f808001u,
                                      0x3f807fffu,
                                      0x7f7fffffu /* to inf */,
                                      0x7f7f7fffu,
                                      0x7f7f8000u /* tie at the top: to inf */,
                                      0x00000001u /* subnormal */,
                                      0x00008000u /* subnormal tie: down */,
                                      0x00018000u /* subnormal tie: up */,
                                      0x007fffffu /* largest subnormal: to the smallest normal */,
                                      0x80008001u};
  std::mt19937 gen(7);
  for (int i = 0; i < 200000; ++i)
    cases.push_back(static_cast<std::uint32_t>(gen()));
  for (const std::uint32_t u : cases) {
    if ((u & 0x7f800000u) == 0x7f800000u)
      continue; // infinities and NaN below
    ASSERT_EQ(rounded_bits(u), nearest_bf16(u)) << std::hex << "input 0x" << u;
  }
  EXPECT_EQ(rounded_bits(0x7f800000u), 0x7f800000u) << "+inf";
  EXPECT_EQ(rounded_bits(0xff800000u), 0xff800000u) << "-inf";
  for (const std::uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x7fffffffu}) {
    const std::uint32_t r = rounded_bits(nan);
    EXPECT_EQ(r & 0x7f800000u, 0x7f800000u) << std::hex << nan;
    EXPECT_NE(r & 0x007f0000u, 0u) << "stays a NaN, not infinity: " << std::hex << nan;
    EXPECT_EQ(r & 0x80000000u, nan & 0x80000000u) << "keeps its sign";
  }
  float x = 1.0f + 1.0f / 256.0f; // halfway between two bfloat16: to even (1.0)
  EXPECT_EQ(kernels::bf16_round(x), 1.0f);
}

TEST(Bf16, GemmMultipliesRoundedInputsInFp32) {
  const ExecSpace exec;
  const int m = 7, k = 33, n = 5;
  kernels::Mat<float> a("a", m, k), bt("bt", n, k), c("c", m, n);
  auto ha = Kokkos::create_mirror_view(a);
  auto hb = Kokkos::create_mirror_view(bt);
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < k; ++j)
      ha(i, j) = dist(gen);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < k; ++j)
      hb(i, j) = dist(gen);
  Kokkos::deep_copy(a, ha);
  Kokkos::deep_copy(bt, hb);
  kernels::set_gemm_precision(Precision::bf16);
  kernels::gemm<float>(exec, false, true, 1.0f, a, bt, 0.0f, c);
  kernels::set_gemm_precision(Precision::fp32);
  auto hc = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c);
  double worst = 0, moved = 0;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double exact = 0, unrounded = 0;
      for (int l = 0; l < k; ++l) {
        exact += static_cast<double>(kernels::bf16_round(ha(i, l))) * kernels::bf16_round(hb(j, l));
        unrounded += static_cast<double>(ha(i, l)) * hb(j, l);
      }
      worst = std::max(worst, std::fabs(hc(i, j) - exact));
      moved = std::max(moved, std::fabs(exact - unrounded));
    }
  EXPECT_LT(worst, 1e-5) << "fp32 accumulation of bf16 products";
  EXPECT_GT(moved, 1e-4) << "the inputs were really rounded";
  // The inputs are left as they were.
  auto ha2 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
  EXPECT_EQ(std::memcmp(ha.data(), ha2.data(), sizeof(float) * m * k), 0);
}

namespace {

Deck quickstart(const std::string& precision) {
  const std::vector<std::string> cases = cubelm::testing::layouts("precision");
  if (cases.size() != 1)
    ADD_FAILURE() << "tests/layouts.hpp: one \"precision\" case per world size, " << cases.size()
                  << " for " << world_size() << " ranks";
  const std::string parallel = cases.empty() ? "" : cases.front();
  // inputs/quickstart.toml's model and optimizer, 100 steps.
  return DeckText()
      .set("model.vocab_size", 256)
      .set("model.seq_len", 64)
      .set("model.hidden", 64)
      .set("model.heads", 4)
      .lines("parallel", parallel)
      .set("train.steps", 100)
      .set("train.global_batch", 16)
      .set("train.precision", precision)
      .set("optimizer.lr", 3e-3)
      .set("optimizer.min_lr", 3e-4)
      .set("optimizer.warmup_steps", 50)
      .erase("data.synthetic_tokens")
      .deck("precision.toml");
}

// The losses of the first `steps` steps (all of them when negative).
std::vector<double> losses(const Deck& deck, int steps = -1) {
  train::Trainer t(deck);
  std::vector<double> out;
  for (int s = 0; s < (steps < 0 ? deck.train.steps : steps); ++s)
    out.push_back(t.step().loss);
  return out;
}

} // namespace

// bf16 storage (activations, their gradients, weight copies and messages in bfloat16;
// docs/precision.md) moves the losses of 100 quick-start steps by less than 0.1%
// (measured: 4.1e-4 on one process, 4.2e-4 in 1D on 2 ranks, 4.9e-4 in 2D on 4, 4.8e-4 in
// 3D on 8), and the same bf16 run twice gives the same bits.
TEST(Precision, Bf16TrainingStaysNearFp32AndIsDeterministic) {
  const std::vector<double> fp32 = losses(quickstart("fp32"));
  const std::vector<double> bf16 = losses(quickstart("bf16"));
  const std::vector<double> again = losses(quickstart("bf16"), 20);
  double worst = 0;
  for (std::size_t s = 0; s < fp32.size(); ++s)
    worst = std::max(worst, std::fabs(bf16[s] - fp32[s]) / fp32[s]);
  std::printf("bf16 vs fp32 over 100 steps (%d ranks): largest relative loss difference %.2e, "
              "final %.4f vs %.4f\n",
              world_size(), worst, bf16.back(), fp32.back());
  EXPECT_LT(worst, 1e-3);
  EXPECT_GT(worst, 0.0) << "bf16 changed nothing: the precision was not applied";
  EXPECT_EQ(std::memcmp(bf16.data(), again.data(), sizeof(double) * again.size()), 0);
  // tf32 is fp32 on CPUs: the same bits.
#ifndef KOKKOS_ENABLE_CUDA
  const std::vector<double> tf32 = losses(quickstart("tf32"), 20);
  EXPECT_EQ(std::memcmp(tf32.data(), fp32.data(), sizeof(double) * tf32.size()), 0);
#endif
}

TEST(Precision, DeckKey) {
  EXPECT_EQ(cost::parse_deck("", "d.toml").train.precision, Precision::fp32);
  EXPECT_EQ(cost::parse_deck("[train]\nprecision = \"bf16\"\n", "d.toml").train.precision,
            Precision::bf16);
  try {
    cost::parse_deck("[train]\nprecision = \"fp16\"\n", "d.toml");
    ADD_FAILURE() << "fp16 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.precision"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
}
