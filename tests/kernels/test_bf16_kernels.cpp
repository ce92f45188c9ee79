// The kernels on bfloat16 storage (train.precision = "bf16") against the same kernels on
// float: given the same numbers (bfloat16 values, held as float in the reference), a
// kernel that computes in float and rounds only where it stores gives exactly the float
// kernel's results rounded to bfloat16, and its float outputs (statistics, parameter
// gradients) bit for bit. The products (gemm with bf16 matrices) are checked against
// double sums of the same inputs.

#include "cubelm/kernels/attention_blocks.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/kernels/elementwise.hpp"
#include "cubelm/kernels/embedding.hpp"
#include "cubelm/kernels/layernorm.hpp"
#include "cubelm/kernels/loss.hpp"
#include "cubelm/kernels/moe.hpp"
#include "cubelm/kernels/precision.hpp"

#include "view_helpers.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

using namespace cubelm;
using namespace cubelm::kernels;
using cubelm::testing::host;
using cubelm::testing::randomize;

namespace {

// A View of `Out` elements with the shape of `in` and its values converted element by
// element (float to bf16 rounds; bf16 to float is exact).
template <class Out, class In>
Out converted(const In& in) {
  Out out(Kokkos::view_alloc(std::string("converted"), Kokkos::WithoutInitializing), in.layout());
  auto hi = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), in);
  auto ho = Kokkos::create_mirror_view(out);
  for (std::size_t i = 0; i < in.span(); ++i)
    ho.data()[i] = typename Out::value_type(static_cast<float>(hi.data()[i]));
  Kokkos::deep_copy(out, ho);
  return out;
}

// A float View of uniform numbers in [lo, hi) that are all bfloat16 values.
template <class V>
V bf16_values(V v, unsigned seed, double lo = -1.0, double hi = 1.0) {
  randomize(v, seed, lo, hi);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  for (std::size_t i = 0; i < v.span(); ++i)
    h.data()[i] = bf16_round(h.data()[i]);
  Kokkos::deep_copy(v, h);
  return v;
}

Mat<float> fmat(std::int64_t r, std::int64_t c, unsigned seed, double lo = -1.0, double hi = 1.0) {
  return bf16_values(Mat<float>("m", r, c), seed, lo, hi);
}
Vec<float> fvec(std::int64_t n, unsigned seed, double lo = -1.0, double hi = 1.0) {
  return bf16_values(Vec<float>("v", n), seed, lo, hi);
}
Mat<bf16> bmat(const Mat<float>& m) {
  return converted<Mat<bf16>>(m);
}
Vec<bf16> bvec(const Vec<float>& v) {
  return converted<Vec<bf16>>(v);
}

// Every element of `b` (bf16) equals the matching element of `f` (float) rounded to
// bfloat16; `what` names the output.
template <class B, class F>
void expect_rounded(const B& b, const F& f, const char* what) {
  const std::vector<double> got = host(b), want = host(f);
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != static_cast<double>(bf16_round(static_cast<float>(want[i]))) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", float kernel " << want[i]
                    << " rounds to " << bf16_round(static_cast<float>(want[i]));
  EXPECT_EQ(bad, 0) << what << ": elements not the rounded float result";
}

// Two float Views equal element for element.
template <class A, class B>
void expect_same(const A& a, const B& b, const char* what) {
  EXPECT_EQ(host(a), host(b)) << what;
}

// |b - f| within `ulps` units in the last place of a bfloat16 of f's size (2^-7 relative
// per unit, for numbers rounded twice).
template <class B, class F>
void expect_within_ulps(const B& b, const F& f, double ulps, const char* what) {
  const std::vector<double> got = host(b), want = host(f);
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double tol = ulps * std::ldexp(1.0, -7) * std::max(std::fabs(want[i]), 1e-30);
    if (std::fabs(got[i] - want[i]) > tol) {
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", float kernel " << want[i];
      return;
    }
  }
}

} // namespace

