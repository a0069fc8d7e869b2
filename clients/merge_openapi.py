#!/usr/bin/env python3
"""Merges the server's /openapi.json with the kinds' schemas from GET /v1/kinds.

The OpenAPI document types a task's `request` and `output` as plain objects; the exact
JSON Schema of each kind's request and output is published by `GET /v1/kinds`. Both
clients' types are generated from the merged document (clients/openapi.json), so neither
is written by hand: each kind becomes `components.schemas.<Kind>Request` and
`<Kind>Output` (e.g. `ClassifyManyRequest`), and each `$defs` entry a component of its
own (`Label`, `ChatMessage`), with the `#/$defs/…` references rewritten.

Usage: merge_openapi.py OPENAPI_JSON KINDS_JSON OUT_JSON
"""

import json
import sys
from typing import Any


def pascal(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.replace("-", "_").split("_"))


def rewrite(node: Any, refs: dict[str, str]) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and value in refs:
                out[key] = refs[value]
            elif key in ("$schema", "title", "$defs"):
                continue
            else:
                out[key] = rewrite(value, refs)
        return out
    if isinstance(node, list):
        return [rewrite(v, refs) for v in node]
    return node


def main() -> None:
    openapi_path, kinds_path, out_path = sys.argv[1:4]
    with open(openapi_path, encoding="utf-8") as f:
        doc = json.load(f)
    with open(kinds_path, encoding="utf-8") as f:
        kinds = json.load(f)["kinds"]
    schemas: dict[str, Any] = doc.setdefault("components", {}).setdefault("schemas", {})
    names = []
    for entry in kinds:
        kind = entry["kind"]
        names.append(kind)
        for part, schema in (("Request", entry["request_schema"]), ("Output", entry["output_schema"])):
            refs: dict[str, str] = {}
            defs = schema.get("$defs", {})
            for def_name in defs:
                component = pascal(def_name)
                refs[f"#/$defs/{def_name}"] = f"#/components/schemas/{component}"
            for def_name, def_schema in defs.items():
                component = pascal(def_name)
                value = rewrite(def_schema, refs)
                if component in schemas and schemas[component] != value:
                    component = pascal(kind) + component
                    refs[f"#/$defs/{def_name}"] = f"#/components/schemas/{component}"
                schemas[component] = value
            value = rewrite(schema, refs)
            value["description"] = (
                value.get("description", "") + f" The `{kind}` {part.lower()} (GET /v1/kinds)."
            ).strip()
            schemas[pascal(kind) + part] = value
    # `HashableJson` is any JSON value (numbers within ±(2^53 − 1)): a recursive anyOf that
    # TypeScript cannot name through an indexed access type (TS2502). For the clients'
    # types it is what it means, an unconstrained JSON value; the server still checks it.
    if "HashableJson" in schemas:
        schemas["HashableJson"] = {"description": schemas["HashableJson"].get("description", "")}
    schemas["Kind"] = {
        "type": "string",
        "enum": names,
        "description": "The task kinds (GET /v1/kinds).",
    }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, ensure_ascii=False, sort_keys=False)
        f.write("\n")


if __name__ == "__main__":
    main()
