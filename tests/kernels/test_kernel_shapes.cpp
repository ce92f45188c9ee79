// The GPU-shaped kernels against independent computations, at the sizes where their
// work splits go wrong if they do: rows shorter, longer and not a multiple of the
// partial sums a CPU thread keeps, row counts on both sides of a column reduction's row
// block, batches smaller and larger than the thread count, vocabulary slices that take
// one, two and three passes of the token sort.

#include "cubelm/kernels/attention.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/kernels/elementwise.hpp"
#include "cubelm/kernels/embedding.hpp"
#include "cubelm/kernels/layernorm.hpp"
#include "cubelm/kernels/loss.hpp"
#include "cubelm/kernels/precision.hpp"
#include "cubelm/kernels/vmath.hpp"

#include "view_helpers.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

using namespace cubelm;
using namespace cubelm::kernels;
using cubelm::testing::randomize;

namespace {

// A host copy (a copy also where the view is on the host already: snapshots before a kernel).
template <class V>
auto on_host(const V& view) {
  auto h = Kokkos::create_mirror(view);
  Kokkos::deep_copy(h, view);
  return h;
}

Tokens device_tokens(const std::vector<std::int32_t>& ids) {
  Tokens t("tokens", ids.size());
  auto h = Kokkos::create_mirror_view(t);
  for (std::size_t i = 0; i < ids.size(); ++i)
    h(i) = ids[i];
  Kokkos::deep_copy(t, h);
  return t;
}

// The index by bucketing the rows of each token on the host, in row order.
void expect_index(const TokenIndex& index, const std::vector<std::int32_t>& ids, int first,
                  int count) {
  std::vector<std::vector<int>> rows(static_cast<std::size_t>(count));
  for (std::size_t n = 0; n < ids.size(); ++n)
    if (ids[n] >= first && ids[n] - first < count)
      rows[static_cast<std::size_t>(ids[n] - first)].push_back(static_cast<int>(n));
  std::vector<int> offsets, positions;
  for (const auto& r : rows) {
    offsets.push_back(static_cast<int>(positions.size()));
    positions.insert(positions.end(), r.begin(), r.end());
  }
  offsets.push_back(static_cast<int>(positions.size()));
  const auto ho = on_host(index.offsets);
  const auto hp = on_host(index.positions);
  ASSERT_EQ(ho.extent(0), offsets.size());
  for (std::size_t v = 0; v < offsets.size(); ++v)
    ASSERT_EQ(ho(v), offsets[v]) << "offset of entry " << v;
  for (std::size_t i = 0; i < positions.size(); ++i)
    ASSERT_EQ(hp(i), positions[i]) << "position " << i;
}

} // namespace

TEST(KernelShapes, TokenIndexIsTheStableCountingSort) {
  const ExecSpace exec;
  std::mt19937 gen(11);
  TokenIndexer indexer; // one indexer for every case: its kept buffers are reused and regrown
  struct Case {
    int tokens, vocab, first, count;
  };
  // Slices of 1 to 70000 entries: one, two and three radix passes; more and fewer
  // tokens than a sort block; slices holding every token, some, and none.
  for (const Case c :
       {Case{1, 5, 0, 5}, Case{300, 7, 0, 7}, Case{1000, 256, 0, 256}, Case{1000, 256, 64, 64},
        Case{777, 300, 100, 200}, Case{4096, 50304, 0, 50304}, Case{2000, 70000, 1000, 69000},
        Case{513, 40, 40, 0}, Case{0, 10, 0, 10}, Case{600, 3, 0, 3}}) {
    SCOPED_TRACE(::testing::Message() << c.tokens << " tokens of " << c.vocab << ", slice ["
                                      << c.first << ", " << c.first + c.count << ")");
    std::uniform_int_distribution<std::int32_t> pick(0, c.vocab - 1);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(c.tokens));
    for (auto& t : ids)
      t = pick(gen);
    const TokenIndex& index = indexer.build(exec, device_tokens(ids), c.first, c.count);
    exec.fence();
    expect_index(index, ids, c.first, c.count);
  }
}

