"""The Python module against vLLM's offline API, on the real trained stories260K (../shared/models).

Golden outputs come from the test data (llama2.c's greedy sample of stories260K), not from Pagoda.
Run by ctest with PYTHONPATH=<build>/python; without the test data the tests skip, unless CI or
PAGODA_REQUIRE_TEST_DATA is set, where they fail.
"""

import gc
import os
import signal
import unittest

import pagoda
from pagoda import LLM, SamplingParams


def _data_dir():
    env = os.environ.get("PAGODA_TEST_DATA")
    if env:
        return env
    source = os.environ.get("PAGODA_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
    return os.path.join(source, "..", "shared", "models")


def _required():
    return any(os.environ.get(n, "") not in ("", "0", "false") for n in ("CI", "PAGODA_REQUIRE_TEST_DATA"))


STORIES = os.path.join(_data_dir(), "stories260K", "stories260K.gguf")


def setUpModule():
    if not os.path.exists(STORIES):
        if _required():
            raise RuntimeError(f"test data missing: {STORIES}")
        raise unittest.SkipTest(f"test data missing: {STORIES} (set PAGODA_TEST_DATA)")


def _mapped_bytes():
    """The process's address space (statm's size): the KV cache is mapped whole when the LLM is
    made (its pages are touched only as it fills), and unmapped when it is freed."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


class LLMTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # The snippet, as a vLLM user writes it.
        cls.llm = LLM(model=STORIES, max_model_len=512, gpu_memory_utilization=0.85, enable_prefix_caching=True,
                      block_size=16)

    def test_snippet_runs_and_samples(self):
        outputs = self.llm.generate(["Hello, my name is"], SamplingParams(temperature=0.8, top_p=0.95, max_tokens=64),
                                    use_tqdm=False)
        self.assertEqual(len(outputs), 1)
        out = outputs[0]
        self.assertEqual(out.prompt, "Hello, my name is")
        self.assertEqual(out.prompt_token_ids, self.llm.get_tokenizer().encode("Hello, my name is"))
        self.assertEqual(len(out.outputs), 1)
        c = out.outputs[0]
        self.assertGreater(len(c.token_ids), 0)
        self.assertLessEqual(len(c.token_ids), 64)
        self.assertIn(c.finish_reason, ("stop", "length"))
        tok = self.llm.get_tokenizer()
        prompt_text = tok.decode(out.prompt_token_ids)  # the continuation's text: what decoding adds after the prompt
        self.assertEqual(prompt_text + c.text, tok.decode(out.prompt_token_ids + c.token_ids))

    def test_greedy_from_bos_is_the_golden_sample(self):
        folder = os.path.dirname(STORIES)
        with open(os.path.join(folder, "greedy-bos-256.ids")) as f:
            want_ids = [int(t) for t in f.read().split()]
        with open(os.path.join(folder, "greedy-bos-256.txt"), encoding="utf-8") as f:
            want_text = f.read()[:-1]  # the file's own final newline
        bos = self.llm.get_tokenizer().bos_token_id
        out = self.llm.generate({"prompt_token_ids": [bos]}, SamplingParams(temperature=0, max_tokens=256),
                                use_tqdm=False)[0]
        self.assertIsNone(out.prompt)
        self.assertEqual(out.prompt_token_ids, [bos])
        self.assertEqual(out.outputs[0].token_ids, want_ids)
        self.assertEqual(out.outputs[0].text, want_text)
        self.assertEqual(out.outputs[0].finish_reason, "length")

    def test_a_batch_comes_back_in_order(self):
        prompts = ["Once upon a time", "The cat", "Lily and Tom went to the park", "One day"]
        greedy = SamplingParams(temperature=0, max_tokens=24)
        alone = [self.llm.generate(p, greedy, use_tqdm=False)[0].outputs[0].text for p in prompts]
        together = self.llm.generate(prompts, greedy)  # with the progress bar
        self.assertEqual([o.prompt for o in together], prompts)
        self.assertEqual([o.outputs[0].text for o in together], alone)
        self.assertEqual(len({o.request_id for o in together}), len(prompts))
        # One SamplingParams per prompt.
        lengths = [SamplingParams(temperature=0, max_tokens=m) for m in (1, 2, 3, 4)]
        mixed = self.llm.generate(prompts, lengths, use_tqdm=False)
        self.assertEqual([len(o.outputs[0].token_ids) for o in mixed], [1, 2, 3, 4])

    def test_token_id_prompts_equal_their_text(self):
        tok = self.llm.get_tokenizer()
        ids = tok.encode("Once upon a time")
        greedy = SamplingParams(temperature=0, max_tokens=16)
        by_ids = self.llm.generate({"prompt_token_ids": ids}, greedy, use_tqdm=False)[0]
        by_text = self.llm.generate("Once upon a time", greedy, use_tqdm=False)[0]
        self.assertEqual(by_ids.prompt_token_ids, ids)
        self.assertEqual(by_ids.outputs[0].token_ids, by_text.outputs[0].token_ids)

    def test_n_sequences_and_seeds(self):
        params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=20)
        out = self.llm.generate("Once upon a time", params, use_tqdm=False)[0]
        self.assertEqual([c.index for c in out.outputs], [0, 1, 2])
        again = self.llm.generate("Once upon a time", params, use_tqdm=False)[0]
        self.assertEqual([c.token_ids for c in out.outputs], [c.token_ids for c in again.outputs])
        self.assertGreater(len({tuple(c.token_ids) for c in out.outputs}), 1)

    def test_logprobs(self):
        params = SamplingParams(temperature=0, max_tokens=8, logprobs=3, prompt_logprobs=2)
        out = self.llm.generate("Once upon a time", params, use_tqdm=False)[0]
        c = out.outputs[0]
        self.assertEqual(len(c.logprobs), len(c.token_ids))
        total = 0.0
        for token, position in zip(c.token_ids, c.logprobs):
            self.assertIn(token, position)
            self.assertLessEqual(len(position), 3 + 1)
            chosen = position[token]
            self.assertLessEqual(chosen.logprob, 0.0)
            self.assertEqual(chosen.rank, 1)  # greedy: the most likely token
            self.assertEqual(max(p.logprob for p in position.values()), chosen.logprob)
            self.assertIsInstance(chosen.decoded_token, str)
            total += chosen.logprob
        self.assertAlmostEqual(c.cumulative_logprob, total, places=4)
        self.assertEqual(len(out.prompt_logprobs), len(out.prompt_token_ids))
        self.assertIsNone(out.prompt_logprobs[0])
        for token, position in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:]):
            self.assertIn(token, position)
        plain = self.llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0]
        self.assertIsNone(plain.outputs[0].logprobs)
        self.assertIsNone(plain.outputs[0].cumulative_logprob)
        self.assertEqual(plain.outputs[0].token_ids, c.token_ids)

    def test_stop_reason(self):
        greedy = SamplingParams(temperature=0, max_tokens=64)
        text = self.llm.generate("Once upon a time", greedy, use_tqdm=False)[0].outputs[0].text
        word = text.split()[2]
        out = self.llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=64, stop=[word]),
                                use_tqdm=False)[0].outputs[0]
        self.assertEqual(out.finish_reason, "stop")
        self.assertEqual(out.stop_reason, word)
        self.assertNotIn(word, out.text)

    def test_bad_arguments_raise_value_error(self):
        with self.assertRaisesRegex(ValueError, "top_p"):
            self.llm.generate("hi", SamplingParams(top_p=1.5), use_tqdm=False)
        with self.assertRaisesRegex(ValueError, "max_tokens"):
            self.llm.generate("hi", SamplingParams(max_tokens=0), use_tqdm=False)
        with self.assertRaisesRegex(ValueError, "prompt 1"):
            self.llm.generate(["hi", {"prompt_token_ids": [10 ** 6]}], SamplingParams(), use_tqdm=False)
        with self.assertRaises(TypeError):
            SamplingParams(guided_decoding={"json": {}})  # a GuidedDecodingParams, not a dict
        with self.assertRaisesRegex(ValueError, "spaces_between_special_tokens"):  # refused, not dropped
            self.llm.generate("hi", SamplingParams(spaces_between_special_tokens=False), use_tqdm=False)
        with self.assertRaises(TypeError):
            SamplingParams(no_such_field=1)
        with self.assertRaisesRegex(ValueError, "nonexistent"):
            LLM(model="/nonexistent/model.gguf")
        with self.assertRaises(ValueError):
            LLM(model=STORIES, block_size=0)
        with self.assertRaises(ValueError):
            LLM(model=STORIES, tensor_parallel_size=2)
        with self.assertRaisesRegex(ValueError, "tokenizer-mode"):
            LLM(model=STORIES, tokenizer_mode="mistral")  # a keyword with a flag is checked, not dropped
        # The engine is still usable after all of these.
        out = self.llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
        self.assertEqual(len(out[0].outputs[0].token_ids), 4)

    def test_structured_outputs_follow_their_constraint(self):
        from pagoda import GuidedDecodingParams, StructuredOutputsParams
        import json
        import re
        schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                                   "age": {"type": "integer", "minimum": 1, "maximum": 99}},
                  "required": ["name", "age"]}
        cases = [
            (StructuredOutputsParams(choice=["happy", "sad"]), lambda t: t in ("happy", "sad")),
            (StructuredOutputsParams(regex="[a-z]{3,8}[0-9]"), lambda t: re.fullmatch("[a-z]{3,8}[0-9]", t)),
            (GuidedDecodingParams(json=schema, disable_any_whitespace=True),
             lambda t: 1 <= json.loads(t)["age"] <= 99 and list(json.loads(t)) == ["name", "age"] and " " not in t[:3]),
            # (A JSON text; whitespace off: the tiny model would spend its tokens on it.)
            (StructuredOutputsParams(json=json.dumps(schema), disable_any_whitespace=True),
             lambda t: isinstance(json.loads(t)["name"], str)),
        ]
        for params, valid in cases:
            for key in ("structured_outputs", "guided_decoding"):
                if key == "guided_decoding" and not isinstance(params, GuidedDecodingParams):
                    continue
                sp = SamplingParams(temperature=1.0, seed=5, max_tokens=60, **{key: params})
                out = self.llm.generate(["Once upon a time"] * 3, sp, use_tqdm=False)
                for o in out:
                    text = o.outputs[0].text
                    self.assertEqual(o.outputs[0].finish_reason, "stop", text)
                    self.assertTrue(valid(text), f"{params!r}: {text!r}")
        with self.assertRaisesRegex(ValueError, "exactly one"):
            StructuredOutputsParams(json={}, regex="a")
        with self.assertRaisesRegex(ValueError, "not both"):
            SamplingParams(structured_outputs=StructuredOutputsParams(regex="a"),
                           guided_decoding=GuidedDecodingParams(regex="b"))
        with self.assertRaisesRegex(ValueError, "multipleOf"):
            self.llm.generate("hi", SamplingParams(structured_outputs=StructuredOutputsParams(
                json={"type": "integer", "multipleOf": 2})), use_tqdm=False)

    def test_sampling_params_are_checked_when_made(self):
        # As vLLM's SamplingParams does: a bad value raises ValueError at construction, naming it.
        bad = [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_k": -2}, "top_k"),
               ({"min_p": 1.5}, "min_p"), ({"n": 0}, "n must be"), ({"presence_penalty": 3}, "presence_penalty"),
               ({"repetition_penalty": 0}, "repetition_penalty"), ({"max_tokens": 0}, "max_tokens"),
               ({"max_tokens": 4, "min_tokens": 5}, "min_tokens"), ({"stop": ["a", ""]}, "stop"),
               ({"logprobs": -1}, "logprobs"), ({"logit_bias": {5: 101}}, "logit_bias"),
               ({"stop_token_ids": [-1]}, "stop_token_ids"), ({"temperature": "hot"}, "temperature"),
               ({"temperature": float("nan")}, "temperature")]
        for kwargs, name in bad:
            with self.assertRaisesRegex(ValueError, name, msg=str(kwargs)):
                SamplingParams(**kwargs)
        # The engine's own bounds (--max-logprobs, 20 by default; the vocabulary) are checked at
        # generate(), when a model takes the request.
        many_logprobs = SamplingParams(temperature=0, max_tokens=None, logprobs=30)
        with self.assertRaisesRegex(ValueError, "logprobs"):
            self.llm.generate("hi", many_logprobs, use_tqdm=False)
        unknown_id = SamplingParams(temperature=0, stop_token_ids=[10 ** 6])
        with self.assertRaisesRegex(ValueError, "stop_token_ids"):
            self.llm.generate("hi", unknown_id, use_tqdm=False)

    def test_generate_without_tqdm_has_no_progress_bar(self):
        # A package installed without its Recommends has no tqdm: generate() still runs.
        import sys
        saved = sys.modules.get("tqdm")
        sys.modules["tqdm"] = None  # makes "from tqdm import tqdm" raise ImportError
        try:
            out = self.llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=4))
        finally:
            if saved is None:
                del sys.modules["tqdm"]
            else:
                sys.modules["tqdm"] = saved
        self.assertEqual(len(out[0].outputs[0].token_ids), 4)

    def test_ctrl_c_aborts_and_the_engine_stays_usable(self):
        # SIGINT arrives while the first prompt's completion is reported (the progress bar's
        # update, inside the engine's run): the call raises KeyboardInterrupt without running the
        # longer prompts to their end, and the LLM stays usable.
        updates = []

        class Interrupting(pagoda._Progress):
            def __call__(self, done, total):
                updates.append(done)
                if len(updates) == 1:
                    os.kill(os.getpid(), signal.SIGINT)
                super().__call__(done, total)

        params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (1, 200, 300, 400)]
        saved = pagoda._Progress
        pagoda._Progress = Interrupting
        try:
            with self.assertRaises(KeyboardInterrupt):
                self.llm.generate(["Once upon a time"] * 4, params)
        finally:
            pagoda._Progress = saved
        self.assertEqual(updates, [1])
        self.assertLess(self.llm._engine.last_steps, 10)  # aborted, not run for 400 more tokens
        # The interrupt handler did not leak: a plain SIGINT still raises after the call.
        self.assertIs(signal.getsignal(signal.SIGINT), signal.default_int_handler)
        self.llm.generate(["Once upon a time"] * 4, params, use_tqdm=False)
        self.assertGreaterEqual(self.llm._engine.last_steps, 400)  # the same call runs to its end


# A template in the style of the ones models ship: the template writes BOS itself.
TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if enable_thinking is defined and enable_thinking %}(thinking)\n{% endif %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")


class ChatTest(unittest.TestCase):
    """llm.chat and the tokenizer's apply_chat_template. stories260K has no chat template of its own
    (llama2.c's export has none), so the tests pass one, as vLLM's users do with chat_template=."""

    @classmethod
    def setUpClass(cls):
        cls.llm = LLM(model=STORIES, max_model_len=512)
        cls.tok = cls.llm.get_tokenizer()

    def test_chat_renders_the_template_and_generates_from_it(self):
        messages = [{"role": "system", "content": "Tell a story."}, {"role": "user", "content": "Once upon a time"}]
        greedy = SamplingParams(temperature=0, max_tokens=24)
        out = self.llm.chat(messages, greedy, chat_template=TEMPLATE, use_tqdm=False)
        self.assertEqual(len(out), 1)
        # The rendering, written out by hand: the template's text, with llama's BOS text.
        want_text = "<s>system: Tell a story.\nuser: Once upon a time\nassistant:"
        self.assertEqual(out[0].prompt, want_text)
        ids = out[0].prompt_token_ids
        bos = self.tok.bos_token_id
        self.assertEqual(ids[0], bos)  # "<s>" written by the template is the control token
        self.assertEqual(ids.count(bos), 1)  # and the tokenizer did not add another
        self.assertEqual(self.tok.decode(ids, skip_special_tokens=True), want_text[len("<s>"):])
        # The tokenizer's apply_chat_template gives the same text and ids (HF's defaults: ids, no
        # generation prompt).
        self.assertEqual(self.tok.apply_chat_template(messages, chat_template=TEMPLATE, add_generation_prompt=True,
                                                      tokenize=False), want_text)
        self.assertEqual(self.tok.apply_chat_template(messages, chat_template=TEMPLATE, add_generation_prompt=True),
                         ids)
        self.assertEqual(self.tok.apply_chat_template(messages, chat_template=TEMPLATE, tokenize=False),
                         want_text[:-len("assistant:")])
        # What chat generates is what generate() does from the same ids.
        plain = self.llm.generate({"prompt_token_ids": ids}, greedy, use_tqdm=False)[0]
        self.assertEqual(out[0].outputs[0].token_ids, plain.outputs[0].token_ids)
        self.assertEqual(out[0].outputs[0].text, plain.outputs[0].text)
        self.assertGreater(len(plain.outputs[0].token_ids), 0)

    def test_a_batch_of_conversations_in_order_with_per_conversation_params(self):
        conversations = [[{"role": "user", "content": c}] for c in ("Lily", "Tim had a dog", "The sun")]
        params = [SamplingParams(temperature=0, max_tokens=k) for k in (3, 5, 7)]
        out = self.llm.chat(conversations, params, chat_template=TEMPLATE, use_tqdm=False)
        self.assertEqual([o.prompt for o in out], [f"<s>user: {c[0]['content']}\nassistant:" for c in conversations])
        self.assertEqual([len(o.outputs[0].token_ids) for o in out], [3, 5, 7])
        self.assertEqual(len({o.request_id for o in out}), 3)
        # Alone, the second conversation gives the same greedy tokens.
        alone = self.llm.chat(conversations[1], params[1], chat_template=TEMPLATE, use_tqdm=False)[0]
        self.assertEqual(alone.outputs[0].token_ids, out[1].outputs[0].token_ids)

    def test_chat_with_n_and_logprobs(self):
        messages = [{"role": "user", "content": "Hi"}]
        out = self.llm.chat(messages, SamplingParams(n=2, seed=7, max_tokens=6, logprobs=2), chat_template=TEMPLATE,
                            use_tqdm=False)[0]
        self.assertEqual([c.index for c in out.outputs], [0, 1])
        for c in out.outputs:
            self.assertEqual(len(c.logprobs), len(c.token_ids))
            for token, position in zip(c.token_ids, c.logprobs):
                self.assertIn(token, position)
                self.assertLessEqual(len(position), 3)  # the sampled token and the top 2
            self.assertAlmostEqual(c.cumulative_logprob, sum(p[t].logprob for t, p in zip(c.token_ids, c.logprobs)),
                                   places=4)

    def test_template_variables_and_template_files(self):
        messages = [{"role": "user", "content": "Hi"}]
        thinking = self.tok.apply_chat_template(messages, chat_template=TEMPLATE, tokenize=False, enable_thinking=True)
        self.assertEqual(thinking, "<s>user: Hi\n(thinking)\n")
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False) as f:
            f.write("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
        try:
            self.assertEqual(self.tok.apply_chat_template(messages, chat_template=f.name, tokenize=False), "[Hi]")
            out = self.llm.chat(messages, SamplingParams(max_tokens=2), chat_template=f.name, use_tqdm=False)[0]
            self.assertEqual(out.prompt, "[Hi]")
        finally:
            os.unlink(f.name)

    def test_chat_errors_raise_value_error(self):
        messages = [{"role": "user", "content": "Hi"}]
        with self.assertRaisesRegex(ValueError, "no chat template"):
            self.llm.chat(messages, use_tqdm=False)
        with self.assertRaisesRegex(ValueError, "no chat template"):
            self.tok.apply_chat_template(messages)
        with self.assertRaisesRegex(ValueError, "chat template 1:"):
            self.llm.chat(messages, chat_template="{% for %}", use_tqdm=False)
        with self.assertRaisesRegex(ValueError, "neither a file nor a template"):
            self.llm.chat(messages, chat_template="/no/such/template.jinja", use_tqdm=False)
        with self.assertRaisesRegex(ValueError, "role"):
            self.llm.chat([{"role": "wizard", "content": "Hi"}], chat_template=TEMPLATE, use_tqdm=False)
        with self.assertRaisesRegex(ValueError, "continue_final_message"):
            self.llm.chat(messages, chat_template=TEMPLATE, continue_final_message=True, use_tqdm=False)
        with self.assertRaisesRegex(ValueError, "continue_final_message"):
            self.tok.apply_chat_template(messages, chat_template=TEMPLATE, continue_final_message=True)
        with self.assertRaisesRegex(ValueError, "tools"):  # tools are rendered, a malformed one refused
            self.llm.chat(messages, chat_template=TEMPLATE, use_tqdm=False, tools=[{"type": "retrieval"}])
        with self.assertRaisesRegex(ValueError, "context_length|maximum context length|max_model_len"):
            self.llm.chat([{"role": "user", "content": "word " * 600}], chat_template=TEMPLATE, use_tqdm=False)
        # The engine serves on after every refusal.
        out = self.llm.chat(messages, SamplingParams(temperature=0, max_tokens=4), chat_template=TEMPLATE,
                            use_tqdm=False)
        self.assertEqual(len(out[0].outputs[0].token_ids), 4)


class ModelChatTemplateTest(unittest.TestCase):
    """The model's own chat template, found as `pagoda serve` finds it: here Qwen3's, from its real
    tokenizer_config.json, on a Qwen3-0.6B-shaped model with random weights (its text is noise; the
    prompts are the point). The expected renderings are Qwen3's documented chat format."""

    @classmethod
    def setUpClass(cls):
        cls.tokenizer_dir = os.path.join(_data_dir(), "tokenizers", "qwen3")
        cls.llm = LLM(model="qwen3-0.6b", load_format="dummy", dtype="q4_0", tokenizer=cls.tokenizer_dir,
                      max_model_len=256)
        cls.tok = cls.llm.get_tokenizer()

    def test_the_models_template_renders_qwen3s_format(self):
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        header = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        self.assertEqual(self.tok.apply_chat_template(messages, tokenize=False), header)
        want = header + "<|im_start|>assistant\n"
        self.assertEqual(self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), want)
        no_thinking = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                   enable_thinking=False)
        self.assertEqual(no_thinking, want + "<think>\n\n</think>\n\n")
        out = self.llm.chat(messages, SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)[0]
        self.assertEqual(out.prompt, want)
        # <|im_start|> and <|im_end|> written by the template are single control tokens.
        im_start = self.tok.encode("<|im_start|>", add_special_tokens=False)
        self.assertEqual(len(im_start), 1)
        self.assertEqual(out.prompt_token_ids.count(im_start[0]), 3)
        self.assertEqual(out.prompt_token_ids, self.tok.encode(want, add_special_tokens=False))
        self.assertEqual(len(out.outputs[0].token_ids), 3)
        thinking_off = self.llm.chat(messages, SamplingParams(max_tokens=1), use_tqdm=False,
                                     chat_template_kwargs={"enable_thinking": False})[0]
        self.assertEqual(thinking_off.prompt, no_thinking)


