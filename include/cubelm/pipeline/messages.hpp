#pragma once
/// \file
/// \brief The messages of a pipeline plan between stages and the exchanges a
/// stage posts them in (docs/pipeline.md, "Messages").
///
/// A stage posts its messages in exchanges, each a batch of sends and at most
/// one receive posted together (Megatron-Core's batched point-to-point,
/// send_forward_recv_backward and the like): before action i the sends of the
/// actions run since the last exchange and the receive action i needs (its
/// input, or its output's gradient); after the last action, the sends left.
///
/// Two transports carry them. MPI matches messages by tag: any order works, and
/// each send may go out right after its action (one exchange per action, the
/// previous action's send with this one's receive). NCCL has no tags: messages
/// between two ranks match in the order they are posted, and the exchanges of a
/// rank, each an NCCL group on one stream, run one after the other, each
/// completing only when all of its transfers have (a send completes only once
/// the receiver has posted its receive). plan_exchanges groups the messages so
/// that they run to the end under those rules too: each message is exchanged at
/// the time the unit-cost timeline (pipeline::simulate) starts the action that
/// receives it, a logical clock both of its ends agree on (docs/pipeline.md,
/// "Messages").
///
/// Pure arithmetic, like pipeline/schedule.hpp.

#include "cubelm/pipeline/schedule.hpp"

#include <cstddef>
#include <string>
#include <vector>

namespace cubelm::pipeline {

/// \brief One message between two stages (exists() is false for "none").
struct Message {
  bool backward = false;  ///< the gradient of a chunk's input (else a chunk's output)
  int micro = -1;         ///< micro-batch; -1: no message
  int sender = -1;        ///< virtual stage of the chunk that sends it
  int from = -1, to = -1; ///< stages
  std::size_t action = 0; ///< the action of the stage that sends or receives it
  bool exists() const { return micro >= 0; }
  /// \brief Same message (same direction, micro-batch, sender and stages).
  bool same(const Message& o) const {
    return backward == o.backward && micro == o.micro && sender == o.sender && from == o.from &&
           to == o.to;
  }
  /// \brief E.g. "the output of virtual stage 2 for micro-batch 3 (stage 2 to 3)".
  std::string describe() const;
};

/// \brief The message action `i` of `stage` receives before it runs (none when its
/// input comes from a chunk on the same rank, or it is the model's first/last chunk).
Message receive_before(const PipelinePlan& plan, int stage, std::size_t i);
/// \brief The message action `i` of `stage` sends when it has run.
Message send_after(const PipelinePlan& plan, int stage, std::size_t i);

/// \brief What a stage posts together, just before action `before`.
struct Exchange {
  std::size_t before = 0;     ///< the action it precedes (actions.size(): after the last)
  std::vector<Message> sends; ///< in the order the actions ran
  Message recv;               ///< what action `before` needs, or none
};

/// \brief The exchanges of every stage, and whether they suit NCCL.
struct ExchangePlan {
  std::vector<std::vector<Exchange>> stages; ///< [stage], in posting order
  /// Empty when `stages` runs to the end without tags (NCCL, see the file comment);
  /// otherwise why not, and `stages` holds one exchange per action (for MPI's tags).
  std::string untagged_problem;
  bool untagged() const { return untagged_problem.empty(); }
};

/// \brief One exchange per action: action i - 1's send with action i's receive.
std::vector<std::vector<Exchange>> exchanges_per_action(const PipelinePlan& plan);

/// \brief Empty when `exchanges` run to the end without tags: for every ordered pair
/// of stages the receiver posts its receives in the order the sender posts the
/// sends, and every stage's exchanges, posted in order and each completing only when
/// the partners of all its transfers have posted theirs, all complete. Otherwise the
/// first problem found, in words.
std::string check_untagged(const std::vector<std::vector<Exchange>>& exchanges);

/// \brief Exchanges for `plan` timed by the unit-cost timeline: a message goes in the
/// receiver's exchange before the action that needs it and in the sender's before its
/// first action that starts no earlier. Should check_untagged find a problem with
/// them, one exchange per action instead, with the problem named (for MPI's tags).
ExchangePlan plan_exchanges(const PipelinePlan& plan);

} // namespace cubelm::pipeline
