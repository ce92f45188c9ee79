#include "cubelm/model/generator.hpp"

#include "cubelm/core/error.hpp"
#include "cubelm/cost/deck.hpp"
#include "cubelm/cost/shape.hpp"
#include "cubelm/kernels/blas.hpp"
#include "cubelm/kernels/decode.hpp"
#include "cubelm/kernels/elementwise.hpp"
#include "cubelm/kernels/embedding.hpp"
#include "cubelm/kernels/layernorm.hpp"

#include <algorithm>

namespace cubelm::model {

using kernels::Mat;
using kernels::Vec;

namespace {

// Rows [begin, end) of a matrix, itself a row-major matrix.
template <class M>
M rows_of(const M& m, std::int64_t begin, std::int64_t end) {
  return Kokkos::subview(m, Kokkos::make_pair(begin, end), Kokkos::ALL);
}

// y = x w^T + beta y for x [n, k] and w [m, k] (a linear layer's weights as [out, in]): for
// one row a matrix-vector product that reads each weight row once, else a gemm.
void product(const ExecSpace& exec, const Mat<float>& x, const Mat<float>& w, float beta,
             const Mat<float>& y) {
  if (x.extent(0) == 1)
    kernels::matvec(exec, w, Vec<float>(Kokkos::subview(x, 0, Kokkos::ALL)), beta,
                    Vec<float>(Kokkos::subview(y, 0, Kokkos::ALL)));
  else
    kernels::gemm(exec, false, true, 1.0f, x, w, beta, y);
}

template <class V>
std::int64_t bytes_of(const V& v) {
  return static_cast<std::int64_t>(v.span() * sizeof(typename V::value_type));
}

// The stored tensor /model/<name> of `shape` [rows, cols], on the device: as stored, or
// transposed ([cols, rows]: a linear layer's [in, out] weights as [out, in], whose rows
// product() reads contiguously).
Mat<float> read_matrix(const io::CheckpointReader& r, const std::string& name, std::int64_t rows,
                       std::int64_t cols, bool transpose = false) {
  const std::vector<std::uint64_t> shape{static_cast<std::uint64_t>(rows),
                                         static_cast<std::uint64_t>(cols)};
  const std::string path = "/model/" + name;
  r.expect_shape(path, shape);
  Mat<float> m(Kokkos::view_alloc(Kokkos::WithoutInitializing, "cubelm::generator/" + name),
               transpose ? cols : rows, transpose ? rows : cols);
  auto host = Kokkos::create_mirror_view(m);
  if (!transpose) {
    r.read(path, io::Block::whole(shape), host.data());
  } else {
    std::vector<float> stored(static_cast<std::size_t>(rows * cols));
    r.read(path, io::Block::whole(shape), stored.data());
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j)
        host(j, i) = stored[static_cast<std::size_t>(i * cols + j)];
  }
  Kokkos::deep_copy(m, host);
  return m;
}

// A linear layer's weights [in, out], as [out, in].
Mat<float> read_weights(const io::CheckpointReader& r, const std::string& name, std::int64_t in,
                        std::int64_t out) {
  return read_matrix(r, name, in, out, true);
}

Vec<float> read_vector(const io::CheckpointReader& r, const std::string& name, std::int64_t n) {
  const std::vector<std::uint64_t> shape{static_cast<std::uint64_t>(n)};
  const std::string path = "/model/" + name;
  r.expect_shape(path, shape);
  Vec<float> v(Kokkos::view_alloc(Kokkos::WithoutInitializing, "cubelm::generator/" + name), n);
  auto host = Kokkos::create_mirror_view(v);
  r.read(path, io::Block::whole(shape), host.data());
  Kokkos::deep_copy(v, host);
  return v;
}

template <class M>
M buffer(const std::string& name, std::int64_t rows, std::int64_t cols) {
  return M(Kokkos::view_alloc(Kokkos::WithoutInitializing, "cubelm::generator/" + name), rows,
           cols);
}

} // namespace

ModelConfig checkpoint_model(const io::CheckpointReader& reader) {
  const std::string text = reader.string_attribute("/", "deck");
  try {
    return cost::parse_deck(text, reader.path() + " (its deck)").model;
  } catch (const Error& e) {
    throw Error("checkpoint " + reader.path() +
                    ": cannot tell the model's shape: this cubelm cannot read the deck it holds (" +
                    e.what() + ")",
                true);
  }
}

// A feed-forward network of the GPT-2 shape: the MLP, or one expert. Every weight matrix of
// the generator is held as [out, in] (read_weights).
struct Mlp {
  Mat<float> w1, w2;
  Vec<float> b1, b2;
};

