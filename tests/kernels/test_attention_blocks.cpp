// Causal attention over blocks of the sequence against the whole-sequence kernels: a
// sequence cut into 2, 3, 4 and 8 chunks (equal and unequal, and in the load-balanced
// order of context parallelism, chunks i and 2cp-1-i together), every block pair
// computed and merged, must give the output and the gradients of attention_forward and
// attention_backward; the block backward against central finite differences in double;
// blocks entirely in the future and rows that see no key of a block.

#include "cubelm/kernels/attention.hpp"
#include "cubelm/kernels/attention_blocks.hpp"

#include "view_helpers.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace cubelm;
using namespace cubelm::kernels;
using cubelm::testing::host;
using cubelm::testing::max_error;
using cubelm::testing::randomize;

namespace {

bool all_finite(const std::vector<double>& x) {
  return std::all_of(x.begin(), x.end(), [](double v) { return std::isfinite(v); });
}

// A split of [0, T) into chunks, and which chunks each of `ranks` ranks holds.
struct Split {
  std::string name;
  std::vector<std::int64_t> begin, len;
  std::vector<std::vector<int>> owned; // owned[r]: the chunks of rank r
};

Split contiguous(const std::string& name, const std::vector<std::int64_t>& lens) {
  Split s{name, {}, lens, {}};
  std::int64_t at = 0;
  for (std::size_t c = 0; c < lens.size(); ++c) {
    s.begin.push_back(at);
    at += lens[c];
    s.owned.push_back({static_cast<int>(c)});
  }
  return s;
}

// `chunks` chunks of T tokens, the first T % chunks one token longer.
std::vector<std::int64_t> near_equal(std::int64_t seq, int chunks) {
  std::vector<std::int64_t> lens;
  for (int c = 0; c < chunks; ++c)
    lens.push_back(seq / chunks + (c < seq % chunks ? 1 : 0));
  return lens;
}

// 2 cp chunks, rank r holding chunks r and 2 cp - 1 - r.
Split load_balanced(std::int64_t seq, int cp) {
  Split s = contiguous("load-balanced cp=" + std::to_string(cp), near_equal(seq, 2 * cp));
  s.owned.assign(static_cast<std::size_t>(cp), {});
  for (int r = 0; r < cp; ++r)
    s.owned[static_cast<std::size_t>(r)] = {r, 2 * cp - 1 - r};
  return s;
}

// The key chunks that reach a rank of a ring, in order: its own, then those of the
// rank before it, and so on.
std::vector<int> ring_order(const Split& s, int rank) {
  const int ranks = static_cast<int>(s.owned.size());
  std::vector<int> order;
  for (int step = 0; step < ranks; ++step)
    for (const int c : s.owned[static_cast<std::size_t>((rank - step + ranks) % ranks)])
      order.push_back(c);
  return order;
}

template <class T>
struct Tolerance;
template <>
struct Tolerance<float> {
  static constexpr double value = 2e-5;
};
template <>
struct Tolerance<double> {
  static constexpr double value = 1e-12;
};

// Whole-sequence attention against every block pair of a split, merged.
template <class T>
void expect_blocks_equal_whole(const Split& split) {
  const ExecSpace exec;
  SCOPED_TRACE(split.name);
  const int batch = 2, heads = 3, d = 4, hid = heads * d;
  std::int64_t seq = 0;
  for (const auto l : split.len)
    seq += l;
  const std::int64_t rows = batch * seq, n = batch * heads;
  Mat<T> q("q", rows, hid), k("k", rows, hid), v("v", rows, hid), dout("dout", rows, hid);
  randomize(q, 31, -3.0, 3.0); // peaked rows: the partial maxima differ widely
  randomize(k, 32);
  randomize(v, 33);
  randomize(dout, 34);
  Mat<T> out("out", rows, hid), dq("dq", rows, hid), dk("dk", rows, hid), dv("dv", rows, hid);
  Tensor4<T> probs("probs", batch, heads, seq, seq), scratch("scratch", batch, heads, seq, seq);
  const AttentionWorkspace<T> work(batch, heads, static_cast<int>(seq), d);
  attention_forward<T>(exec, q, k, v, heads, probs, work, out);
  attention_backward<T>(exec, q, k, v, heads, probs, dout, scratch, work, dq, dk, dv);

  const std::size_t chunks = split.len.size();
  auto block = [&](const char* name, std::size_t c) {
    return Batch<T>(std::string(name), n, split.len[c], d);
  };
  std::vector<Batch<T>> qb, kb, vb, dob, acc, dqb, dkb, dvb;
  std::vector<Mat<T>> lse, delta;
  for (std::size_t c = 0; c < chunks; ++c) {
    qb.push_back(block("qb", c));
    kb.push_back(block("kb", c));
    vb.push_back(block("vb", c));
    dob.push_back(block("dob", c));
    acc.push_back(block("acc", c));
    dqb.push_back(block("dqb", c)); // zero-initialised: the backward adds
    dkb.push_back(block("dkb", c));
    dvb.push_back(block("dvb", c));
    lse.push_back(Mat<T>("lse", n, split.len[c]));
    delta.push_back(Mat<T>("delta", n, split.len[c]));
    gather_heads<T>(exec, q, heads, split.begin[c], qb[c]);
    gather_heads<T>(exec, k, heads, split.begin[c], kb[c]);
    gather_heads<T>(exec, v, heads, split.begin[c], vb[c]);
    gather_heads<T>(exec, dout, heads, split.begin[c], dob[c]);
  }
  // Forward: each rank's query chunks over the key chunks in ring order. Blocks in the
  // future are computed too (they must merge as nothing).
  for (std::size_t r = 0; r < split.owned.size(); ++r)
    for (const int qc : split.owned[r]) {
      const auto c = static_cast<std::size_t>(qc);
      bool first = true;
      for (const int kc : ring_order(split, static_cast<int>(r))) {
        const auto e = static_cast<std::size_t>(kc);
        Batch<T> scores("scores", n, split.len[c], split.len[e]);
        if (first) {
          attention_block_forward<T>(exec, qb[c], kb[e], vb[e], split.begin[c], split.begin[e],
                                     scores, acc[c], lse[c]);
          first = false;
        } else {
          Batch<T> part("part", n, split.len[c], d);
          Mat<T> part_lse("part_lse", n, split.len[c]);
          attention_block_forward<T>(exec, qb[c], kb[e], vb[e], split.begin[c], split.begin[e],
                                     scores, part, part_lse);
          attention_combine<T>(exec, acc[c], lse[c], part, part_lse);
        }
      }
    }
  Mat<T> out_b("out_b", rows, hid), dq_b("dq_b", rows, hid), dk_b("dk_b", rows, hid),
      dv_b("dv_b", rows, hid);
  for (std::size_t c = 0; c < chunks; ++c)
    scatter_heads<T>(exec, acc[c], heads, split.begin[c], out_b);
  const auto o_b = host(out_b);
  EXPECT_TRUE(all_finite(o_b));
  EXPECT_LT(max_error(o_b, host(out)), Tolerance<T>::value) << "output";

  // Backward: every block pair, in the same order.
  for (std::size_t r = 0; r < split.owned.size(); ++r)
    for (const int qc : split.owned[r]) {
      const auto c = static_cast<std::size_t>(qc);
      attention_block_delta<T>(exec, acc[c], dob[c], delta[c]);
      for (const int kc : ring_order(split, static_cast<int>(r))) {
        const auto e = static_cast<std::size_t>(kc);
        Batch<T> p("p", n, split.len[c], split.len[e]), ds("ds", n, split.len[c], split.len[e]);
        attention_block_backward<T>(exec, qb[c], kb[e], vb[e], dob[c], lse[c], delta[c],
                                    split.begin[c], split.begin[e], p, ds, dqb[c], dkb[e], dvb[e]);
      }
    }
  for (std::size_t c = 0; c < chunks; ++c) {
    scatter_heads<T>(exec, dqb[c], heads, split.begin[c], dq_b);
    scatter_heads<T>(exec, dkb[c], heads, split.begin[c], dk_b);
    scatter_heads<T>(exec, dvb[c], heads, split.begin[c], dv_b);
  }
  EXPECT_LT(max_error(host(dq_b), host(dq)), Tolerance<T>::value) << "dq";
  EXPECT_LT(max_error(host(dk_b), host(dk)), Tolerance<T>::value) << "dk";
  EXPECT_LT(max_error(host(dv_b), host(dv)), Tolerance<T>::value) << "dv";
}

std::vector<Split> splits() {
  const std::int64_t seq = 23; // divisible by none of the chunk counts
  std::vector<Split> s;
  for (const int chunks : {1, 2, 3, 4, 8})
    s.push_back(contiguous(std::to_string(chunks) + " chunks", near_equal(seq, chunks)));
  s.push_back(contiguous("unequal chunks", {1, 9, 5, 8}));
  s.push_back(contiguous("single tokens", std::vector<std::int64_t>(7, 1)));
  s.push_back(load_balanced(seq, 2)); // 4 chunks on 2 ranks
  s.push_back(load_balanced(seq, 4)); // 8 chunks on 4 ranks
  s.push_back(load_balanced(24, 3));  // 6 equal chunks on 3 ranks
  return s;
}

} // namespace

