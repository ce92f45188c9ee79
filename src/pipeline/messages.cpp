#include "cubelm/pipeline/messages.hpp"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

namespace cubelm::pipeline {

std::string Message::describe() const {
  if (!exists())
    return "no message";
  return std::string(backward ? "the input gradient" : "the output") + " of virtual stage " +
         std::to_string(sender) + " for micro-batch " + std::to_string(micro) + " (stage " +
         std::to_string(from) + " to " + std::to_string(to) + ")";
}

namespace {

Message message(bool backward, int micro, int sender, int from, int to, std::size_t action) {
  Message m;
  m.backward = backward;
  m.micro = micro;
  m.sender = sender;
  m.from = from;
  m.to = to;
  m.action = action;
  return m;
}

} // namespace

// The same decisions as train::PipelineStage::run: a forward receives unless its chunk
// is the model's first or the previous chunk is on this rank (input_from); a backward
// unless its chunk is the last or the next chunk is on this rank (grad_from).
Message receive_before(const PipelinePlan& plan, int stage, std::size_t i) {
  const Action& a = plan.actions.at(static_cast<std::size_t>(stage)).at(i);
  const int p = plan.stages;
  const int vs = plan.virtual_stage(stage, a.chunk);
  if (a.op == Op::forward) {
    if (plan.first(stage, a.chunk) || a.input_from >= 0)
      return {};
    return message(false, a.micro, vs - 1, (stage + p - 1) % p, stage, i);
  }
  if (plan.last(stage, a.chunk) || a.grad_from >= 0)
    return {};
  return message(true, a.micro, vs + 1, (stage + 1) % p, stage, i);
}

Message send_after(const PipelinePlan& plan, int stage, std::size_t i) {
  const Action& a = plan.actions.at(static_cast<std::size_t>(stage)).at(i);
  const int p = plan.stages;
  const int vs = plan.virtual_stage(stage, a.chunk);
  if (a.op == Op::forward) {
    if (plan.last(stage, a.chunk) || plan.local_next(stage, a.chunk))
      return {};
    return message(false, a.micro, vs, stage, (stage + 1) % p, i);
  }
  if (plan.first(stage, a.chunk) || plan.local_prev(a.chunk))
    return {};
  return message(true, a.micro, vs, stage, (stage + p - 1) % p, i);
}

std::vector<std::vector<Exchange>> exchanges_per_action(const PipelinePlan& plan) {
  std::vector<std::vector<Exchange>> all;
  for (int s = 0; s < plan.stages; ++s) {
    const std::size_t n = plan.actions.at(static_cast<std::size_t>(s)).size();
    std::vector<Exchange> out;
    for (std::size_t i = 0; i <= n; ++i) {
      Exchange e;
      e.before = i;
      if (i > 0 && send_after(plan, s, i - 1).exists())
        e.sends.push_back(send_after(plan, s, i - 1));
      if (i < n)
        e.recv = receive_before(plan, s, i);
      if (!e.sends.empty() || e.recv.exists())
        out.push_back(e);
    }
    all.push_back(std::move(out));
  }
  return all;
}

namespace {

// A transfer's end: stage, exchange, and the send's index in it (-1: the receive).
using End = std::tuple<int, std::size_t, int>;

struct Posted {
  End end;
  Message message;
};

// Runs the exchanges under the untagged rules (see check_untagged) and returns, per
// stage, the first exchange that never completes (the stage's count when all do);
// an ordering problem goes to `problem` instead.
std::vector<std::size_t> run_untagged(const std::vector<std::vector<Exchange>>& ex,
                                      std::string& problem) {
  const int p = static_cast<int>(ex.size());
  std::map<std::pair<int, int>, std::vector<Posted>> sends, recvs; // by (from, to)
  for (int s = 0; s < p; ++s)
    for (std::size_t j = 0; j < ex[static_cast<std::size_t>(s)].size(); ++j) {
      const Exchange& e = ex[static_cast<std::size_t>(s)][j];
      for (std::size_t k = 0; k < e.sends.size(); ++k)
        sends[{e.sends[k].from, e.sends[k].to}].push_back(
            {End{s, j, static_cast<int>(k)}, e.sends[k]});
      if (e.recv.exists())
        recvs[{e.recv.from, e.recv.to}].push_back({End{s, j, -1}, e.recv});
    }
  // Without tags the k-th send from one stage to another matches the k-th receive.
  std::map<End, End> partner;
  for (const auto& [pair, sent] : sends) {
    const auto& received = recvs[pair];
    for (std::size_t k = 0; k < sent.size() || k < received.size(); ++k) {
      if (k >= sent.size() || k >= received.size() || !sent[k].message.same(received[k].message)) {
        problem = "message " + std::to_string(k) + " from stage " + std::to_string(pair.first) +
                  " to stage " + std::to_string(pair.second) + " is " +
                  (k < sent.size() ? sent[k].message.describe() : "missing") +
                  " but the receiver expects " +
                  (k < received.size() ? received[k].message.describe() : "none");
        return {};
      }
      partner[sent[k].end] = received[k].end;
      partner[received[k].end] = sent[k].end;
    }
  }
  for (const auto& [pair, received] : recvs)
    if (!received.empty() && sends.find(pair) == sends.end()) {
      problem = "stage " + std::to_string(pair.second) + " expects " +
                received.front().message.describe() + ", which is never sent";
      return {};
    }
  // Exchange j of a stage runs once its exchanges before j have completed; a
  // transfer completes once the exchanges at both of its ends run; an exchange
  // completes with the last of its transfers.
  std::vector<std::size_t> running(static_cast<std::size_t>(p), 0);
  std::map<End, bool> done;
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      const auto si = static_cast<std::size_t>(s);
      while (running[si] < ex[si].size()) {
        const std::size_t j = running[si];
        const Exchange& e = ex[si][j];
        bool complete = true;
        for (int k = e.recv.exists() ? -1 : 0; k < static_cast<int>(e.sends.size()); ++k) {
          const End mine{s, j, k};
          if (done[mine])
            continue;
          const End other = partner.at(mine);
          if (running[static_cast<std::size_t>(std::get<0>(other))] == std::get<1>(other))
            done[mine] = done[other] = true;
          else
            complete = false;
        }
        if (!complete)
          break;
        ++running[si];
        progress = true;
      }
    }
  }
  return running;
}

} // namespace

