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
        with self.assertRaises(ValueError):
            SamplingParams(guided_decoding={"json": {}})
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
