// _pagoda: the C++ half of the Python module `pagoda` (python/pagoda/__init__.py holds vLLM's
// classes, LLM, SamplingParams, RequestOutput, on top of it).
//
// An Engine is built from `pagoda generate`'s own flags (the Python keywords turned into them by
// the package), so that the Python API, the CLI and the server accept, default and refuse the
// same settings. Requests arrive as completions or chat completions bodies (JSON) and go through
// the server's request parsers, for the same reason; chat templates are found as `pagoda serve`
// finds them. While the engine runs, the GIL is released; the progress
// callback and a check for signals (Ctrl-C) take it back once a step.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launch/cli_flags.h"
#include "launch/engine_setup.h"
#include "engine/llm.h"
#include "server/openai_request.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/unicode.h"

namespace py = pybind11;

namespace pagoda::python {
namespace {

[[noreturn]] void raise(const Status& st) {
  if (st.code() == StatusCode::kInvalidArgument || st.code() == StatusCode::kNotFound ||
      st.code() == StatusCode::kUnimplemented || st.code() == StatusCode::kDataLoss) {
    throw py::value_error(st.message());
  }
  throw std::runtime_error(st.message());
}

const char* finish_reason_text(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    default: return nullptr;
  }
}

// One logprobs position as vLLM gives it: {token_id: (logprob, rank, decoded_token)} holding the
// sampled (or prompt) token and the top ones. rank: the place among the top ones (1 = most
// likely); the chosen token's is None when it is not among them (not computed), as the server's.
py::dict position_logprobs(const SampledOutput& s, const Tokenizer& tok) {
  py::dict d;
  auto text = [&](TokenId id) { return unicode::sanitize_utf8(tok.token_bytes(id)); };
  py::object own_rank = py::none();
  for (size_t k = 0; k < s.top_logprobs.size(); ++k) {
    if (s.top_logprobs[k].token == s.token) own_rank = py::int_(k + 1);
  }
  d[py::int_(s.token)] = py::make_tuple(s.logprob, own_rank, text(s.token));
  for (size_t k = 0; k < s.top_logprobs.size(); ++k) {
    const TokenLogprobEntry& e = s.top_logprobs[k];
    if (e.token != s.token) d[py::int_(e.token)] = py::make_tuple(e.logprob, k + 1, text(e.token));
  }
  return d;
}

class Engine {
 public:
  explicit Engine(const std::vector<std::string>& args) {
    if (Status st = app::register_backends(); !st.ok()) raise(st);
    CLI::App app("pagoda (Python)");
    app::add_model_flags(app, model_, true);
    app::add_engine_flags(app, engine_);
    app.add_option("--max-tokens", default_max_tokens_);
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 parses a vector backwards
    try {
      app.parse(reversed);
    } catch (const CLI::ParseError& e) {
      throw py::value_error(e.what());
    }
    if (Status st = model_.check(); !st.ok()) raise(st);
    if (Status st = engine_.check_one_replica("pagoda.LLM"); !st.ok()) raise(st);
    if (engine_.tensor_parallel_size != 1 || engine_.pipeline_parallel_size != 1) {
      throw py::value_error("pagoda.LLM runs in one process: tensor_parallel_size and pipeline_parallel_size must be 1 "
                            "(run `pagoda serve` under mpirun for more)");
    }
    // The model's chat template, found as `pagoda serve` finds it. Unlike the server, a model
    // whose template is missing or broken still loads: only chat() without a template of its
    // own then fails, saying why.
    Result<app::EngineSetup> setup = [&] {
      py::gil_scoped_release release;
      return app::make_engine(model_, engine_, [&](const Tokenizer& tok) {
        model_chat_ = load_chat_template("", tok);
        return Status::ok_status();
      });
    }();
    if (!setup.ok()) raise(setup.status());
    setup_ = std::move(*setup);
    ctx_ = app::model_context(model_, setup_, default_max_tokens_);
    llm_ = std::make_unique<LLM>(std::move(setup_.engine));
  }

