"""Pagoda's offline Python API: vLLM's ``LLM`` and ``SamplingParams``, unchanged.

    from pagoda import LLM, SamplingParams
    llm = LLM(model="model.gguf", max_model_len=4096)
    outputs = llm.generate(["Hello, my name is"], SamplingParams(temperature=0.8, max_tokens=64))
    print(outputs[0].outputs[0].text)

The engine is C++ (the ``_pagoda`` extension). ``LLM``'s keywords are ``pagoda generate``'s
flags under vLLM's names (``max_model_len`` is ``--max-model-len``), checked by the same code;
requests go through the server's request parser, so a bad value raises ``ValueError`` with the
message the server would give in its 400.
"""

import json
import math

from . import _pagoda

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "GuidedDecodingParams", "RequestOutput",
           "CompletionOutput", "Logprob", "Tokenizer"]

# Keywords of vLLM's LLM / EngineArgs that have no flag here and change nothing on a CPU (those
# with a flag, swap_space or tokenizer_mode, go to it and are checked there).
_ACCEPTED_WITHOUT_EFFECT = {"cpu_offload_gb", "disable_custom_all_reduce", "disable_log_stats",
                            "compilation_config", "mm_processor_kwargs", "task"}
# Keywords whose meaning Pagoda does not have: refused rather than silently ignored.
_UNSUPPORTED = {"skip_tokenizer_init", "allowed_local_media_path", "override_pooler_config"}


def _flag_args(kwargs):
    args = []
    for name, value in kwargs.items():
        if value is None or name in _ACCEPTED_WITHOUT_EFFECT:
            continue
        if name in _UNSUPPORTED:
            raise ValueError(f"pagoda.LLM does not support {name}")
        if callable(value):  # vLLM's hf_overrides may be a function of the config
            raise ValueError(f"pagoda.LLM takes {name} as a dict, not a function")
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            args.append(f"{flag}={'true' if value else 'false'}")
        elif isinstance(value, dict):
            args += [flag, json.dumps(value)]
        else:
            args += [flag, str(value)]
    return args


