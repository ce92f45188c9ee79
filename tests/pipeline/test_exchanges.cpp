// The exchanges a pipeline stage posts its messages in (pipeline/messages.hpp): every
// message once, sent after the action that makes it and received just before the
// action that needs it, and, without tags, in an order and grouping that cannot
// deadlock when each rank's exchanges complete one after the other and as a whole
// (NCCL group calls on one stream). Checked against a simulation written here
// independently of pipeline::check_untagged: per pair of stages, FIFO queues of posted
// sends and receives, matched head to head as NCCL and in-order MPI match them.

#include "cubelm/pipeline/messages.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <utility>

using namespace cubelm;
using namespace cubelm::pipeline;

namespace {

PipelinePlan make(const std::string& schedule, int p, int m, int v, int layers) {
  return make_plan(*parse_schedule(schedule), p, m, v, layers);
}

// Runs `ex` with rendezvous semantics: each stage's exchanges in order, an exchange
// posting all its transfers at once and completing when every one of them has met
// its partner (the head of the pair's queue on the other side). Returns "" when
// everything completes, else what went wrong.
std::string rendezvous(const std::vector<std::vector<Exchange>>& ex) {
  const auto p = ex.size();
  struct Posted {
    Message m;
    std::size_t stage, exchange, index;
  };
  std::map<std::pair<int, int>, std::deque<Posted>> sends, recvs; // (from, to)
  std::vector<std::size_t> at(p, 0);
  std::vector<bool> posted(p, false);
  std::vector<std::vector<bool>> done(p);
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t s = 0; s < p; ++s) {
      if (at[s] == ex[s].size())
        continue;
      const Exchange& e = ex[s][at[s]];
      if (!posted[s]) {
        posted[s] = true;
        done[s].assign(e.sends.size() + 1, false);
        for (std::size_t k = 0; k < e.sends.size(); ++k)
          sends[{e.sends[k].from, e.sends[k].to}].push_back({e.sends[k], s, at[s], k});
        if (e.recv.exists())
          recvs[{e.recv.from, e.recv.to}].push_back({e.recv, s, at[s], e.sends.size()});
        else
          done[s].back() = true;
        progress = true;
      }
    }
    for (auto& [pair, q] : sends) {
      auto& r = recvs[pair];
      while (!q.empty() && !r.empty()) {
        if (!q.front().m.same(r.front().m))
          return "mismatch: " + q.front().m.describe() + " meets " + r.front().m.describe();
        done[q.front().stage][q.front().index] = true;
        done[r.front().stage][r.front().index] = true;
        q.pop_front();
        r.pop_front();
        progress = true;
      }
    }
    for (std::size_t s = 0; s < p; ++s)
      if (posted[s] && std::all_of(done[s].begin(), done[s].end(), [](bool d) { return d; })) {
        posted[s] = false;
        ++at[s];
        progress = true;
      }
  }
  for (std::size_t s = 0; s < p; ++s)
    if (at[s] < ex[s].size())
      return "stage " + std::to_string(s) + " stuck before action " +
             std::to_string(ex[s][at[s]].before);
  return "";
}

// Every message of the plan appears once as a send, in an exchange after the action
// that makes it, and once as a receive, in the exchange right before the action that
// needs it (and no other receive is posted).
void expect_every_message_once(const PipelinePlan& plan, const ExchangePlan& ex) {
  std::map<std::tuple<bool, int, int>, int> sent, received;
  for (int s = 0; s < plan.stages; ++s) {
    const auto& mine = ex.stages[static_cast<std::size_t>(s)];
    std::size_t last = 0;
    for (const Exchange& e : mine) {
      EXPECT_TRUE(e.before >= last) << "exchanges in action order";
      last = e.before;
      for (const Message& m : e.sends) {
        EXPECT_EQ(m.from, s);
        EXPECT_GT(e.before, m.action) << "sent after its action: " << m.describe();
        EXPECT_TRUE(m.same(send_after(plan, s, m.action)));
        ++sent[{m.backward, m.micro, m.sender}];
      }
      if (e.recv.exists()) {
        EXPECT_TRUE(e.recv.same(receive_before(plan, s, e.before)));
        ++received[{e.recv.backward, e.recv.micro, e.recv.sender}];
      }
    }
    for (std::size_t i = 0; i < plan.actions[static_cast<std::size_t>(s)].size(); ++i) {
      const Message r = receive_before(plan, s, i);
      const bool posted = std::any_of(mine.begin(), mine.end(), [&](const Exchange& e) {
        return e.before == i && e.recv.exists();
      });
      EXPECT_EQ(posted, r.exists()) << "stage " << s << " action " << i;
    }
  }
  EXPECT_EQ(sent.size(), received.size());
  for (const auto& [key, n] : sent) {
    EXPECT_EQ(n, 1);
    EXPECT_EQ(received[key], 1);
  }
}

} // namespace