TEST(KernelShapes, BatchedGemmMatchesLoops) {
  const ExecSpace exec;
  // Batches of 1 (fewer matrices than threads: one product after the other) and 13.
  for (const int count : {1, 13})
    for (const bool ta : {false, true})
      for (const bool tb : {false, true}) {
        const int m = 6, n = 5, k = 9;
        Batch<double> a("a", count, ta ? k : m, ta ? m : k), b("b", count, tb ? n : k, tb ? k : n),
            c("c", count, m, n);
        randomize(a, 1);
        randomize(b, 2);
        randomize(c, 3);
        const auto c0 = on_host(c);
        gemm_batched<double>(exec, ta, tb, 1.5, a, b, 0.5, c);
        const auto ha = on_host(a);
        const auto hb = on_host(b);
        const auto hc = on_host(c);
        for (int q = 0; q < count; ++q)
          for (int i = 0; i < m; ++i)
            for (int j = 0; j < n; ++j) {
              double s = 0;
              for (int l = 0; l < k; ++l)
                s += (ta ? ha(q, l, i) : ha(q, i, l)) * (tb ? hb(q, j, l) : hb(q, l, j));
              ASSERT_NEAR(hc(q, i, j), 1.5 * s + 0.5 * c0(q, i, j), 1e-12)
                  << "matrix " << q << " ta " << ta << " tb " << tb;
            }
      }
}

namespace {

// A product computed under bf16 precision against the double sum of its rounded inputs'
// products: the largest distance (worst), and how far the rounding moved that sum from
// the unrounded inputs' (moved), over the products added.
struct Bf16ProductErrors {
  double worst = 0, moved = 0;
  template <class A, class B, class C>
  void add(int m, int n, int k, const A& a, const B& b, const C& c) {
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        double exact = 0, unrounded = 0;
        for (int l = 0; l < k; ++l) {
          exact += static_cast<double>(bf16_round(a(i, l))) * bf16_round(b(l, j));
          unrounded += static_cast<double>(a(i, l)) * b(l, j);
        }
        worst = std::max(worst, std::fabs(c(i, j) - exact));
        moved = std::max(moved, std::fabs(exact - unrounded));
      }
  }
};

} // namespace

TEST(KernelShapes, BatchedGemmFollowsTheBf16Precision) {
  const ExecSpace exec;
  const int count = 4, m = 3, k = 17, n = 2;
  Batch<float> a("a", count, m, k), b("b", count, k, n), c("c", count, m, n);
  randomize(a, 5);
  randomize(b, 6);
  set_gemm_precision(Precision::bf16);
  gemm_batched<float>(exec, false, false, 1.0f, a, b, 0.0f, c);
  set_gemm_precision(Precision::fp32);
  const auto ha = on_host(a);
  const auto hb = on_host(b);
  const auto hc = on_host(c);
  Bf16ProductErrors e;
  for (int q = 0; q < count; ++q)
    e.add(
        m, n, k, [&](int i, int l) { return ha(q, i, l); },
        [&](int l, int j) { return hb(q, l, j); }, [&](int i, int j) { return hc(q, i, j); });
  EXPECT_LT(e.worst, 1e-5) << "fp32 accumulation of bf16 products";
  EXPECT_GT(e.moved, 1e-4) << "the inputs were really rounded";
}

TEST(KernelShapes, FloatGemmOnAColumnBlockFollowsTheBf16Precision) {
  // A float product under bf16 precision reads rounded copies of its operands; here A
  // is a block of columns of a wider matrix (rows with a stride), B is transposed.
  const ExecSpace exec;
  const int m = 5, k = 19, n = 3, wide = k + 4;
  Mat<float> whole("whole", m, wide), b("b", n, k), c("c", m, n);
  randomize(whole, 7);
  randomize(b, 8);
  const auto a = Kokkos::subview(whole, Kokkos::ALL, std::make_pair(2, 2 + k));
  set_gemm_precision(Precision::bf16);
  gemm(exec, false, true, 1.0f, Mat<float>(a), b, 0.0f, c);
  set_gemm_precision(Precision::fp32);
  const auto hw = on_host(whole);
  const auto hb = on_host(b);
  const auto hc = on_host(c);
  Bf16ProductErrors e;
  e.add(
      m, n, k, [&](int i, int l) { return hw(i, 2 + l); }, [&](int l, int j) { return hb(j, l); },
      [&](int i, int j) { return hc(i, j); });
  EXPECT_LT(e.worst, 1e-5) << "fp32 accumulation of bf16 products";
  EXPECT_GT(e.moved, 1e-4) << "the inputs were really rounded";
}