class HfOverridesTest(unittest.TestCase):
    def test_rope_scaling_stretches_the_context(self):
        """hf_overrides reaches --hf-overrides: stories260K's 2,048 positions stretched 4 times."""
        with self.assertRaisesRegex(ValueError, "max-model-len"):
            LLM(model=STORIES, max_model_len=8192, kv_cache_memory_bytes=64 << 20)
        llm = LLM(model=STORIES, max_model_len=8192, kv_cache_memory_bytes=64 << 20,
                  hf_overrides={"rope_scaling": {"rope_type": "linear", "factor": 4}})
        out = llm.generate("Once upon a time " * 600, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
        self.assertGreater(len(out[0].prompt_token_ids), 2048)
        self.assertEqual(len(out[0].outputs[0].token_ids), 4)
        with self.assertRaisesRegex(ValueError, "num_hidden_layers"):
            LLM(model=STORIES, hf_overrides={"num_hidden_layers": 2})
        with self.assertRaisesRegex(ValueError, "hf_overrides as a dict"):
            LLM(model=STORIES, hf_overrides=lambda config: config)


class LifetimeTest(unittest.TestCase):
    def test_a_collected_llm_frees_its_memory(self):
        gc.collect()
        before = _mapped_bytes()
        llm = LLM(model=STORIES, max_model_len=256, kv_cache_memory_bytes=512 << 20)
        llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
        held = _mapped_bytes()
        del llm
        gc.collect()
        after = _mapped_bytes()
        self.assertGreater(held - before, 512 << 20, "the KV cache is mapped while the LLM lives")
        self.assertLess(after - before, 64 << 20, "the LLM's memory is freed once it is collected")


if __name__ == "__main__":
    unittest.main()