TEST(Bf16Storage, ConvertsToFloatExactlyAndFromFloatByRounding) {
  // Implicit conversions: a View of bf16 reads as float, stores floats rounded.
  const float x = 1.0f + std::ldexp(1.0f, -9); // below half an ulp of bfloat16 at 1
  const bf16 b = x;
  EXPECT_EQ(static_cast<float>(b), 1.0f);
  EXPECT_EQ(b.bits, bf16_bits(x));
  const bf16 c = 1.0f + 3 * std::ldexp(1.0f, -9); // 3/4 of an ulp above 1: rounds up
  EXPECT_EQ(static_cast<float>(c), 1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(bf16::from(2.5f).value(), 2.5f);
  static_assert(std::is_same_v<compute_t<bf16>, float>);
  static_assert(std::is_same_v<compute_t<float>, float>);
  static_assert(std::is_same_v<compute_t<double>, double>);
}

TEST(Bf16Storage, ElementwiseKernelsRoundOnlyWhereTheyStore) {
  const ExecSpace exec;
  // Rows wider than a CPU chunk (256 columns), with a partial one: GELU converts chunks.
  const std::int64_t n = 37, h = 300;
  const Mat<float> x = fmat(n, h, 1, -3, 3), y = fmat(n, h, 2);
  const Vec<float> bias = fvec(h, 3);
  const Mat<bf16> xb = bmat(x), yb = bmat(y);
  const Vec<bf16> biasb = bvec(bias);

  bias_add<float>(exec, y, bias);
  bias_add<bf16>(exec, yb, biasb);
  expect_rounded(yb, y, "bias_add");

  const Mat<float> out("out", n, h), th("th", n, h);
  const Mat<bf16> outb("outb", n, h), thb("thb", n, h);
  gelu_forward<float>(exec, x, out, th);
  gelu_forward<bf16>(exec, xb, outb, thb);
  expect_rounded(outb, out, "gelu y");
  expect_rounded(thb, th, "gelu tanh");

  // The backward reads the tanh values as stored: give the float kernel the same ones.
  const Mat<float> th_stored = converted<Mat<float>>(thb);
  const Mat<float> dy = fmat(n, h, 4), dx("dx", n, h);
  const Mat<bf16> dyb = bmat(dy), dxb("dxb", n, h);
  gelu_backward<float>(exec, x, th_stored, dy, dx);
  gelu_backward<bf16>(exec, xb, thb, dyb, dxb);
  expect_rounded(dxb, dx, "gelu_backward");

  const Mat<float> acc = fmat(n, h, 5);
  const Mat<bf16> accb = bmat(acc);
  add_inplace<float>(exec, acc, x);
  add_inplace<bf16>(exec, accb, xb);
  expect_rounded(accb, acc, "add_inplace");

  // Parameter gradients are float and accumulate: the same sums bit for bit.
  const Vec<float> db = fvec(h, 6), db2 = converted<Vec<float>>(db);
  bias_backward<float>(exec, dy, db);
  bias_backward<bf16>(exec, dyb, db2);
  expect_same(db2, db, "bias_backward");
}

TEST(Bf16Storage, LayerNormKeepsFloatStatisticsAndGradients) {
  const ExecSpace exec;
  const std::int64_t n = 29, h = 96;
  const Mat<float> x = fmat(n, h, 11, -2, 3);
  const Vec<float> gamma = fvec(h, 12, 0.5, 1.5), beta = fvec(h, 13);
  const Mat<bf16> xb = bmat(x);
  const Vec<bf16> gammab = bvec(gamma), betab = bvec(beta);
  const Mat<float> y("y", n, h);
  const Mat<bf16> yb("yb", n, h);
  const Vec<float> mean("mean", n), rstd("rstd", n), meanb("meanb", n), rstdb("rstdb", n);
  layernorm_forward<float>(exec, x, gamma, beta, y, mean, rstd);
  layernorm_forward<bf16>(exec, xb, gammab, betab, yb, meanb, rstdb);
  expect_rounded(yb, y, "layernorm y");
  expect_same(meanb, mean, "layernorm mean");
  expect_same(rstdb, rstd, "layernorm rstd");

  const Mat<float> dy = fmat(n, h, 14), dx = fmat(n, h, 15);
  const Mat<bf16> dyb = bmat(dy), dxb = bmat(dx);
  const Vec<float> dgamma = fvec(h, 16), dbeta = fvec(h, 17);
  const Vec<float> dgammab = converted<Vec<float>>(dgamma), dbetab = converted<Vec<float>>(dbeta);
  layernorm_backward<float>(exec, dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
  layernorm_backward<bf16>(exec, dyb, xb, gammab, meanb, rstdb, dxb, dgammab, dbetab);
  expect_rounded(dxb, dx, "layernorm dx (accumulated)");
  expect_same(dgammab, dgamma, "layernorm dgamma");
  expect_same(dbetab, dbeta, "layernorm dbeta");
}

TEST(Bf16Storage, CrossEntropyComputesLossesInFloat) {
  const ExecSpace exec;
  const std::int64_t n = 23, vocab = 300, valid = 290;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    ids[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 37) % valid);
  const Tokens tok =
      cubelm::testing::filled<std::int32_t>(ids.size(), [&](std::size_t i) { return ids[i]; });
  for (const float scale : {0.0f, 0.125f}) {
    const Mat<float> logits = fmat(n, vocab, 21, -4, 4);
    const Mat<bf16> logitsb = bmat(logits);
    const Vec<float> loss("loss", n), lossb("lossb", n);
    whole_vocab_cross_entropy<float>(exec, logits, tok, valid, loss, scale);
    whole_vocab_cross_entropy<bf16>(exec, logitsb, tok, valid, lossb, scale);
    expect_same(lossb, loss, "cross-entropy losses");
    if (scale != 0.0f) // the row is computed in float and rounded once
      expect_rounded(logitsb, logits, "cross-entropy gradient");
  }
  // The vocabulary-parallel steps on one slice: the same losses.
  const Mat<float> logits = fmat(n, vocab, 22, -4, 4);
  const Mat<bf16> logitsb = bmat(logits);
  const Vec<float> mx("mx", n), loss("loss", n);
  const Mat<float> stats("stats", n, 2);
  row_max<bf16>(exec, logitsb, valid, mx);
  row_sumexp_target<bf16>(exec, logitsb, mx, tok, 0, valid, stats);
  vocab_cross_entropy<bf16>(exec, logitsb, stats, tok, 0, valid, loss, 0.125f);
  const Vec<float> whole("whole", n);
  const Mat<float> whole_grad = logits;
  whole_vocab_cross_entropy<float>(exec, whole_grad, tok, valid, whole, 0.125f);
  expect_same(loss, whole, "vocabulary-parallel losses");
  // The exponentials are stored (rounded) before they are scaled.
  expect_within_ulps(logitsb, whole_grad, 2, "vocabulary-parallel gradient");
}

TEST(Bf16Storage, EmbeddingSumsGradientsInFloat) {
  const ExecSpace exec;
  const int vocab = 50, seq = 8, batch = 3;
  const std::int64_t h = 40, rows = batch * seq;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows));
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<std::int32_t>((i * 7) % 13); // repeated tokens
  const Tokens tok =
      cubelm::testing::filled<std::int32_t>(ids.size(), [&](std::size_t i) { return ids[i]; });
  const Mat<float> wte = fmat(vocab, h, 31), wpe = fmat(seq, h, 32);
  const Mat<float> y("y", rows, h);
  const Mat<bf16> yb("yb", rows, h);
  embedding_forward<float>(exec, tok, wte, wpe, seq, y);
  embedding_forward<bf16>(exec, tok, bmat(wte), bmat(wpe), seq, yb);
  // The lookup stores the bf16 weight (exact), then adds the position: one rounding.
  expect_rounded(yb, y, "embedding");

  const Mat<float> dy = fmat(rows, h, 33);
  const Mat<float> dwte = fmat(vocab, h, 34), dwpe = fmat(seq, h, 35);
  const Mat<float> dwteb = converted<Mat<float>>(dwte), dwpeb = converted<Mat<float>>(dwpe);
  const TokenIndex index = make_token_index(ids, vocab);
  embedding_backward<float>(exec, index, dy, seq, dwte, dwpe);
  embedding_backward<bf16>(exec, index, bmat(dy), seq, dwteb, dwpeb);
  expect_same(dwteb, dwte, "dwte");
  expect_same(dwpeb, dwpe, "dwpe");
}

