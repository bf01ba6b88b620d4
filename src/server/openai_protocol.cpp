#include "server/openai_protocol.h"

#include "util/json_depth.h"

#include <algorithm>
#include <cctype>
#include <cfloat>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <utility>

namespace tandem::server {

using json = nlohmann::json;
// Requests keep their key order: a chat template's tojson prints tools and
// messages as the client wrote them, as Python's dicts do.
using rjson = nlohmann::ordered_json;

namespace {

std::string describe_number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// Reads the fields of one JSON object, keeping the first error. Field names
// in errors carry `prefix_` ("stream_options.", "messages[2].").
class FieldReader {
 public:
  explicit FieldReader(const rjson& obj, std::string prefix = {})
      : obj_(obj), prefix_(std::move(prefix)) {}

  bool ok() const { return !error_.has_value(); }
  std::optional<ApiError>& error() { return error_; }
  void fail(ApiError e) {
    if (!error_) error_ = std::move(e);
  }
  std::string name(std::string_view key) const { return prefix_ + std::string(key); }

  // nullptr when absent or null: OpenAI reads an explicit null as "not given".
  const rjson* get(const char* key) const {
    const auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  bool read_bool(const char* key, bool& out) {
    const rjson* v = get(key);
    if (!v) return false;
    if (!v->is_boolean()) {
      fail(invalid_type(name(key), "a boolean"));
      return false;
    }
    out = v->get<bool>();
    return true;
  }

  bool read_string(const char* key, std::string& out) {
    const rjson* v = get(key);
    if (!v) return false;
    if (!v->is_string()) {
      fail(invalid_type(name(key), "a string"));
      return false;
    }
    out = v->get<std::string>();
    return true;
  }

  // int32 fields; the semantic range is SamplingParams::validate's business.
  template <class Int>
  bool read_int(const char* key, Int& out) {
    const rjson* v = get(key);
    if (!v) return false;
    auto r = to_int(*v, name(key), std::numeric_limits<int32_t>::min(),
                    std::numeric_limits<int32_t>::max());
    if (!r) return false;
    out = static_cast<Int>(*r);
    return true;
  }

  bool read_float(const char* key, float& out) {
    const rjson* v = get(key);
    if (!v) return false;
    auto r = to_float(*v, name(key));
    if (!r) return false;
    out = *r;
    return true;
  }

  // An integer in [lo, hi]. Python clients may send 16.0 for 16, which
  // pydantic (and so vLLM) accepts; a fractional value is a type error.
  std::optional<int64_t> to_int(const rjson& v, const std::string& param, int64_t lo, int64_t hi) {
    std::optional<int64_t> value;
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u <= static_cast<uint64_t>(hi)) value = static_cast<int64_t>(u);
    } else if (v.is_number_integer()) {
      value = v.get<int64_t>();
    } else if (v.is_number_float()) {
      const double d = v.get<double>();
      if (!std::isfinite(d) || d != std::floor(d)) {
        fail(invalid_type(param, "an integer"));
        return std::nullopt;
      }
      // Comparing as doubles first keeps the conversion below in range; the
      // upper bound is exclusive because (double)INT64_MAX rounds up to 2^63.
      if (d >= static_cast<double>(lo) && d < static_cast<double>(hi) + 1.0)
        value = static_cast<int64_t>(d);
    } else {
      fail(invalid_type(param, "an integer"));
      return std::nullopt;
    }
    if (!value || *value < lo || *value > hi) {
      fail(invalid_value(param, "must be an integer in [" + std::to_string(lo) + ", " +
                                    std::to_string(hi) + "], got " + v.dump() + "."));
      return std::nullopt;
    }
    return value;
  }

  std::optional<float> to_float(const rjson& v, const std::string& param) {
    if (!v.is_number()) {
      fail(invalid_type(param, "a number"));
      return std::nullopt;
    }
    const double d = v.get<double>();
    if (!std::isfinite(d) || std::fabs(d) > FLT_MAX) {
      fail(invalid_value(
          param, "must be a finite number within float range, got " + describe_number(d) + "."));
      return std::nullopt;
    }
    return static_cast<float>(d);
  }