class StructuredOutputsParams:
    """vLLM's StructuredOutputsParams: one constraint of json (a schema: a dict, its JSON text, or a
    pydantic model class), regex, choice, grammar (GBNF) or json_object, with
    disable_any_whitespace. The output follows it exactly (the server's structured outputs)."""

    _CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object")

    def __init__(self, json=None, regex=None, choice=None, grammar=None, json_object=None, disable_fallback=False,
                 disable_any_whitespace=False, disable_additional_properties=False, whitespace_pattern=None,
                 structural_tag=None, backend=None):
        self.json, self.regex, self.choice, self.grammar, self.json_object = json, regex, choice, grammar, json_object
        self.disable_fallback = disable_fallback
        self.disable_any_whitespace = disable_any_whitespace
        self.disable_additional_properties = disable_additional_properties
        self.whitespace_pattern, self.structural_tag, self.backend = whitespace_pattern, structural_tag, backend
        given = [name for name in self._CONSTRAINTS if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise ValueError("structured outputs take exactly one of json, regex, choice, grammar, json_object; got "
                             + (", ".join(given) or "none"))
        if whitespace_pattern is not None:
            raise ValueError("whitespace_pattern is not supported by pagoda (disable_any_whitespace is)")
        if structural_tag is not None:
            raise ValueError("structural_tag is not supported by pagoda")

    def __repr__(self):
        name = next(n for n in self._CONSTRAINTS if getattr(self, n) not in (None, False))
        return f"{type(self).__name__}({name}={getattr(self, name)!r})"

    def _body(self):
        body = {}
        schema = self.json
        if schema is not None and hasattr(schema, "model_json_schema"):  # a pydantic model class
            schema = schema.model_json_schema()
        for name, value in (("json", schema), ("regex", self.regex), ("grammar", self.grammar)):
            if value is not None:
                body[name] = value
        if self.choice is not None:
            body["choice"] = [str(c) for c in self.choice]
        if self.json_object:
            body["json_object"] = True
        if self.disable_any_whitespace:
            body["disable_any_whitespace"] = True
        if self.disable_additional_properties:
            body["disable_additional_properties"] = True
        return body


class GuidedDecodingParams(StructuredOutputsParams):
    """vLLM's older name for StructuredOutputsParams (SamplingParams(guided_decoding=...))."""


class SamplingParams:
    """vLLM's SamplingParams: the same keywords, the same defaults."""

    _FIELDS = {
        "n": 1, "best_of": None, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
        "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None, "stop": None,
        "stop_token_ids": None, "ignore_eos": False, "max_tokens": 16, "min_tokens": 0, "logprobs": None,
        "prompt_logprobs": None, "detokenize": True, "skip_special_tokens": True,
        "spaces_between_special_tokens": True, "include_stop_str_in_output": False, "logit_bias": None,
        "bad_words": None, "allowed_token_ids": None, "truncate_prompt_tokens": None, "logits_processors": None,
        "guided_decoding": None, "structured_outputs": None, "output_kind": None,
    }
    # Fields Pagoda has no way to honour: refused when set, not ignored.
    _REFUSED = ("bad_words", "allowed_token_ids", "truncate_prompt_tokens", "logits_processors")

    def __init__(self, **kwargs):
        for name in kwargs:
            if name not in self._FIELDS:
                raise TypeError(f"SamplingParams got an unexpected keyword argument '{name}'")
        for name, default in self._FIELDS.items():
            setattr(self, name, kwargs.get(name, default))
        for name in self._REFUSED:
            if getattr(self, name) is not None:
                raise ValueError(f"SamplingParams.{name} is not supported by pagoda")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("SamplingParams.best_of is not supported by pagoda (give n alone)")
        if not self.detokenize:
            raise ValueError("SamplingParams.detokenize=False is not supported by pagoda")
        if self.structured_outputs is not None and self.guided_decoding is not None:
            raise ValueError("give structured_outputs or guided_decoding (its older name), not both")
        for name in ("structured_outputs", "guided_decoding"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, StructuredOutputsParams):
                raise TypeError(f"SamplingParams.{name} must be a StructuredOutputsParams")
        problem = _pagoda.sampling_params_problem(json.dumps(self._body()))
        if problem is not None:
            raise ValueError(problem)

    def __repr__(self):
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._FIELDS if getattr(self, k) != self._FIELDS[k])
        return f"SamplingParams({fields})"

    def clone(self):
        return SamplingParams(**{k: getattr(self, k) for k in self._FIELDS})

    def _body(self):
        body = {"n": self.n, "presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty,
                "repetition_penalty": self.repetition_penalty, "temperature": self.temperature, "top_p": self.top_p,
                "top_k": self.top_k, "min_p": self.min_p, "ignore_eos": self.ignore_eos,
                "max_tokens": self.max_tokens, "min_tokens": self.min_tokens,
                "skip_special_tokens": self.skip_special_tokens,
                "include_stop_str_in_output": self.include_stop_str_in_output,
                "spaces_between_special_tokens": self.spaces_between_special_tokens}
        if self.seed is not None:
            body["seed"] = self.seed
        if self.stop is not None:
            body["stop"] = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        if self.stop_token_ids is not None:
            body["stop_token_ids"] = list(self.stop_token_ids)
        if self.logprobs is not None:
            body["logprobs"] = self.logprobs
        if self.prompt_logprobs is not None:
            body["prompt_logprobs"] = self.prompt_logprobs
        if self.logit_bias is not None:
            body["logit_bias"] = {str(k): v for k, v in dict(self.logit_bias).items()}
        constraint = self.structured_outputs or self.guided_decoding
        if constraint is not None:
            body["structured_outputs"] = constraint._body()
        for key, value in body.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{key} must be finite, got {value}")
        return body


class Logprob:
    """One token's log-probability, its rank among the top ones (None when not among them) and its text."""

    __slots__ = ("logprob", "rank", "decoded_token")

    def __init__(self, logprob, rank=None, decoded_token=None):
        self.logprob = logprob
        self.rank = rank
        self.decoded_token = decoded_token

    def __repr__(self):
        return f"Logprob(logprob={self.logprob}, rank={self.rank}, decoded_token={self.decoded_token!r})"


def _logprobs(positions):
    if positions is None:
        return None
    return [None if p is None else {tid: Logprob(*entry) for tid, entry in p.items()} for p in positions]


class CompletionOutput:
    """One generated sequence: vLLM's attribute names."""

    def __init__(self, d):
        self.index = d["index"]
        self.text = d["text"]
        self.token_ids = d["token_ids"]
        self.cumulative_logprob = d["cumulative_logprob"]
        self.logprobs = _logprobs(d["logprobs"])
        self.finish_reason = d["finish_reason"]
        self.stop_reason = d["stop_reason"]

    def finished(self):
        return self.finish_reason is not None

    def __repr__(self):
        return (f"CompletionOutput(index={self.index}, text={self.text!r}, token_ids={self.token_ids}, "
                f"cumulative_logprob={self.cumulative_logprob}, finish_reason={self.finish_reason}, "
                f"stop_reason={self.stop_reason})")


