#!/usr/bin/env python3
"""Writes the hand-made seed inputs of fuzz/corpus/ (run from anywhere; overwrites the seeds,
leaves saved findings alone). Every file is built here from the format specifications: tiny
valid files plus the corrupt cases the reliability checklist lists (bad magic, truncation,
huge counts and lengths, offsets past the end, bad alignment, mismatched arrays)."""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def out(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


# ---- GGUF (v3, little-endian) ----
T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64 = 4, 5, 6, 7, 8, 9, 10


def gstr(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv(key, typ, value):
    body = gstr(key) + struct.pack("<I", typ)
    if typ == T_U32:
        body += struct.pack("<I", value)
    elif typ == T_I32:
        body += struct.pack("<i", value)
    elif typ == T_F32:
        body += struct.pack("<f", value)
    elif typ == T_BOOL:
        body += struct.pack("<B", value)
    elif typ == T_STR:
        body += gstr(value)
    elif typ == T_U64:
        body += struct.pack("<Q", value)
    return body


def kv_arr(key, elem, values):
    body = gstr(key) + struct.pack("<I", T_ARR) + struct.pack("<IQ", elem, len(values))
    for v in values:
        if elem == T_STR:
            body += gstr(v)
        elif elem == T_F32:
            body += struct.pack("<f", v)
        elif elem == T_I32:
            body += struct.pack("<i", v)
    return body


def gguf(kvs, tensors, data, n_tensors=None, n_kv=None, magic=b"GGUF", version=3, align=32):
    head = magic + struct.pack("<I", version)
    head += struct.pack("<QQ", len(tensors) if n_tensors is None else n_tensors,
                        len(kvs) if n_kv is None else n_kv)
    head += b"".join(kvs)
    for name, dims, typ, off in tensors:
        head += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        head += struct.pack("<IQ", typ, off)
    pad = (-len(head)) % align
    return head + b"\0" * pad + data


tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % i for i in range(256)] + ["\u2581", "\u2581a", "b", "\u2581ab"]
scores = [0.0] * len(tokens)
types = [2, 3, 3] + [6] * 256 + [1] * 4
vocab_kvs = [
    kv("general.architecture", T_STR, "llama"),
    kv("llama.context_length", T_U32, 128),
    kv("llama.embedding_length", T_U32, 8),
    kv("llama.block_count", T_U32, 1),
    kv("llama.feed_forward_length", T_U32, 16),
    kv("llama.attention.head_count", T_U32, 2),
    kv("llama.attention.head_count_kv", T_U32, 1),
    kv("llama.attention.layer_norm_rms_epsilon", T_F32, 1e-5),
    kv("tokenizer.ggml.model", T_STR, "llama"),
    kv_arr("tokenizer.ggml.tokens", T_STR, tokens),
    kv_arr("tokenizer.ggml.scores", T_F32, scores),
    kv_arr("tokenizer.ggml.token_type", T_I32, types),
    kv("tokenizer.ggml.bos_token_id", T_U32, 1),
    kv("tokenizer.ggml.eos_token_id", T_U32, 2),
]
weights = struct.pack("<8f", *[0.5] * 8) + struct.pack("<8e", *[0.25] * 8)
tensors = [("token_embd.weight", [8], 0, 0), ("output_norm.weight", [8], 1, 32)]
valid = gguf(vocab_kvs, tensors, weights)
out("gguf_fuzz", "vocab-spm", valid)
bpe_tokens = ["a", "b", "ab", "\u0120", "\u0120ab", "<|endoftext|>"]
out("gguf_fuzz", "vocab-bpe", gguf([
    kv("general.architecture", T_STR, "llama"),
    kv("tokenizer.ggml.model", T_STR, "gpt2"),
    kv("tokenizer.ggml.pre", T_STR, "gpt-2"),
    kv_arr("tokenizer.ggml.tokens", T_STR, bpe_tokens),
    kv_arr("tokenizer.ggml.token_type", T_I32, [1, 1, 1, 1, 1, 3]),
    kv_arr("tokenizer.ggml.merges", T_STR, ["a b", "\u0120 ab"]),
    kv("tokenizer.ggml.eos_token_id", T_U32, 5),
], [], b""))
out("gguf_fuzz", "bad-magic", b"GGUX" + valid[4:])
out("gguf_fuzz", "version-1", gguf(vocab_kvs, tensors, weights, version=1))
out("gguf_fuzz", "truncated-data", valid[:-1])
out("gguf_fuzz", "truncated-header", valid[:40])
out("gguf_fuzz", "huge-tensor-count", gguf(vocab_kvs, tensors, weights, n_tensors=(1 << 64) - 1))
out("gguf_fuzz", "huge-kv-count", gguf(vocab_kvs, tensors, weights, n_kv=(1 << 61)))
out("gguf_fuzz", "tensor-offset-past-end", gguf(vocab_kvs, [("t", [8], 0, 1 << 40)], weights))
out("gguf_fuzz", "dims-overflow", gguf(vocab_kvs, [("t", [1 << 42, 1 << 42], 0, 0)], weights))
out("gguf_fuzz", "bad-alignment", gguf(vocab_kvs + [kv("general.alignment", T_U32, 13)], tensors, weights))
out("gguf_fuzz", "alignment-as-i32", gguf(vocab_kvs + [kv("general.alignment", T_I32, 64)], tensors, weights))
out("gguf_fuzz", "scores-short", gguf(vocab_kvs[:10] + [kv_arr("tokenizer.ggml.scores", T_F32, [0.0] * 3)]
                                       + vocab_kvs[11:], tensors, weights))
out("gguf_fuzz", "bos-out-of-range", gguf(vocab_kvs + [kv("tokenizer.ggml.bos_token_id", T_U32, 99999)],
                                          tensors, weights))
out("gguf_fuzz", "duplicate-key", gguf(vocab_kvs + [vocab_kvs[0]], tensors, weights))
out("gguf_fuzz", "duplicate-tensor", gguf(vocab_kvs, tensors + [tensors[0]], weights))
out("gguf_fuzz", "unknown-type", gguf(vocab_kvs, [("t", [8], 77, 0)], weights))
# K-quant tensors: a Q4_K [256, 2] (two 144-byte super-blocks) and a Q6_K row of 256, whole; a
# Q6_K whose row is not a whole super-block; a Q4_K whose data is cut short.
kquant = bytes(range(256)) * 3
out("gguf_fuzz", "kquants", gguf(vocab_kvs, [("blk.0.ffn_up.weight", [256, 2], 12, 0),
                                             ("output.weight", [256], 14, 288)], kquant[:288 + 210]))
out("gguf_fuzz", "kquant-partial-block", gguf(vocab_kvs, [("t", [64], 14, 0)], kquant[:210]))
out("gguf_fuzz", "kquant-truncated", gguf(vocab_kvs, [("t", [256, 2], 12, 0)], kquant[:200]))

# ---- safetensors ----
def st(header, data, length=None):
    h = json.dumps(header).encode("utf-8")
    return struct.pack("<Q", len(h) if length is None else length) + h + data


data = struct.pack("<4f", 1, 2, 3, 4) + struct.pack("<4e", 1, 2, 3, 4)
good = {"__metadata__": {"format": "pt"},
        "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        "b": {"dtype": "F16", "shape": [4], "data_offsets": [16, 24]}}
out("safetensors_fuzz", "valid", st(good, data))
out("safetensors_fuzz", "bf16", st({"c": {"dtype": "BF16", "shape": [1, 4], "data_offsets": [0, 8]}}, data[:8]))
out("safetensors_fuzz", "header-too-long", st(good, data, length=1 << 40))
out("safetensors_fuzz", "offsets-past-end", st({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1 << 33]}}, data))
out("safetensors_fuzz", "shape-mismatch", st({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}, data))
out("safetensors_fuzz", "overlap", st({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                        "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}, data))
out("safetensors_fuzz", "bad-dtype", st({"a": {"dtype": "F7", "shape": [4], "data_offsets": [0, 16]}}, data))
out("safetensors_fuzz", "not-json", struct.pack("<Q", 5) + b"{abc}" + data)
out("safetensors_fuzz", "short", b"\x08\x00\x00")

# ---- packed projections (packed_linear_fuzz): scheme byte, shape bytes, then a .safetensors
# file with model.layers.0.self_attn.q_proj's tensors (quantization-formats.md 2-4) ----
def packed(scheme, n_sel, k_sel, tensors):
    header, blob = {}, b""
    for name, dtype, shape, raw in tensors:
        header["model.layers.0.self_attn.q_proj." + name] = {
            "dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    return bytes([scheme, n_sel, k_sel]) + st(header, blob)


def i32(*v):
    return struct.pack("<%dI" % len(v), *v)


def f16(*v):
    return struct.pack("<%de" % len(v), *v)


awq = [("qweight", "I32", [8, 1], i32(0x76543210, *[0xFFFFFFFF] * 7)),
       ("qzeros", "I32", [1, 1], i32(0x11111118)), ("scales", "F16", [1, 8], f16(*range(1, 9)))]
out("packed_linear_fuzz", "awq", packed(0, 0, 0, awq))
out("packed_linear_fuzz", "awq-qweight-shape", packed(0, 0, 0, [("qweight", "I32", [4, 2], awq[0][3])] + awq[1:]))
out("packed_linear_fuzz", "awq-no-zeros", packed(0, 0, 0, [awq[0], awq[2]]))
out("packed_linear_fuzz", "awq-truncated", packed(0, 0, 0, awq)[:-7])
gptq = [("qweight", "I32", [2, 8], i32(*[0x76543210] * 8, *[0xFEDCBA98] * 8)),
        ("qzeros", "I32", [2, 1], i32(0x77777777, 0x33333335)),
        ("scales", "F16", [2, 8], f16(*[1.0] * 8, *[0.25] * 8)), ("g_idx", "I32", [16], i32(*[t % 2 for t in range(16)]))]
out("packed_linear_fuzz", "gptq-act-order", packed(1, 0, 1, gptq))
out("packed_linear_fuzz", "gptq-g-idx-out-of-range", packed(1, 0, 1, gptq[:3] + [("g_idx", "I32", [16], i32(*[5] * 16))]))
out("packed_linear_fuzz", "gptq-g-idx-unequal", packed(1, 0, 1, gptq[:3] + [("g_idx", "I32", [16], i32(*[0] * 9, *[1] * 7))]))
out("packed_linear_fuzz", "gptq8", packed(2, 0, 0, [("qweight", "I32", [2, 8], i32(*[0x80FF0100] * 8, *[0x7F7F7F7F] * 8)),
                                                  ("qzeros", "I32", [1, 2], i32(0x7F7F7F7F, 0x7F7F7F7F)),
                                                  ("scales", "F16", [1, 8], f16(*[2.0] * 8))]))
ct = [("weight_packed", "I32", [8, 2], i32(*[0x01234567, 0x89ABCDEF] * 8)),
      ("weight_scale", "F16", [8, 1], f16(*[0.5] * 8)), ("weight_shape", "I64", [2], struct.pack("<2q", 8, 16))]
out("packed_linear_fuzz", "ct-sym", packed(3, 0, 1, ct))
out("packed_linear_fuzz", "ct-shape-disagrees", packed(3, 0, 1, ct[:2] + [("weight_shape", "I64", [2], struct.pack("<2q", 8, 32))]))
out("packed_linear_fuzz", "ct-shape-huge", packed(3, 0, 1, ct[:2] + [("weight_shape", "I64", [2], struct.pack("<2q", 2**63 - 1, -2**63))]))
out("packed_linear_fuzz", "ct-asym-act-order", packed(4, 0, 1, [ct[0], ("weight_scale", "F16", [8, 2], f16(*[0.5] * 16)),
                                                             ("weight_zero_point", "I32", [1, 2], i32(0x9ABCDEF0, 0x88888888)),
                                                             ("weight_g_idx", "I32", [16], i32(*[1 - t // 8 for t in range(16)]))]))

# ---- config.json ----
llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
         "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 300, "max_position_embeddings": 256,
         "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False}
out("hf_config_fuzz", "llama", json.dumps(llama))
out("hf_config_fuzz", "llama3-rope", json.dumps(dict(llama, rope_scaling={
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192})))
out("hf_config_fuzz", "qwen3", json.dumps(dict(llama, architectures=["Qwen3ForCausalLM"], model_type="qwen3",
                                               head_dim=32, tie_word_embeddings=True)))
out("hf_config_fuzz", "mistral", json.dumps(dict(llama, architectures=["MistralForCausalLM"],
                                                 model_type="mistral", sliding_window=64)))
out("hf_config_fuzz", "zero-heads", json.dumps(dict(llama, num_attention_heads=0)))
out("hf_config_fuzz", "heads-not-divisible", json.dumps(dict(llama, num_key_value_heads=3)))
out("hf_config_fuzz", "huge", json.dumps(dict(llama, hidden_size=1 << 62, vocab_size=-1)))
out("hf_config_fuzz", "deep", "[" * 5000 + "]" * 5000)
w8a8 = {"quant_method": "compressed-tensors", "format": "int-quantized", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"],
                          "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
                          "input_activations": {"num_bits": 8, "type": "int", "symmetric": True,
                                                "strategy": "token", "dynamic": True}}}}
out("hf_config_fuzz", "w8a8", json.dumps(dict(llama, quantization_config=w8a8)))
out("hf_config_fuzz", "w8a8-groups-not-object", json.dumps(dict(llama, quantization_config=dict(w8a8, config_groups=[1]))))
out("hf_config_fuzz", "awq", json.dumps(dict(llama, quantization_config={"quant_method": "awq", "bits": 4})))
out("hf_config_fuzz", "quant-method-number", json.dumps(dict(llama, quantization_config={"quant_method": 5})))
out("hf_config_fuzz", "gptq-act-order", json.dumps(dict(llama, quantization_config={
    "quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True, "sym": False, "checkpoint_format": "gptq"})))
out("hf_config_fuzz", "gptq-bits-string", json.dumps(dict(llama, quantization_config={"quant_method": "gptq", "bits": "8"})))
out("hf_config_fuzz", "w4a16", json.dumps(dict(llama, quantization_config={
    "quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "input_activations": None, "weights": {
            "num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 128,
            "actorder": "group"}}}})))

# ---- tokenizer.json ----
byte_level = {"version": "1.0", "added_tokens": [
    {"id": 6, "content": "<|endoftext|>", "special": True, "single_word": False, "lstrip": False,
     "rstrip": False, "normalized": False}],
    "normalizer": None,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False, "byte_fallback": False,
              "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3, "\u0120ab": 4, "c": 5},
              "merges": ["a b", "\u0120 ab"]}}
out("tokenizer_json_fuzz", "byte-level", json.dumps(byte_level))
spm_vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
for i in range(256):
    spm_vocab["<0x%02X>" % i] = 3 + i
spm_vocab.update({"\u2581": 259, "a": 260, "\u2581a": 261, "b": 262, "\u2581ab": 263})
metaspace = {"version": "1.0", "added_tokens": [
    {"id": 1, "content": "<s>", "special": True, "single_word": False, "lstrip": False, "rstrip": False,
     "normalized": False}],
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                        {"type": "Replace", "pattern": {"String": " "},
                                                         "content": "\u2581"}]},
    "pre_tokenizer": None,
    "decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "fuse_unk": True, "byte_fallback": True,
              "vocab": spm_vocab, "merges": ["\u2581 a", "\u2581a b"]}}
out("tokenizer_json_fuzz", "metaspace-byte-fallback", json.dumps(metaspace))
out("tokenizer_json_fuzz", "merge-of-unknown", json.dumps(dict(byte_level, model=dict(byte_level["model"],
                                                                                    merges=["x y"]))))
out("tokenizer_json_fuzz", "added-id-out-of-range", json.dumps(dict(byte_level, added_tokens=[
    dict(byte_level["added_tokens"][0], id=1 << 40)])))
out("tokenizer_json_fuzz", "wordpiece", json.dumps(dict(byte_level, model={"type": "WordPiece", "vocab": {}})))

# ---- tokenize (byte 0 picks the vocabulary) ----
texts = ["Hello world! It's 2026.", " leading space and  double", "\u00e9t\u00e9 \u4e2d\u6587 \U0001F600",
         "<s>hi</s><|endoftext|><|begin_of_text|><|im_start|>", "tabs\tand\nnewlines\r\n",
         "1234567890 3.14159", "\xff\xfe invalid".encode("latin-1").decode("latin-1")]
for v in range(6):
    for i, t in enumerate(texts):
        raw = t.encode("utf-8") if i != 6 else b"\xff\xfe invalid \xc3"
        out("tokenize_fuzz", "v%d-%d" % (v, i), bytes([v]) + raw)

# ---- chat templates (source, NUL, role \x01 content \x02 ...) ----
chatml = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
llama2 = ("{{ bos_token }}{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate') }}{% endif %}"
          "{% if m.role == 'user' %}[INST] {{ m.content | trim }} [/INST]{% else %} {{ m.content }} {{ eos_token }}"
          "{% endif %}{% endfor %}")
macros = ("{% macro r(n) %}{% if n > 0 %}{{ r(n - 1) }}{{ n }}{% endif %}{% endmacro %}{{ r(5) }}"
          "{% set ns = namespace(x=0) %}{% for i in range(10) %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}"
          "{{ messages | length }}{{ messages[0].content | upper | replace('A', 'b') }}{{ 'x' * 3 }}"
          "{{ messages | tojson }}{% if enable_thinking is defined %}{{ enable_thinking }}{% endif %}")
msgs = b"system\x01Be brief.\x02user\x01Hello <|im_end|>\x02assistant\x01Hi!\x02user\x01Bye\x02"
for name, src in [("chatml", chatml), ("llama2", llama2), ("macros", macros)]:
    out("chat_template_fuzz", name, src.encode("utf-8") + b"\x03\0" + msgs)
out("chat_template_fuzz", "unclosed", b"{% for m in messages %}{{ m.content }\0user\x01x\x02")
out("chat_template_fuzz", "loop-bomb", b"{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}"
    b"{% endfor %}\0user\x01x\x02")

# ---- OpenAI requests (byte 0: bits 0-1 endpoint: 0 completions, 1 chat, 2 tokenize,
# 3 detokenize; bit 2 picks the model: 0 stories260K, 1 Qwen3) ----
def req(endpoint, model, body, texts=()):
    return bytes([endpoint | (model << 2)]) + json.dumps(body).encode("utf-8") + b"\0" + b"\x03".join(
        t.encode("utf-8") for t in texts)


outputs = ["Once", " upon a time", " \u00e9\u4e2d", ""]
out("openai_request_fuzz", "completion", req(0, 0, {"prompt": "Once upon", "max_tokens": 8}, outputs))
out("openai_request_fuzz", "completion-stream-n", req(0, 0, {
    "prompt": ["a", "b"], "n": 2, "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 4,
    "logprobs": 2, "echo": True, "stop": ["x", "\u2014"], "seed": -1}, outputs))
out("openai_request_fuzz", "completion-ids", req(0, 0, {"prompt": [[1, 2, 3], [4]], "max_tokens": 2,
                                                        "logit_bias": {"5": 100}}, outputs))
out("openai_request_fuzz", "chat", req(1, 1, {"model": "qwen3", "messages": [
    {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|im_end|>"}],
    "max_completion_tokens": 16, "logprobs": True, "top_logprobs": 3, "stream": True,
    "chat_template_kwargs": {"enable_thinking": False}}, outputs))
out("openai_request_fuzz", "chat-parts", req(1, 1, {"messages": [
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    {"role": "assistant", "content": None}, {"role": "tool", "content": "r", "tool_call_id": "t1"}]},
    outputs))
out("openai_request_fuzz", "chat-no-template", req(1, 0, {"messages": [{"role": "user", "content": "x"}]}))
out("openai_request_fuzz", "too-long", req(0, 0, {"prompt": "a " * 200, "max_tokens": 10}))
out("openai_request_fuzz", "bad-types", req(0, 0, {"prompt": "a", "max_tokens": "10", "temperature": -1,
                                                   "n": 3.5}))
out("openai_request_fuzz", "deep", bytes([0]) + b'{"prompt":' + b"[" * 200 + b"]" * 200 + b"}\0")
out("openai_request_fuzz", "tokenize", req(2, 1, {"prompt": "Hello <|im_start|>", "add_special_tokens": False}))
out("openai_request_fuzz", "tokenize-chat", req(2, 1, {"messages": [{"role": "user", "content": "x"}],
                                                       "add_generation_prompt": True}))
out("openai_request_fuzz", "detokenize", req(3, 0, {"tokens": [1, 2, 300, 511]}))
out("openai_request_fuzz", "detokenize-bad", req(3, 0, {"tokens": [-1, 1 << 40]}))