// Every schedule over a range of sizes: the exchanges carry every message once and
// run to the end without tags, by pipeline::check_untagged and by the FIFO simulation.
TEST(Exchanges, EveryPlanRunsWithoutTags) {
  int plans = 0, per_action_stuck = 0;
  for (const char* schedule : {"gpipe", "1f1b", "interleaved", "layered"})
    for (int p : {1, 2, 3, 4, 5, 8})
      for (int m : {1, 2, 3, 4, 6, 8})
        for (int v : {1, 2, 3}) {
          const std::string s = schedule;
          if ((s != "interleaved" && v > 1) || (s == "interleaved" && m % p != 0))
            continue;
          for (int layers : {p * v, 2 * p * v, p * v + 1}) {
            if (s == "interleaved" && layers % (p * v) != 0)
              continue;
            SCOPED_TRACE(s + " p" + std::to_string(p) + " m" + std::to_string(m) + " v" +
                         std::to_string(v) + " L" + std::to_string(layers));
            const PipelinePlan plan = make(s, p, m, v, layers);
            const ExchangePlan ex = plan_exchanges(plan);
            EXPECT_TRUE(ex.untagged()) << ex.untagged_problem;
            expect_every_message_once(plan, ex);
            EXPECT_EQ(rendezvous(ex.stages), "");
            // The simpler grouping, one exchange per action, does not always run.
            const auto simple = exchanges_per_action(plan);
            const std::string problem = check_untagged(simple);
            EXPECT_EQ(problem.empty(), rendezvous(simple).empty()) << problem;
            per_action_stuck += problem.empty() ? 0 : 1;
            ++plans;
          }
        }
  EXPECT_GT(plans, 300);
  EXPECT_GT(per_action_stuck, 0) << "the check must be able to fail";
}

// Megatron's 1F1B posts one exchange per action (send_forward_recv_backward and the
// like), which runs without tags; a ring of stages (layered, interleaved) with one
// exchange per action waits forever, which both simulations see.
TEST(Exchanges, OneExchangePerActionDeadlocksOnARing) {
  const PipelinePlan f1b = make("1f1b", 4, 8, 1, 4);
  EXPECT_EQ(check_untagged(exchanges_per_action(f1b)), "");

  const PipelinePlan ring = make("layered", 2, 4, 1, 3);
  const auto simple = exchanges_per_action(ring);
  EXPECT_EQ(check_untagged(simple).rfind("stage 0 waits forever in its exchange", 0), 0u)
      << check_untagged(simple);
  EXPECT_NE(rendezvous(simple), "");
  // Stage 1 holds its outputs back until stage 0 comes round to them.
  const ExchangePlan ex = plan_exchanges(ring);
  ASSERT_TRUE(ex.untagged()) << ex.untagged_problem;
  std::size_t most = 0;
  for (const Exchange& e : ex.stages[1])
    most = std::max(most, e.sends.size());
  EXPECT_GT(most, 1u);
}

// Two sends between the same pair of stages swapped: the receiver would take one
// for the other, which the check names.
TEST(Exchanges, SendsOutOfOrderAreFound) {
  const PipelinePlan plan = make("layered", 2, 4, 1, 3);
  ExchangePlan ex = plan_exchanges(plan);
  auto& stage1 = ex.stages[1];
  const auto e = std::find_if(stage1.begin(), stage1.end(),
                              [](const Exchange& x) { return x.sends.size() > 1; });
  ASSERT_NE(e, stage1.end());
  std::swap(e->sends[0], e->sends[1]);
  const std::string problem = check_untagged(ex.stages);
  EXPECT_NE(problem.find("but the receiver expects"), std::string::npos) << problem;
  EXPECT_EQ(rendezvous(ex.stages).rfind("mismatch", 0), 0u);
}

// The messages follow the plan: none on one stage; with two stages, outputs go
// forward and input gradients back, tagged with the sending virtual stage.
TEST(Exchanges, MessagesFollowThePlan) {
  const PipelinePlan one = make("layered", 1, 2, 1, 3);
  EXPECT_TRUE(plan_exchanges(one).stages[0].empty());
  const PipelinePlan two = make("gpipe", 2, 2, 1, 2);
  const Message out = send_after(two, 0, 0); // F(0) of stage 0
  EXPECT_TRUE(out.exists());
  EXPECT_FALSE(out.backward);
  EXPECT_EQ(out.sender, 0);
  EXPECT_EQ(out.to, 1);
  EXPECT_TRUE(out.same(receive_before(two, 1, 0)));
  EXPECT_FALSE(receive_before(two, 0, 0).exists()) << "the model's first chunk";
  EXPECT_FALSE(send_after(two, 1, 0).exists()) << "the model's last chunk";
  const Message grad = send_after(two, 1, 2); // B(0) of stage 1
  EXPECT_TRUE(grad.backward);
  EXPECT_EQ(grad.to, 0);
  EXPECT_TRUE(grad.same(receive_before(two, 0, 2)));
  EXPECT_EQ(out.describe(), "the output of virtual stage 0 for micro-batch 0 (stage 0 to 1)");
}