 private:
  const rjson& obj_;
  std::string prefix_;
  std::optional<ApiError> error_;
};

// The body must be a JSON object. nlohmann validates UTF-8 in strings while
// parsing, so every string read from a parsed body is valid UTF-8.
std::variant<rjson, ApiError> parse_object(std::string_view body) {
  if (const std::string_view problem = json_shape_problem(body); !problem.empty()) return bad_json(problem);
  rjson doc;
  try {
    doc = rjson::parse(body.begin(), body.end());
  } catch (const rjson::exception& e) {
    // Drop nlohmann's "[json.exception.parse_error.101] " tag; keep the position.
    std::string_view what = e.what();
    if (const size_t tag = what.find("] "); what.starts_with("[json.") && tag != what.npos)
      what.remove_prefix(tag + 2);
    return bad_json(what);
  }
  if (!doc.is_object()) {
    return bad_json(std::string("expected a JSON object, got ") +
                    (doc.is_array() ? "an array" : doc.type_name()));
  }
  return doc;
}

// An array of token ids, each in [0, n_vocab).
bool read_token_array(FieldReader& r, const rjson& arr, const std::string& param, int64_t n_vocab,
                      std::vector<int32_t>& out) {
  out.clear();
  out.reserve(arr.size());
  for (const rjson& v : arr) {
    if (!v.is_number()) {
      r.fail(invalid_type(param, "an array of integer token ids"));
      return false;
    }
    // Token ids index the vocabulary: [0, n_vocab).
    const auto id = r.to_int(v, param, 0, std::min<int64_t>(n_vocab, INT32_MAX) - 1);
    if (!id) return false;
    out.push_back(static_cast<int32_t>(*id));
  }
  return true;
}

// The first word of a SamplingParams::validate message is the field it is
// about ("temperature must be ...", "logit_bias token id ...", "stop[1] ...").
std::string validated_field(const std::string& message) {
  size_t n = 0;
  while (n < message.size() &&
         (std::islower(static_cast<unsigned char>(message[n])) || message[n] == '_'))
    ++n;
  return message.substr(0, n);
}

std::optional<ApiError> validate_sampling(const SamplingParams& sp, int64_t n_vocab,
                                          bool chat_logprobs) {
  const std::string message = sp.validate(n_vocab);
  if (message.empty()) return std::nullopt;
  std::string param = validated_field(message);
  // Chat requests give the number of alternatives as top_logprobs.
  if (chat_logprobs && param == "logprobs") param = "top_logprobs";
  return ApiError{400, "invalid_request_error", message + ".", param, "invalid_value"};
}

// Sampling fields common to both endpoints (OpenAI's, plus vLLM's top_k,
// min_p, repetition_penalty, ignore_eos, include_stop_str_in_output,
// stop_token_ids, best_of).
void read_sampling(FieldReader& r, int64_t n_vocab, SamplingParams& sp) {
  r.read_float("temperature", sp.temperature);
  r.read_float("top_p", sp.top_p);
  r.read_int("top_k", sp.top_k);
  r.read_float("min_p", sp.min_p);
  r.read_float("presence_penalty", sp.presence_penalty);
  r.read_float("frequency_penalty", sp.frequency_penalty);
  r.read_float("repetition_penalty", sp.repetition_penalty);
  r.read_int("n", sp.n);
  sp.best_of = sp.n;
  r.read_int("best_of", sp.best_of);
  r.read_bool("ignore_eos", sp.ignore_eos);
  r.read_bool("include_stop_str_in_output", sp.include_stop_str_in_output);

  if (const rjson* seed = r.get("seed")) {
    // Any 64-bit integer; a negative seed keeps its two's complement bits.
    if (seed->is_number_unsigned()) {
      sp.seed = seed->get<uint64_t>();
    } else if (auto v = r.to_int(*seed, "seed", std::numeric_limits<int64_t>::min(),
                                 std::numeric_limits<int64_t>::max())) {
      sp.seed = static_cast<uint64_t>(*v);
    }
  }

  if (const rjson* stop = r.get("stop")) {
    if (stop->is_string()) {
      sp.stop = {stop->get<std::string>()};
    } else if (stop->is_array()) {
      for (const rjson& s : *stop) {
        if (!s.is_string()) {
          r.fail(invalid_type("stop", "a string or an array of strings"));
          break;
        }
        sp.stop.push_back(s.get<std::string>());
      }
    } else {
      r.fail(invalid_type("stop", "a string or an array of strings"));
    }
  }

  if (const rjson* ids = r.get("stop_token_ids")) {
    if (!ids->is_array()) {
      r.fail(invalid_type("stop_token_ids", "an array of integer token ids"));
    } else {
      read_token_array(r, *ids, "stop_token_ids", n_vocab, sp.stop_token_ids);
    }
  }

  if (const rjson* bias = r.get("logit_bias")) {
    if (!bias->is_object()) {
      r.fail(invalid_type("logit_bias", "an object mapping token ids to numbers"));
    } else {
      for (const auto& [key, value] : bias->items()) {
        // Keys are token ids written as decimal strings, as in OpenAI's API.
        int64_t id = -1;
        const char* end = key.data() + key.size();
        const auto [ptr, ec] = std::from_chars(key.data(), end, id);
        if (key.empty() || ec != std::errc() || ptr != end || id < 0) {
          const std::string got = "got \"" + key + "\".";
          r.fail(invalid_value("logit_bias",
                               "keys must be token ids written as decimal integers, " + got));
          break;
        }
        const auto b = r.to_float(value, "logit_bias");
        if (!b) break;
        sp.logit_bias.emplace_back(static_cast<int32_t>(std::min<int64_t>(id, INT32_MAX)), *b);
      }
    }
  }
}

// stream and stream_options; OpenAI (and vLLM) refuse stream_options without stream.
void read_stream(FieldReader& r, bool& stream, bool& include_usage) {
  r.read_bool("stream", stream);
  const rjson* opts = r.get("stream_options");
  if (!opts) return;
  if (!opts->is_object()) {
    r.fail(invalid_type("stream_options", "an object"));
    return;
  }
  if (!stream) {
    r.fail(invalid_value("stream_options", "is only allowed when stream is true."));
    return;
  }
  FieldReader o(*opts, "stream_options.");
  o.read_bool("include_usage", include_usage);
  if (!o.ok()) r.fail(std::move(*o.error()));
}

// best_of picks the best of several finished sequences, so nothing can be
// streamed before all of them end (OpenAI refuses the combination too).
void check_best_of_stream(FieldReader& r, const SamplingParams& sp, bool stream) {
  if (r.ok() && stream && sp.best_of > sp.n)
    r.fail(invalid_value("best_of", "best_of greater than n cannot be used with stream."));
}

// The content of one message: a string, or an array of text parts (joined
// with "\n", as vLLM does for templates that take a string); null when an
// assistant turn has none (OpenAI allows it with tool calls).
void read_content(FieldReader& r, const rjson& msg, const std::string& prefix, bool optional,
                  rjson& out) {
  const auto it = msg.find("content");
  if (it == msg.end() || it->is_null()) {
    if (!optional) r.fail(missing_field(prefix + "content"));
    out = nullptr;
    return;
  }
  if (it->is_string()) {
    out = *it;
    return;
  }
  if (!it->is_array()) {
    r.fail(invalid_type(prefix + "content", "a string or an array of content parts"));
    return;
  }
  std::string joined;
  for (size_t j = 0; j < it->size(); ++j) {
    const rjson& part = (*it)[j];
    const std::string where = prefix + "content[" + std::to_string(j) + "]";
    if (!part.is_object()) {
      r.fail(invalid_type(where, "a content part object"));
      return;
    }
    FieldReader p(part, where + ".");
    std::string type, text;
    if (!p.read_string("type", type)) {
      if (p.ok()) p.fail(missing_field(where + ".type"));
    } else if (type != "text") {
      p.fail(unsupported(where + ".type", "content parts of type '" + type +
                                              "' are not supported; only 'text' parts are."));
    } else if (!p.read_string("text", text) && p.ok()) {
      p.fail(missing_field(where + ".text"));
    }
    if (!p.ok()) {
      r.fail(std::move(*p.error()));
      return;
    }
    if (j > 0) joined += '\n';
    joined += text;
  }
  out = std::move(joined);
}

// An assistant turn's tool_calls, as OpenAI sends them (arguments a JSON
// string), into what chat templates read (arguments an object, as vLLM
// hands them to transformers).
void read_tool_calls(FieldReader& m, const rjson& calls, const std::string& prefix, rjson& out) {
  if (!calls.is_array()) {
    m.fail(invalid_type(prefix + "tool_calls", "an array of tool call objects"));
    return;
  }
  out = rjson::array();
  for (size_t j = 0; j < calls.size() && m.ok(); ++j) {
    const std::string where = prefix + "tool_calls[" + std::to_string(j) + "]";
    const rjson& call = calls[j];
    if (!call.is_object()) {
      m.fail(invalid_type(where, "a tool call object"));
      return;
    }
    FieldReader c(call, where + ".");
    std::string type = "function";
    c.read_string("type", type);
    const rjson* fn = c.get("function");
    if (c.ok() && type != "function") c.fail(invalid_value(where + ".type", "must be 'function', got '" + type + "'."));
    if (c.ok() && !fn) c.fail(missing_field(where + ".function"));
    if (c.ok() && !fn->is_object()) c.fail(invalid_type(where + ".function", "an object"));
    rjson normalized = call;
    if (c.ok()) {
      FieldReader f(*fn, where + ".function.");
      std::string name;
      if (!f.read_string("name", name) && f.ok()) f.fail(missing_field(where + ".function.name"));
      const rjson* args = f.get("arguments");
      if (f.ok() && args && args->is_string()) {
        const std::string& text = args->get_ref<const std::string&>();
        const std::string_view problem = json_shape_problem(text);
        rjson parsed = problem.empty() ? rjson::parse(text, nullptr, false) : rjson(rjson::value_t::discarded);
        if (!problem.empty()) {
          f.fail(invalid_value(where + ".function.arguments", std::string("is too large a JSON document: ") + std::string(problem) + "."));
        } else if (parsed.is_discarded()) {
          f.fail(invalid_value(where + ".function.arguments", "is not valid JSON (it must be a JSON-encoded object)."));
        } else {
          normalized["function"]["arguments"] = std::move(parsed);
        }
      } else if (f.ok() && args && !args->is_object()) {
        f.fail(invalid_type(where + ".function.arguments", "a JSON-encoded string"));
      }
      if (!f.ok()) c.fail(std::move(*f.error()));
    }
    if (!c.ok()) {
      m.fail(std::move(*c.error()));
      return;
    }
    out.push_back(std::move(normalized));
  }
}

void read_messages(FieldReader& r, rjson& out) {
  const rjson* msgs = r.get("messages");
  if (!msgs) {
    r.fail(missing_field("messages"));
    return;
  }
  if (!msgs->is_array()) {
    r.fail(invalid_type("messages", "an array of message objects"));
    return;
  }
  if (msgs->empty()) {
    r.fail(invalid_value("messages", "must contain at least one message."));
    return;
  }
  out = rjson::array();
  for (size_t i = 0; i < msgs->size() && r.ok(); ++i) {
    const rjson& msg = (*msgs)[i];
    const std::string prefix = "messages[" + std::to_string(i) + "].";
    if (!msg.is_object()) {
      r.fail(invalid_type("messages[" + std::to_string(i) + "]", "a message object"));
      return;
    }
    FieldReader m(msg, prefix);
    rjson normalized = msg;
    std::string role;
    if (!m.read_string("role", role)) {
      if (m.ok()) m.fail(missing_field(prefix + "role"));
    } else if (role == "developer") {
      role = "system";  // OpenAI's newer name for the system role
    } else if (role == "function") {
      m.fail(unsupported(prefix + "role", "'function' messages (OpenAI's deprecated function calling) are not "
                                          "supported; send the result as a 'tool' message."));
    } else if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      const std::string got = "got '" + role + "'.";
      m.fail(invalid_value(prefix + "role",
                           "must be one of 'system', 'developer', 'user', 'assistant' or 'tool', " + got));
    }
    if (m.ok()) normalized["role"] = role;
    if (m.ok() && m.get("function_call"))
      m.fail(unsupported(prefix + "function_call", "OpenAI's deprecated function calling is not supported; use tool_calls."));
    if (m.ok()) {
      if (const rjson* calls = m.get("tool_calls")) {
        if (role != "assistant") {
          m.fail(invalid_value(prefix + "tool_calls", "only assistant messages carry tool calls."));
        } else {
          read_tool_calls(m, *calls, prefix, normalized["tool_calls"]);
        }
      }
    }
    if (m.ok()) {
      rjson content;
      read_content(m, msg, prefix, role == "assistant", content);
      normalized["content"] = std::move(content);
    }
    if (!m.ok()) {
      r.fail(std::move(*m.error()));
      return;
    }
    out.push_back(std::move(normalized));
  }
}

