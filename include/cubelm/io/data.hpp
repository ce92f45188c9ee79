#pragma once
/// \file
/// \brief Token files (llm.c, Megatron, raw text), the two samplers that cut
/// them into batches, and a synthetic corpus with a known entropy floor.
///
/// A corpus is read whole into host memory as int32 tokens. Every way a file
/// can be wrong is a cubelm::Error (not collective: only the rank that reads
/// the file sees it) whose message names the file, the byte offset or token
/// index, the value found and the rule it breaks.
///
/// ## File formats (all integers little-endian)
///
/// **llm.c `.bin`**: a header of 256 int32, of which [0] is the magic number
/// 20240520, [1] the version (only 1: uint16 tokens) and [2] the token count
/// N; the other 253 are zero. Then N uint16 tokens. The file must be exactly
/// 1024 + 2·N bytes: shorter is truncated, longer is refused as llm.c does.
///
/// **Megatron `.bin` + `.idx`**: the `.idx` file holds, at byte offsets
///  -  0: 9 bytes `MMIDIDX\0\0`;
///  -  9: u64 version, must be 1;
///  - 17: u8 dtype code, 8 = uint16 or 4 = int32 (other codes are refused);
///  - 18: u64 sequence count S;
///  - 26: u64 document count D (the length of the document index array);
///  - 34: int32 lengths[S] (tokens per sequence);
///  - 34 + 4·S: int64 pointers[S] (byte offset of each sequence in `.bin`);
///  - 34 + 12·S: int64 document indices[D] (nondecreasing, within [0, S]).
///
/// Every sequence must lie inside `.bin` (pointer aligned to the token size,
/// pointer + length·size <= file size). The corpus is the concatenation of
/// all S sequences in index order; document boundaries are not kept (the
/// samplers cut across them, as llm.c does for its end-of-text separated
/// shards). The path may be the common prefix (`data/corpus`) or either file
/// (`data/corpus.bin`, `data/corpus.idx`): a trailing `.bin` or `.idx` is
/// stripped to find the prefix.
///
/// **Raw text**: the bytes of the file are the tokens (byte vocabulary, 256).
///
/// ## Samplers (N tokens, global batch B sequences, context T)
///
/// Both give the first token s of sequence k (0-based, 0 <= k < B) of step t
/// (0-based). The sequence's inputs are tokens[s .. s+T) and its targets
/// tokens[s+1 .. s+T+1). The start depends only on (t, k), never on which rank
/// asks, so the global batch and the loss do not depend on the layout. Both
/// refuse N < T + 2.
///
/// **sequential** (DESIGN §6): s = ((t·B + k)·T) mod (N − T − 1).
///
/// **shuffle**: the corpus is cut into W = (N − 1) / T windows of T + 1
/// tokens, window w starting at w·T (consecutive windows share one token, so
/// tokens 1 .. W·T are each a target exactly once per epoch; the last
/// (N − 1) mod T tokens are never read). Let
/// i = t·B + k, epoch e = i / W. Sequence k of step t is window perm_e[i mod W]
/// and starts at perm_e[i mod W]·T. perm_e is a Fisher–Yates shuffle of
/// 0..W−1 driven by Rng(seed, e): start from the identity, then for
/// j = W−1 down to 1 swap entries j and Rng::below(j + 1).
///
/// ## Portable random numbers
///
/// Rng is xoshiro256** (Blackman & Vigna) seeded by splitmix64, with integers
/// below n by rejection, so the same seed gives the same numbers with every
/// compiler and standard library (std::shuffle and the std distributions do
/// not promise that). Seeding: a splitmix64 state x = seed XOR
/// splitmix64_mix(stream); the four xoshiro words are the next four splitmix64
/// outputs from x. Here splitmix64 advances x by 0x9E3779B97F4A7C15 and
/// returns splitmix64_mix(x), and splitmix64_mix(z) is
/// z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27; z *= 0x94D049BB133111EB;
/// z ^= z >> 31.
///
/// ## Synthetic corpus
///
/// A first-order Markov chain over V tokens in which every token a has exactly
/// b distinct successors succ[a][0..b), each taken with probability 1/b.
/// Generator, all from one Rng(seed, kSyntheticStream):
///  1. successors: p = (0, 1, .., V−1); for a = 0..V−1, for i = 0..b−1:
///     swap p[i] and p[i + below(V − i)], then succ[a][i] = p[i]
///     (p is not reset between tokens, so each row is a partial Fisher–Yates
///     shuffle of the previous permutation and its b entries are distinct);
///  2. tokens: x_0 = below(V); x_i = succ[x_{i−1}][below(b)] for i >= 1.
///
/// Given the previous token the next one is uniform over b choices, and the
/// chain is Markov, so no model can do better than ln(b) nats per predicted
/// token: synthetic_entropy_floor(b). (The chain may settle in a closed subset
/// of the vocabulary; that does not change the floor.)

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cubelm::io {

/// \brief A corpus in memory and where it came from (for messages and logs).
struct TokenData {
  std::string source;               ///< the file(s) read, e.g. "data/c.bin" or "data/c.{bin,idx}"
  std::vector<std::int32_t> tokens; ///< every token in [0, vocab_size)
};

/// \brief Reads an llm.c token file; every token must be < vocab_size.
std::vector<std::int32_t> read_llmc(const std::string& path, int vocab_size);
/// \brief Reads a Megatron `.bin` + `.idx` pair (path: prefix or either file)
/// and concatenates its sequences in index order; every token must be in
/// [0, vocab_size).
std::vector<std::int32_t> read_megatron(const std::string& path, int vocab_size);
/// \brief Reads a file's bytes as tokens; every byte must be < vocab_size.
std::vector<std::int32_t> read_text(const std::string& path, int vocab_size = 256);

/// \brief Reads a corpus; `format` is "llmc", "megatron" or "text".
TokenData load_tokens(const std::string& format, const std::string& path, int vocab_size);

/// \brief Writes an llm.c token file; refuses tokens outside [0, 65535].
void write_llmc(const std::string& path, const std::vector<std::int32_t>& tokens);
/// \brief Writes prefix.bin and prefix.idx, one sequence per document.
///
/// The dtype is uint16 (code 8) when every token fits, int32 (code 4)
/// otherwise; negative tokens are refused. As Megatron's own writer does, the
/// document index array has D = documents + 1 entries 0, 1, .., S, so that
/// document d is sequences [index[d], index[d+1]).
void write_megatron(const std::string& prefix,
                    const std::vector<std::vector<std::int32_t>>& documents);
/// \brief Concatenates the bytes of text files into one llm.c file (byte
/// vocabulary, 256) and returns the token count; backs `cubelm data`.
std::int64_t text_to_llmc(const std::vector<std::string>& inputs, const std::string& output);

/// \brief splitmix64_mix (see the file comment): a bijective 64-bit hash.
std::uint64_t splitmix64_mix(std::uint64_t z);

/// \brief Portable xoshiro256** generator, seeded as the file comment says.
class Rng {
public:
  /// \brief Independent streams for one seed: epochs, the synthetic corpus.
  explicit Rng(std::uint64_t seed, std::uint64_t stream = 0);
  /// \brief Seeds the four state words directly (for reference tests).
  Rng(std::uint64_t s0, std::uint64_t s1, std::uint64_t s2, std::uint64_t s3);
  /// \brief The next 64 random bits.
  std::uint64_t next();
  /// \brief Uniform integer in [0, n), n >= 1: draws r = next() until
  /// r >= 2^64 mod n, then returns r mod n.
  std::uint64_t below(std::uint64_t n);

private:
  std::uint64_t s_[4];
};

/// \brief The Rng stream of the synthetic corpus; far from any epoch number,
/// so that one seed can drive both the corpus and the shuffle sampler.
inline constexpr std::uint64_t kSyntheticStream = ~std::uint64_t{0};

/// \brief B sequences of T tokens, row-major [B][T]; row r is sequence
/// first + r of the global batch.
struct Batch {
  int B = 0;
  int T = 0;
  int first = 0; ///< global index of row 0
  std::vector<std::int32_t> inputs;
  std::vector<std::int32_t> targets;
};

/// \brief Where sequence k of step t starts; the file comment defines both kinds.
class Sampler {
public:
  virtual ~Sampler() = default;
  /// \brief First token of sequence k (0 <= k < B) of step `step`.
  virtual std::int64_t start(std::int64_t step, std::int64_t k) const = 0;
  /// \brief "sequential" or "shuffle".
  virtual std::string name() const = 0;

  std::int64_t token_count() const { return n_; }
  int batch() const { return batch_; }
  int context() const { return context_; }

  /// \brief Fills the whole global batch of `step` from `tokens` (N of them).
  void fill(const std::vector<std::int32_t>& tokens, std::int64_t step, Batch& out) const;
  /// \brief Fills only rows [first, first + count) of the global batch, as a
  /// data-parallel rank does for its own sequences.
  void fill_rows(const std::vector<std::int32_t>& tokens, std::int64_t step, int first, int count,
                 Batch& out) const;

protected:
  /// Refuses N < T + 2 (and B, T < 1) with an Error.
  Sampler(std::int64_t n, int batch, int context);

private:
  std::int64_t n_;
  int batch_;
  int context_;
};

/// \brief s = ((t·B + k)·T) mod (N − T − 1), as DESIGN §6 states.
class SequentialSampler : public Sampler {
public:
  SequentialSampler(std::int64_t n, int batch, int context);
  std::int64_t start(std::int64_t step, std::int64_t k) const override;
  std::string name() const override { return "sequential"; }
};

/// \brief Each epoch visits the W = (N − 1) / T windows once, in an order
/// shuffled by (seed, epoch).
///
/// The permutation of the last epoch asked for is cached, so start() is cheap
/// for consecutive steps; the cache makes one object unsafe to share between
/// threads.
class ShuffleSampler : public Sampler {
public:
  ShuffleSampler(std::int64_t n, int batch, int context, std::uint64_t seed);
  std::int64_t start(std::int64_t step, std::int64_t k) const override;
  std::string name() const override { return "shuffle"; }

  /// \brief W, the number of windows of T + 1 tokens.
  std::int64_t windows() const { return windows_; }
  /// \brief perm_e: the window order of epoch e (a copy; W entries).
  std::vector<std::int64_t> permutation(std::int64_t epoch) const;

private:
  const std::vector<std::int64_t>& cached_permutation(std::int64_t epoch) const;

  std::uint64_t seed_;
  std::int64_t windows_;
  mutable std::int64_t cached_epoch_ = -1;
  mutable std::vector<std::int64_t> perm_;
};

/// \brief Builds a sampler by name: "sequential" or "shuffle".
std::unique_ptr<Sampler> make_sampler(const std::string& kind, std::int64_t n, int batch,
                                      int context, std::uint64_t seed);

/// \brief succ[a][i] of the synthetic chain, row-major [vocab][branching].
std::vector<std::int32_t> synthetic_successors(int vocab, int branching, std::uint64_t seed);
/// \brief `count` tokens of the synthetic Markov chain (file comment).
std::vector<std::int32_t> make_synthetic_corpus(int vocab, std::int64_t count, int branching,
                                                std::uint64_t seed);
/// \brief ln(branching): the least mean cross-entropy, in nats per token, that
/// any model can reach on the synthetic corpus.
double synthetic_entropy_floor(int branching);

} // namespace cubelm::io
