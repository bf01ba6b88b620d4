// A load generator for any OpenAI-compatible server (tandem, llama.cpp's
// server, vLLM): a sweep over concurrency levels with streaming requests,
// reporting throughput and latency percentiles per level.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tandem::loadgen {

struct LoadConfig {
  std::string url = "http://127.0.0.1:8000";
  std::string model;  // empty: the first id from /v1/models
  std::string api_key;
  std::string endpoint = "completions";  // or "chat"
  std::vector<int> concurrency = {1, 2, 4, 8};
  int requests_per_level = 0;  // 0: 4 x concurrency (at least 8)
  int input_words = 128;       // prompt length in words (about one token each)
  int input_tokens = 0;        // > 0: send prompts of exactly this many token ids instead (completions only)
  int output_tokens = 128;
  double jitter = 0.0;         // +/- fraction applied to input and output lengths
  int n = 1;
  int best_of = 0;             // 0: not sent
  bool stream = true;
  double temperature = 0.0;
  int shared_prefix_words = 0; // words every prompt starts with (exercises prefix caching)
  uint64_t seed = 1;
  double max_p99_e2e_s = 0;    // stop the sweep after a level whose p99 e2e exceeds this (0: never)
  int timeout_s = 600;         // per request
};

struct Percentiles {
  double mean = 0, p50 = 0, p90 = 0, p95 = 0, p99 = 0;
};

struct LevelResult {
  int concurrency = 0;
  int requests = 0;
  int errors = 0;
  std::string first_error;
  double duration_s = 0;
  double requests_per_s = 0;
  double output_tokens_per_s = 0;
  Percentiles ttft_s, tpot_s, e2e_s;
  double mean_input_tokens = 0;
  double mean_output_tokens = 0;
  double prefix_cache_hit_rate = 0;  // cached prompt tokens / prompt tokens, from usage
};

// Runs the sweep. `progress` gets a one-line status now and then.
std::vector<LevelResult> run_sweep(const LoadConfig& config, const std::function<void(const std::string&)>& progress);

std::string results_to_json(const LoadConfig& config, const std::vector<LevelResult>& results);
std::string results_to_table(const std::vector<LevelResult>& results);

}  // namespace tandem::loadgen