// tools (rendered into the prompt by the chat template), documents and
// chat_template_kwargs (vLLM's extensions), add_generation_prompt.
void read_conversation_extras(FieldReader& r, ChatConversation& conv) {
  r.read_bool("add_generation_prompt", conv.add_generation_prompt);
  if (const rjson* tools = r.get("tools")) {
    if (!tools->is_array()) {
      r.fail(invalid_type("tools", "an array of tool objects"));
      return;
    }
    for (size_t i = 0; i < tools->size() && r.ok(); ++i) {
      const rjson& t = (*tools)[i];
      const std::string where = "tools[" + std::to_string(i) + "]";
      if (!t.is_object()) {
        r.fail(invalid_type(where, "a tool object"));
      } else if (!t.contains("function") || !t["function"].is_object()) {
        r.fail(missing_field(where + ".function"));
      } else if (!t["function"].contains("name") || !t["function"]["name"].is_string()) {
        r.fail(missing_field(where + ".function.name"));
      }
    }
    if (!tools->empty()) conv.tools = *tools;
  }
  if (const rjson* docs = r.get("documents")) {
    if (!docs->is_array()) {
      r.fail(invalid_type("documents", "an array of document objects"));
    } else {
      conv.documents = *docs;
    }
  }
  if (const rjson* kwargs = r.get("chat_template_kwargs")) {
    if (!kwargs->is_object()) {
      r.fail(invalid_type("chat_template_kwargs", "an object"));
    } else {
      for (const char* reserved : {"messages", "tools", "documents", "add_generation_prompt"}) {
        if (kwargs->contains(reserved) && r.ok())
          r.fail(invalid_value("chat_template_kwargs", std::string("'") + reserved +
                                                           "' comes from the request's own field of that name, not from here."));
      }
      conv.template_kwargs = *kwargs;
    }
  }
}