TEST(AttentionBlocks, MaskOfABlockPair) {
  EXPECT_EQ(block_mask(0, 4, 4, 4), BlockMask::skip);    // keys after every query
  EXPECT_EQ(block_mask(4, 4, 0, 4), BlockMask::full);    // keys before every query
  EXPECT_EQ(block_mask(4, 4, 0, 5), BlockMask::full);    // the last key is the first query
  EXPECT_EQ(block_mask(4, 4, 0, 6), BlockMask::partial); // reaches past the first query
  EXPECT_EQ(block_mask(4, 4, 4, 4), BlockMask::partial); // the diagonal
  EXPECT_EQ(block_mask(4, 4, 7, 9), BlockMask::partial); // the last query sees one key
  EXPECT_EQ(block_mask(4, 4, 8, 1), BlockMask::skip);
  EXPECT_EQ(block_mask(4, 0, 0, 4), BlockMask::skip); // empty blocks
  EXPECT_EQ(block_mask(4, 4, 0, 0), BlockMask::skip);
}

TEST(AttentionBlocks, LoadBalancedChunksGiveEveryRankTheSameWork) {
  // 2 cp equal chunks, rank r holding chunks r and 2 cp - 1 - r: every rank has 2 cp + 1
  // block pairs to compute, 2 of them on the diagonal; contiguous chunks would give rank r
  // r + 1 pairs.
  for (const int cp : {1, 2, 3, 4, 8}) {
    const std::int64_t len = 5;
    for (int r = 0; r < cp; ++r) {
      int computed = 0, partial = 0;
      for (const int qc : {r, 2 * cp - 1 - r})
        for (int kc = 0; kc < 2 * cp; ++kc) {
          const BlockMask m = block_mask(qc * len, len, kc * len, len);
          computed += m != BlockMask::skip;
          partial += m == BlockMask::partial;
        }
      EXPECT_EQ(computed, 2 * cp + 1) << "cp " << cp << ", rank " << r;
      EXPECT_EQ(partial, 2) << "cp " << cp << ", rank " << r;
    }
  }
}