struct Generator::Layer {
  Vec<float> ln1_gamma, ln1_beta, ln2_gamma, ln2_beta;
  Mat<float> wq, wk, wv, wo; // [out, in]
  Vec<float> bq, bk, bv, bo;
  Mlp mlp;                  // a dense layer's
  Mat<float> router;        // an MoE layer's ([E, H]) and its experts
  std::vector<Mlp> experts; //
  Mat<float> keys, values;  // the cache: [seq_len, H] each
};

Generator::Generator(const io::CheckpointReader& r, const ModelConfig& config, int rows)
    : config_(config), rows_(std::max(1, std::min(rows, config.seq_len))) {
  const std::int64_t H = config.hidden, V = config.vocab_size, T = config.seq_len, F = 4 * H;
  CUBELM_ASSERT(config.heads > 0 && H % config.heads == 0,
                "hidden must be a multiple of heads (the deck's rule)");
  wte_ = read_matrix(r, "wte", V, H);
  wpe_ = read_matrix(r, "wpe", T, H);
  for (int l = 0; l < config.layers; ++l) {
    const bool moe = config.moe_layer(l);
    const cost::LayerParams n = cost::layer_params(l, moe ? config.experts : 0);
    Layer y;
    y.ln1_gamma = read_vector(r, n.ln1 + "/gamma", H);
    y.ln1_beta = read_vector(r, n.ln1 + "/beta", H);
    y.ln2_gamma = read_vector(r, n.ln2 + "/gamma", H);
    y.ln2_beta = read_vector(r, n.ln2 + "/beta", H);
    y.wq = read_weights(r, n.qkv[0], H, H);
    y.wk = read_weights(r, n.qkv[1], H, H);
    y.wv = read_weights(r, n.qkv[2], H, H);
    y.wo = read_weights(r, n.wo, H, H);
    y.bq = read_vector(r, n.qkv_bias[0], H);
    y.bk = read_vector(r, n.qkv_bias[1], H);
    y.bv = read_vector(r, n.qkv_bias[2], H);
    y.bo = read_vector(r, n.bo, H);
    if (moe) {
      y.router = read_weights(r, n.router, H, config.experts);
      for (int e = 0; e < config.experts; ++e)
        y.experts.push_back(Mlp{read_weights(r, n.ew1[e], H, F), read_weights(r, n.ew2[e], F, H),
                                read_vector(r, n.eb1[e], F), read_vector(r, n.eb2[e], H)});
    } else {
      y.mlp = Mlp{read_weights(r, n.w1, H, F), read_weights(r, n.w2, F, H), read_vector(r, n.b1, F),
                  read_vector(r, n.b2, H)};
    }
    const std::string cache = "layers/" + std::to_string(l) + "/";
    y.keys = buffer<Mat<float>>(cache + "keys", T, H);
    y.values = buffer<Mat<float>>(cache + "values", T, H);
    layers_.push_back(std::move(y));
  }
  lnf_gamma_ = read_vector(r, "ln_f/gamma", H);
  lnf_beta_ = read_vector(r, "ln_f/beta", H);

  const std::int64_t R = rows_;
  x_ = buffer<Mat<float>>("x", R, H);
  y_ = buffer<Mat<float>>("ln_out", R, H);
  q_ = buffer<Mat<float>>("q", R, H);
  att_ = buffer<Mat<float>>("att", R, H);
  h_ = buffer<Mat<float>>("hidden", R, F);
  g_ = buffer<Mat<float>>("gelu", R, F);
  th_ = buffer<Mat<float>>("tanh", R, F);
  scores_ = buffer<Mat<float>>("scores", R * config.heads, T);
  logits_ = buffer<Mat<float>>("logits", R, V);
  mean_ = Vec<float>("cubelm::generator/mean", R);
  rstd_ = Vec<float>("cubelm::generator/rstd", R);
  tokens_ = kernels::Tokens("cubelm::generator/tokens", R);
  tokens_host_ = Kokkos::create_mirror_view(tokens_);
  if (config.experts > 1) {
    const int k = config.top_k;
    probs_ = buffer<Mat<float>>("moe/probs", R, config.experts);
    gate_ = buffer<Mat<float>>("moe/gate", R, k);
    expert_out_ = buffer<Mat<float>>("moe/expert_out", R * k, H);
    moe_out_ = buffer<Mat<float>>("moe/out", R, H);
    choice_ = kernels::IntMat("cubelm::generator/moe/choice", R, k);
    choice_host_ = Kokkos::create_mirror_view(choice_);
    slot_ = kernels::IntMat("cubelm::generator/moe/slot", R, k);
    auto slot = Kokkos::create_mirror_view(slot_);
    for (std::int64_t t = 0; t < R; ++t)
      for (int j = 0; j < k; ++j)
        slot(t, j) = static_cast<int>(t * k + j);
    Kokkos::deep_copy(slot_, slot);
  }
}