TEST(KernelShapes, RowReductionsAtEveryWidth) {
  const ExecSpace exec;
  // Widths around the CPU's 8 partial sums and a GPU team; the sums in double.
  for (const int h : {1, 2, 7, 8, 9, 31, 33, 100, 5000}) {
    SCOPED_TRACE(::testing::Message() << "width " << h);
    const int rows = 5;
    Mat<double> x("x", rows, h), y("y", rows, h);
    Vec<double> gamma("gamma", h), beta("beta", h), mean("mean", rows), rstd("rstd", rows);
    randomize(x, static_cast<unsigned>(h), -3.0, 3.0);
    randomize(gamma, 2);
    randomize(beta, 3);
    layernorm_forward<double>(exec, x, gamma, beta, y, mean, rstd);
    Mat<double> logits("logits", rows, h);
    randomize(logits, 4, -20.0, 20.0);
    const auto hl = on_host(logits);
    Vec<double> mx("mx", rows), losses("losses", rows);
    Mat<double> stats("stats", rows, 2);
    const Tokens targets = device_tokens({0, h - 1, h / 2, 1 % h, h / 3});
    row_max<double>(exec, logits, h, mx);
    row_sumexp_target<double>(exec, logits, mx, targets, 0, h, stats);
    const auto hx = on_host(x);
    const auto hy = on_host(y);
    const auto hg = on_host(gamma);
    const auto hb = on_host(beta);
    const auto hmx = on_host(mx);
    const auto hs = on_host(stats);
    for (int n = 0; n < rows; ++n) {
      double s = 0, mxe = -1e300;
      for (int j = 0; j < h; ++j) {
        s += hx(n, j);
        mxe = std::max(mxe, hl(n, j));
      }
      const double mu = s / h;
      double v = 0;
      for (int j = 0; j < h; ++j)
        v += (hx(n, j) - mu) * (hx(n, j) - mu);
      const double rs = 1.0 / std::sqrt(v / h + kLayerNormEps);
      for (int j = 0; j < h; ++j)
        ASSERT_NEAR(hy(n, j), (hx(n, j) - mu) * rs * hg(j) + hb(j), 1e-12) << n << "," << j;
      double se = 0;
      for (int j = 0; j < h; ++j)
        se += std::exp(hl(n, j) - mxe);
      EXPECT_EQ(hmx(n), mxe);
      EXPECT_NEAR(hs(n, 0), se, 1e-12 * se);
    }
  }
}