std::string check_untagged(const std::vector<std::vector<Exchange>>& exchanges) {
  std::string problem;
  const std::vector<std::size_t> stuck = run_untagged(exchanges, problem);
  if (!problem.empty())
    return problem;
  for (std::size_t s = 0; s < stuck.size(); ++s)
    if (stuck[s] < exchanges[s].size()) {
      const Exchange& e = exchanges[s][stuck[s]];
      const Message& m = e.recv.exists() ? e.recv : e.sends.front();
      return "stage " + std::to_string(s) + " waits forever in its exchange before action " +
             std::to_string(e.before) + " (" + m.describe() + ")";
    }
  return {};
}

ExchangePlan plan_exchanges(const PipelinePlan& plan) {
  const int p = plan.stages;
  // A logical clock: the unit-cost timeline, where every action starts after the
  // actions it needs have ended. A message is exchanged at the start time T of the
  // action that receives it: the receiver posts it just before that action, the
  // sender before its first action that starts at T or later. Both ends of every
  // message thus meet at the same T, each rank posts in increasing T, and exchanges
  // at one T wait only for exchanges at the same T, which every rank reaches once
  // all before it have completed: no cycle, whatever the schedule.
  const Timeline timeline = simulate(plan);
  std::vector<std::vector<double>> start(static_cast<std::size_t>(p));
  for (int s = 0; s < p; ++s)
    for (const Interval& iv : timeline.stages[static_cast<std::size_t>(s)])
      if (iv.kind != Interval::idle)
        start[static_cast<std::size_t>(s)].push_back(iv.start);
  // Every message by (direction, micro-batch, sender's virtual stage): its send.
  std::map<std::tuple<bool, int, int>, Message> sent;
  for (int s = 0; s < p; ++s)
    for (std::size_t i = 0; i < plan.actions[static_cast<std::size_t>(s)].size(); ++i) {
      const Message m = send_after(plan, s, i);
      if (m.exists())
        sent[{m.backward, m.micro, m.sender}] = m;
    }
  // Per stage: exchanges by the action they precede; sends with their T.
  std::vector<std::map<std::size_t, Exchange>> by_action(static_cast<std::size_t>(p));
  std::vector<std::map<std::size_t, std::vector<std::pair<double, Message>>>> sends(
      static_cast<std::size_t>(p));
  ExchangePlan out;
  for (int s = 0; s < p; ++s) {
    const auto& mine = start[static_cast<std::size_t>(s)];
    for (std::size_t i = 0; i < mine.size(); ++i) {
      const Message r = receive_before(plan, s, i);
      if (!r.exists())
        continue;
      const auto found = sent.find({r.backward, r.micro, r.sender});
      if (found == sent.end()) {
        out.stages = exchanges_per_action(plan);
        out.untagged_problem =
            "stage " + std::to_string(s) + " expects " + r.describe() + ", which is never sent";
        return out;
      }
      const double t = mine[i];
      Exchange& e = by_action[static_cast<std::size_t>(s)][i];
      e.before = i;
      e.recv = r;
      const Message& m = found->second;
      const auto& theirs = start[static_cast<std::size_t>(m.from)];
      std::size_t k = m.action + 1;
      while (k < theirs.size() && theirs[k] < t)
        ++k;
      sends[static_cast<std::size_t>(m.from)][k].emplace_back(t, m);
      sent.erase(found);
    }
  }
  if (!sent.empty()) {
    out.stages = exchanges_per_action(plan);
    out.untagged_problem = sent.begin()->second.describe() + " is sent but never received";
    return out;
  }
  for (int s = 0; s < p; ++s) {
    const auto si = static_cast<std::size_t>(s);
    for (auto& [k, list] : sends[si]) {
      std::stable_sort(list.begin(), list.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      Exchange& e = by_action[si][k];
      e.before = k;
      for (const auto& tm : list)
        e.sends.push_back(tm.second);
    }
    std::vector<Exchange> list;
    for (auto& [k, e] : by_action[si])
      list.push_back(std::move(e));
    out.stages.push_back(std::move(list));
  }
  out.untagged_problem = check_untagged(out.stages);
  if (!out.untagged())
    out.stages = exchanges_per_action(plan);
  return out;
}

} // namespace cubelm::pipeline