Generator::~Generator() = default;

std::int64_t Generator::bytes() const {
  std::int64_t total = bytes_of(wte_) + bytes_of(wpe_) + bytes_of(lnf_gamma_) +
                       bytes_of(lnf_beta_) + bytes_of(tokens_) + bytes_of(choice_) +
                       bytes_of(slot_) + bytes_of(mean_) + bytes_of(rstd_);
  for (const Mat<float>* m : {&x_, &y_, &q_, &att_, &h_, &g_, &th_, &scores_, &logits_, &probs_,
                              &gate_, &expert_out_, &moe_out_})
    total += bytes_of(*m);
  const auto add_mlp = [&](const Mlp& m) {
    total += bytes_of(m.w1) + bytes_of(m.w2) + bytes_of(m.b1) + bytes_of(m.b2);
  };
  for (const Layer& y : layers_) {
    for (const Vec<float>* v :
         {&y.ln1_gamma, &y.ln1_beta, &y.ln2_gamma, &y.ln2_beta, &y.bq, &y.bk, &y.bv, &y.bo})
      total += bytes_of(*v);
    for (const Mat<float>* m : {&y.wq, &y.wk, &y.wv, &y.wo, &y.router, &y.keys, &y.values})
      total += bytes_of(*m);
    add_mlp(y.mlp);
    for (const Mlp& e : y.experts)
      add_mlp(e);
  }
  return total;
}

const std::vector<float>& Generator::feed(const std::vector<std::int32_t>& tokens) {
  CUBELM_ASSERT(!tokens.empty(), "Generator::feed needs at least one token");
  for (std::size_t begin = 0; begin < tokens.size(); begin += static_cast<std::size_t>(rows_))
    run(tokens, begin, std::min(tokens.size(), begin + static_cast<std::size_t>(rows_)), false);
  return logits_host_;
}

std::vector<float> Generator::feed_all(const std::vector<std::int32_t>& tokens) {
  CUBELM_ASSERT(!tokens.empty(), "Generator::feed_all needs at least one token");
  std::vector<float> all;
  all.reserve(tokens.size() * static_cast<std::size_t>(config_.vocab_size));
  for (std::size_t begin = 0; begin < tokens.size(); begin += static_cast<std::size_t>(rows_)) {
    run(tokens, begin, std::min(tokens.size(), begin + static_cast<std::size_t>(rows_)), true);
    all.insert(all.end(), logits_host_.begin(), logits_host_.end());
  }
  return all;
}