TEST(AttentionBlocks, BlockPairsEqualWholeAttentionInFloat) {
  for (const Split& s : splits())
    expect_blocks_equal_whole<float>(s);
}

TEST(AttentionBlocks, BlockPairsEqualWholeAttentionInDouble) {
  for (const Split& s : splits())
    expect_blocks_equal_whole<double>(s);
}

TEST(AttentionBlocks, BlocksInTheFutureAndRowsThatSeeNothing) {
  const ExecSpace exec;
  const int n = 3, d = 4;
  Batch<double> q("q", n, 4, d), k("k", n, 3, d), v("v", n, 3, d);
  randomize(q, 41);
  randomize(k, 42);
  randomize(v, 43);
  const double inf = std::numeric_limits<double>::infinity();
  // Keys at 8..10 for queries at 4..7: nothing is visible.
  {
    Batch<double> scores("s", n, 4, 3), out("out", n, 4, d);
    Mat<double> lse("lse", n, 4);
    Kokkos::deep_copy(out, std::nan(""));
    EXPECT_EQ(attention_block_forward<double>(exec, q, k, v, 4, 8, scores, out, lse),
              BlockMask::skip);
    for (const double x : host(out))
      ASSERT_EQ(x, 0.0);
    for (const double x : host(lse))
      ASSERT_EQ(x, -inf);
    // Merged into a partial result, it changes nothing (bitwise).
    Batch<double> acc("acc", n, 4, d);
    Mat<double> acc_lse("acc_lse", n, 4);
    randomize(acc, 44);
    randomize(acc_lse, 45, -2.0, 2.0);
    const auto before = host(acc), before_lse = host(acc_lse);
    attention_combine<double>(exec, acc, acc_lse, out, lse);
    EXPECT_EQ(host(acc), before);
    EXPECT_EQ(host(acc_lse), before_lse);
    // And a partial result merged into it is taken as it is.
    attention_combine<double>(exec, out, lse, acc, acc_lse);
    EXPECT_EQ(host(out), before);
    EXPECT_EQ(host(lse), before_lse);
    // Two empty parts stay empty, without NaN.
    Batch<double> e1("e1", n, 4, d), e2("e2", n, 4, d);
    Mat<double> l1("l1", n, 4), l2("l2", n, 4);
    Kokkos::deep_copy(l1, -inf);
    Kokkos::deep_copy(l2, -inf);
    attention_combine<double>(exec, e1, l1, e2, l2);
    for (const double x : host(e1))
      ASSERT_EQ(x, 0.0);
    for (const double x : host(l1))
      ASSERT_EQ(x, -inf);
    // The backward of the pair adds nothing.
    Batch<double> dq("dq", n, 4, d), dk("dk", n, 3, d), dv("dv", n, 3, d), dout("dout", n, 4, d);
    Batch<double> p("p", n, 4, 3), ds("ds", n, 4, 3);
    randomize(dq, 46);
    randomize(dk, 47);
    randomize(dv, 48);
    const auto dq0 = host(dq), dk0 = host(dk), dv0 = host(dv);
    EXPECT_EQ(attention_block_backward<double>(exec, q, k, v, dout, acc_lse, acc_lse, 4, 8, p, ds,
                                               dq, dk, dv),
              BlockMask::skip);
    EXPECT_EQ(host(dq), dq0);
    EXPECT_EQ(host(dk), dk0);
    EXPECT_EQ(host(dv), dv0);
  }
  // Keys at 5..7 for queries at 3..6: queries 3 and 4 see nothing, 5 sees one key, 6 two.
  {
    Batch<double> scores("s", n, 4, 3), out("out", n, 4, d);
    Mat<double> lse("lse", n, 4);
    EXPECT_EQ(attention_block_forward<double>(exec, q, k, v, 3, 5, scores, out, lse),
              BlockMask::partial);
    const auto hq = host(q), hk = host(k), hv = host(v), ho = host(out), hl = host(lse);
    for (int i = 0; i < n; ++i)
      for (int t = 0; t < 4; ++t) {
        const int seen = std::max(0, std::min(3, 3 + t - 5 + 1));
        const std::size_t row = static_cast<std::size_t>(i * 4 + t);
        if (seen == 0) {
          EXPECT_EQ(hl[row], -inf);
          for (int j = 0; j < d; ++j)
            EXPECT_EQ(ho[row * d + static_cast<std::size_t>(j)], 0.0);
          continue;
        }
        std::vector<double> sc(static_cast<std::size_t>(seen));
        double mx = -inf, z = 0;
        for (int s = 0; s < seen; ++s) {
          double x = 0;
          for (int j = 0; j < d; ++j)
            x += hq[row * d + j] * hk[static_cast<std::size_t>((i * 3 + s) * d + j)];
          sc[s] = x / std::sqrt(double(d));
          mx = std::max(mx, sc[s]);
        }
        for (const double x : sc)
          z += std::exp(x - mx);
        EXPECT_NEAR(hl[row], mx + std::log(z), 1e-14);
        for (int j = 0; j < d; ++j) {
          double o = 0;
          for (int s = 0; s < seen; ++s)
            o += std::exp(sc[s] - mx) / z * hv[static_cast<std::size_t>((i * 3 + s) * d + j)];
          EXPECT_NEAR(ho[row * d + static_cast<std::size_t>(j)], o, 1e-14);
        }
      }
  }
}

