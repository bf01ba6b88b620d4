// The router's registry: registration by fingerprint, and the KV credits it
// reserves per request (copy-on-write blocks per sibling, quarantined blocks
// counted against an instance until freed, waits bounded).
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "router/cluster_api.h"
#include "router/registry.h"
#include "router/request_shape.h"
#include "util/clock.h"

namespace tandem::router {
namespace {

using json = nlohmann::json;

InstanceInfo instance(pd::NodeId node, pd::Role role, int64_t capacity_blocks = 100) {
  InstanceInfo i;
  i.node = node;
  i.epoch = 1;
  i.role = role;
  i.api_host = i.transfer_host = "127.0.0.1";
  i.api_port = static_cast<uint16_t>(9000 + node);
  i.transfer_port = static_cast<uint16_t>(9100 + node);
  i.model_name = "m";
  i.max_model_len = 512;
  i.capacity_blocks = capacity_blocks;
  i.fingerprint.model_hash = 7;
  i.fingerprint.kv_dtype = 1;
  i.fingerprint.block_size = 16;
  i.fingerprint.kv_layout = 2;
  i.fingerprint.n_layers = 2;
  i.fingerprint.n_kv_heads = 2;
  i.fingerprint.head_dim = 16;
  return i;
}

TEST(RouterRegistry, AnInstanceWhoseFingerprintDiffersIsRefusedNamingTheField) {
  Registry r(5000);
  ASSERT_FALSE(r.add(instance(2, pd::Role::kPrefill), 0));
  InstanceInfo other = instance(3, pd::Role::kDecode);
  other.fingerprint.kv_dtype = 2;
  auto why = r.add(other, 0);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("kv_dtype differs: the cluster has"), std::string::npos) << *why;
  other = instance(3, pd::Role::kDecode);
  other.fingerprint.block_size = 32;
  why = r.add(other, 0);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("block_size differs"), std::string::npos) << *why;
  other = instance(3, pd::Role::kDecode);
  other.mode = other.fingerprint.mode = pd::TransferMode::kRead;
  why = r.add(other, 0);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("transfer mode differs"), std::string::npos) << *why;
  EXPECT_FALSE(r.add(instance(3, pd::Role::kDecode), 0));
  EXPECT_EQ(r.list().size(), 2u);
}

TEST(RouterRegistry, TheFingerprintSurvivesTheRegistrationJson) {
  InstanceInfo i = instance(4, pd::Role::kDecode);
  std::string why;
  auto back = instance_from_json(to_json(i), &why);
  ASSERT_TRUE(back) << why;
  EXPECT_EQ(back->fingerprint.model_hash, i.fingerprint.model_hash);
  EXPECT_EQ(back->fingerprint.block_size, 16);
  EXPECT_EQ(back->fingerprint.head_dim, 16);
  EXPECT_EQ(back->max_model_len, 512);
  json no_fp = to_json(i);
  no_fp.erase("fingerprint");
  EXPECT_FALSE(instance_from_json(no_fp, &why));
  EXPECT_NE(why.find("fingerprint"), std::string::npos) << why;
}

