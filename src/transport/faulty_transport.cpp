#include "transport/faulty_transport.h"

#include <algorithm>
#include <sstream>

#include "util/clock.h"
#include "util/error.h"

namespace tandem::transport {

FaultSpec parse_fault_spec(const std::string& text) {
  FaultSpec s;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t eq = item.find('=');
    if (eq == std::string::npos) throw Error("--test-faults: '" + item + "' is not key=value");
    std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    try {
      if (key == "seed") s.seed = std::stoull(value);
      else if (key == "drop") s.drop = std::stod(value);
      else if (key == "dup") s.duplicate = std::stod(value);
      else if (key == "delay") s.delay = std::stod(value);
      else if (key == "max_delay_ms") s.max_delay_ms = std::stoi(value);
      else throw Error("--test-faults: unknown key '" + key + "' (seed, drop, dup, delay, max_delay_ms)");
    } catch (const std::invalid_argument&) {
      throw Error("--test-faults: '" + value + "' is not a number");
    }
  }
  for (double p : {s.drop, s.duplicate, s.delay})
    if (p < 0 || p > 1) throw Error("--test-faults: probabilities lie in [0, 1]");
  return s;
}

FaultyTransport::FaultyTransport(std::unique_ptr<Transport> inner, const FaultSpec& spec)
    : inner_(std::move(inner)), spec_(spec), rng_(spec.seed) {}

bool FaultyTransport::send(pd::NodeId peer, std::span<const uint8_t> frame) {
  std::uniform_real_distribution<double> u(0, 1);
  if (u(rng_) < spec_.drop) {
    ++counters_.dropped;
    return true;  // lost on the way: the sender cannot tell
  }
  int copies = u(rng_) < spec_.duplicate ? 2 : 1;
  if (copies == 2) ++counters_.duplicated;
  bool ok = true;
  for (int i = 0; i < copies; ++i) {
    if (spec_.max_delay_ms > 0 && u(rng_) < spec_.delay) {
      ++counters_.delayed;
      pd::TimeMs due = monotonic_ms() + static_cast<pd::TimeMs>(rng_() % static_cast<uint64_t>(spec_.max_delay_ms + 1));
      auto c = connection_.find(peer);
      held_.push_back({due, peer, c == connection_.end() ? 0 : c->second, {frame.begin(), frame.end()}});
    } else {
      ok = inner_->send(peer, frame) && ok;
    }
  }
  return ok;
}

void FaultyTransport::poll(int timeout_ms, std::vector<TransportEvent>* events) {
  pd::TimeMs now = monotonic_ms();
  // Held frames go out when due (in due order, so delays also reorder).
  std::sort(held_.begin(), held_.end(), [](const Held& a, const Held& b) { return a.due_ms < b.due_ms; });
  size_t sent = 0;
  for (; sent < held_.size() && held_[sent].due_ms <= now; ++sent) {
    const Held& h = held_[sent];
    auto c = connection_.find(h.peer);
    if (c == connection_.end() || c->second != h.connection) {
      ++counters_.lost_with_connection;
      continue;
    }
    inner_->send(h.peer, h.frame);
  }
  held_.erase(held_.begin(), held_.begin() + static_cast<ptrdiff_t>(sent));
  if (!held_.empty()) timeout_ms = static_cast<int>(std::clamp<pd::TimeMs>(held_.front().due_ms - now, 0, timeout_ms));
  size_t first = events->size();
  inner_->poll(timeout_ms, events);
  for (size_t i = first; i < events->size(); ++i) {
    const TransportEvent& e = (*events)[i];
    if (e.kind == TransportEvent::Kind::kConnected) connection_[e.peer] = e.connection;
    if (e.kind == TransportEvent::Kind::kPeerFailed && connection_[e.peer] == e.connection) connection_.erase(e.peer);
  }
}

}  // namespace tandem::transport