// tool_choice / functions / function_call / response_format: only the values
// that ask for plain text generation are accepted. Tools render into the
// prompt, but tandem does not parse tool calls out of the output, so like
// vLLM without a tool-call parser it serves them with tool_choice "none" only.
void read_unsupported_chat_features(FieldReader& r) {
  if (const rjson* v = r.get("functions")) {
    if (!v->is_array()) {
      r.fail(invalid_type("functions", "an array"));
    } else if (!v->empty()) {
      r.fail(unsupported("functions", "OpenAI's deprecated function calling is not supported."));
    }
  }
  const rjson* tools = r.get("tools");
  const bool has_tools = tools && tools->is_array() && !tools->empty();
  const char* no_parsing =
      "tandem renders tools into the prompt but does not parse tool calls out of the output, so "
      "requests with tools are served with tool_choice 'none' only (send it explicitly).";
  for (const char* key : {"tool_choice", "function_call"}) {
    const rjson* v = r.get(key);
    const bool is_tool_choice = std::string_view(key) == "tool_choice";
    if (!v) {
      if (is_tool_choice && has_tools && r.ok()) r.fail(unsupported("tool_choice", no_parsing));
      continue;
    }
    if (v->is_object()) {
      r.fail(unsupported(key, no_parsing));
    } else if (!v->is_string()) {
      r.fail(invalid_type(key, "a string or an object"));
    } else if (const auto s = v->get<std::string>(); s != "none" && s != "auto" && s != "required") {
      r.fail(invalid_value(key, "must be 'none', 'auto' or 'required', got '" + s + "'."));
    } else if (s == "required" || (s == "auto" && has_tools)) {
      r.fail(unsupported(key, no_parsing));
    }
  }
  if (const rjson* v = r.get("response_format")) {
    if (!v->is_object()) {
      r.fail(invalid_type("response_format", "an object"));
      return;
    }
    FieldReader f(*v, "response_format.");
    std::string type;
    if (!f.read_string("type", type)) {
      if (f.ok()) f.fail(missing_field("response_format.type"));
    } else if (type == "json_object" || type == "json_schema") {
      f.fail(unsupported("response_format",
                         "response_format of type '" + type +
                             "' is not supported (structured output is not implemented); only "
                             "'text' is."));
    } else if (type != "text") {
      f.fail(invalid_value("response_format.type",
                           "must be 'text', 'json_object' or 'json_schema', got '" + type + "'."));
    }
    if (!f.ok()) r.fail(std::move(*f.error()));
  }
}