TEST(AttentionBlocks, BlockBackwardAgainstFiniteDifferences) {
  const ExecSpace exec;
  // Queries at 4..8 over three key blocks: 0..2 (all visible), 3..6 (the diagonal) and
  // 7..9 (queries 4-6 see none of it). loss = <w, merged output>.
  const int n = 2, d = 3, tq = 5;
  const std::int64_t q_offset = 4;
  const std::vector<std::int64_t> k_offset = {0, 3, 7}, k_len = {3, 4, 3};
  Batch<double> q("q", n, tq, d), w("w", n, tq, d), out("out", n, tq, d), part("part", n, tq, d);
  Mat<double> lse("lse", n, tq), part_lse("part_lse", n, tq), delta("delta", n, tq);
  randomize(q, 51, -2.0, 2.0);
  randomize(w, 52);
  std::vector<Batch<double>> k, v, dk, dv, scores, ds;
  for (std::size_t b = 0; b < k_len.size(); ++b) {
    k.emplace_back("k", n, k_len[b], d);
    v.emplace_back("v", n, k_len[b], d);
    dk.emplace_back("dk", n, k_len[b], d);
    dv.emplace_back("dv", n, k_len[b], d);
    scores.emplace_back("scores", n, tq, k_len[b]);
    ds.emplace_back("ds", n, tq, k_len[b]);
    randomize(k[b], 53 + static_cast<unsigned>(b));
    randomize(v[b], 63 + static_cast<unsigned>(b));
  }
  auto forward = [&] {
    // The future-most block first: the merge starts from rows that see nothing.
    for (std::size_t b = k_len.size(); b-- > 0;) {
      const bool first = b + 1 == k_len.size();
      attention_block_forward<double>(exec, q, k[b], v[b], q_offset, k_offset[b], scores[b],
                                      first ? out : part, first ? lse : part_lse);
      if (!first)
        attention_combine<double>(exec, out, lse, part, part_lse);
    }
  };
  auto loss = [&] {
    forward();
    const auto o = host(out), ww = host(w);
    double s = 0;
    for (std::size_t i = 0; i < o.size(); ++i)
      s += o[i] * ww[i];
    return s;
  };
  forward();
  Batch<double> dq("dq", n, tq, d);
  attention_block_delta<double>(exec, out, w, delta);
  for (std::size_t b = 0; b < k_len.size(); ++b)
    attention_block_backward<double>(exec, q, k[b], v[b], w, lse, delta, q_offset, k_offset[b],
                                     scores[b], ds[b], dq, dk[b], dv[b]);
  auto fd_error = [&](const Batch<double>& param, const Batch<double>& analytic) {
    return cubelm::testing::fd_error(param, analytic, loss).worst;
  };
  constexpr double kTol = 1e-7;
  EXPECT_LT(fd_error(q, dq), kTol) << "dq";
  for (std::size_t b = 0; b < k_len.size(); ++b) {
    EXPECT_LT(fd_error(k[b], dk[b]), kTol) << "dk of key block " << b;
    EXPECT_LT(fd_error(v[b], dv[b]), kTol) << "dv of key block " << b;
  }
}