class RequestOutput:
    """One prompt's outputs: vLLM's attribute names."""

    def __init__(self, request_id, d):
        self.request_id = request_id
        self.prompt = d["prompt"]
        self.prompt_token_ids = d["prompt_token_ids"]
        self.prompt_logprobs = _logprobs(d["prompt_logprobs"])
        self.outputs = [CompletionOutput(o) for o in d["outputs"]]
        self.finished = True
        self.num_cached_tokens = d["num_cached_tokens"]

    def __repr__(self):
        return (f"RequestOutput(request_id={self.request_id}, prompt={self.prompt!r}, "
                f"prompt_token_ids={self.prompt_token_ids}, outputs={self.outputs}, finished={self.finished})")


class Tokenizer:
    """The model's tokenizer (``LLM.get_tokenizer()``): encode / decode as Hugging Face's do."""

    def __init__(self, engine):
        self._engine = engine

    @property
    def vocab_size(self):
        return self._engine.vocab_size

    @property
    def eos_token_id(self):
        return self._engine.eos_token_id

    @property
    def bos_token_id(self):
        return self._engine.bos_token_id

    def encode(self, text, add_special_tokens=True):
        return self._engine.encode(text, add_special_tokens)

    def decode(self, token_ids, skip_special_tokens=True):
        return self._engine.decode(list(token_ids), skip_special_tokens)

    def apply_chat_template(self, conversation, tools=None, chat_template=None, add_generation_prompt=False,
                            continue_final_message=False, tokenize=True, **kwargs):
        """Hugging Face's apply_chat_template: the conversation rendered with the model's chat template
        (or ``chat_template``, a file or the template text), as token ids or, with tokenize=False,
        the text. Keywords left over are the template's variables, of which only ``enable_thinking``
        is read (Qwen3's; as the server reads chat_template_kwargs)."""
        for name in ("return_tensors", "return_dict", "documents"):
            if kwargs.get(name):
                raise ValueError(f"apply_chat_template: {name} is not supported by pagoda")
            kwargs.pop(name, None)
        for name in ("padding", "truncation", "max_length"):
            kwargs.pop(name, None)  # only apply to batches of tensors, which are refused above
        body = _chat_body({}, conversation, tools, add_generation_prompt, continue_final_message, kwargs)
        text, ids = self._engine.apply_chat_template(json.dumps(body), chat_template or "")
        return ids if tokenize else text

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": self.encode(text, add_special_tokens)}

    def __len__(self):
        return self.vocab_size


def _one_each(sampling_params, count, what):
    """One SamplingParams per prompt: the default, one for all, or a list of as many."""
    if sampling_params is None:
        sampling_params = SamplingParams()
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * count
    sampling_params = list(sampling_params)
    if len(sampling_params) != count:
        raise ValueError(f"{count} {what} but {len(sampling_params)} sampling_params")
    return sampling_params


def _chat_body(body, conversation, tools, add_generation_prompt, continue_final_message, template_kwargs):
    """A chat completions body: the server's parser checks it (roles, content, tools, the template's
    variables) as it checks /v1/chat/completions."""
    if not isinstance(conversation, (list, tuple)) or not all(isinstance(m, dict) for m in conversation):
        raise ValueError("a conversation is a list of messages, each a dict with 'role' and 'content'")
    body["messages"] = list(conversation)
    body["add_generation_prompt"] = bool(add_generation_prompt)
    body["continue_final_message"] = bool(continue_final_message)
    if tools:
        # Rendered for the model, not parsed back: LLM.chat returns the text, as vLLM's does.
        body["tools"] = list(tools)
        body.setdefault("tool_choice", "none")
    if template_kwargs:
        body["chat_template_kwargs"] = dict(template_kwargs)
    return body


class _Progress:
    """vLLM's progress bar (tqdm, as vLLM's) over the prompts of one generate() call."""

    def __init__(self, total):
        try:
            from tqdm import tqdm
        except ImportError:  # no progress bar without tqdm (a package installed without Recommends)
            tqdm = None
        self._bar = tqdm(total=total, desc="Processed prompts", dynamic_ncols=True) if tqdm else None
        self._done = 0

    def __call__(self, done, total):
        if self._bar is not None:
            self._bar.update(done - self._done)
        self._done = done

    def close(self):
        if self._bar is not None:
            self._bar.close()


