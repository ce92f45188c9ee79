#pragma once
/// \file
/// \brief The TOML input deck: keys, documented defaults, validation.
///
/// Every key and its default is listed in docs/deck.md. Unknown keys, wrong
/// types and impossible values are cubelm::Error messages that name the file,
/// the line, the key, the value and the rule. Validation needs no MPI and
/// allocates nothing, so `cubelm check` can run it on a login node.

#include "cubelm/comm/layout.hpp"

#include <cstdint>
#include <string>

namespace cubelm::io {

struct ModelConfig {
  int vocab_size = 256;
  int seq_len = 64;
  int hidden = 64;
  int heads = 4;
  int layers = 2;
};

struct ParallelConfig {
  comm::TensorMode tensor_mode = comm::TensorMode::none;
  int tensor_size = 1;
  int pipeline_size = 1;
  int data_size = 1;
  std::string schedule = "1f1b"; ///< gpipe | 1f1b | interleaved | layered
  int virtual_stages = 1;
  int microbatches = 1;
  int zero = 0;
  bool sequence_parallel = false;
  std::string recompute = "none"; ///< none | full
  double bucket_mb = 25.0;        ///< data-parallel gradient bucket size (MB, 10^6 bytes)

  /// \brief The process grid these keys describe.
  comm::Layout layout() const;
};

struct TrainConfig {
  int steps = 100;
  int global_batch = 8; ///< sequences per optimizer step
  std::int64_t seed = 1234;
};

struct OptimizerConfig {
  double lr = 6e-4;
  double min_lr = 6e-5; ///< default: lr / 10
  int warmup_steps = 0;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0; ///< 0 switches clipping off
};

struct DataConfig {
  std::string format = "synthetic";        ///< synthetic | llmc | megatron | text
  std::string path;                        ///< required unless format = "synthetic"
  std::string sampler = "shuffle";         ///< sequential | shuffle
  std::int64_t synthetic_tokens = 1 << 20; ///< corpus size for format = "synthetic"
  int synthetic_branching = 4;             ///< successors per token: entropy floor ln(branching)
};

struct CheckpointConfig {
  std::string dir = "checkpoints";
  int interval = 0;            ///< steps between checkpoints; 0: only at the end
  int keep = 0;                ///< how many to keep; 0: all
  std::string resume = "none"; ///< none | auto | <file>
};

struct LogConfig {
  int interval = 1;         ///< steps between printed lines
  std::string metrics;      ///< JSON-lines path; empty: none
  double peak_gflops = 0.0; ///< per-rank peak for MFU; 0: measured with a gemm at start-up
};

/// \brief A validated deck.
struct Deck {
  std::string source; ///< file name (or "<string>")
  std::string text;   ///< the full text, stored in every checkpoint
  ModelConfig model;
  ParallelConfig parallel;
  TrainConfig train;
  OptimizerConfig optimizer;
  DataConfig data;
  CheckpointConfig checkpoint;
  LogConfig log;

  /// \brief Sequences per micro-batch: global_batch / (data_size * microbatches).
  int micro_batch() const {
    return train.global_batch / (parallel.data_size * parallel.microbatches);
  }
};

/// \brief Parses and validates deck text; `source` names it in messages.
Deck parse_deck(const std::string& text, const std::string& source = "<string>");
/// \brief Reads and validates a deck file.
Deck load_deck(const std::string& path);

} // namespace cubelm::io