// Reads the prompt of a completion request: a string, token ids, or an array
// holding exactly one of those.
void read_prompt(FieldReader& r, int64_t n_vocab, CompletionRequest& req) {
  const rjson* p = r.get("prompt");
  if (!p) {
    r.fail(missing_field("prompt"));
    return;
  }
  const char* expected = "a string or an array of token ids";
  if (p->is_string()) {
    req.prompt_text = p->get<std::string>();
    return;
  }
  if (!p->is_array()) {
    r.fail(invalid_type("prompt", expected));
    return;
  }
  if (p->empty()) {
    r.fail(invalid_value("prompt", "must not be empty."));
    return;
  }
  const rjson& first = p->front();
  if (first.is_string() || first.is_array()) {
    if (p->size() > 1) {
      r.fail(unsupported("prompt",
                         "an array of several prompts (a batch) is not supported; send "
                         "one prompt per request."));
      return;
    }
    if (first.is_string()) {
      req.prompt_text = first.get<std::string>();
      return;
    }
    if (first.empty()) {
      r.fail(invalid_value("prompt", "must not be empty."));
      return;
    }
    req.prompt_is_tokens = read_token_array(r, first, "prompt", n_vocab, req.prompt_tokens);
    return;
  }
  req.prompt_is_tokens = read_token_array(r, *p, "prompt", n_vocab, req.prompt_tokens);
}

