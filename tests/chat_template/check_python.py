"""Cross-checks expected.json against Python Jinja2 configured as Hugging Face transformers
configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
raise_exception, strftime_now, tojson = json.dumps(ensure_ascii=False)). Optional: it needs
the jinja2 Python package. Prints the cases where the two references disagree.

  python3 check_python.py cases.json expected.json ../../../shared/models
"""
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def token_text(t):
    if isinstance(t, str):
        return t
    if isinstance(t, dict) and isinstance(t.get("content"), str):
        return t["content"]
    return ""


def main():
    cases_path, expected_path, models = sys.argv[1:4]
    data = json.load(open(cases_path, encoding="utf-8"))
    expected = json.load(open(expected_path, encoding="utf-8"))
    env = make_env()
    read = lambda name: json.load(open(os.path.join(models, "tokenizers", name, "tokenizer_config.json"), encoding="utf-8"))
    bad = 0
    for c in data["cases"]:
        config = None
        if c["template"].startswith("file:"):
            config = read(c["template"][5:])
            source = config["chat_template"]
        else:
            source = data["templates"][c["template"][7:]]
        if "tokens_from" in c:
            config = read(c["tokens_from"])
        ctx = dict(messages=c["messages"], add_generation_prompt=c["add_generation_prompt"],
                   bos_token=c.get("bos_token", token_text((config or {}).get("bos_token"))),
                   eos_token=c.get("eos_token", token_text((config or {}).get("eos_token"))), **c.get("kwargs", {}))
        try:
            got = {"output": env.from_string(source).render(**ctx)}
        except jinja2.exceptions.TemplateError as e:
            got = {"error": str(e)}
        if got != expected[c["name"]]:
            bad += 1
            print("DIFF", c["name"])
            print("  python:", json.dumps(got, ensure_ascii=False))
            print("  js:    ", json.dumps(expected[c["name"]], ensure_ascii=False))
    print(f"{len(data['cases']) - bad}/{len(data['cases'])} cases agree")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