class LLM:
    """vLLM's offline entry point: LLM(model=..., **engine_args).generate(prompts, sampling_params)."""

    def __init__(self, model, tokenizer=None, **kwargs):
        if "model" in kwargs:
            raise TypeError("model given twice")
        args = _flag_args(dict(model=model, tokenizer=tokenizer, **kwargs))
        self._engine = _pagoda.Engine(args)
        self._next_id = 0

    def get_tokenizer(self):
        return Tokenizer(self._engine)

    def generate(self, prompts=None, sampling_params=None, use_tqdm=True, prompt_token_ids=None, **kwargs):
        """prompts: a string, a list of strings, a dict {"prompt": ...} / {"prompt_token_ids": [...]}
        or a list of those. sampling_params: one SamplingParams for all, or a list, one per prompt."""
        for name in kwargs:
            if name not in ("lora_request", "priority", "guided_options_request"):
                raise TypeError(f"generate() got an unexpected keyword argument '{name}'")
            if kwargs[name] is not None:
                raise ValueError(f"generate(): {name} is not supported by pagoda")
        if prompts is None and prompt_token_ids is not None:
            prompts = [{"prompt_token_ids": ids} for ids in prompt_token_ids]
        if prompts is None:
            raise ValueError("generate() needs prompts")
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        sampling_params = _one_each(sampling_params, len(prompts), "prompts")
        bodies, texts = [], []
        for prompt, params in zip(prompts, sampling_params):
            if not isinstance(params, SamplingParams):
                raise TypeError("sampling_params must be SamplingParams")
            body = params._body()
            if isinstance(prompt, dict) and "prompt" in prompt and "prompt_token_ids" not in prompt:
                prompt = prompt["prompt"]
            if isinstance(prompt, str):
                body["prompt"] = prompt
                texts.append(prompt)
            elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
                body["prompt"] = [int(t) for t in prompt["prompt_token_ids"]]
                texts.append(prompt.get("prompt"))
            else:
                raise ValueError("a prompt is a string, {'prompt': str} or {'prompt_token_ids': [int, ...]}")
            bodies.append(json.dumps(body))
        results = self._run(bodies, use_tqdm)
        for d, text in zip(results, texts):
            d["prompt"] = text  # None for token ids, as vLLM
        return self._outputs(results)

    def chat(self, messages, sampling_params=None, use_tqdm=True, lora_request=None, chat_template=None,
             chat_template_content_format="auto", add_generation_prompt=True, continue_final_message=False,
             tools=None, chat_template_kwargs=None, mm_processor_kwargs=None):
        """messages: one conversation (a list of {"role": ..., "content": ...}) or a list of them.
        Each is rendered with the model's chat template (or ``chat_template``, a file or the text)
        and generated from as generate() does; RequestOutput.prompt is the rendered text."""
        if lora_request is not None:
            raise ValueError("chat(): lora_request is not supported by pagoda")
        if chat_template_content_format not in ("auto", "string", "openai"):
            raise ValueError(f"chat_template_content_format must be auto, string or openai, "
                             f"got {chat_template_content_format!r}")
        if not isinstance(messages, (list, tuple)) or not messages:
            raise ValueError("chat() needs a conversation (a list of messages) or a list of conversations")
        conversations = [messages] if isinstance(messages[0], dict) else list(messages)
        sampling_params = _one_each(sampling_params, len(conversations), "conversations")
        bodies = []
        for conversation, params in zip(conversations, sampling_params):
            if not isinstance(params, SamplingParams):
                raise TypeError("sampling_params must be SamplingParams")
            body = params._body()
            if "logprobs" in body:  # chat's form of the same request
                body["top_logprobs"] = body.pop("logprobs")
                body["logprobs"] = True
            bodies.append(json.dumps(_chat_body(body, conversation, tools, add_generation_prompt,
                                                continue_final_message, chat_template_kwargs)))
        return self._outputs(self._run(bodies, use_tqdm, chat=True, chat_template=chat_template or ""))

    def _run(self, bodies, use_tqdm, **kwargs):
        progress = _Progress(len(bodies)) if use_tqdm and bodies else None
        try:
            return self._engine.generate(bodies, progress, **kwargs)
        finally:
            if progress is not None:
                progress.close()

    def _outputs(self, results):
        outputs = []
        for d in results:
            outputs.append(RequestOutput(str(self._next_id), d))
            self._next_id += 1
        return outputs