// Credits are reserved on pick and returned when the request ends; a request
// that fits no instance now (but would fit one) waits, one that fits no
// instance ever goes to the least loaded (which refuses it with its reason).
TEST(RouterRegistry, PicksReserveCreditsAndAFullClusterMakesRequestsWait) {
  Registry r(5000);
  ASSERT_FALSE(r.add(instance(3, pd::Role::kDecode, 100), 0));
  Pick a = r.pick(pd::Role::kDecode, 60);
  ASSERT_TRUE(a.instance);
  EXPECT_EQ(r.list()[0].reserved_blocks, 60);
  Pick b = r.pick(pd::Role::kDecode, 60);
  EXPECT_FALSE(b.instance);
  EXPECT_TRUE(b.must_wait);
  Pick never = r.pick(pd::Role::kDecode, 500);
  ASSERT_TRUE(never.instance) << "no instance could ever hold it: the instance answers why";
  r.done(*never.instance, 500);
  EXPECT_EQ(r.list()[0].requests, 2);
  EXPECT_EQ(r.list()[0].reserved_blocks, 60);
  // A waiter wakes when credits come back, and then fits.
  Pick waiting = r.pick(pd::Role::kDecode, 60);
  ASSERT_TRUE(waiting.must_wait);
  std::thread ender([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    r.done(*a.instance, 60);
  });
  EXPECT_TRUE(r.wait_for_credits(waiting.credits_version, monotonic_ms() + 10'000));
  ender.join();
  Pick again = r.pick(pd::Role::kDecode, 60);
  EXPECT_TRUE(again.instance);
  // A release between a pick and its wait is not missed: the wait returns at once.
  Pick full = r.pick(pd::Role::kDecode, 60);
  ASSERT_TRUE(full.must_wait);
  r.done(*again.instance, 60);
  int64_t before = monotonic_ms();
  EXPECT_TRUE(r.wait_for_credits(full.credits_version, before + 10'000));
  EXPECT_LT(monotonic_ms() - before, 1'000);
  // The wait is bounded.
  Pick hold = r.pick(pd::Role::kDecode, 60);
  ASSERT_TRUE(hold.instance);
  Pick none = r.pick(pd::Role::kDecode, 100);
  ASSERT_TRUE(none.must_wait);
  before = monotonic_ms();
  EXPECT_FALSE(r.wait_for_credits(none.credits_version, before + 100));
  EXPECT_GE(monotonic_ms() - before, 90);
}

TEST(RouterRegistry, QuarantinedBlocksCountAgainstAnInstanceUntilFreed) {
  Registry r(5000);
  ASSERT_FALSE(r.add(instance(3, pd::Role::kDecode, 100), 0));
  InstanceLoad load;
  load.free_blocks = 10;
  load.quarantined_blocks = 90;
  ASSERT_TRUE(r.heartbeat(3, 1, load, 10));
  Pick p = r.pick(pd::Role::kDecode, 20);
  EXPECT_FALSE(p.instance);
  EXPECT_TRUE(p.must_wait);
  load.quarantined_blocks = 0;
  ASSERT_TRUE(r.heartbeat(3, 1, load, 20));
  EXPECT_TRUE(r.pick(pd::Role::kDecode, 20).instance);
}

// An evicted instance that registers again starts with clean credits: what
// the old entry's requests return when they end does not touch the new one.
TEST(RouterRegistry, RequestsOfAnEvictedEntryDoNotTouchItsSuccessor) {
  Registry r(1000);
  ASSERT_FALSE(r.add(instance(3, pd::Role::kDecode, 100), 0));
  Pick old = r.pick(pd::Role::kDecode, 40);
  ASSERT_TRUE(old.instance);
  EXPECT_EQ(r.evict_silent(5000), std::vector<pd::NodeId>{3});
  InstanceInfo again = instance(3, pd::Role::kDecode, 100);
  again.epoch = 2;
  ASSERT_FALSE(r.add(again, 5000));
  Pick fresh = r.pick(pd::Role::kDecode, 30);
  ASSERT_TRUE(fresh.instance);
  r.done(*old.instance, 40);  // ignored: another entry
  EXPECT_EQ(r.list()[0].reserved_blocks, 30);
  EXPECT_EQ(r.list()[0].in_flight, 1);
  r.done(*fresh.instance, 30);
  EXPECT_EQ(r.list()[0].reserved_blocks, 0);
}

// An instance that is fencing a peer (after a failure, until the fence
// completes, which with shared memory and a live peer may be never) says so
// in its heartbeats; the router pairs neither with the other, either way round.
TEST(RouterRegistry, InstancesFencingEachOtherAreNotPaired) {
  Registry r(5000);
  ASSERT_FALSE(r.add(instance(2, pd::Role::kPrefill), 0));
  ASSERT_FALSE(r.add(instance(3, pd::Role::kDecode), 0));
  ASSERT_FALSE(r.add(instance(4, pd::Role::kDecode), 0));
  const InstanceInfo prefill = r.list()[0];
  EXPECT_TRUE(r.cut_from(prefill).empty());
  InstanceLoad load;
  load.fencing = std::vector<std::pair<pd::NodeId, pd::Epoch>>{{3, 1}};
  ASSERT_TRUE(r.heartbeat(2, 1, load, 10));  // the prefill fences decode 3
  EXPECT_EQ(r.cut_from(prefill), std::vector<pd::NodeId>{3});
  InstanceLoad other;
  other.fencing = std::vector<std::pair<pd::NodeId, pd::Epoch>>{{2, 1}};
  ASSERT_TRUE(r.heartbeat(4, 1, other, 10));  // decode 4 fences the prefill
  EXPECT_EQ(r.cut_from(prefill), (std::vector<pd::NodeId>{3, 4}));
  // A fence of an older incarnation does not cut the new one.
  other.fencing = std::vector<std::pair<pd::NodeId, pd::Epoch>>{{2, 0}};
  ASSERT_TRUE(r.heartbeat(4, 1, other, 20));
  EXPECT_EQ(r.cut_from(prefill), std::vector<pd::NodeId>{3});
  Pick d = r.pick(pd::Role::kDecode, 1, r.cut_from(prefill));
  ASSERT_TRUE(d.instance);
  EXPECT_EQ(d.instance->node, 4u);
  r.done(*d.instance, 1);
  // Both legs at once: the pair is never the cut one, and nothing is left
  // reserved when no pair exists.
  PairPick pair = r.pick_pair(1, 1, {}, {});
  ASSERT_TRUE(pair.ok());
  EXPECT_EQ(pair.decode->node, 4u);
  r.done(*pair.prefill, 1);
  r.done(*pair.decode, 1);
  PairPick none = r.pick_pair(1, 1, {}, {4});
  EXPECT_FALSE(none.ok());
  EXPECT_TRUE(none.skipped_cut);
  EXPECT_EQ(none.missing, pd::Role::kPrefill);
  for (const InstanceInfo& i : r.list()) EXPECT_EQ(i.reserved_blocks, 0) << i.node;
}

TEST(RouterRequestShape, EstimatesBoundThePromptAndCountEverySiblingsCopiedBlock) {
  RequestShape c = estimate_shape(json{{"prompt", "hello world"}, {"n", 2}, {"best_of", 3}}, false);
  EXPECT_EQ(c.prompt_tokens, 13);  // 11 bytes, a BOS and a space prefix
  EXPECT_EQ(c.n_sequences, 3);
  EXPECT_EQ(c.max_tokens, 16);  // the completions API's default
  RequestShape chat = estimate_shape(
      json{{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"max_completion_tokens", 40}}, true);
  EXPECT_EQ(chat.prompt_tokens, kChatTokensPerRequest + kChatTokensPerMessage + 2);
  EXPECT_EQ(chat.max_tokens, 40);
  // Tools and tool calls are rendered into the prompt: their JSON counts too.
  const json tools = json::array({{{"type", "function"}, {"function", {{"name", "get_weather"}}}}});
  const json calls = json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"arguments", "{}"}}}}});
  RequestShape with_tools = estimate_shape(
      json{{"messages", json::array({{{"role", "assistant"}, {"content", nullptr}, {"tool_calls", calls}}})}, {"tools", tools}}, true);
  EXPECT_EQ(with_tools.prompt_tokens, kChatTokensPerRequest + kChatTokensPerMessage +
                                          static_cast<int64_t>(calls.dump().size() + tools.dump().size()));
  RequestShape open_ended = estimate_shape(json{{"messages", json::array()}}, true);
  EXPECT_EQ(open_ended.max_tokens, 0);
  // 17 prompt tokens in blocks of 16: the prefill moves 1 block; the decode
  // holds 33 tokens for the first sequence (3 blocks) and, for each of the
  // 2 others, its 16 outputs plus its copy of the partial last block.
  RequestShape s{17, 3, 16};
  EXPECT_EQ(prefill_credits(s, 16, 512), 1);
  EXPECT_EQ(decode_credits(s, 16, 512), 3 + 2 * 2);
  // No max_tokens: the rest of the context.
  EXPECT_EQ(decode_credits(RequestShape{17, 1, 0}, 16, 512), 512 / 16);
}

}  // namespace
}  // namespace tandem::router