TEST(KernelShapes, WholeVocabLossIsBitwiseTheThreeSteps) {
  const ExecSpace exec;
  // One kernel per row against the vocabulary-parallel steps with one slice: the same
  // losses and gradients to the bit, in float, with and without padding columns, with
  // and without a gradient.
  for (const int cols : {1, 9, 33, 300, 5000})
    for (const int pad : {0, 3})
      for (const float scale : {0.0f, 0.3f}) {
        const int valid = std::max(1, cols - pad);
        SCOPED_TRACE(::testing::Message()
                     << cols << " columns, " << valid << " valid, scale " << scale);
        const int rows = 6;
        Mat<float> a("a", rows, cols), b("b", rows, cols), stats("stats", rows, 2);
        Vec<float> mx("mx", rows), la("la", rows), lb("lb", rows);
        randomize(a, static_cast<unsigned>(cols + pad), -30.0, 30.0);
        Kokkos::deep_copy(b, a);
        // A target in every part of the row, and one in no column (skipped rows).
        const Tokens targets =
            device_tokens({0, valid - 1, valid / 2, valid / 3, 1 % valid, valid + pad});
        row_max<float>(exec, a, valid, mx);
        row_sumexp_target<float>(exec, a, mx, targets, 0, valid, stats);
        vocab_cross_entropy<float>(exec, a, stats, targets, 0, valid, la, scale);
        whole_vocab_cross_entropy<float>(exec, b, targets, valid, lb, scale);
        const auto ha = on_host(a), hb = on_host(b);
        const auto hla = on_host(la), hlb = on_host(lb);
        for (int n = 0; n < rows; ++n) {
          ASSERT_EQ(std::memcmp(&hla(n), &hlb(n), sizeof(float)), 0) << "loss of row " << n;
          ASSERT_TRUE(std::isfinite(hlb(n)));
          for (int j = 0; j < cols; ++j)
            ASSERT_EQ(std::memcmp(&ha(n, j), &hb(n, j), sizeof(float)), 0) << n << "," << j;
        }
      }
}

TEST(KernelShapes, ColumnSumsAroundTheRowBlock) {
  const ExecSpace exec;
  // Row counts below, at and above the row block of 64, column counts around the CPU's
  // chunk of 32; the sums in double, added to what the gradients held.
  for (const int rows : {1, 63, 64, 65, 200})
    for (const int cols : {1, 31, 32, 33, 70}) {
      SCOPED_TRACE(::testing::Message() << rows << " x " << cols);
      Mat<double> dy("dy", rows, cols), x("x", rows, cols);
      Vec<double> db("db", cols), dg("dg", cols), dbeta("dbeta", cols), mean("mean", rows),
          rstd("rstd", rows);
      randomize(dy, 7);
      randomize(x, 8);
      randomize(mean, 9);
      randomize(rstd, 10, 0.5, 2.0);
      randomize(db, 11);
      randomize(dg, 12);
      randomize(dbeta, 13);
      const auto db0 = on_host(db);
      const auto dg0 = on_host(dg);
      const auto dbeta0 = on_host(dbeta);
      bias_backward<double>(exec, dy, db);
      layernorm_backward_params<double>(exec, dy, x, mean, rstd, dg, dbeta);
      const auto hdy = on_host(dy);
      const auto hx = on_host(x);
      const auto hm = on_host(mean);
      const auto hr = on_host(rstd);
      const auto hdb = on_host(db);
      const auto hdg = on_host(dg);
      const auto hdbeta = on_host(dbeta);
      for (int j = 0; j < cols; ++j) {
        double sb = 0, sg = 0;
        for (int n = 0; n < rows; ++n) {
          sb += hdy(n, j);
          sg += hdy(n, j) * (hx(n, j) - hm(n)) * hr(n);
        }
        ASSERT_NEAR(hdb(j), db0(j) + sb, 1e-12) << "column " << j;
        ASSERT_NEAR(hdbeta(j), dbeta0(j) + sb, 1e-12) << "column " << j;
        ASSERT_NEAR(hdg(j), dg0(j) + sg, 1e-12) << "column " << j;
      }
    }
}

TEST(KernelShapes, TokenGradientAroundTheColumnChunk) {
  const ExecSpace exec;
  // Widths around the CPU's column chunk of 32; tokens that occur several times, once and
  // never. Every element sums its token's rows of dy in row order from 0 and adds the sum
  // to what dwte held: the same float operations on the host give the same bits.
  TokenIndexer indexer;
  const int vocab = 9, rows = 50;
  std::vector<std::int32_t> ids(rows);
  for (int n = 0; n < rows; ++n)
    ids[static_cast<std::size_t>(n)] = (n * 5 + n / 7) % (vocab - 2); // tokens 7, 8: none
  for (const int cols : {1, 31, 32, 33, 70}) {
    SCOPED_TRACE(::testing::Message() << cols << " columns");
    Mat<float> dy("dy", rows, cols), dwte("dwte", vocab, cols);
    randomize(dy, 21);
    randomize(dwte, 22);
    const auto dwte0 = on_host(dwte);
    const TokenIndex& index = indexer.build(exec, device_tokens(ids), 0, vocab);
    token_backward<float>(exec, index, dy, dwte);
    const auto hdy = on_host(dy);
    const auto hdwte = on_host(dwte);
    for (int v = 0; v < vocab; ++v)
      for (int h = 0; h < cols; ++h) {
        float acc = 0;
        for (int n = 0; n < rows; ++n)
          if (ids[static_cast<std::size_t>(n)] == v)
            acc += hdy(n, h);
        ASSERT_EQ(hdwte(v, h), dwte0(v, h) + acc) << "token " << v << ", column " << h;
      }
  }
}