  // bodies: one completions body (JSON) per prompt, each a single prompt, or with `chat` one
  // chat completions body per conversation, rendered with `chat_template` (a file or the text;
  // empty: the model's own). Returns one dict per body, in order. progress(done, total) after
  // each finished prompt (all its n sequences).
  py::list generate(const std::vector<std::string>& bodies, const py::object& progress, bool chat,
                    const std::string& chat_template) {
    std::vector<PreparedRequest> requests;  // checked by the parser, as the server checks them
    std::vector<server::ParsedRequest> parsed;
    std::optional<ChatTemplateHolder> call_template;
    const server::ModelContext ctx = chat ? chat_context(chat_template, call_template) : ctx_;
    for (size_t i = 0; i < bodies.size(); ++i) {
      server::ApiResult<server::ParsedRequest> p =
          chat ? server::parse_chat_request(bodies[i], ctx) : server::parse_completion_request(bodies[i], ctx);
      if (auto* e = std::get_if<server::ApiError>(&p)) {
        throw py::value_error((chat ? "conversation " : "prompt ") + std::to_string(i) + ": " + e->message);
      }
      parsed.push_back(std::get<server::ParsedRequest>(std::move(p)));
      if (parsed.back().prompts.size() != 1) throw py::value_error("one prompt per request");
      requests.push_back(parsed.back().prompts[0]);
    }
    std::unique_ptr<py::error_already_set> pending;  // raised by a signal handler or the callback
    last_steps_ = 0;
    Result<std::vector<RequestOutput>> results = [&] {
      py::gil_scoped_release release;
      return llm_->generate(
          requests,
          [&](size_t done, size_t total) {
            if (progress.is_none() || pending) return;
            py::gil_scoped_acquire acquire;
            try {
              progress(done, total);
            } catch (py::error_already_set& e) {
              pending = std::make_unique<py::error_already_set>(std::move(e));
            }
          },
          [&] {
            ++last_steps_;
            if (pending) return true;
            py::gil_scoped_acquire acquire;
            if (PyErr_CheckSignals() != 0) pending = std::make_unique<py::error_already_set>();
            return pending != nullptr;
          });
    }();
    if (pending) throw std::move(*pending);
    if (!results.ok()) raise(results.status());
    py::list out;
    const Tokenizer& tok = *setup_.tokenizer;
    for (size_t i = 0; i < results->size(); ++i) {
      const RequestOutput& r = (*results)[i];
      const GenerateRequest& req = parsed[i].prompts[0];
      py::dict d;
      d["prompt"] = parsed[i].prompt_texts.empty() ? py::object(py::none()) : py::object(py::str(parsed[i].prompt_texts[0]));
      d["prompt_token_ids"] = r.prompt_token_ids;
      if (req.params.prompt_logprobs) {
        py::list plp;
        plp.append(py::none());  // nothing precedes the first prompt token
        for (size_t t = 0; t < r.prompt_logprobs.size(); ++t) {
          plp.append(position_logprobs(r.prompt_logprobs[t], tok));
        }
        d["prompt_logprobs"] = plp;
      } else {
        d["prompt_logprobs"] = py::none();
      }
      py::list outputs;
      for (const CompletionOutput& o : r.outputs) {
        py::dict c;
        c["index"] = o.index;
        c["text"] = o.text;
        c["token_ids"] = o.token_ids;
        if (req.params.logprobs) {
          py::list lps;
          double cumulative = 0;
          for (const SampledOutput& s : o.logprobs) {
            lps.append(position_logprobs(s, tok));
            cumulative += s.logprob;
          }
          c["logprobs"] = lps;
          c["cumulative_logprob"] = cumulative;
        } else {
          c["logprobs"] = py::none();
          c["cumulative_logprob"] = py::none();
        }
        const char* reason = finish_reason_text(o.finish_reason);
        c["finish_reason"] = reason ? py::object(py::str(reason)) : py::object(py::none());
        // vLLM's stop_reason: the stop string or stop token id that ended the sequence, else None.
        if (!o.stop_string.empty()) {
          c["stop_reason"] = o.stop_string;
        } else if (o.stop_token >= 0 && o.finish_reason == FinishReason::kStop) {
          c["stop_reason"] = o.stop_token;
        } else {
          c["stop_reason"] = py::none();
        }
        outputs.append(c);
      }
      d["outputs"] = outputs;
      d["num_cached_tokens"] = r.cached_tokens;
      out.append(d);
    }
    return out;
  }

  // A chat completions body's messages rendered as chat() would (with add_generation_prompt and
  // chat_template_kwargs): the text and its token ids.
  std::pair<std::string, std::vector<TokenId>> apply_chat_template(const std::string& body,
                                                                   const std::string& chat_template) {
    std::optional<ChatTemplateHolder> call_template;
    const server::ModelContext ctx = chat_context(chat_template, call_template);
    server::ApiResult<ChatPrompt> rendered = server::render_chat_messages(body, ctx);
    if (auto* e = std::get_if<server::ApiError>(&rendered)) throw py::value_error(e->message);
    ChatPrompt& p = std::get<ChatPrompt>(rendered);
    return {std::move(p.text), std::move(p.ids)};
  }