TEST(AttentionBlocks, GatherAndScatterHeads) {
  const ExecSpace exec;
  const int batch = 2, heads = 3, d = 2, seq = 7;
  Mat<double> x("x", batch * seq, heads * d), y("y", batch * seq, heads * d);
  randomize(x, 71);
  Kokkos::deep_copy(y, 1.0);
  Batch<double> blk("blk", batch * heads, 3, d);
  gather_heads<double>(exec, x, heads, 2, blk);
  const auto hx = host(x), hb = host(blk);
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int t = 0; t < 3; ++t)
        for (int j = 0; j < d; ++j)
          ASSERT_EQ(hb[static_cast<std::size_t>(((b * heads + h) * 3 + t) * d + j)],
                    hx[static_cast<std::size_t>((b * seq + 2 + t) * heads * d + h * d + j)]);
  scatter_heads<double>(exec, blk, heads, 2, y, true);
  const auto hy = host(y);
  for (int r = 0; r < batch * seq; ++r)
    for (int c = 0; c < heads * d; ++c) {
      const int t = r % seq;
      const std::size_t at = static_cast<std::size_t>(r * heads * d + c);
      ASSERT_EQ(hy[at], t >= 2 && t < 5 ? 1.0 + hx[at] : 1.0) << r << "," << c;
    }
  scatter_heads<double>(exec, blk, heads, 2, y);
  const auto hz = host(y);
  for (int r = 0; r < batch * seq; ++r) {
    const int t = r % seq;
    const std::size_t at = static_cast<std::size_t>(r * heads * d);
    ASSERT_EQ(hz[at], t >= 2 && t < 5 ? hx[at] : 1.0);
  }
}