TEST(KernelShapes, CausalSoftmaxRowsOfAttention) {
  const ExecSpace exec;
  // One head of one sequence with d = 1 and v = e_s: out(t) is then the probability row
  // itself, against a direct causal softmax in double.
  const int seq = 37, heads = 1, d = 1;
  Mat<double> q("q", seq, d), k("k", seq, d), v("v", seq, d), out("out", seq, d);
  randomize(q, 14, -4.0, 4.0);
  randomize(k, 15, -4.0, 4.0);
  Kokkos::deep_copy(v, 1.0);
  Tensor4<double> probs("probs", 1, heads, seq, seq);
  const AttentionWorkspace<double> work(1, heads, seq, d);
  attention_forward<double>(exec, q, k, v, heads, probs, work, out);
  const auto hq = on_host(q);
  const auto hk = on_host(k);
  const auto hp = on_host(probs);
  const auto ho = on_host(out);
  for (int t = 0; t < seq; ++t) {
    double mx = -1e300, sum = 0;
    for (int s = 0; s <= t; ++s)
      mx = std::max(mx, hq(t, 0) * hk(s, 0));
    for (int s = 0; s <= t; ++s)
      sum += std::exp(hq(t, 0) * hk(s, 0) - mx);
    for (int s = 0; s < seq; ++s) {
      const double expected = s <= t ? std::exp(hq(t, 0) * hk(s, 0) - mx) / sum : 0.0;
      ASSERT_NEAR(hp(0, 0, t, s), expected, 1e-14) << t << "," << s;
    }
    EXPECT_NEAR(ho(t, 0), 1.0, 1e-14) << "rows of probabilities sum to one";
  }
}

// On CPUs attention runs by (sequence, head) pair: the same BLAS calls and softmax rows
// as the separate passes, so the same bits (forward and backward).
// By pair the products read q, k, v, dout and write the results in place (leading
// dimension H); the passes use head-major copies.
class AttentionByPair : public ::testing::TestWithParam<std::array<int, 4>> {};

TEST_P(AttentionByPair, IsBitwiseThePasses) {
  const ExecSpace exec;
  const auto [batch, heads, seq, d] = GetParam();
  const int hidden = heads * d, n = batch * seq;
  Mat<float> q("q", n, hidden), k("k", n, hidden), v("v", n, hidden), dout("dout", n, hidden);
  randomize(q, 21, -2.0, 2.0);
  randomize(k, 22, -2.0, 2.0);
  randomize(v, 23, -1.0, 1.0);
  randomize(dout, 24, -1.0, 1.0);
  struct Result {
    Mat<float> out, dq, dk, dv;
    Tensor4<float> probs;
  };
  const auto run = [&](bool by_pair) {
    set_attention_by_pair(by_pair);
    Result r{Mat<float>("out", n, hidden), Mat<float>("dq", n, hidden), Mat<float>("dk", n, hidden),
             Mat<float>("dv", n, hidden), Tensor4<float>("probs", batch, heads, seq, seq)};
    const Tensor4<float> scratch("scratch", batch, heads, seq, seq);
    const AttentionWorkspace<float> work(batch, heads, seq, d);
    attention_forward<float>(exec, q, k, v, heads, r.probs, work, r.out);
    attention_backward<float>(exec, q, k, v, heads, r.probs, dout, scratch, work, r.dq, r.dk, r.dv);
    exec.fence();
    return r;
  };
  const Result pairs = run(true), passes = run(false);
  set_attention_by_pair(true);
  const auto same = [](const auto& a, const auto& b) {
    const auto ha = on_host(a);
    const auto hb = on_host(b);
    return std::memcmp(ha.data(), hb.data(), ha.span() * sizeof(float)) == 0;
  };
  EXPECT_TRUE(same(pairs.out, passes.out));
  EXPECT_TRUE(same(pairs.probs, passes.probs));
  EXPECT_TRUE(same(pairs.dq, passes.dq));
  EXPECT_TRUE(same(pairs.dk, passes.dk));
  EXPECT_TRUE(same(pairs.dv, passes.dv));
}

