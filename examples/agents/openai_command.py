"""The OpenAI-SDK math agent (openai_loop.py) as a standalone script, trained through
ponder's gateway as a command run once per episode (a program in any language works
the same way):

    ponder train --recipe recipes/gateway_math.yaml --out runs/gateway-command \
        env.options.agent=null 'env.options.command=[python, examples/agents/openai_command.py]'

It reads what the gateway sets — OPENAI_BASE_URL, OPENAI_API_KEY, PONDER_TASK (the
task as JSON) — and prints its reward as the last line (a JSON object of named numbers).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from examples.agents.openai_loop import run  # noqa: E402 - the script runs from anywhere

if __name__ == "__main__":
    task = json.loads(os.environ["PONDER_TASK"])
    print(json.dumps(asyncio.run(run(task, os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]))))
