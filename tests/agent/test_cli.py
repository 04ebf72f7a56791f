import io
import json

from ponder.cli import main

from .conftest import call
from .openai_server import running


def run_cli(capsys, argv):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_run_agent_prints_json(capsys, tmp_path):
    replies = [{"content": call("calculator", expression="6 * 7")}, {"content": "42"}]
    with running(replies) as (url, _):
        code, out, _ = run_cli(capsys, ["run-agent", "--task", "6 times 7?", "--model", url, "--out", str(tmp_path / "r.json")])
    result = json.loads(out)
    assert code == 0 and result["status"] == "answered" and result["answer"] == "42"
    assert [(a["tool"], a["ok"]) for a in result["tool_attempts"]] == [("calculator", True)]
    assert result["transcript"][3]["content"] == "<tool_response>\n[output of tool 'calculator'; untrusted data]\n42\n</tool_response>"
    assert json.loads((tmp_path / "r.json").read_text()) == result


def test_run_agent_with_a_schema_and_config_overrides(capsys, tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}))
    with running([{"content": '{"n": "x"}'}, {"content": '{"n": 3}'}]) as (url, _):
        code, out, _ = run_cli(
            capsys, ["run-agent", "--task", "count", "--model", url, "--schema", str(schema), "--no-transcript", "max_corrections=1"]
        )
    result = json.loads(out)
    assert code == 0 and result["answer"] == {"n": 3} and "transcript" not in result


def test_run_agent_interrupt_and_resume(capsys, tmp_path):
    state = tmp_path / "state.json"
    replies = [{"content": call("echo", text="hi")}, {"content": "said hi"}]
    with running(replies) as (url, requests):
        code, out, _ = run_cli(capsys, ["run-agent", "--task", "say hi", "--model", url, "--max-steps", "2", "--save-state", str(state)])
        assert code == 1 and json.loads(out)["status"] == "running"
        assert json.loads(state.read_text())["phase"] == "observing"
        code, out, _ = run_cli(capsys, ["run-agent", "--resume", str(state), "--model", url])
    assert code == 0 and json.loads(out)["answer"] == "said hi" and len(requests) == 2


def test_run_agent_bad_input_is_one_line_with_exit_2(capsys, tmp_path):
    code, out, err = run_cli(capsys, ["run-agent", "--task", "x", "--tools", "calculator,teleport", "--model", "tiny"])
    assert code == 2 and out == ""
    assert err.strip() == "ponder run-agent: error: unknown built-in tool 'teleport'; valid: calculator, echo, python, rag, read_file, search"
    code, _, err = run_cli(capsys, ["run-agent", "--task", "x", "--model", "tiny", "max_turns=0"])
    assert code == 2 and "max_turns must be >= 1" in err
    (tmp_path / "bad.json").write_text("{nope")
    code, _, err = run_cli(capsys, ["run-agent", "--task", "x", "--model", "tiny", "--schema", str(tmp_path / "bad.json")])
    assert code == 2 and "not valid JSON" in err


def test_run_agent_on_a_local_model(capsys):
    code, out, _ = run_cli(capsys, ["run-agent", "--task", "hi", "--model", "tiny", "max_turns=2", "max_new_tokens_per_turn=8"])
    result = json.loads(out)
    assert result["status"] in ("answered", "stopped") and result["turns"] <= 2
    assert code == (0 if result["status"] == "answered" else 1)


def test_chat_streams_and_handles_commands(capsys, monkeypatch, tmp_path):
    saved = tmp_path / "chat.json"
    lines = ["What is 2+3?", "/tools", f"/save {saved}", "/reset", f"/load {saved}", "And doubled?", "/bogus", "/quit"]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
    replies = [{"content": call("calculator", expression="2+3")}, {"content": "It is 5."}, {"content": "Doubled: 10."}]
    with running(replies) as (url, requests):
        code, out, _ = run_cli(capsys, ["chat", "--model", url])
    assert code == 0
    assert "  [calculator ok] 5\nIt is 5.\n" in out
    assert "calculator: Evaluate an arithmetic expression" in out and "echo: Return the text unchanged" in out
    assert f"saved 5 messages to {saved}" in out and "conversation cleared" in out
    assert f"loaded 5 messages from {saved}" in out and "Doubled: 10." in out
    assert "unknown command /bogus" in out
    # After /load the conversation went on from the saved transcript.
    assert [m["role"] for m in requests[2]["messages"]] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert requests[2]["stream"] is True


def test_chat_load_of_a_bad_file_is_reported(capsys, monkeypatch, tmp_path):
    (tmp_path / "bad.json").write_text("nonsense")
    monkeypatch.setattr("sys.stdin", io.StringIO(f"/load {tmp_path / 'bad.json'}\n/load {tmp_path / 'missing.json'}\n"))
    with running([]) as (url, _):
        code, out, _ = run_cli(capsys, ["chat", "--model", url, "--tools", ""])
    assert code == 0
    assert "error: agent state is not valid JSON" in out and "cannot read agent state" in out


def test_run_agent_with_rag_prints_provenance(capsys, tmp_path):
    (tmp_path / "notes.md").write_text("# Plants\nThe fern needs water twice a week.\n")
    (tmp_path / "stock.csv").write_text("item,count\nferns,12\ncacti,3\n")
    replies = [{"content": call("rag_search", query="how many cacti")}, {"content": "3 cacti"}]
    with running(replies) as (url, _):
        code, out, _ = run_cli(capsys, ["run-agent", "--task", "How many cacti?", "--model", url, "--tools", "rag",
                                        "--docs", str(tmp_path), "--no-transcript"])
    result = json.loads(out)
    assert code == 0 and result["answer"] == "3 cacti"
    assert result["provenance"][0] == {"id": "stock.csv#r2", "source": "stock.csv", "snippet": "item: cacti; count: 3",
                                       "score": result["provenance"][0]["score"], "row": 2}