INSTANTIATE_TEST_SUITE_P(KernelShapes, AttentionByPair,
                         ::testing::Values(std::array<int, 4>{2, 3, 33, 8},
                                           std::array<int, 4>{1, 2, 256, 32}));

namespace {

// Distance in units in the last place between two finite floats of the same sign.
std::int64_t ulps(float a, float b) {
  return std::abs(static_cast<std::int64_t>(float_bits(a)) -
                  static_cast<std::int64_t>(float_bits(b)));
}

} // namespace

TEST(KernelShapes, CpuExpAndTanhAgainstDouble) {
  std::mt19937 gen(21);
  std::uniform_real_distribution<float> wide(-110.0f, 95.0f), narrow(-12.0f, 12.0f);
  std::vector<float> xs = {0.0f,    -0.0f,   1e-30f,  -1e-30f, 1.0f,   -1.0f,
                           0.5f,    88.0f,   88.7f,   89.0f,   -87.0f, -87.4f,
                           -100.0f, -103.9f, -104.0f, -104.5f, 20.0f,  -20.0f};
  for (int i = 0; i < 400000; ++i)
    xs.push_back(i % 2 == 0 ? wide(gen) : narrow(gen));
  std::int64_t worst_normal = 0;
  double worst_tanh = 0;
  for (const float x : xs) {
    const double exact = std::exp(static_cast<double>(x));
    const float e = exp_cpu(x);
    if (x > 89.0f) {
      ASSERT_TRUE(std::isinf(e) && e > 0) << x;
    } else if (x < -104.0f) {
      ASSERT_EQ(e, 0.0f) << x;
    } else if (exact >= 1.1754943508222875e-38 && exact <= 3.4028234663852886e38) {
      const std::int64_t d = ulps(e, static_cast<float>(exact));
      worst_normal = std::max(worst_normal, d);
      ASSERT_LE(d, 2) << "exp(" << x << ") = " << e << ", exact " << exact;
    } else if (exact < 1.1754943508222875e-38) { // subnormal: absolute error of a few steps
      ASSERT_LE(std::fabs(e - exact), 4 * 1.401298464324817e-45) << x;
    }
    const double t = std::tanh(static_cast<double>(x));
    const float tf = tanh_of<float>(x);
    worst_tanh = std::max(worst_tanh, std::fabs(tf - t));
    ASSERT_LE(std::fabs(tf - t), 2.0 * 5.960464477539063e-08) << "tanh(" << x << ")";
    ASSERT_EQ(tanh_of<float>(-x), -tf) << "tanh is odd";
  }
  EXPECT_TRUE(std::isnan(exp_cpu(std::nanf(""))));
  EXPECT_TRUE(std::isnan(tanh_of<float>(std::nanf(""))));
  EXPECT_EQ(exp_cpu(-INFINITY), 0.0f);
  EXPECT_TRUE(std::isinf(exp_cpu(INFINITY)));
  EXPECT_EQ(exp_cpu(0.0f), 1.0f);
  EXPECT_EQ(tanh_of<float>(INFINITY), 1.0f);
  RecordProperty("worst_exp_ulps", static_cast<int>(worst_normal));
  std::printf("exp_cpu: worst %lld ulp over normal results; tanh: worst absolute error %.3g\n",
              static_cast<long long>(worst_normal), worst_tanh);
}