TEST(Bf16Storage, AttentionBlocksAreFloatCopiesOfTheActivations) {
  const ExecSpace exec;
  const int heads = 3, batch = 2, seq = 10, d = 4;
  const Mat<float> src = fmat(batch * seq, heads * d, 41);
  const Mat<bf16> srcb = bmat(src);
  const Batch<float> blk("blk", batch * heads, 6, d), blkb("blkb", batch * heads, 6, d);
  gather_heads<float>(exec, src, heads, 3, blk);
  gather_heads<bf16>(exec, srcb, heads, 3, blkb);
  expect_same(blkb, blk, "gather_heads");
  const Batch<float> part = bf16_values(Batch<float>("part", batch * heads, 6, d), 42);
  const Mat<float> dst = fmat(batch * seq, heads * d, 43);
  const Mat<bf16> dstb = bmat(dst);
  scatter_heads<float>(exec, part, heads, 3, dst, true);
  scatter_heads<bf16>(exec, part, heads, 3, dstb, true);
  expect_rounded(dstb, dst, "scatter_heads (accumulated)");
}

TEST(Bf16Storage, MoeRowsRoundWhereTheyStoreAndGatesStayFloat) {
  const ExecSpace exec;
  const std::int64_t n = 12, h = 20;
  const int experts = 4, k = 2;
  Mat<float> probs = fmat(n, experts, 51, -2, 2);
  const IntMat choice("choice", n, k), slot("slot", n, k);
  const Mat<float> gate("gate", n, k);
  moe_route<float>(exec, probs, choice, gate);
  const Tokens keys("keys", n * k);
  TokenIndexer sorter;
  const IntVec pairs("pairs", n * k), offsets("offsets", experts + 1);
  const Vec<float> fraction("fraction", experts);
  moe_dispatch<float>(exec, choice, 5, keys, sorter, slot, pairs, offsets, fraction);
  const std::int64_t rows = n * k; // pairs past the capacity have no row
  const Mat<float> x = fmat(n, h, 52), out = fmat(rows, h, 53);
  const Mat<bf16> xb = bmat(x), outb = bmat(out);

  int kept = 0;
  {
    auto ho = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), offsets);
    kept = ho(experts);
  }
  const Mat<float> xin("xin", rows, h);
  const Mat<bf16> xinb("xinb", rows, h);
  moe_gather<float>(exec, x, pairs, kept, xin);
  moe_gather<bf16>(exec, xb, pairs, kept, xinb);
  expect_rounded(xinb, xin, "moe_gather");

  const Mat<float> y("y", n, h);
  const Mat<bf16> yb("yb", n, h);
  moe_combine<float>(exec, out, slot, gate, y);
  moe_combine<bf16>(exec, outb, slot, gate, yb);
  expect_rounded(yb, y, "moe_combine");

  const Mat<float> dy = fmat(n, h, 54), dout("dout", rows, h), dgate("dgate", n, k);
  const Mat<bf16> doutb("doutb", rows, h);
  const Mat<float> dgateb("dgateb", n, k);
  moe_combine_backward<float>(exec, dy, out, slot, gate, pairs, kept, dout, dgate);
  moe_combine_backward<bf16>(exec, bmat(dy), outb, slot, gate, pairs, kept, doutb, dgateb);
  expect_rounded(Kokkos::subview(doutb, std::make_pair(0, kept), Kokkos::ALL),
                 Kokkos::subview(dout, std::make_pair(0, kept), Kokkos::ALL), "moe dout");
  expect_same(dgateb, dgate, "moe dgate");

  const Mat<float> dx = fmat(n, h, 55);
  const Mat<bf16> dxb = bmat(dx);
  moe_scatter_add<float>(exec, out, slot, dx);
  moe_scatter_add<bf16>(exec, outb, slot, dxb);
  expect_rounded(dxb, dx, "moe_scatter_add");
}

