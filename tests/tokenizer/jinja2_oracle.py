#!/usr/bin/env python3
"""Regenerates the expected outputs of tests/data/tokenizer/jinja_cases.json with Python jinja2.

Renders every case's template with the file's context in the environment transformers uses for
chat templates (immutable sandbox, trim_blocks, lstrip_blocks, loopcontrols, a json.dumps
`tojson`, raise_exception, strftime_now) and prints, per case, the output or the error.
Development aid only (needs `pip install jinja2`); the C++ test reads the committed file.

    python3 tests/tokenizer/jinja2_oracle.py tests/data/tokenizer/jinja_cases.json
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    doc = json.load(open(sys.argv[1]))
    results = []
    for case in doc["cases"]:
        try:
            results.append({"name": case["name"],
                            "output": env.from_string(case["template"]).render(**doc["context"])})
        except Exception as e:  # noqa: BLE001 - reported, not handled
            results.append({"name": case["name"], "error": f"{type(e).__name__}: {e}"})
    json.dump(results, sys.stdout, indent=1, ensure_ascii=False)
    print()


if __name__ == "__main__":
    main()
