"""`ponder gateway` (online mode): a separate process drives sessions with the real
`openai` client; the trainer takes a step on them (tiny model, 127.0.0.1)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest

from ponder.config import load_recipe
from ponder.jobs.online import run_online
from ponder.runlog.metrics_log import read_metrics

DRIVER = """
import sys, time, httpx, openai
url, key = sys.argv[1], sys.argv[2]
admin = {"Authorization": f"Bearer {key}"}
for _ in range(600):  # the trainer is still loading the model
    try:
        httpx.get(url + "/health"); break
    except httpx.HTTPError:
        time.sleep(0.1)
for reward in (1.0, 0.0):
    opened = httpx.post(url + "/v1/sessions", json={"task_id": "shared"}, headers=admin).json()
    client = openai.OpenAI(base_url=opened["base_url"], api_key=opened["api_key"], max_retries=0)
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "Say hi."}])
    session = url + "/v1/sessions/" + opened["id"]
    own = {"Authorization": f"Bearer {opened['api_key']}"}
    assert httpx.post(session + "/reward", json={"reward": reward}, headers=own).status_code == 200
    assert httpx.post(session + "/end", headers=own).status_code == 200
print("driven")
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_online_mode_trains_on_sessions_a_separate_process_drives(tmp_path) -> None:
    recipe = load_recipe("recipes/gateway_math.yaml", [
        "model.name=tiny", "train.steps=1", "train.tasks_per_step=1", "rollout.group_size=2", "sft.steps=0",
        "rollout.sampling.max_new_tokens_per_turn=8", "env.options.tasks_from.options.n_train=4",
        "env.options.tasks_from.options.n_eval=2", "lora.r=2", "lora.alpha=4", "train.eval_every=0",
        "env.options.agent=null"])  # fmt: skip
    port, lines = free_port(), []
    trainer = threading.Thread(target=run_online, args=(recipe, tmp_path / "run", "admin-key", "127.0.0.1", port,
                                                        lines.append), daemon=True)  # fmt: skip
    trainer.start()
    driver = subprocess.run([sys.executable, "-c", DRIVER, f"http://127.0.0.1:{port}", "admin-key"],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert driver.returncode == 0 and driver.stdout.strip() == "driven", driver.stderr[-2000:]
    trainer.join(300)
    assert not trainer.is_alive()
    (record,) = [r for r in read_metrics(tmp_path / "run") if r.get("step") == 1]
    assert record["gateway/episodes"] == 2.0 and record["reward/mean"] == 0.5  # one group: 1 and 0
    assert f"127.0.0.1:{port}/v1/sessions" in lines[0]


def test_online_mode_refuses_async_rollouts(tmp_path) -> None:
    recipe = load_recipe("recipes/gateway_math.yaml", ["model.name=tiny", "train.async_rollouts=true"])
    with pytest.raises(ValueError, match="train.async_rollouts=false"):
        run_online(recipe, tmp_path, "k")
