#pragma once
/// \file
/// \brief Machine files (docs/planner.md): what `cubelm plan` needs to know of a machine
/// to predict a layout's step time and whether it fits: devices per node, their memory,
/// peak arithmetic rate by precision, memory bandwidth, and the bandwidth and latency of
/// each network level (inside a node, between nodes). TOML, validated like a deck: a bad
/// value is an error naming the file, the line, the key, the value and the rule.
///
/// Pure values, no Kokkos and no MPI: the planner runs on a login node.

#include "cubelm/core/config.hpp"

#include <string>

namespace cubelm::io {

/// \brief One network level, as a collective sees it.
struct NetworkLevel {
  /// GB/s (10^9 bytes) one direction. Inside a node: what each device sends at once to
  /// its neighbours in a ring. Between nodes: what one node sends in all; the devices of a
  /// node whose groups leave it at the same time share it.
  double bandwidth_gbs = 1;
  double latency_us = 0; ///< per message step (one hop of a ring)
};

/// \brief A machine: one kind of node, many of them.
struct Machine {
  std::string source;          ///< file name, for messages
  std::string name;            ///< for people
  int devices_per_node = 1;    ///< ranks per node (one per device)
  double memory_gib = 1;       ///< memory per device (GiB) for a rank's model and activations
  double memory_gbs = 1;       ///< memory bandwidth per device (GB/s), for the non-gemm kernels
  double peak_tflops_fp32 = 1; ///< arithmetic peak per device by train.precision
  double peak_tflops_tf32 = 1;
  double peak_tflops_bf16 = 1;
  /// The share of the peak that the products of a transformer layer reach (large gemms
  /// rarely run at the data sheet's peak); 1 for a calibrated file, whose peaks are measured.
  double gemm_efficiency = 1;
  NetworkLevel intra; ///< between devices of one node
  NetworkLevel inter; ///< between nodes
  /// GB/s at which a job writes a checkpoint, all its ranks together, to the file system its
  /// checkpoints go to (cubelm's writer, `cubelm plan --calibrate` measures it); 0: not
  /// known (the key is optional), and no checkpoint time is predicted.
  double checkpoint_gbs = 0;

  /// \brief The peak of `precision` in FLOP/s.
  double peak_flops(Precision precision) const;
};

/// \brief Parses and validates machine-file text; `source` names it in messages.
Machine parse_machine(const std::string& text, const std::string& source = "<string>");
/// \brief Reads and validates a machine file.
Machine load_machine(const std::string& path);
/// \brief The TOML text of `machine` (parse_machine reads it back to the same values),
/// with `comment` (lines starting with '#') at the top.
std::string machine_toml(const Machine& machine, const std::string& comment = "");

} // namespace cubelm::io