namespace {

// C = alpha op(A) op(B) + beta C in double from the bfloat16 values of the inputs.
std::vector<double> reference(bool ta, bool tb, double alpha, const std::vector<double>& a,
                              const std::vector<double>& b, double beta,
                              const std::vector<double>& c, std::int64_t m, std::int64_t n,
                              std::int64_t k) {
  std::vector<double> out(static_cast<std::size_t>(m * n));
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t l = 0; l < k; ++l) {
        const double x = ta ? a[l * m + i] : a[i * k + l];
        const double y = tb ? b[j * k + l] : b[l * n + j];
        s += static_cast<double>(bf16_round(static_cast<float>(x))) *
             static_cast<double>(bf16_round(static_cast<float>(y)));
      }
      out[i * n + j] = alpha * s + beta * c[i * n + j];
    }
  return out;
}

template <class TA, class TB, class TC>
void check_product(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float beta,
                   unsigned seed) {
  const ExecSpace exec;
  // Float inputs are not bfloat16 values: the product must round them.
  Mat<float> af("a", ta ? k : m, ta ? m : k), bf("b", tb ? n : k, tb ? k : n), cf("c", m, n);
  randomize(af, seed);
  randomize(bf, seed + 1);
  bf16_values(cf, seed + 2);
  const auto a = converted<Mat<TA>>(af);
  const auto b = converted<Mat<TB>>(bf);
  const auto c = converted<Mat<TC>>(cf);
  const float alpha = 0.75f;
  gemm(exec, ta, tb, alpha, a, b, beta, c);
  const std::vector<double> want =
      reference(ta, tb, alpha, host(af), host(bf), beta, host(cf), m, n, k);
  const std::vector<double> got = host(c);
  const bool rounded_c = std::is_same_v<TC, bf16>;
  const double rel = rounded_c ? std::ldexp(1.0, -8) : 1e-5;
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double tol = rel * std::fabs(want[i]) + 1e-5 * std::sqrt(static_cast<double>(k));
    if (std::fabs(got[i] - want[i]) > tol && bad++ < 3)
      ADD_FAILURE() << "C[" << i / n << "," << i % n << "] = " << got[i] << ", want " << want[i]
                    << " (ta " << ta << ", tb " << tb << ", m " << m << ", n " << n << ", k " << k
                    << ")";
  }
  EXPECT_EQ(bad, 0);
}

} // namespace

TEST(Bf16Storage, ProductsOfBf16MatricesAccumulateInFloat) {
  // Every combination a bf16 model uses, both transposes, beta 0 and 1, and shapes past
  // the CPU path's 1024 x 1024 tiles.
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      check_product<bf16, bf16, bf16>(ta, tb, 33, 17, 45, 0.0f, 1);
      check_product<bf16, bf16, bf16>(ta, tb, 9, 21, 64, 1.0f, 2);
      check_product<bf16, bf16, float>(ta, tb, 25, 14, 50, 1.0f, 3);
      check_product<float, bf16, bf16>(ta, tb, 18, 11, 30, 0.0f, 4);
      check_product<bf16, float, bf16>(ta, tb, 12, 19, 27, 1.0f, 5);
      check_product<float, bf16, float>(ta, tb, 16, 8, 23, 1.0f, 6);
      check_product<bf16, float, float>(ta, tb, 7, 13, 31, 0.0f, 7);
    }
  check_product<bf16, bf16, bf16>(false, true, 1100, 1030, 3, 1.0f, 8);
  check_product<bf16, bf16, float>(true, false, 1030, 1100, 2, 1.0f, 9);
}
