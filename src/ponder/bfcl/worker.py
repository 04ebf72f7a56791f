"""Runs inside bfcl-eval's own virtual environment (never imported by ponder).

ponder starts `<bfcl venv>/bin/python worker.py` and exchanges JSON lines over
stdin/stdout: one request per line, one reply per line. Everything BFCL-specific is
BFCL's own code: the prompt (`system_prompt_pre_processing_chat_model` after the
language-specific function doc processing), the decoder of prompt-mode models
(`default_decode_ast_prompting`) and the AST checker (`ast_checker`), with the
eval runner's logic for relevance categories. This file imports nothing from ponder.

Requests:
  {"op": "ping"}
  {"op": "prompt", "category": C, "entries": [{"id", "question", "function"}]}
      → {"messages": [[...], ...]}  the chat BFCL sends a prompt-mode model
  {"op": "check", "category": C, "items": [{"id", "text", "function", "ground_truth"}]}
      → {"results": [{"valid", "error_type", "error", "decoded"}]}
"""

from __future__ import annotations

import copy
import json
import sys
import traceback

from bfcl_eval.constants.enums import Language, ReturnFormat
from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
from bfcl_eval.model_handler.utils import (
    default_decode_ast_prompting,
    system_prompt_pre_processing_chat_model,
)
from bfcl_eval.utils import (
    _func_doc_language_specific_pre_processing,
    is_empty_output,
    is_function_calling_format_output,
)

# A prompt-mode model whose names keep their dots (underscore_to_dot False); BFCL's
# checker only reads that flag from the model's config.
CHECKER_MODEL = "Qwen_Qwen3-0.6B"


def _language(category: str) -> tuple[Language, ReturnFormat]:
    if "java" in category and "javascript" not in category:
        return Language.JAVA, ReturnFormat.JAVA
    if "javascript" in category:
        return Language.JAVASCRIPT, ReturnFormat.JAVASCRIPT
    return Language.PYTHON, ReturnFormat.PYTHON


def prompt(category: str, entries: list[dict]) -> dict:
    chats = []
    for entry in entries:
        functions = _func_doc_language_specific_pre_processing(copy.deepcopy(entry["function"]), category)
        messages = copy.deepcopy(entry["question"][0])
        chats.append(system_prompt_pre_processing_chat_model(messages, functions, entry["id"]))
    return {"messages": chats}


def _relevance(category: str, text: str) -> dict:
    try:
        decoded = default_decode_ast_prompting(text, ReturnFormat.PYTHON, False)
        called = not is_empty_output(decoded)
    except Exception:
        decoded, called = None, False
    valid = not called if "irrelevance" in category else called
    error_type = "" if valid else ("irrelevance_error:decoder_success" if "irrelevance" in category
                                   else "relevance_error:decoder_failed")
    return {"valid": valid, "error_type": error_type, "error": [], "decoded": _jsonable(decoded)}


def _ast(category: str, item: dict) -> dict:
    language, return_format = _language(category)
    try:
        decoded = default_decode_ast_prompting(item["text"], return_format, False)
    except Exception as exc:
        return {"valid": False, "error_type": "ast_decoder:decoder_failed", "error": [str(exc)], "decoded": None}
    if not is_function_calling_format_output(decoded):
        return {"valid": False, "error_type": "ast_decoder:decoder_wrong_output_format", "error": [], "decoded": None}
    result = ast_checker(item["function"], decoded, item["ground_truth"], language, category, CHECKER_MODEL)
    return {"valid": bool(result["valid"]), "error_type": result.get("error_type", ""),
            "error": [str(e) for e in result.get("error", [])], "decoded": _jsonable(decoded)}


def check(category: str, items: list[dict]) -> dict:
    relevance = "relevance" in category  # irrelevance, live_irrelevance, live_relevance
    return {"results": [_relevance(category, item["text"]) if relevance else _ast(category, item) for item in items]}


def _jsonable(value):
    return json.loads(json.dumps(value, default=repr))


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            op = request.get("op")
            if op == "ping":
                reply = {"ok": True}
            elif op == "prompt":
                reply = prompt(request["category"], request["entries"])
            elif op == "check":
                reply = check(request["category"], request["items"])
            else:
                reply = {"error": f"unknown op {op!r}"}
        except Exception as exc:  # the reply names the failure; the worker keeps serving
            reply = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=3)}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