void Generator::run(const std::vector<std::int32_t>& tokens, std::size_t begin, std::size_t end,
                    bool all) {
  const ModelConfig& c = config_;
  const std::int64_t n = static_cast<std::int64_t>(end - begin), p = position_;
  if (p + n > c.seq_len)
    throw Error("positions " + std::to_string(p) + " to " + std::to_string(p + n - 1) +
                " do not fit the model's context: model.seq_len = " + std::to_string(c.seq_len) +
                " positions (0 to " + std::to_string(c.seq_len - 1) + ")");
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int32_t t = tokens[begin + static_cast<std::size_t>(i)];
    if (t < 0 || t >= c.vocab_size)
      throw Error("token " + std::to_string(begin + static_cast<std::size_t>(i)) + " is " +
                  std::to_string(t) + ", outside the vocabulary [0, " +
                  std::to_string(c.vocab_size) + ")");
    tokens_host_(i) = t;
  }
  const ExecSpace exec;
  Kokkos::deep_copy(exec, tokens_, tokens_host_);
  const kernels::Tokens tok = Kokkos::subview(tokens_, Kokkos::make_pair(std::int64_t{0}, n));
  const Mat<float> x = rows_of(x_, 0, n), y = rows_of(y_, 0, n), q = rows_of(q_, 0, n),
                   att = rows_of(att_, 0, n), h = rows_of(h_, 0, n), g = rows_of(g_, 0, n),
                   th = rows_of(th_, 0, n), scores = rows_of(scores_, 0, n * c.heads);
  const Vec<float> mean = Kokkos::subview(mean_, Kokkos::make_pair(std::int64_t{0}, n)),
                   rstd = Kokkos::subview(rstd_, Kokkos::make_pair(std::int64_t{0}, n));

  kernels::embedding_lookup(exec, tok, wte_, 0, x);
  kernels::position_add(exec, wpe_, kernels::Positions(c.seq_len), x, p);
  for (const Layer& l : layers_) {
    // Attention: this chunk's keys and values go to their rows of the cache first.
    kernels::layernorm_forward(exec, x, l.ln1_gamma, l.ln1_beta, y, mean, rstd);
    const Mat<float> k = rows_of(l.keys, p, p + n), v = rows_of(l.values, p, p + n);
    product(exec, y, l.wq, 0.0f, q);
    kernels::bias_add(exec, q, l.bq);
    product(exec, y, l.wk, 0.0f, k);
    kernels::bias_add(exec, k, l.bk);
    product(exec, y, l.wv, 0.0f, v);
    kernels::bias_add(exec, v, l.bv);
    kernels::cached_attention(exec, q, l.keys, l.values, c.heads, p, scores, att);
    product(exec, att, l.wo, 1.0f, x); // x += att wo
    kernels::bias_add(exec, x, l.bo);
    // The feed-forward: the MLP or the experts.
    kernels::layernorm_forward(exec, x, l.ln2_gamma, l.ln2_beta, y, mean, rstd);
    if (!l.experts.empty()) {
      moe(l, n);
      continue;
    }
    product(exec, y, l.mlp.w1, 0.0f, h);
    kernels::bias_add(exec, h, l.mlp.b1);
    kernels::gelu_forward(exec, h, g, th);
    product(exec, g, l.mlp.w2, 1.0f, x); // x += gelu(h) w2
    kernels::bias_add(exec, x, l.mlp.b2);
  }
  kernels::layernorm_forward(exec, x, lnf_gamma_, lnf_beta_, y, mean, rstd);
  // The tied head over the real vocabulary: logits = y wte^T, for every row or the last.
  const Mat<float> head_in = all ? y : rows_of(y, n - 1, n);
  const Mat<float> logits = rows_of(logits_, 0, head_in.extent(0));
  product(exec, head_in, wte_, 0.0f, logits);
  logits_host_.resize(logits.size());
  const Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace,
                     Kokkos::MemoryTraits<Kokkos::Unmanaged>>
      host(logits_host_.data(), logits.extent(0), logits.extent(1));
  Kokkos::deep_copy(exec, host, logits);
  exec.fence();
  position_ += static_cast<int>(n);
}

// An MoE feed-forward on y (ln2's output) of n rows, added to x: the router's softmax and
// top-k with renormalised gates (kernels::moe_route, as training routes), each (token,
// choice) pair through its expert, and the gated sum (docs/model.md). Every pair is
// computed: with one token at a time no capacity could bind.
void Generator::moe(const Layer& l, std::int64_t n) {
  const ExecSpace exec;
  const int k = config_.top_k;
  const Mat<float> x = rows_of(x_, 0, n), y = rows_of(y_, 0, n), probs = rows_of(probs_, 0, n),
                   gate = rows_of(gate_, 0, n), out = rows_of(moe_out_, 0, n);
  const kernels::IntMat choice = rows_of(choice_, 0, n), slot = rows_of(slot_, 0, n);
  product(exec, y, l.router, 0.0f, probs);
  kernels::moe_route(exec, probs, choice, gate);
  // The choices decide which weights each pair's products read.
  Kokkos::deep_copy(exec, choice_host_, choice_);
  exec.fence();
  const Mat<float> h = rows_of(h_, 0, 1), g = rows_of(g_, 0, 1), th = rows_of(th_, 0, 1);
  for (std::int64_t t = 0; t < n; ++t)
    for (int j = 0; j < k; ++j) {
      const Mlp& e = l.experts[static_cast<std::size_t>(choice_host_(t, j))];
      const std::int64_t row = t * k + j;
      const Mat<float> o = rows_of(expert_out_, row, row + 1);
      product(exec, rows_of(y, t, t + 1), e.w1, 0.0f, h);
      kernels::bias_add(exec, h, e.b1);
      kernels::gelu_forward(exec, h, g, th);
      product(exec, g, e.w2, 0.0f, o);
      kernels::bias_add(exec, o, e.b2);
    }
  kernels::moe_combine(exec, expert_out_, slot, gate, out);
  kernels::add_inplace(exec, x, out);
}

} // namespace cubelm::model