template <class T>
Parsed<T> finish(FieldReader& r, T value) {
  if (!r.ok()) return std::move(*r.error());
  return value;
}

// -9999 stands for -inf (and anything not finite), as in vLLM. A float goes
// out as the shortest decimal that reads back as the same float, so JSON
// shows -0.25 rather than the double expansion of the float.
json logprob_json(float lp) {
  if (!std::isfinite(lp)) return -9999.0;
  lp = std::max(lp, -9999.0f);
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, lp);
  return std::strtod(std::string(buf, res.ptr).c_str(), nullptr);
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json finish_json(const std::string& reason) {
  if (reason.empty()) return nullptr;
  return reason;
}

// Characters (as Python counts them) in raw UTF-8 bytes: every byte that
// does not continue a multi-byte sequence.
int64_t count_chars(std::string_view bytes) {
  return std::count_if(bytes.begin(), bytes.end(),
                       [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

// The legacy completions format: parallel arrays, top alternatives as a map.
json completion_logprobs_json(const std::vector<OutputLogprob>& lps, int64_t text_offset) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  int64_t offset = text_offset;
  for (const OutputLogprob& lp : lps) {
    tokens.push_back(valid_utf8(lp.token));
    token_logprobs.push_back(logprob_json(lp.logprob));
    json alternatives = json::object();
    for (const LogprobCandidate& c : lp.top) {
      std::string key = valid_utf8(c.token);
      // Two tokens can share a text (or both be partial characters); the more
      // likely one, listed first, keeps the key.
      if (!alternatives.contains(key)) alternatives[std::move(key)] = logprob_json(c.logprob);
    }
    top.push_back(std::move(alternatives));
    offsets.push_back(offset);
    offset += count_chars(lp.token);
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

json bytes_json(std::string_view s) {
  json out = json::array();
  for (char c : s) out.push_back(static_cast<unsigned char>(c));
  return out;
}

json chat_logprobs_json(const std::vector<OutputLogprob>& lps) {
  json content = json::array();
  for (const OutputLogprob& lp : lps) {
    json top = json::array();
    for (const LogprobCandidate& c : lp.top) {
      top.push_back({{"token", valid_utf8(c.token)},
                     {"logprob", logprob_json(c.logprob)},
                     {"bytes", bytes_json(c.token)}});
    }
    content.push_back({{"token", valid_utf8(lp.token)},
                       {"logprob", logprob_json(lp.logprob)},
                       {"bytes", bytes_json(lp.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

json header_json(const ResponseHeader& h, std::string_view object) {
  return {{"id", valid_utf8(h.id)},
          {"object", object},
          {"created", h.created},
          {"model", valid_utf8(h.model)}};
}

json completion_choice_json(const CompletionChoice& c) {
  return {{"index", c.index},
          {"text", valid_utf8(c.text)},
          {"logprobs", c.logprobs ? completion_logprobs_json(*c.logprobs, c.text_offset) : json()},
          {"finish_reason", finish_json(c.finish_reason)}};
}

}  // namespace

// ---------------------------------------------------------------------------
// Requests

Parsed<CompletionRequest> parse_completion_request(std::string_view body, int64_t n_vocab) {
  auto doc = parse_object(body);
  if (auto* err = std::get_if<ApiError>(&doc)) return std::move(*err);
  const rjson& obj = std::get<rjson>(doc);
  FieldReader r(obj);
  CompletionRequest req;
  r.read_string("model", req.model);
  read_prompt(r, n_vocab, req);
  req.max_tokens = 16;
  r.read_int("max_tokens", *req.max_tokens);
  req.sampling.max_tokens = *req.max_tokens;
  read_sampling(r, n_vocab, req.sampling);
  if (const rjson* lp = r.get("logprobs")) {
    if (auto v = r.to_int(*lp, "logprobs", std::numeric_limits<int32_t>::min(),
                          std::numeric_limits<int32_t>::max()))
      req.sampling.logprobs = static_cast<int32_t>(*v);
  }
  r.read_bool("echo", req.echo);
  read_stream(r, req.stream, req.include_usage);
  if (const rjson* suffix = r.get("suffix")) {
    if (!suffix->is_string()) {
      r.fail(invalid_type("suffix", "a string"));
    } else if (!suffix->get_ref<const std::string&>().empty()) {
      r.fail(unsupported("suffix", "insertion (text after the completion) is not supported."));
    }
  }
  if (r.ok() && req.echo && req.sampling.logprobs >= 0) {
    r.fail(unsupported("echo",
                       "echo with logprobs needs log-probabilities of the prompt tokens, "
                       "which this server does not compute; drop echo or logprobs."));
  }
  check_best_of_stream(r, req.sampling, req.stream);
  if (r.ok()) {
    if (auto err = validate_sampling(req.sampling, n_vocab, false)) r.fail(std::move(*err));
  }
  return finish(r, std::move(req));
}

Parsed<ChatRequest> parse_chat_request(std::string_view body, int64_t n_vocab) {
  auto doc = parse_object(body);
  if (auto* err = std::get_if<ApiError>(&doc)) return std::move(*err);
  const rjson& obj = std::get<rjson>(doc);
  FieldReader r(obj);
  ChatRequest req;
  r.read_string("model", req.model);
  read_messages(r, req.conversation.messages);
  int32_t max_tokens = 0;
  if (r.read_int("max_completion_tokens", max_tokens) || r.read_int("max_tokens", max_tokens))
    req.max_tokens = max_tokens;
  if (req.max_tokens) req.sampling.max_tokens = *req.max_tokens;
  read_sampling(r, n_vocab, req.sampling);
  bool logprobs = false;
  r.read_bool("logprobs", logprobs);
  int32_t top_logprobs = 0;
  const bool top_given = r.read_int("top_logprobs", top_logprobs);
  if (logprobs) {
    req.sampling.logprobs = top_logprobs;
  } else if (top_given && top_logprobs > 0 && r.ok()) {
    r.fail(invalid_value("top_logprobs", "requires logprobs to be true."));
  }
  read_stream(r, req.stream, req.include_usage);
  read_conversation_extras(r, req.conversation);
  read_unsupported_chat_features(r);
  check_best_of_stream(r, req.sampling, req.stream);
  if (r.ok()) {
    if (auto err = validate_sampling(req.sampling, n_vocab, true)) r.fail(std::move(*err));
  }
  return finish(r, std::move(req));
}

Parsed<TokenizeRequest> parse_tokenize_request(std::string_view body) {
  auto doc = parse_object(body);
  if (auto* err = std::get_if<ApiError>(&doc)) return std::move(*err);
  const rjson& obj = std::get<rjson>(doc);
  FieldReader r(obj);
  TokenizeRequest req;
  r.read_string("model", req.model);
  const bool has_prompt = r.get("prompt") != nullptr, has_messages = r.get("messages") != nullptr;
  if (has_prompt && has_messages)
    return invalid_value("messages", "give either 'prompt' or 'messages', not both.");
  if (!has_prompt && !has_messages) {
    ApiError err = missing_field("prompt");
    err.message = "Missing required parameter: 'prompt' (a string) or 'messages' (chat messages).";
    return err;
  }
  req.is_chat = has_messages;
  if (has_prompt) {
    r.read_string("prompt", req.prompt);
  } else {
    read_messages(r, req.conversation.messages);
    read_conversation_extras(r, req.conversation);
  }
  bool add_special = false;
  if (r.read_bool("add_special_tokens", add_special)) req.add_special_tokens = add_special;
  r.read_bool("return_token_strs", req.return_token_strs);
  return finish(r, std::move(req));
}

Parsed<DetokenizeRequest> parse_detokenize_request(std::string_view body, int64_t n_vocab) {
  auto doc = parse_object(body);
  if (auto* err = std::get_if<ApiError>(&doc)) return std::move(*err);
  const rjson& obj = std::get<rjson>(doc);
  FieldReader r(obj);
  DetokenizeRequest req;
  r.read_string("model", req.model);
  const rjson* tokens = r.get("tokens");
  if (!tokens) {
    r.fail(missing_field("tokens"));
  } else if (!tokens->is_array()) {
    r.fail(invalid_type("tokens", "an array of integer token ids"));
  } else {
    read_token_array(r, *tokens, "tokens", n_vocab, req.tokens);
  }
  return finish(r, std::move(req));
}

std::optional<ApiError> check_model(std::string_view requested,
                                    std::span<const std::string> served) {
  if (requested.empty()) return std::nullopt;
  for (const std::string& name : served)
    if (name == requested) return std::nullopt;
  return model_not_found(requested);
}

std::optional<ApiError> fit_to_context(std::optional<int32_t> max_tokens, int64_t prompt_tokens,
                                       int64_t max_model_len, std::string_view param,
                                       SamplingParams& sampling) {
  if (prompt_tokens <= 0) {
    return invalid_value(param,
                         "is empty: it must hold at least one token (after "
                         "tokenization) for the model to continue from.");
  }
  if (max_tokens) {
    if (prompt_tokens + *max_tokens > max_model_len)
      return context_length_exceeded(param, max_model_len, prompt_tokens, *max_tokens);
    sampling.max_tokens = *max_tokens;
    return std::nullopt;
  }
  if (prompt_tokens >= max_model_len)
    return context_length_exceeded(param, max_model_len, prompt_tokens, -1);
  sampling.max_tokens = static_cast<int32_t>(
      std::min<int64_t>(max_model_len - prompt_tokens, std::numeric_limits<int32_t>::max()));
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// Responses

json completion_response(const ResponseHeader& header, std::span<const CompletionChoice> choices,
                         const Usage& usage) {
  json out = header_json(header, "text_completion");
  json list = json::array();
  for (const CompletionChoice& c : choices) list.push_back(completion_choice_json(c));
  out["choices"] = std::move(list);
  out["usage"] = usage_json(usage);
  return out;
}

json completion_chunk(const ResponseHeader& header, std::span<const CompletionChoice> choices,
                      bool with_usage) {
  // OpenAI streams completions as objects of the same type as the response.
  json out = header_json(header, "text_completion");
  json list = json::array();
  for (const CompletionChoice& c : choices) list.push_back(completion_choice_json(c));
  out["choices"] = std::move(list);
  if (with_usage) out["usage"] = nullptr;
  return out;
}

json completion_usage_chunk(const ResponseHeader& header, const Usage& usage) {
  json out = header_json(header, "text_completion");
  out["choices"] = json::array();
  out["usage"] = usage_json(usage);
  return out;
}

json chat_response(const ResponseHeader& header, std::span<const ChatChoice> choices,
                   const Usage& usage) {
  json out = header_json(header, "chat.completion");
  json list = json::array();
  for (const ChatChoice& c : choices) {
    list.push_back(
        {{"index", c.index},
         {"message",
          {{"role", "assistant"}, {"content", valid_utf8(c.content)}, {"refusal", nullptr}}},
         {"logprobs", c.logprobs ? chat_logprobs_json(*c.logprobs) : json()},
         {"finish_reason", finish_json(c.finish_reason)}});
  }
  out["choices"] = std::move(list);
  out["usage"] = usage_json(usage);
  return out;
}

json chat_chunk(const ResponseHeader& header, std::span<const ChatChunkChoice> choices,
                bool with_usage) {
  json out = header_json(header, "chat.completion.chunk");
  json list = json::array();
  for (const ChatChunkChoice& c : choices) {
    // The first delta names the role (with content "", as OpenAI sends it);
    // later ones carry only new text; the closing one may be empty.
    json delta = json::object();
    if (c.first) {
      delta["role"] = "assistant";
      delta["content"] = valid_utf8(c.content);
    } else if (!c.content.empty()) {
      delta["content"] = valid_utf8(c.content);
    }
    list.push_back({{"index", c.index},
                    {"delta", std::move(delta)},
                    {"logprobs", c.logprobs ? chat_logprobs_json(*c.logprobs) : json()},
                    {"finish_reason", finish_json(c.finish_reason)}});
  }
  out["choices"] = std::move(list);
  if (with_usage) out["usage"] = nullptr;
  return out;
}

json chat_usage_chunk(const ResponseHeader& header, const Usage& usage) {
  json out = header_json(header, "chat.completion.chunk");
  out["choices"] = json::array();
  out["usage"] = usage_json(usage);
  return out;
}

json models_response(std::span<const ModelCard> models) {
  json data = json::array();
  for (const ModelCard& m : models) {
    data.push_back({{"id", valid_utf8(m.id)},
                    {"object", "model"},
                    {"created", m.created},
                    {"owned_by", valid_utf8(m.owned_by)},
                    {"max_model_len", m.max_model_len}});
  }
  return {{"object", "list"}, {"data", std::move(data)}};
}

json tokenize_response(std::span<const int32_t> tokens, int64_t max_model_len,
                       const std::vector<std::string>* token_strs) {
  json strs = nullptr;
  if (token_strs) {
    strs = json::array();
    for (const std::string& s : *token_strs) strs.push_back(valid_utf8(s));
  }
  return {{"count", tokens.size()},
          {"max_model_len", max_model_len},
          {"tokens", std::vector<int32_t>(tokens.begin(), tokens.end())},
          {"token_strs", std::move(strs)}};
}

json detokenize_response(std::string_view text) { return {{"prompt", valid_utf8(text)}}; }

std::string make_response_id(std::string_view prefix, uint64_t random) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(random));
  return std::string(prefix) + hex;
}

std::string dump_body(const json& body) {
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse_event(const json& body) { return "data: " + dump_body(body) + "\n\n"; }

}  // namespace tandem::server