  std::vector<TokenId> encode(const std::string& text, bool add_special_tokens) const {
    return setup_.tokenizer->encode(text, add_special_tokens);
  }
  std::string decode(const std::vector<TokenId>& ids, bool skip_special_tokens) const {
    for (TokenId id : ids) {
      if (id < 0 || id >= setup_.tokenizer->vocab_size()) {
        throw py::value_error("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                              std::to_string(setup_.tokenizer->vocab_size()) + ")");
      }
    }
    return setup_.tokenizer->decode(ids, skip_special_tokens);
  }
  int64_t vocab_size() const { return setup_.tokenizer->vocab_size(); }
  std::optional<TokenId> eos_token_id() const { return setup_.tokenizer->eos_id(); }
  std::optional<TokenId> bos_token_id() const { return setup_.tokenizer->bos_id(); }
  int64_t max_model_len() const { return ctx_.max_model_len; }
  const std::string& kernels() const { return setup_.kernels; }
  int64_t last_steps() const { return last_steps_; }

 private:
  // A parsed chat template with the bos / eos texts it is rendered with; or why there is none.
  struct ChatTemplateHolder {
    std::optional<ChatTemplate> parsed;
    std::string bos, eos;
    Status error;
  };

  ChatTemplateHolder load_chat_template(const std::string& flag, const Tokenizer& tok) const {
    ChatTemplateHolder h;
    Result<app::ChatTemplateSource> found = app::find_chat_template(flag, model_, tok);
    if (!found.ok()) {
      h.error = found.status();
      return h;
    }
    if (found->text.empty()) {
      h.error = invalid_argument("the model has no chat template; pass chat_template= (a file or the template text)");
      return h;
    }
    Result<ChatTemplate> parsed = ChatTemplate::parse(found->text);
    if (!parsed.ok()) {
      h.error = parsed.status();
      return h;
    }
    h.parsed = std::move(*parsed);
    h.bos = std::move(found->bos);
    h.eos = std::move(found->eos);
    return h;
  }

  // The request context with a chat template: `chat_template` (loaded into `holder`) or the
  // model's. Raises ValueError when there is none or it does not parse.
  server::ModelContext chat_context(const std::string& chat_template, std::optional<ChatTemplateHolder>& holder) const {
    const ChatTemplateHolder* use = &model_chat_;
    if (!chat_template.empty()) use = &holder.emplace(load_chat_template(chat_template, *setup_.tokenizer));
    if (!use->parsed) raise(use->error);
    server::ModelContext ctx = ctx_;
    ctx.chat_template = &*use->parsed;
    ctx.bos_token = use->bos;
    ctx.eos_token = use->eos;
    return ctx;
  }

  app::ModelFlags model_;
  app::EngineFlags engine_;
  int64_t default_max_tokens_ = 16;
  app::EngineSetup setup_;
  std::unique_ptr<LLM> llm_;
  server::ModelContext ctx_;      // completions; chat_context() adds a template
  ChatTemplateHolder model_chat_;  // the model's own template
  int64_t last_steps_ = 0;  // engine steps of the last generate() call
};

}  // namespace
}  // namespace pagoda::python

PYBIND11_MODULE(_pagoda, m) {
  using pagoda::python::Engine;
  m.doc() = "Pagoda's engine, for the pagoda package (vLLM's offline API)";
  // Why a SamplingParams (its completions body, JSON) is refused, or None: the server's rules.
  m.def("sampling_params_problem", [](const std::string& body) { return pagoda::server::sampling_fields_problem(body); },
        py::arg("body"));
  py::class_<Engine>(m, "Engine")
      .def(py::init<const std::vector<std::string>&>(), py::arg("args"))
      .def("generate", &Engine::generate, py::arg("bodies"), py::arg("progress") = py::none(), py::arg("chat") = false,
           py::arg("chat_template") = "")
      .def("apply_chat_template", &Engine::apply_chat_template, py::arg("body"), py::arg("chat_template") = "")
      .def("encode", &Engine::encode, py::arg("text"), py::arg("add_special_tokens") = true)
      .def("decode", &Engine::decode, py::arg("ids"), py::arg("skip_special_tokens") = true)
      .def_property_readonly("vocab_size", &Engine::vocab_size)
      .def_property_readonly("eos_token_id", &Engine::eos_token_id)
      .def_property_readonly("bos_token_id", &Engine::bos_token_id)
      .def_property_readonly("max_model_len", &Engine::max_model_len)
      .def_property_readonly("kernels", &Engine::kernels)
      .def_property_readonly("last_steps", &Engine::last_steps, "engine steps of the last generate() call");
}
